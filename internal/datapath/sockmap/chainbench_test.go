package sockmap

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/axonhq/axon/internal/bench"
	"github.com/axonhq/axon/internal/stats"
	"github.com/axonhq/axon/internal/testutil"
)

// TestChainBench measures the sidecar chain of TestSidecarHAProxyChain (qperf
// client in pod A -> OUTPUT REDIRECT -> HAProxy on 127.0.0.1:15001 -> pod B
// -> PREROUTING REDIRECT -> HAProxy on :15006 -> qperf server on 127.0.0.1,
// qperf's control and data connections alike) with the bypass against the
// same chain without it (both pods and their netns withdrawn), qperf client
// on CPU 0 and server on CPU 1 (the proxies wherever the scheduler puts
// them). Both arms run back to back for every test in each round, the first
// alternating; the report is each arm's median, the median of the per-round
// ratios with their 95 % interval (stats.MedianCI, 9 rounds or more;
// min–max below) and the counters the bypass arm moved (left: sockets of
// the chain that went to the stack and left the map). A benchmark: runs
// with AXON_SOCKMAP_CHAIN_BENCH=1 (root, HAProxy, qperf, iptables-nft);
// AXON_SOCKMAP_FLOW_BENCH_ROUNDS (default 5), _SECONDS (default 2) and
// AXON_SOCKMAP_CHAIN_BENCH_TESTS (default tcp_bw:16384,tcp_lat:64) change it.
func TestChainBench(t *testing.T) {
	if os.Getenv("AXON_SOCKMAP_CHAIN_BENCH") != "1" {
		t.Skip("qperf benchmark of the sidecar chain with and without the bypass: runs with AXON_SOCKMAP_CHAIN_BENCH=1")
	}
	requireIptables(t)
	if _, err := os.Stat(haproxyPath); err != nil {
		t.Skipf("HAProxy is not installed (%v): apt-get install haproxy", err)
	}
	qperf, err := lookTool("qperf", "nsenter", "taskset")
	if err != nil {
		t.Skip(err)
	}
	rounds := testutil.EnvInt(t, "AXON_SOCKMAP_FLOW_BENCH_ROUNDS", 5)
	secs := testutil.EnvInt(t, "AXON_SOCKMAP_FLOW_BENCH_SECONDS", 2)
	type run struct {
		test string
		size int
	}
	runs := []run{{"tcp_bw", 16384}, {"tcp_lat", 64}}
	if v := os.Getenv("AXON_SOCKMAP_CHAIN_BENCH_TESTS"); v != "" {
		runs = nil
		for _, f := range strings.Split(v, ",") {
			test, size, ok := strings.Cut(strings.TrimSpace(f), ":")
			n, err := strconv.Atoi(size)
			if !ok || err != nil || n < 1 {
				t.Fatalf("AXON_SOCKMAP_CHAIN_BENCH_TESTS: %q is not test:bytes (e.g. tcp_bw:16384)", f)
			}
			runs = append(runs, run{test, n})
		}
	}

	b, _, cg, cgFD := loadTest(t, Config{StreamVerdict: true})
	n := newSidecarNet(t, b)
	nsRun(t, n.a, "iptables", "-w", "-t", "nat", "-A", "OUTPUT", "-p", "tcp", "-d", "10.78.0.0/24",
		"-m", "owner", "!", "--uid-owner", fmt.Sprint(proxyUID), "-j", "REDIRECT", "--to-ports", "15001")
	nsRun(t, n.b, "iptables", "-w", "-t", "nat", "-A", "PREROUTING", "-p", "tcp", "-i", "b0", "-j", "REDIRECT", "--to-ports", "15006")
	startHAProxy(t, n.a, cgFD, "outbound", haproxyConfig("127.0.0.1:15001", "0.0.0.0:0"), 15001)
	startHAProxy(t, n.b, cgFD, "inbound", haproxyConfig("10.78.0.2:15006", "127.0.0.1:0"), 15006)
	setArm := func(bypass bool) {
		for ip, ns := range map[netip.Addr]uint64{n.podA: n.ca, n.podB: n.cb} {
			var err error
			if bypass {
				err = errors.Join(b.SetPod(ip, ns), b.SetNetns(ns))
			} else {
				err = errors.Join(b.DeletePod(ip), b.DeleteNetns(ns))
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	}

	ctx := context.Background()
	startQperfServer(t, ctx, cg, qperf, n.b, "1", "19766")
	measure := func(r run) (float64, error) {
		out, errOut, err := runQperf(ctx, cg, qperf, n.a, "0", n.podB, "19766", secs, r.size, r.test)
		res, perr := bench.ParseQperf(append(out, errOut...))
		if perr != nil || len(res) != 1 {
			return math.NaN(), fmt.Errorf("qperf %s %d through the chain: %v %v: %s", r.test, r.size, err, perr, out)
		}
		if strings.HasSuffix(r.test, "_lat") {
			return res[0].LatencyNs / 1e3, nil
		}
		return res[0].BytesPerSec * 8 / 1e9, nil
	}

	vals := map[run][2][]float64{} // [without, with the bypass]
	ratios := map[run][]float64{}
	moved := map[run]map[string]uint64{}
	var loads []string
	for rd := range rounds {
		loads = append(loads, loadavg())
		for _, r := range runs {
			var got [2]float64
			order := []int{0, 1}
			if rd%2 == 1 {
				order = []int{1, 0}
			}
			for _, a := range order {
				setArm(a == 1)
				before := metrics(t, b)
				v, err := measure(r)
				if err != nil {
					t.Fatal(err)
				}
				if a == 1 {
					if moved[r] == nil {
						moved[r] = map[string]uint64{}
					}
					for c, x := range metricsDelta(t, b, before) {
						moved[r][c] += x
					}
				}
				got[a] = v
			}
			vs := vals[r]
			vs[0], vs[1] = append(vs[0], got[0]), append(vs[1], got[1])
			vals[r] = vs
			ratios[r] = append(ratios[r], got[1]/got[0])
		}
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "\n%d rounds, qperf -t %d, load average at each round's start: %s\n"+
		"| test | size | chain without | chain with the bypass | with/without (median of rounds) | 95 %% CI (min–max below 9 rounds) | counters |\n|---|---:|---:|---:|---:|---|---|\n",
		rounds, secs, strings.Join(loads, "; "))
	for _, r := range runs {
		unit := "Gb/s"
		if strings.HasSuffix(r.test, "_lat") {
			unit = "µs"
		}
		lo, hi := stats.MedianCI(ratios[r])
		if math.IsNaN(lo) {
			lo, hi = slices.Min(ratios[r]), slices.Max(ratios[r])
		}
		fmt.Fprintf(&sb, "| %s | %d | %.3f %s | %.3f %s | %.2fx | %.2f–%.2f | %s |\n", r.test, r.size,
			stats.Median(vals[r][0]), unit, stats.Median(vals[r][1]), unit, stats.Median(ratios[r]), lo, hi,
			counterText(moved[r]))
	}
	t.Log(sb.String())
}
