package main

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/axonhq/axon/internal/sysdump"
)

func newSysdumpCmd() *cobra.Command {
	var f agentFlags
	o := sysdump.Options{}
	var out string
	cmd := &cobra.Command{
		Use:   "sysdump",
		Short: "Collect the node's axon state into one tar.gz for a bug report",
		Long: "Collect into one tar.gz: the agent's status, endpoints, Services and BPF tables (local API),\n" +
			"its /metrics (--health-addr), its command line (secret-looking flag values redacted), every\n" +
			"map pinned under --bpf-root (at most --max-map-entries entries each), the BPF programs and\n" +
			"links in the kernel, the kernel version and the agent's probe results, the kernel log's tail,\n" +
			"and the agent's log (--agent-log FILE or --journal-unit UNIT). A part that cannot be read\n" +
			"becomes <part>.error in the archive; the archive is written anyway. No kubeconfig, token or\n" +
			"environment is collected. Run it as root on the node (kubectl exec into the agent's pod).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			o.Socket = c.Socket()
			if out == "" {
				out = "axon-sysdump-" + time.Now().UTC().Format("20060102-150405") + ".tar.gz"
			}
			if err := writeSysdump(cmd, out, o); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s\n", out)
			return nil
		},
	}
	cmd.Flags().StringVar(&f.socket, "socket", defaultSocket(), "agent API socket (env AXON_SOCKET)")
	cmd.Flags().StringVarP(&f.node, "node", "n", "", "the lab node's agent (overrides --socket)")
	cmd.Flags().StringVar(&o.HealthAddr, "health-addr", "127.0.0.1:9876", "the agent's --health-addr, for /metrics (empty: skip)")
	cmd.Flags().StringVar(&o.BPFRoot, "bpf-root", "/sys/fs/bpf/axon", "the agent's --bpf-root, whose pinned maps are dumped")
	cmd.Flags().IntVar(&o.MaxMapEntries, "max-map-entries", sysdump.DefaultMaxMapEntries, "entries written per pinned map (the rest are counted)")
	cmd.Flags().Int64Var(&o.MaxLogBytes, "max-log-bytes", sysdump.DefaultMaxLogBytes, "bytes of each log's tail")
	cmd.Flags().StringVar(&o.AgentLog, "agent-log", "", "a file with the agent's log")
	cmd.Flags().StringVar(&o.JournalUnit, "journal-unit", "", "a systemd unit whose journal holds the agent's log")
	cmd.Flags().StringVarP(&out, "file", "f", "", "the archive to write (default ./axon-sysdump-<UTC time>.tar.gz)")
	return cmd
}

func writeSysdump(cmd *cobra.Command, out string, o sysdump.Options) error {
	tmp, err := os.CreateTemp(filepath.Dir(out), ".axon-sysdump-*")
	if err != nil {
		return fmt.Errorf("create the archive next to %s: %w", out, err)
	}
	defer os.Remove(tmp.Name())
	if err := sysdump.Write(cmd.Context(), tmp, o); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", out, err)
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), out)
}
