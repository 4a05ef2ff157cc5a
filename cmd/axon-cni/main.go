// Command axon-cni is the CNI plugin of axon. Container runtimes run it with
// CNI_COMMAND and friends in the environment and the network config on stdin.
//
// `axon-cni install DIR` (no CNI_COMMAND) copies the running binary into
// DIR/axon-cni atomically: the DaemonSet's init container runs it, since the
// image has no shell or coreutils.
package main

import (
	"fmt"
	"os"

	"github.com/axonhq/axon/internal/cni"
)

func main() {
	if len(os.Args) > 1 && os.Getenv("CNI_COMMAND") == "" {
		os.Exit(runInstall(os.Args[1:]))
	}
	os.Exit(cni.Main())
}

func runInstall(args []string) int {
	if len(args) != 2 || args[0] != "install" {
		fmt.Fprintln(os.Stderr, "usage: axon-cni install DIR   (copies this binary to DIR/axon-cni; runtimes run axon-cni with CNI_COMMAND set and no arguments)")
		return 2
	}
	dst, err := installSelf(args[1])
	if err != nil {
		fmt.Fprintf(os.Stderr, "axon-cni install: %v\n", err)
		return 1
	}
	fmt.Printf("installed %s\n", dst)
	return 0
}
