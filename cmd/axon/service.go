package main

// `axon service list` (the agent's desired Service table) and
// `axon bpf lb list` (what is programmed in the socket LB's BPF maps). Both
// print the same text format (internal/lb.Render), so
//   diff <(axon service list) <(axon bpf lb list)
// shows what is not programmed (yet).

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"
)

func newServiceCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "service",
		Short: "Inspect the Kubernetes Services the agent load-balances",
	}
	var f agentFlags
	list := &cobra.Command{
		Use:   "list",
		Short: "List the DESIRED Service frontends and backends (the agent's table, from the kube-apiserver)",
		Long: "List the Service frontends and backends the agent WANTS programmed: its table built\n" +
			"from Services and EndpointSlices, one frontend per line (address:port/proto, kind,\n" +
			"namespace/name:port, affinity) followed by its backends (address, state, node).\n" +
			"Problems (ignored entries, write errors, conflicts, watch errors) go to stderr.\n" +
			"This is the intent, not what the kernel translates: `axon bpf lb list` shows the\n" +
			"programmed BPF maps in the same format, so the two outputs can be diffed.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			rep, err := c.Services(cmd.Context())
			if err != nil {
				return err
			}
			if f.out.structured() {
				return f.out.write(cmd, rep)
			}
			if _, err := io.WriteString(cmd.OutOrStdout(), rep.Text); err != nil {
				return err
			}
			errw := cmd.ErrOrStderr()
			if !rep.Synced {
				fmt.Fprintln(errw, "note: the Service watch has not synced yet; the table may be incomplete")
			} else if !rep.Writer {
				fmt.Fprintln(errw, "note: watch only, nothing is programmed (socket load balancing not loaded; see `axon status`)")
			}
			if rep.Frontends == 0 && rep.Synced {
				fmt.Fprintln(errw, "no Service frontends")
			}
			if rep.WatchError != "" {
				fmt.Fprintln(errw, "watch error:", rep.WatchError)
			}
			for _, p := range rep.Problems {
				fmt.Fprintln(errw, "ignored:", p)
			}
			for _, p := range rep.WriteErrors {
				fmt.Fprintln(errw, "not programmed:", p)
			}
			for _, p := range rep.Conflicts {
				fmt.Fprintln(errw, "conflict:", p)
			}
			return nil
		},
	}
	f.register(list)
	cmd.AddCommand(list)
	return cmd
}

func newBPFCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bpf",
		Short: "Inspect the agent's BPF maps",
	}
	lbCmd := &cobra.Command{
		Use:   "lb",
		Short: "Inspect the socket load balancer's BPF maps",
	}
	var f agentFlags
	list := &cobra.Command{
		Use:   "list",
		Short: "List the PROGRAMMED Service frontends, read back from the socket LB's BPF maps",
		Long: "List the Service frontends and backends actually present in the socket load\n" +
			"balancer's BPF maps, i.e. what connect()/sendmsg() translate right now, in the same\n" +
			"format as `axon service list` (which shows the desired table). Kind and\n" +
			"namespace/name are not stored in the maps: they are empty for frontends the running\n" +
			"agent has not written since it started. Fails with the reason when socket load\n" +
			"balancing is disabled on the node (-o json then prints enabled=false and the reason).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			rep, err := c.LBMaps(cmd.Context())
			if err != nil {
				return err
			}
			if f.out.structured() {
				return f.out.write(cmd, rep)
			}
			if !rep.Enabled {
				return fmt.Errorf("socket load balancing is disabled on this node: %s", rep.Reason)
			}
			if _, err := io.WriteString(cmd.OutOrStdout(), rep.Text); err != nil {
				return err
			}
			if rep.Frontends == 0 {
				fmt.Fprintln(cmd.ErrOrStderr(), "no frontends in the BPF maps")
			}
			return nil
		},
	}
	f.register(list)
	lbCmd.AddCommand(list)
	cmd.AddCommand(lbCmd)
	cmd.AddCommand(newBPFBandwidthCmd()) // bandwidth.go
	cmd.AddCommand(newBPFSockmapCmd())   // sockmap.go
	return cmd
}
