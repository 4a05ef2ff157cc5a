package main

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/axonhq/axon/internal/bench/connrate"
	"github.com/axonhq/axon/internal/bench/services"
)

// newLabBenchServicesCmd is `axon lab bench services`: the Services benchmark's targets.
func newLabBenchServicesCmd(stateDir *string) *cobra.Command {
	var (
		cfg      services.Config
		levels   string
		out      string
		noFull   bool
		keepObjs bool
		render   string
		leave    bool
	)
	cmd := &cobra.Command{
		Use:   "services",
		Short: "Benchmark Services: axon socket LB vs kube-proxy nftables and iptables, at 10 to 10 000 Services",
		Long: `Benchmark Services on the running lab (4 nodes, axon datapath, no lab-wide kube-proxy:
axon lab up --nodes 4).

In ONE lab and one interleaved run it measures a TCP connect+request+close loop
(axon lab bench _connrate; client on CPU 0, server on CPU 1) from pods on different
nodes to one backend pod on node2:
  node1: axon pod → pod IP (reference), axon pod → ClusterIP (socket LB),
         ptp pod → pod IP with no netfilter rules on the node
  node3: kube-proxy nftables (started by the benchmark): ptp pod → ClusterIP, → pod IP
  node4: kube-proxy iptables: ptp pod → ClusterIP, → pod IP; axon pod → pod IP
at each Service count (generated Services × endpoints written straight to the
apiserver; endpoints are unrouted fake addresses, no pods needed). At the last
count it measures the control plane: one EndpointSlice change → applied (axon:
the pinned BPF map; kube-proxy: its own sync timestamp), full sync after a restart,
and memory (VmHWM). Writes results.csv, results.md, results.json and chart.svg.
A kube-proxy that does not apply a level within --sync-timeout is stopped and its
paths are reported as not synced.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if render != "" { // re-render a finished run's files from its results.json
				rep, err := services.ReadReport(filepath.Join(render, "results.json"))
				if err != nil {
					return err
				}
				if err := rep.WriteFiles(render); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s\nrewrote %s/results.{md,csv,json} and chart.svg\n", rep.TargetsTable(), render)
				return nil
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			l, err := loadLabFor(*stateDir, "axon lab up --nodes 4")
			if err != nil {
				return err
			}
			l.SetLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
			if cfg.Levels, err = services.ParseLevels(levels); err != nil {
				return err
			}
			if cfg.Axon, err = os.Executable(); err != nil {
				return fmt.Errorf("find the axon binary: %w", err)
			}
			if out == "" {
				out = filepath.Join("results", "bench-services-"+time.Now().UTC().Format("20060102T150405Z"))
			}
			cfg.OutDir, cfg.NoFullSync, cfg.Keep, cfg.LeaveObjects = out, noFull, keepObjs, leave
			cfg.Progress = cmd.ErrOrStderr()
			fmt.Fprintf(cmd.ErrOrStderr(), "service benchmark: levels %v × %d endpoints, %d reps × %s, results in %s\n",
				cfg.Levels, cfg.Endpoints, cfg.Reps, cfg.Duration, out)
			rep, err := services.Run(ctx, l, cfg)
			if rep != nil {
				rep.Command = "axon " + strings.Join(os.Args[1:], " ")
				_ = rep.WriteFiles(out)
				fmt.Fprintf(cmd.OutOrStdout(), "\n%s", rep.TargetsTable())
				for _, lv := range rep.Levels {
					fmt.Fprintf(cmd.OutOrStdout(), "\n%d Services × %d endpoints\n%s", lv.Services, lv.Endpoints, rep.Table(lv.Services))
				}
				if rep.ControlPlane != nil {
					fmt.Fprintf(cmd.OutOrStdout(), "\ncontrol plane\n%s", rep.ControlPlaneTable())
				}
				fmt.Fprintf(cmd.OutOrStdout(), "\nresults: %s (results.md, results.csv, results.json, chart.svg)\n", out)
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&levels, "services", "10,1000,10000", "Service counts to measure, ascending (cumulative levels), e.g. 10,1k,10k")
	f.IntVar(&cfg.Endpoints, "endpoints", 10, "endpoints per generated Service")
	f.IntVar(&cfg.Reps, "reps", 5, "connect-rate repetitions per path and level (interleaved across paths)")
	f.DurationVar(&cfg.Duration, "duration", 3*time.Second, "duration of each connect-rate sample")
	f.DurationVar(&cfg.PairedDuration, "paired-duration", 0, "length of each paired run at each level: ClusterIP vs pod IP, and the iptables node's axon pod vs a rules-free node's (default reps × duration)")
	f.StringSliceVar(&cfg.Pairings, "paired", nil, "paired runs to make: clusterip (ClusterIP vs pod IP), rules (the iptables node's axon pod vs a rules-free node's); default both")
	f.IntVar(&cfg.Changes, "changes", 20, "EndpointSlice changes to time at the last level (each adds then removes an endpoint: 2 samples)")
	f.DurationVar(&cfg.SyncTimeout, "sync-timeout", 5*time.Minute, "how long a kube-proxy may take to apply a level before it is stopped")
	f.BoolVar(&noFull, "no-full-sync", false, "skip the agent and kube-proxy restart (full sync) measurements")
	f.StringVar(&out, "out", "", "results folder (default results/bench-services-<UTC time>)")
	f.BoolVar(&leave, "leave-objects", false, "leave the generated Services in the apiserver and kube-proxy's rules in the node namespaces (when the lab goes down next; deleting 20 000 objects takes minutes)")
	f.StringVar(&render, "render", "", "only re-render results.md/csv/svg of a finished run from <dir>/results.json")
	f.BoolVar(&keepObjs, "keep", false, "leave the benchmark's pods, Services and kube-proxies' rules in place afterwards (debugging; the kube-proxy processes are stopped, and their rules, e.g. KUBE-FORWARD's drop of conntrack-INVALID packets, can fail some probes of axon lab check until axon lab down)")
	return cmd
}

// newConnRateCmd is the hidden connect-rate tool: `_connrate serve` in the
// backend pod, `_connrate client` in the client pod (one JSON line).
func newConnRateCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:    "_connrate",
		Short:  "connect+request+close loop (client) and its server, for axon lab bench services",
		Hidden: true,
	}
	var listen string
	serve := &cobra.Command{
		Use:  "serve",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ap, err := netip.ParseAddrPort(listen)
			if err != nil {
				return fmt.Errorf("--listen %q: want address:port: %w", listen, err)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return connrate.Serve(ctx, ap, nil)
		},
	}
	serve.Flags().StringVar(&listen, "listen", "", "address:port to serve on")
	var cc connrate.Config
	var target string
	client := &cobra.Command{
		Use:  "client",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ap, err := netip.ParseAddrPort(target)
			if err != nil {
				return fmt.Errorf("--target %q: want address:port: %w", target, err)
			}
			cc.Target = ap
			res, err := connrate.Run(cmd.Context(), cc)
			if err != nil {
				return err
			}
			return json.NewEncoder(cmd.OutOrStdout()).Encode(res)
		},
	}
	client.Flags().StringVar(&target, "target", "", "server address:port (pod IP or ClusterIP)")
	client.Flags().DurationVar(&cc.Duration, "duration", 3*time.Second, "how long to loop")
	client.Flags().IntVar(&cc.Request, "request", 32, "request (and response) size in bytes")
	var pc connrate.Config
	var ptarget, pversus string
	var slice time.Duration
	var from [2]connrate.Place
	paired := &cobra.Command{
		Use:   "paired",
		Short: "the same loop against --target and --versus in alternating slices: their rate ratio per pair",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			a, err := netip.ParseAddrPort(ptarget)
			if err != nil {
				return fmt.Errorf("--target %q: want address:port: %w", ptarget, err)
			}
			b, err := netip.ParseAddrPort(pversus)
			if err != nil {
				return fmt.Errorf("--versus %q: want address:port: %w", pversus, err)
			}
			pc.Target = a
			res, err := connrate.RunPaired(cmd.Context(), pc, b, slice, from)
			if err != nil {
				return err
			}
			if res.Pairs == 0 {
				return fmt.Errorf("no pair of slices with connections on both sides (%s: %s; %s: %s)", a, res.A.FirstError, b, res.B.FirstError)
			}
			return json.NewEncoder(cmd.OutOrStdout()).Encode(res)
		},
	}
	paired.Flags().StringVar(&ptarget, "target", "", "A: server address:port (e.g. a ClusterIP)")
	paired.Flags().StringVar(&pversus, "versus", "", "B: server address:port (e.g. the backend pod IP)")
	paired.Flags().DurationVar(&pc.Duration, "duration", 15*time.Second, "how long to loop in all")
	paired.Flags().DurationVar(&slice, "slice", 250*time.Millisecond, "nominal length of each slice (each pair draws 0.75–1.25 × it; the order within a pair is random)")
	paired.Flags().IntVar(&pc.Request, "request", 32, "request (and response) size in bytes")
	paired.Flags().StringVar(&from[0].Netns, "target-netns", "", "A connects from this network namespace (a file such as /run/netns/NAME; default: where the command runs)")
	paired.Flags().StringVar(&from[0].Cgroup, "target-cgroup", "", "A's sockets are made in this cgroup v2 directory (the process moves before each A slice; give --versus-cgroup too)")
	paired.Flags().StringVar(&from[1].Netns, "versus-netns", "", "B connects from this network namespace (default: where the command runs)")
	paired.Flags().StringVar(&from[1].Cgroup, "versus-cgroup", "", "B's sockets are made in this cgroup v2 directory (give --target-cgroup too)")
	cmd.AddCommand(serve, client, paired)
	return cmd
}
