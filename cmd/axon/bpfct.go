package main

// `axon bpf ct list`, `axon bpf nat list` and `axon bpf lb maglev
// get <service>`: the north-south load balancer's maps, read by the process
// that loaded them (the node agent, or the standalone `axon lb` with
// --socket pointing at its socket).

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/axonhq/axon/internal/api"
)

// addNorthSouthBPFCmds hangs ct, nat and lb maglev under `axon bpf`.
func addNorthSouthBPFCmds(root *cobra.Command) {
	bpf, _, err := root.Find([]string{"bpf"})
	if err != nil || bpf == root {
		bpf = &cobra.Command{Use: "bpf", Short: "Inspect the agent's BPF maps"}
		root.AddCommand(bpf)
	}
	bpf.AddCommand(newCTCmd(), newNATCmd())
	lbCmd, _, err := bpf.Find([]string{"lb"})
	if err != nil || lbCmd == bpf {
		lbCmd = &cobra.Command{Use: "lb", Short: "Inspect the load balancers' BPF maps"}
		bpf.AddCommand(lbCmd)
	}
	lbCmd.AddCommand(newMaglevCmd())
}

const nsSocketHelp = "\nTalks to the node agent (--node / --socket); for the standalone `axon lb` pass its socket\n(--socket /run/axon/l4lb.sock by default)."

// newNSListCmd builds `axon bpf <table> list` for one of the north-south load
// balancer's tables: fetch the table from the agent, print it as JSON, or, when
// the load balancer is loaded, as text.
func newNSListCmd[R any](table, tableShort string, list *cobra.Command,
	fetch func(*api.Client, context.Context) (R, error),
	loaded func(R) (bool, string),
	print func(cmd *cobra.Command, rep R)) *cobra.Command {
	parent := &cobra.Command{Use: table, Short: tableShort}
	var f agentFlags
	list.Use = "list"
	list.Args = cobra.NoArgs
	list.RunE = func(cmd *cobra.Command, _ []string) error {
		c, err := f.client()
		if err != nil {
			return err
		}
		rep, err := fetch(c, cmd.Context())
		if err != nil {
			return err
		}
		if f.out.structured() {
			return f.out.write(cmd, rep)
		}
		if ok, reason := loaded(rep); !ok {
			return fmt.Errorf("the north-south load balancer is not loaded: %s", reason)
		}
		print(cmd, rep)
		return nil
	}
	f.register(list)
	parent.AddCommand(list)
	return parent
}

func newCTCmd() *cobra.Command {
	return newNSListCmd("ct", "Inspect the north-south load balancer's connection tracking table",
		&cobra.Command{
			Short: "List tracked north-south flows: client, frontend, backend, mode, age, idle time, kept next hop",
			Long:  "List the flows in the north-south conntrack table (axon_np_ct), one per line." + nsSocketHelp,
		},
		(*api.Client).CT,
		func(rep api.CTReply) (bool, string) { return rep.Enabled, rep.Reason },
		func(cmd *cobra.Command, rep api.CTReply) {
			printCT(cmd.OutOrStdout(), rep)
			fmt.Fprintf(cmd.ErrOrStderr(), "%d of %d entries\n", len(rep.Entries), rep.Max)
		})
}

func printCT(w io.Writer, rep api.CTReply) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PROTO\tCLIENT\tFRONTEND\tBACKEND\tMODE\tAGE\tIDLE\tNEXT HOP")
	for _, e := range rep.Entries {
		mode := e.Mode
		if e.NATPort != 0 {
			mode += fmt.Sprintf(" port %d", e.NATPort)
		}
		if e.Closing {
			mode += " closing"
		}
		if e.Unreplied {
			mode += " unreplied"
		}
		nh := e.NextHop
		if nh == "" {
			nh = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%.0fs\t%.0fs\t%s\n", e.Proto, e.Client, e.Frontend, e.Backend, mode, e.AgeSec, e.IdleSec, nh)
	}
	tw.Flush()
}

func newNATCmd() *cobra.Command {
	return newNSListCmd("nat", "Inspect the north-south load balancer's reverse NAT table",
		&cobra.Command{
			Short: "List reverse translations: a reply as seen on the wire, and what it is rewritten to",
			Long:  "List the reverse NAT entries (axon_np_nat): SNAT replies coming back to the node, and\nreplies of local backends fixed up at uplink egress." + nsSocketHelp,
		},
		(*api.Client).NAT,
		func(rep api.NATReply) (bool, string) { return rep.Enabled, rep.Reason },
		func(cmd *cobra.Command, rep api.NATReply) {
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "PROTO\tREPLY SRC\tREPLY DST\tNEW SRC\tNEW DST\tKIND\tIDLE")
			for _, e := range rep.Entries {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%.0fs\n", e.Proto, e.ReplySrc, e.ReplyDst, e.NewSrc, e.NewDst, e.Kind, e.IdleSec)
			}
			tw.Flush()
			fmt.Fprintf(cmd.ErrOrStderr(), "%d entries\n", len(rep.Entries))
		})
}

func newMaglevCmd() *cobra.Command {
	mg := &cobra.Command{Use: "maglev", Short: "Inspect the north-south load balancer's Maglev tables"}
	var f agentFlags
	var frontend bool
	var slots bool
	get := &cobra.Command{
		Use:   "get <namespace/service | addr:port/proto>",
		Short: "Show a Service's (or frontend's) programmed Maglev table: slots per backend",
		Long: "Read the Maglev lookup table of every north-south frontend of a Service (its NodePort,\n" +
			"LoadBalancer and externalIP frontends), or of one frontend given as addr:port/proto\n" +
			"(NodePorts as 0.0.0.0:<port>/tcp), from the BPF map axon_lb_maglev, and print how many\n" +
			"slots each backend holds (--slots prints the whole table). For the standalone load\n" +
			"balancer, name a VIP by its name or address." + nsSocketHelp,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			svc, fe := args[0], ""
			if frontend || strings.Contains(args[0], ":") {
				svc, fe = "", args[0]
			}
			rep, err := c.Maglev(cmd.Context(), svc, fe, slots)
			if err != nil {
				return err
			}
			if f.out.structured() {
				return f.out.write(cmd, rep)
			}
			w := cmd.OutOrStdout()
			for _, t := range rep.Tables {
				name := t.Frontend
				if t.Service != "" {
					name += "  " + t.Service
				}
				if t.Random {
					fmt.Fprintf(w, "%s: random selection, no Maglev table (annotate the Service with axon.io/lb-algorithm: maglev)\n", name)
					continue
				}
				fmt.Fprintf(w, "%s: Maglev table of %d slots\n", name, t.Size)
				for _, b := range t.Backends {
					label := b.Backend
					if label == "invalid AddrPort" {
						label = "(empty)"
					}
					fmt.Fprintf(w, "  -> %-28s %6d slots  %5.1f %%\n", label, b.Slots, 100*float64(b.Slots)/float64(max(t.Size, 1)))
				}
				if slots {
					for i, s := range t.Slots {
						fmt.Fprintf(w, "  [%d] %s\n", i, s)
					}
				}
			}
			return nil
		},
	}
	f.register(get)
	get.Flags().BoolVar(&frontend, "frontend", false, "the argument is a frontend addr:port/proto, not a Service")
	get.Flags().BoolVar(&slots, "slots", false, "print every slot")
	mg.AddCommand(get)
	return mg
}
