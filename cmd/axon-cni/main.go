// Command axon-cni is the CNI plugin of axon. Container runtimes run it with
// CNI_COMMAND and friends in the environment and the network config on stdin.
package main

import (
	"os"

	"github.com/axonhq/axon/internal/cni"
)

func main() { os.Exit(cni.Main()) }
