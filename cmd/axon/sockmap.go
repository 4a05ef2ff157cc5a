package main

// `axon bpf sockmap list`, the connections the same-node TCP bypass
// accelerates, read back from its SOCKHASH.

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/axonhq/axon/internal/api"
)

func newBPFSockmapCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "sockmap",
		Short: "Inspect the same-node TCP bypass's BPF maps (bypassed connections)",
	}
	var f agentFlags
	list := &cobra.Command{
		Use:   "list",
		Short: "List the sockets in the same-node TCP bypass's SOCKHASH",
		Long: "List every socket in the same-node TCP bypass's SOCKHASH: its local and remote\n" +
			"address, the pods that own them (from the agent's endpoint registry: pod addresses\n" +
			"for pod-to-pod connections, the netns cookie for loopback connections inside a\n" +
			"pod), then the bypass's counters. A bypassed connection shows twice, once per end.\n" +
			"Fails with the reason when the bypass is off (-o json then prints enabled=false\n" +
			"and the reason).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			rep, err := c.SockmapConns(cmd.Context())
			if err != nil {
				return err
			}
			if f.out.structured() {
				return f.out.write(cmd, rep)
			}
			if !rep.Enabled {
				return fmt.Errorf("the same-node TCP bypass is off on this node: %s", rep.Reason)
			}
			return printSockmap(cmd.OutOrStdout(), rep)
		},
	}
	f.register(list)
	cmd.AddCommand(list)
	return cmd
}

func printSockmap(w io.Writer, rep api.SockmapReply) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "LOCAL\tREMOTE\tLOCAL POD\tREMOTE POD\tNETNS\tMODE\tBYPASSED BYTES\tTCP BYTES")
	for _, c := range rep.Conns {
		netns := "-"
		if c.Netns != 0 {
			netns = fmt.Sprint(c.Netns)
		}
		mode := dash(c.Mode)
		if c.Alias {
			mode += "(alias)" // paired through a sidecar's REDIRECT
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\n", c.Local, c.Remote, dash(c.LocalPod), dash(c.RemotePod), netns,
			mode, c.RedirectedBytes, c.PassedBytes)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(rep.Conns) == 0 {
		fmt.Fprintln(w, "(no bypassed connection)")
	}
	if len(rep.Counters) > 0 {
		fmt.Fprintln(w, "counters:", formatCounters(rep.Counters))
	}
	return nil
}
