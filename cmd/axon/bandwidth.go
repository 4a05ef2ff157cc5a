package main

// `axon bpf bandwidth list`, the pod bandwidth limits read back
// from the Bandwidth Manager's BPF maps.

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/axonhq/axon/internal/api"
)

func newBPFBandwidthCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bandwidth",
		Short: "Inspect the Bandwidth Manager's BPF maps (pod egress/ingress limits)",
	}
	var f agentFlags
	list := &cobra.Command{
		Use:   "list",
		Short: "List the pod bandwidth limits programmed in the BPF maps",
		Long: "List every pod bandwidth limit present in the Bandwidth Manager's BPF maps: pod\n" +
			"(from the agent's endpoint registry), direction, rate, the pod's addresses and\n" +
			"the packets dropped for the limit (egress: beyond the EDT horizon; ingress: token\n" +
			"bucket empty). Limits come from the Pod annotations kubernetes.io/egress-bandwidth\n" +
			"and kubernetes.io/ingress-bandwidth. Fails with the reason when the Bandwidth\n" +
			"Manager is disabled (-o json then prints enabled=false and the reason).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			rep, err := c.BandwidthMaps(cmd.Context())
			if err != nil {
				return err
			}
			if f.out.structured() {
				return f.out.write(cmd, rep)
			}
			if !rep.Enabled {
				return fmt.Errorf("the bandwidth manager is disabled on this node: %s", rep.Reason)
			}
			return printBandwidth(cmd.OutOrStdout(), rep)
		},
	}
	f.register(list)
	cmd.AddCommand(list)
	return cmd
}

func printBandwidth(w io.Writer, rep api.BandwidthReply) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "POD\tDIRECTION\tRATE\tADDRESSES\tDROPS\tID")
	for _, r := range rep.Rows {
		pod := r.Pod
		if pod == "" {
			pod = "-"
		}
		addrs := make([]string, 0, len(r.Addrs))
		for _, a := range r.Addrs {
			addrs = append(addrs, a.String())
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\n", pod, r.Direction, r.Rate, strings.Join(addrs, ","), r.Drops, r.ID)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(rep.Rows) == 0 {
		fmt.Fprintln(w, "(no pod has a bandwidth limit)")
	}
	if len(rep.Counters) > 0 {
		fmt.Fprintln(w, "counters:", formatCounters(rep.Counters))
	}
	return nil
}

// formatCounters prints counters as name=value pairs sorted by name,
// separated by spaces.
func formatCounters(m map[string]uint64) string {
	parts := make([]string, 0, len(m))
	for _, n := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s=%d", n, m[n]))
	}
	return strings.Join(parts, " ")
}
