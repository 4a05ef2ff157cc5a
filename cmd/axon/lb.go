package main

// `axon lb --config lb.yaml` (the standalone L4 load balancer),
// `axon lb status`, `axon lb reload`, `axon lb uninstall` and
// `axon lb explain <proto> <src> <dst>` (agent or standalone).

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/l4lb"
)

func newLBCmd() *cobra.Command {
	var config, logLevel string
	cmd := &cobra.Command{
		Use:   "lb --config lb.yaml",
		Short: "Run the standalone XDP/tc layer-4 load balancer (no Kubernetes), or inspect one",
		Long: "With --config, run the north-south load balancer alone, like Katran or Cilium's\n" +
			"standalone L4LB: virtual IPs (VIPs) with backends, Maglev or random selection, DSR by\n" +
			"IPIP encapsulation or SNAT, on one interface at XDP (native) or tc. The config is\n" +
			"validated strictly; SIGHUP, `axon lb reload` or a change of the file reloads it,\n" +
			"applying only the difference: established flows keep their backend (removed backends\n" +
			"drain), an invalid file is rejected and the old config keeps running.\n" +
			"On exit the programs stay attached with the last config; `axon lb uninstall` removes them.\n" +
			"Config reference: docs/nslb-control.md.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if config == "" {
				return fmt.Errorf("--config is required to run the load balancer (or use a subcommand: %s)", subNames(cmd))
			}
			var lvl slog.Level
			if err := lvl.UnmarshalText([]byte(logLevel)); err != nil {
				return fmt.Errorf("--log-level %q: use debug, info, warn or error", logLevel)
			}
			log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
			hup := make(chan os.Signal, 1)
			signal.Notify(hup, syscall.SIGHUP)
			defer signal.Stop(hup)
			return l4lb.Run(cmd.Context(), config, l4lb.RunOptions{Log: log, Reload: hup})
		},
	}
	cmd.Flags().StringVarP(&config, "config", "c", "", "load balancer config (YAML)")
	cmd.Flags().StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn or error")
	cmd.AddCommand(newLBStatusCmd(), newLBReloadCmd(), newLBUninstallCmd(), newLBCheckCmd(), newLBExplainCmd())
	return cmd
}

func subNames(cmd *cobra.Command) string {
	var n []string
	for _, c := range cmd.Commands() {
		n = append(n, c.Name())
	}
	return strings.Join(n, ", ")
}

// l4lbSocket is the status socket: --socket, else the config's, else the default.
type l4lbSocket struct{ socket, config string }

func (s *l4lbSocket) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&s.socket, "socket", "", "status socket of the running axon lb (default: the config's socket:, else "+l4lb.DefaultSocket+")")
	cmd.Flags().StringVarP(&s.config, "config", "c", "", "take the socket from this config file")
}

func (s *l4lbSocket) path() (string, error) {
	if s.socket != "" {
		return s.socket, nil
	}
	if s.config != "" {
		c, _, err := l4lb.ReadFile(s.config)
		if err != nil {
			return "", err
		}
		return c.Socket, nil
	}
	return l4lb.DefaultSocket, nil
}

func newLBStatusCmd() *cobra.Command {
	var s l4lbSocket
	var out outputFlag
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the running standalone load balancer: config generation, VIPs, backends, flows, packets",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.parse(); err != nil {
				return err
			}
			p, err := s.path()
			if err != nil {
				return err
			}
			st, err := l4lb.NewClient(p).Status(cmd.Context())
			if err != nil {
				return err
			}
			if out.structured() {
				return out.write(cmd, st)
			}
			printLBStatus(cmd.OutOrStdout(), st)
			return nil
		},
	}
	s.register(cmd)
	out.register(cmd)
	return cmd
}

func printLBStatus(w io.Writer, st l4lb.Status) {
	fmt.Fprintf(w, "config:     %s (generation %d, loaded %s, %d reloads, %d rejected)\n", st.ConfigFile, st.Generation,
		st.LoadedAt.Format(time.RFC3339), st.Reloads, st.Rejected)
	if st.LastError != "" {
		fmt.Fprintf(w, "REJECTED:   %s: %s\n            (the previous config keeps running)\n", st.LastErrorAt.Format(time.RFC3339), st.LastError)
	}
	fmt.Fprintf(w, "attached:   %s\n", st.Attach)
	fmt.Fprintf(w, "conntrack:  %d / %d entries; Maglev table size %d\n", st.CTEntries, st.CTMax, st.MaglevTableSize)
	if len(st.Packets) > 0 {
		fmt.Fprintf(w, "packets:    %s\n", formatCounters(st.Packets))
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\nVIP\tNAME\tALGORITHM\tFORWARDING\tFLOWS")
	for _, v := range st.VIPs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\n", v.VIP, dash(v.Name), v.Algorithm, v.Forwarding, v.Flows)
		for _, b := range v.Backends {
			if b.Draining {
				fmt.Fprintf(tw, "  -> %s\tdraining\t\t\t%d\n", b.Address, b.Flows)
				continue
			}
			fmt.Fprintf(tw, "  -> %s\tweight %d\t%.1f %%\t\t%d\n", b.Address, b.Weight, 100*b.Share, b.Flows)
		}
	}
	tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func newLBReloadCmd() *cobra.Command {
	var s l4lbSocket
	cmd := &cobra.Command{
		Use:   "reload",
		Short: "Reload the running standalone load balancer's config file now (same as SIGHUP)",
		Long:  "Reload the config file now and print what changed; an invalid file is rejected with the\nreason (exit status 1) and the running config stays.",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := s.path()
			if err != nil {
				return err
			}
			res, err := l4lb.NewClient(p).Reload(cmd.Context())
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), res)
			return nil
		},
	}
	s.register(cmd)
	return cmd
}

func newLBCheckCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "check lb.yaml",
		Short: "Validate a standalone load balancer config without running it",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := l4lb.ReadFile(args[0])
			if err != nil {
				return err
			}
			n := 0
			for _, v := range c.VIPs {
				n += len(v.Backends)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: valid: %d VIPs, %d backends, interface %s, xdpMode %s\n", args[0], len(c.VIPs), n, c.Interface, c.XDPMode)
			return nil
		},
	}
}

func newLBUninstallCmd() *cobra.Command {
	var config string
	cmd := &cobra.Command{
		Use:   "uninstall --config lb.yaml",
		Short: "Detach the standalone load balancer and remove its pinned maps (established flows are lost)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if config == "" {
				return fmt.Errorf("--config is required: it names the interface and pin directory to clean up")
			}
			return l4lb.Uninstall(config)
		},
	}
	cmd.Flags().StringVarP(&config, "config", "c", "", "the config the load balancer ran with")
	return cmd
}

func newLBExplainCmd() *cobra.Command {
	var f agentFlags
	cmd := &cobra.Command{
		Use:   "explain <tcp|udp> <src-addr:port> <dst-addr:port>",
		Short: "Which backend would this flow hit? Answered from the live maps, changing nothing",
		Long: "Run a synthetic first packet of the flow (TCP SYN or UDP datagram) through a dry-run\n" +
			"copy of the north-south load balancer program that shares the live maps: an existing\n" +
			"flow answers from conntrack, Maglev and session affinity answer exactly, a random pick\n" +
			"is one possible answer. Nothing is written and nothing is sent.\n" +
			"Talks to the node agent (--node / --socket); for the standalone load balancer pass\n" +
			"--socket " + l4lb.DefaultSocket + " (or its socket: setting).\n\n" +
			"Example: axon lb explain --node node1 tcp 198.18.0.250:40000 198.18.0.11:30080",
		Args: cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			rep, err := c.Explain(cmd.Context(), args[0], args[1], args[2])
			if err != nil {
				return err
			}
			if f.out.structured() {
				return f.out.write(cmd, rep)
			}
			printExplain(cmd.OutOrStdout(), rep)
			return nil
		},
	}
	f.register(cmd)
	return cmd
}

func printExplain(w io.Writer, rep api.ExplainReply) {
	fmt.Fprintf(w, "flow:      %s\n", rep.Flow)
	if rep.Frontend != "" {
		svc := ""
		if rep.Service != "" {
			svc = " (" + rep.Service + ")"
		}
		fmt.Fprintf(w, "frontend:  %s%s\n", rep.Frontend, svc)
	}
	if rep.Backend != "" {
		fmt.Fprintf(w, "backend:   %s via %s\n", rep.Backend, rep.Mode)
	}
	fmt.Fprintf(w, "verdict:   %s\n", rep.Verdict)
	for _, s := range rep.Steps {
		fmt.Fprintf(w, "  - %s\n", s)
	}
}
