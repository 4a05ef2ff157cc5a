// Command axon is the operator CLI: it reads the agent's local API (status,
// endpoints) and drives the local lab cluster (axon lab ...).
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

// version is stamped by the Makefile (-ldflags "-X main.version=...").
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRootCmd().ExecuteContext(ctx)
	stop()
	if err != nil {
		var ee exitError
		if errors.As(err, &ee) {
			os.Exit(ee.code)
		}
		fmt.Fprintln(os.Stderr, "axon:", err)
		os.Exit(1)
	}
}

// exitError carries a specific exit code (e.g. from `axon lab exec`) without
// printing anything more.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "axon",
		Short:         "axon: an eBPF networking datapath for Kubernetes",
		Long:          "axon is the operator CLI of the axon datapath. It reads the local agent's state\n(status, endpoints) and runs a whole multi-node cluster on one machine (axon lab).",
		Version:       version,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newStatusCmd(), newEndpointCmd(), newLabCmd(), newServiceCmd(), newBPFCmd(), newSysdumpCmd(), newMonitorCmd())
	// lb.go; bpfct.go adds bpf ct, bpf nat, bpf lb maglev
	root.AddCommand(newLBCmd(), newUninstallCmd()) // uninstall.go
	addNorthSouthBPFCmds(root)
	return root
}
