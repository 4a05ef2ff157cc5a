package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/axonhq/axon/internal/bench"
	"github.com/axonhq/axon/internal/lab"
)

// benchPod is one pod the benchmark adds to a running lab and removes after.
type benchPod struct {
	name, datapath string
	nodeIdx        int // index into the lab's nodes: 0 = first node, 1 = second
}

// benchPods: a client and a same-node server on the first node, a
// cross-node server on the second, for each datapath.
var benchPods = []benchPod{
	{"bench-axon-c", lab.DatapathAxon, 0}, {"bench-axon-s1", lab.DatapathAxon, 0}, {"bench-axon-s2", lab.DatapathAxon, 1},
	{"bench-base-c", lab.DatapathBaseline, 0}, {"bench-base-s1", lab.DatapathBaseline, 0}, {"bench-base-s2", lab.DatapathBaseline, 1},
}

func newLabBenchCmd(stateDir *string) *cobra.Command {
	var (
		reps     int
		duration time.Duration
		out      string
		keep     bool
		cmpBig   bool // labbench_bigtcp.go
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Benchmark host-to-host vs axon vs baseline pod-to-pod, interleaved in one run",
		Long: `Benchmark the running lab (needs at least 2 nodes and the axon datapath).

Adds benchmark pods of both datapaths (axon and the reference ptp + host-local
plugins) to the lab, then measures, interleaved in each repetition:
  host-to-host                    node1 netns -> node2 netns over the wire (the reference)
  axon pod-to-pod cross-node      axon pod on node1 -> axon pod on node2
  axon pod-to-pod same-node       two axon pods on node1
  baseline pod-to-pod cross-node  ptp pods, kernel routing
  baseline pod-to-pod same-node
with iperf3 (single TCP flow throughput; retransmits, and how many of them the
receiver already had: DSACK, i.e. reordering; CPU seconds per GB, the busy time of
the client's and server's CPUs over the bytes received: the work per byte) and
sockperf ping-pong (TCP RTT p50/p99), client on CPU 0 and server on CPU 1,
recording /proc/pressure/cpu. Writes
results.csv, results.md, results.json and chart.svg to the output folder and prints
the table with medians and ratios to host-to-host, and the paired ratios: each
repetition's value over host-to-host's of the same repetition, median with its
95 % confidence interval (8 repetitions or more), beside host-to-host's throughput
in those repetitions (a ratio holds at a speed: a fixed cost per packet weighs
more on a faster wire).
The pods are removed afterwards.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			l, err := loadLabFor(*stateDir, "axon lab up")
			if err != nil {
				return err
			}
			l.SetLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
			nodes := l.Nodes()
			if len(nodes) < 2 {
				return fmt.Errorf("the benchmark needs at least 2 lab nodes, this lab has %d: axon lab up --nodes 2", len(nodes))
			}
			if out == "" {
				out = bench.DefaultOutDir("results", time.Now())
			}
			pods, cleanup, err := addBenchPods(ctx, l, nodes, keep)
			defer cleanup()
			if err != nil {
				return err
			}
			ep := func(p lab.Pod) bench.Endpoint {
				return bench.Endpoint{Name: p.Name, Netns: "/run/netns/" + p.Netns, Cgroup: p.Cgroup, IP: p.IP}
			}
			nodeEP := func(n lab.Node) bench.Endpoint {
				return bench.Endpoint{Name: n.Name, Netns: "/run/netns/" + n.Netns, IP: n.IP}
			}
			paths := []bench.Path{
				{Name: "host-to-host", Client: nodeEP(nodes[0]), Server: nodeEP(nodes[1])},
				{Name: "axon pod-to-pod cross-node", Client: ep(pods["bench-axon-c"]), Server: ep(pods["bench-axon-s2"])},
				{Name: "axon pod-to-pod same-node", Client: ep(pods["bench-axon-c"]), Server: ep(pods["bench-axon-s1"])},
				{Name: "baseline pod-to-pod cross-node", Client: ep(pods["bench-base-c"]), Server: ep(pods["bench-base-s2"])},
				{Name: "baseline pod-to-pod same-node", Client: ep(pods["bench-base-c"]), Server: ep(pods["bench-base-s1"])},
			}
			if cmpBig { // BIG TCP off next to the lab's pods
				p, cleanupSmall, err := addSmallGSOPath(ctx, l, nodes, keep)
				defer cleanupSmall()
				if err != nil {
					return err
				}
				paths = append(paths, p)
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "benchmark: %d paths × %d reps × %s (iperf3 + sockperf), results in %s\n", len(paths), reps, duration, out)
			rep, err := bench.Run(ctx, bench.Config{
				Paths: paths, Reps: reps, Duration: duration, OutDir: out, Progress: cmd.ErrOrStderr(),
			})
			if rep != nil {
				fmt.Fprintln(cmd.OutOrStdout(), rep.Table())
				fmt.Fprintln(cmd.OutOrStdout(), "Per-repetition ratios to the reference (median, 95 % CI):")
				fmt.Fprintln(cmd.OutOrStdout(), rep.PairedTable())
				if cmpBig { // the two BIG TCP ratios, also in results.md
					if werr := writeBigTCPSummary(cmd.OutOrStdout(), rep, out); werr != nil {
						fmt.Fprintln(cmd.ErrOrStderr(), "benchmark:", werr)
					}
				}
				fmt.Fprintf(cmd.OutOrStdout(), "results: %s (results.md, results.csv, chart.svg)\n", out)
			}
			return err
		},
	}
	cmd.Flags().IntVar(&reps, "reps", 10, "repetitions per path and metric (interleaved across paths; 8 or more give the paired ratios an interval)")
	cmd.Flags().DurationVar(&duration, "duration", 3*time.Second, "duration of each measurement")
	cmd.Flags().StringVar(&out, "out", "", "results folder (default results/bench-<UTC time>)")
	cmd.Flags().BoolVar(&keep, "keep-pods", false, "leave the benchmark pods in the lab afterwards")
	cmd.Flags().BoolVar(&cmpBig, "compare-big-tcp", false, "also measure a cross-node axon pod pair whose devices keep GSO/GRO at 64 KiB (BIG TCP off), next to the lab's pods (use with axon lab up --big-tcp on)")
	cmd.AddCommand(newLabBenchServicesCmd(stateDir), newConnRateCmd()) // labbench_svc.go
	cmd.AddCommand(newLabBenchNorthSouthCmd(stateDir))                 // labbench_ns.go
	cmd.AddCommand(newLabBenchSockmapCmd(stateDir))                    // labbench_sockmap.go
	return cmd
}

// addBenchPods (re)creates the benchmark pods; cleanup removes them unless keep.
func addBenchPods(ctx context.Context, l *lab.Lab, nodes []lab.Node, keep bool) (map[string]lab.Pod, func(), error) {
	pods := map[string]lab.Pod{}
	cleanup := func() {
		if keep {
			return
		}
		// The command's context may be cancelled (Ctrl-C): clean up regardless.
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for name := range pods {
			if err := l.DeletePod(cctx, name); err != nil {
				fmt.Fprintf(os.Stderr, "benchmark: remove pod %s: %v\n", name, err)
			}
		}
	}
	existing := map[string]bool{}
	for _, p := range l.Pods() {
		existing[p.Name] = true
	}
	var errs []error
	for _, bp := range benchPods {
		if existing[bp.name] { // left by an interrupted run or --keep-pods
			if err := l.DeletePod(ctx, bp.name); err != nil {
				return pods, cleanup, fmt.Errorf("remove stale benchmark pod %s: %w", bp.name, err)
			}
		}
		p, err := l.AddPod(ctx, nodes[bp.nodeIdx].Name, bp.name, bp.datapath)
		if err != nil {
			errs = append(errs, fmt.Errorf("add benchmark pod %s (%s) on %s: %w", bp.name, bp.datapath, nodes[bp.nodeIdx].Name, err))
			break
		}
		pods[bp.name] = p
	}
	return pods, cleanup, errors.Join(errs...)
}

// loadLabFor opens the lab a benchmark runs in; with none, the error names
// the command that brings up the lab it wants (up).
func loadLabFor(stateDir, up string) (*lab.Lab, error) {
	l, err := lab.Load(stateDir)
	if errors.Is(err, lab.ErrNoLab) {
		return nil, fmt.Errorf("no lab in %s: bring one up first: %s", stateDir, up)
	}
	return l, err
}
