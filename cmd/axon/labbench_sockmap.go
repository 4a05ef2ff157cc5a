package main

// `axon lab bench sockmap`: the same-node TCP bypass, bypass vs the stack.

import (
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/axonhq/axon/internal/bench/bypass"
)

func newLabBenchSockmapCmd(stateDir *string) *cobra.Command {
	var (
		cfg   bypass.Config
		sizes string
		bwSz  string
		tests string
		out   string
		from  string
	)
	cmd := &cobra.Command{
		Use:   "sockmap",
		Short: "Benchmark the same-node TCP bypass: qperf latency and throughput at 1 B..16 KiB, bypass vs the stack",
		Long: `Benchmark the same-node TCP bypass (sockmap) in the running lab.

Adds two pods to a node (bench-sockmap-c, bench-sockmap-s) and measures between them
with qperf, client pinned to CPU 0 and server to CPU 1:
  tcp_lat   one-way latency (half the round trip), µs
  tcp_bw    throughput, and CPU seconds per GB (busy time of the two CPUs over the
            bytes received)
at every message size, with the bypass and without it (the TCP stack), the two arms
back to back in every repetition, the order alternating. Reports medians and the
paired ratios bypass/stack (median with its 95 % interval, 8 repetitions or more)
against the targets: latency ≤ 0.5× the stack at every size, throughput ≥ 1.0× at
every size and ≥ 2.5× at 16 KiB. Records the machine's load and CPU pressure.

--attach agent (default): the agent's bypass, switched per arm by the pods'
axon.io/sockmap annotation (enabled|disabled). The agent must have the bypass on.
--attach direct: where the agent keeps the bypass off (its kernel self-test failed;
axon status says why), the benchmark loads the same programs
(internal/datapath/sockmap) on the node's cgroup root with a private pin dir,
admits exactly the two pods for the bypass arm and withdraws them for the stack arm,
and unloads everything at the end. Refused while the agent has the bypass on.

--chain: the sidecar chain app → proxy → proxy → app. Each pod gets an HAProxy
sidecar (/usr/sbin/haproxy, TCP mode, uid 1337) wired as a service mesh wires its proxy:
the client pod's outgoing TCP is redirected (nat OUTPUT REDIRECT, the proxy's uid
exempt by -m owner) to its proxy on 127.0.0.1:15001, which connects to the original
destination (SO_ORIGINAL_DST); TCP arriving at the server pod is redirected (nat
PREROUTING REDIRECT) to its proxy on :15006, which connects to the same port on
127.0.0.1. qperf's control and data connections both take the chain. Before measuring,
a connection to each of two server ports must reach that port's listener through both
proxies. The arms are the chain with the bypass and without; target: latency ≤ 0.6×.
Defaults with --chain: --sizes 1,64,1K,16K (tcp_lat) and --bw-sizes 64,16K (tcp_bw,
with CPU seconds per GB). Halfway through each measurement the pods' sockets are listed
(sock_diag) and looked up in the SOCKHASH: the report says which hops were bypassed.
iptables rules live in the pods' network namespaces only and go with the pods; the
proxies are stopped by PID.

Writes results.md, results.csv and results.json to the output folder, progress on
stderr. The pods are removed afterwards. --from DIR renders DIR/results.json's report
again (results.md and results.csv) without measuring.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if from != "" {
				rep, err := bypass.ReadReport(filepath.Join(from, "results.json"))
				if err != nil {
					return err
				}
				if out == "" {
					out = from
				}
				if err := rep.WriteFiles(out); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%sresults: %s (results.md, results.csv, results.json)\n", rep.Table(), out)
				return nil
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			l, err := loadLabFor(*stateDir, "axon lab up --nodes 1 --no-demo")
			if err != nil {
				return err
			}
			l.SetLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
			if !cfg.Chain || cmd.Flags().Changed("sizes") {
				if cfg.Sizes, err = parseSizes(sizes); err != nil {
					return err
				}
			}
			if bwSz != "" {
				if cfg.BWSizes, err = parseSizes(bwSz); err != nil {
					return fmt.Errorf("--bw-sizes: %w", err)
				}
			}
			if tests != "" {
				cfg.Tests = strings.Split(tests, ",")
			}
			if out == "" {
				kind := "bench-sockmap-"
				if cfg.Chain {
					kind = "bench-sockmap-chain-"
				}
				out = filepath.Join("results", kind+time.Now().UTC().Format("20060102T150405Z"))
			}
			cfg.Lab, cfg.OutDir, cfg.Progress = l, out, cmd.ErrOrStderr()
			cfg.Command = "axon " + strings.Join(os.Args[1:], " ")
			cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
			rep, err := bypass.Run(ctx, cfg)
			if rep != nil {
				fmt.Fprint(cmd.OutOrStdout(), rep.Table())
				if missed := rep.Missed(); len(missed) > 0 {
					fmt.Fprintf(cmd.OutOrStdout(), "targets missed: %s\n", strings.Join(missed, "; "))
				}
				fmt.Fprintf(cmd.OutOrStdout(), "bypass attached by %s; results: %s (results.md, results.csv, results.json)\n", rep.Attach, out)
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Attach, "attach", bypass.AttachAgent, "who attaches the bypass: agent (switched by the pods' annotation) or direct (the benchmark loads it; where the agent keeps it off)")
	f.IntVar(&cfg.Reps, "reps", 8, "repetitions (each measures both arms of every test and size; 8 or more give the paired ratios an interval)")
	f.DurationVar(&cfg.Duration, "duration", 3*time.Second, "qperf -t of each measurement (whole seconds)")
	f.StringVar(&sizes, "sizes", "1,4,16,64,256,1K,4K,16K", "message sizes, comma-separated (bytes; K = 1024)")
	f.BoolVar(&cfg.Chain, "chain", false, "the sidecar chain: an HAProxy sidecar in each pod, traffic redirected through both (see above)")
	f.StringVar(&bwSz, "bw-sizes", "", "message sizes of tcp_bw, a subset of --sizes (default: all of --sizes; with --chain 64,16K)")
	f.StringVar(&tests, "tests", "tcp_lat,tcp_bw", "qperf tests, comma-separated, in order")
	f.StringVar(&cfg.Node, "node", "", "lab node of the two pods (default: the first)")
	f.StringVar(&out, "out", "", "results folder (default results/bench-sockmap-<UTC time>)")
	f.StringVar(&from, "from", "", "render the report of an earlier run from its folder's results.json (into --out, default that folder) without measuring")
	f.BoolVar(&cfg.KeepPods, "keep-pods", false, "leave the two benchmark pods in the lab afterwards")
	return cmd
}

// parseSizes parses "1,4,16K" into bytes.
func parseSizes(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		mult := 1
		if strings.HasSuffix(f, "K") {
			f, mult = strings.TrimSuffix(f, "K"), 1024
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("--sizes: %q is not a message size (bytes, or with K for KiB: 1,64,16K)", f)
		}
		out = append(out, n*mult)
	}
	return out, nil
}
