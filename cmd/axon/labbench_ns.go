package main

// `axon lab bench northsouth` and the hidden helpers of
// `axon lab check --external` (`_xprobe`, `_peerecho`).

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/axonhq/axon/internal/bench/northsouth"
	"github.com/axonhq/axon/internal/lab/probe"
)

func newLabBenchNorthSouthCmd(stateDir *string) *cobra.Command {
	var (
		cfg     northsouth.Config
		configs string
		out     string
	)
	var names []string
	for _, c := range northsouth.Configs() {
		names = append(names, c.Name)
	}
	cmd := &cobra.Command{
		Use:   "northsouth",
		Short: "Benchmark north-south forwarding: external client → NodePort, axon tc / XDP vs kube-proxy iptables / nftables",
		Long: `Benchmark north-south forwarding. Needs the machine's lab slot (no lab up): for every
configuration it brings up its own 2-node lab (1 pod per node), measures, and takes it down;
configurations alternate inside every repetition (A B C D, A B C D, ...).

The external namespace (198.18.0.250) connects to a NodePort on node2 whose only backend
is a pod on node1 (every packet is forwarded by node2):
  new connections/s   connect+request+response+close loop (axon lab bench _connrate),
                      client on CPU 0, server on CPU 1
  throughput          iperf3, one TCP flow
  softirq CPU/conn    /proc/stat softirq time and /proc/softirqs NET_RX during the loop
  forwarding rate     64-byte UDP frames to the NodePort from an XDP generator (BPF_PROG_RUN
                      live frames) straight into node2's receive ring; node2's receive runs in
                      threaded NAPI alone on CPU 1; a sink at node2's wire port counts what it
                      forwarded: packets/s, and node2's CPU ns per forwarded packet (the measure
                      behind Cilium's "XDP ≈ 5× kube-proxy iptables"). node2's eth0 gets GRO on
                      and TSO off for it, after the other samples.
  xdp-forwarder       the forwarding rate alone, of a trivial XDP forwarder (check the Ethernet
                      and IPv4 headers, write both MACs, XDP_TX; no lookup) in place of any LB
                      on node2's eth0, sent what the LB sends on: the floor of an XDP forward on
                      this wire, compared to axon-xdp repetition by repetition.
Configurations: ` + strings.Join(names, ", ") + `.
Ratios are to kube-proxy iptables in the same run. Writes results.{md,csv,json}.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			exe, err := os.Executable()
			if err != nil {
				return fmt.Errorf("find the axon binary: %w", err)
			}
			if p, err := filepath.EvalSymlinks(exe); err == nil {
				exe = p
			}
			if cfg.BinDir == "" {
				cfg.BinDir = filepath.Dir(exe)
			}
			if configs != "" {
				cfg.Configs = strings.Split(configs, ",")
			}
			if out == "" {
				out = filepath.Join("results", "bench-northsouth-"+time.Now().UTC().Format("20060102T150405Z"))
			}
			cfg.StateDir, cfg.OutDir, cfg.Progress = *stateDir, out, cmd.ErrOrStderr()
			rep, err := northsouth.Run(ctx, cfg)
			if rep != nil {
				rep.Command = "axon " + strings.Join(os.Args[1:], " ")
				if werr := rep.WriteFiles(out); werr != nil && err == nil {
					err = werr
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s\nForwarding rate:\n%s\nresults: %s (results.md, results.csv, results.json)\n", rep.Table(), rep.FwdTable(), out)
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&configs, "configs", "", "comma-separated configurations in interleaving order (default all: "+strings.Join(names, ",")+")")
	f.IntVar(&cfg.Reps, "reps", 3, "repetitions (each brings up one lab per configuration)")
	f.DurationVar(&cfg.Duration, "duration", 3*time.Second, "duration of each connect-rate, iperf3 and forwarding-rate sample")
	f.StringVar(&cfg.BinDir, "lab-bin-dir", "", "axon, axon-agent and axon-cni for the labs (default: next to this axon)")
	f.StringVar(&out, "out", "", "results folder (default results/bench-northsouth-<UTC time>)")
	f.BoolVar(&cfg.Keep, "keep", false, "leave the last configuration's lab up (node2's eth0 keeps the forwarding measurement's GRO on, TSO off and threaded NAPI)")
	f.DurationVar(&cfg.WaitFree, "wait", 0, "wait this long for the lab slot when a lab is up (shared machines), instead of failing at once")
	return cmd
}

// newLabXProbeCmd is the external client of `axon lab check --external`.
func newLabXProbeCmd() *cobra.Command {
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:    "_xprobe tcp|udp|http/ADDR:PORT...",
		Short:  "internal: external-client prober of `axon lab check --external` (one JSON line per probe)",
		Hidden: true,
		Args:   cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var ps []probe.External
			for _, a := range args {
				p, err := probe.ParseExternal(a)
				if err != nil {
					return err
				}
				ps = append(ps, p)
			}
			return probe.RunExternals(cmd.Context(), ps, timeout, os.Stdout)
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 3*time.Second, "per-probe timeout")
	return cmd
}

// newLabPeerEchoCmd is the peer-echo server (answers with the client
// address it saw); it exits when stdin closes.
func newLabPeerEchoCmd() *cobra.Command {
	var port int
	cmd := &cobra.Command{
		Use:    "_peerecho",
		Short:  "internal: peer-echo server of `axon lab check --external`",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return probe.ServePeerEcho(cmd.Context(), port, os.Stdout, os.Stdin)
		},
	}
	cmd.Flags().IntVar(&port, "port", probe.PeerEchoPort, "TCP and UDP port")
	return cmd
}
