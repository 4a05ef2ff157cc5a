package sockmap

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/axonhq/axon/internal/bench"
	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/stats"
)

// TestFlowBench measures the bypass against the stack with qperf (tcp_bw
// and tcp_lat, 1 B..16 KiB by default) between two pod namespaces joined by
// a veth pair, client and server in the test cgroup on CPUs 0 and 1, the
// stream verdict attached as the agent attaches it here. The arms switch by
// admitting or withdrawing the two pods (qperf connects anew for every
// run); both arms run back to back for every size in each round, the first
// arm alternating; the report is each arm's median and the median of the
// per-round ratios, with the counters the bypass arm moved. A benchmark for
// a quiet machine: runs with AXON_SOCKMAP_FLOW_BENCH=1;
// AXON_SOCKMAP_FLOW_BENCH_ROUNDS (default 5), _SECONDS (qperf -t, default
// 1), _SIZES (comma-separated bytes), _TESTS (tcp_bw,tcp_lat) and _VERDICT
// (0: without the stream verdict) change it.
func TestFlowBench(t *testing.T) {
	if os.Getenv("AXON_SOCKMAP_FLOW_BENCH") != "1" {
		t.Skip("qperf benchmark of the bypass against the stack: runs with AXON_SOCKMAP_FLOW_BENCH=1")
	}
	rounds := envInt(t, "AXON_SOCKMAP_FLOW_BENCH_ROUNDS", 5)
	secs := envInt(t, "AXON_SOCKMAP_FLOW_BENCH_SECONDS", 1)
	sizes := []int{1, 4, 16, 64, 256, 1024, 4096, 16384}
	if v := os.Getenv("AXON_SOCKMAP_FLOW_BENCH_SIZES"); v != "" {
		sizes = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 {
				t.Fatalf("AXON_SOCKMAP_FLOW_BENCH_SIZES: %q is not a size in bytes", f)
			}
			sizes = append(sizes, n)
		}
	}
	tests := []string{"tcp_bw", "tcp_lat"}
	if v := os.Getenv("AXON_SOCKMAP_FLOW_BENCH_TESTS"); v != "" {
		tests = strings.Split(v, ",")
	}
	qperf, err := lookTool("qperf", "nsenter", "taskset")
	if err != nil {
		t.Skip(err)
	}

	verdict := os.Getenv("AXON_SOCKMAP_FLOW_BENCH_VERDICT") != "0"
	b, _, cg, _ := loadTest(t, Config{StreamVerdict: verdict})
	n := newPodNet(t)
	arm := func(bypass bool) {
		for ip, ns := range map[netip.Addr]uint64{n.podA: n.ca, n.podB: n.cb} {
			var err error
			if bypass {
				err = b.SetPod(ip, ns)
			} else {
				err = b.DeletePod(ip)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	ctx := context.Background()
	srv, cleanup, err := bench.Command(ctx, cg, []string{qperf["nsenter"], "--net=" + netnsutil.Path(n.b),
		qperf["taskset"], "-c", "1", qperf["qperf"], "--listen_port", "19765"})
	if err != nil {
		t.Fatal(err)
	}
	srv.Stdout, srv.Stderr = io.Discard, io.Discard
	if err := srv.Start(); err != nil {
		cleanup()
		t.Fatal(err)
	}
	cleanup()
	t.Cleanup(func() { _ = srv.Process.Signal(syscall.SIGTERM); _ = srv.Wait() })

	run := func(test string, size int) (float64, error) {
		argv := []string{qperf["nsenter"], "--net=" + netnsutil.Path(n.a), qperf["taskset"], "-c", "0",
			qperf["qperf"], n.podB.String(), "--listen_port", "19765", "-t", strconv.Itoa(secs), "-m", strconv.Itoa(size),
			"-uu", "-v", test}
		var out, errOut []byte
		var err error
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			out, errOut, err = bench.RunClient(ctx, cg, argv, time.Duration(secs)*time.Second+30*time.Second)
			if err == nil || !strings.Contains(string(out)+string(errOut), "failed to connect") || time.Now().After(deadline) {
				break
			}
		}
		res, perr := bench.ParseQperf(append(out, errOut...))
		if perr != nil || len(res) != 1 {
			return math.NaN(), fmt.Errorf("qperf %s %d: %v %v: %s", test, size, err, perr, out)
		}
		if strings.HasSuffix(test, "_lat") {
			return res[0].LatencyNs / 1e3, nil
		}
		return res[0].BytesPerSec * 8 / 1e9, nil
	}

	type key struct {
		test string
		size int
	}
	vals := map[key][2][]float64{} // [stack, bypass]
	ratios := map[key][]float64{}
	moved := map[key]map[string]uint64{}
	for r := range rounds {
		for _, test := range tests {
			for _, size := range sizes {
				k := key{test, size}
				var got [2]float64
				order := []int{0, 1}
				if r%2 == 1 {
					order = []int{1, 0}
				}
				for _, a := range order {
					arm(a == 1)
					before := metrics(t, b)
					v, err := run(test, size)
					if err != nil {
						t.Fatal(err)
					}
					if a == 1 {
						d := metricsDelta(t, b, before)
						if moved[k] == nil {
							moved[k] = map[string]uint64{}
						}
						for c, x := range d {
							moved[k][c] += x
						}
					}
					got[a] = v
				}
				vs := vals[k]
				vs[0], vs[1] = append(vs[0], got[0]), append(vs[1], got[1])
				vals[k] = vs
				ratios[k] = append(ratios[k], got[1]/got[0])
			}
		}
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "\n%d rounds, qperf -t %d, stream verdict %v, load %s\n| test | size | stack | bypass | bypass/stack (median of rounds) | min–max | bypass arm's counters |\n|---|---:|---:|---:|---:|---|---|\n",
		rounds, secs, verdict, loadavg())
	for _, test := range tests {
		unit := "Gb/s"
		if strings.HasSuffix(test, "_lat") {
			unit = "µs"
		}
		for _, size := range sizes {
			k := key{test, size}
			rs := slices.Clone(ratios[k])
			slices.Sort(rs)
			fmt.Fprintf(&sb, "| %s | %d | %.3f %s | %.3f %s | %.2fx | %.2f–%.2f | %s |\n", test, size,
				stats.Median(vals[k][0]), unit, stats.Median(vals[k][1]), unit, stats.Median(ratios[k]), rs[0], rs[len(rs)-1],
				counterText(moved[k]))
		}
	}
	t.Log(sb.String())
}

// counterText lists the counters of the mode machine that moved.
func counterText(m map[string]uint64) string {
	var parts []string
	for _, c := range []string{"redirect_msgs", "pass_sticky", "switch_stack", "backpressure", "left"} {
		if m[c] > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", c, m[c]))
		}
	}
	return strings.Join(parts, ", ")
}

func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// lookTool finds the named programs in PATH.
func lookTool(names ...string) (map[string]string, error) {
	out := map[string]string{}
	for _, name := range names {
		for _, dir := range strings.Split(os.Getenv("PATH")+":/usr/sbin:/usr/bin:/sbin:/bin", ":") {
			p := dir + "/" + name
			if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
				out[name] = p
				break
			}
		}
		if out[name] == "" {
			return nil, fmt.Errorf("%s not installed (apt-get install qperf util-linux)", name)
		}
	}
	return out, nil
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}
