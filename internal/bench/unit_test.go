package bench

import (
	"encoding/csv"
	"errors"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func readTestdata(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// parsed checks the error of parsing a testdata file and reports whether the
// result is there to check: with wantError set, err must contain it (and
// there is no result); without, err must be nil.
func parsed(t *testing.T, err error, wantError string) bool {
	t.Helper()
	if wantError != "" {
		if err == nil || !strings.Contains(err.Error(), wantError) {
			t.Fatalf("err = %v, want %q", err, wantError)
		}
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	return true
}

func TestParseIperfJSON(t *testing.T) {
	tests := []struct {
		file      string
		bps       float64
		retr      int
		cong      string
		wantError string
	}{
		{file: "iperf3-client.json", bps: 42299889626.48964, retr: 0, cong: "bbr"},
		{file: "iperf3-veth.json", bps: 3100860036.73372, retr: 239, cong: "bbr"},
		{file: "iperf3-refused.json", wantError: "unable to connect to server: Connection refused"},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			r, err := ParseIperfJSON(readTestdata(t, tc.file))
			if !parsed(t, err, tc.wantError) {
				return
			}
			if r.BitsPerSecond != tc.bps || r.Retransmits != tc.retr || r.Congestion != tc.cong {
				t.Errorf("got %+v, want bps %v retr %d cong %s", r, tc.bps, tc.retr, tc.cong)
			}
		})
	}
	for _, bad := range []string{"", "not json", `{"end":{}}`} {
		if _, err := ParseIperfJSON([]byte(bad)); err == nil {
			t.Errorf("ParseIperfJSON(%q) succeeded", bad)
		}
	}
}

func TestParseSockperf(t *testing.T) {
	tests := []struct {
		file          string
		rtt           bool
		avg, p50, p99 float64
		min, max      float64
		obs           int
		wantError     string
	}{
		{file: "sockperf-pingpong-fullrtt.txt", rtt: true, avg: 19.767, p50: 20.077, p99: 33.512, min: 15.799, max: 4046.235, obs: 27801},
		{file: "sockperf-pingpong-latency.txt", rtt: false, avg: 10.696, p50: 10.313},
		{file: "sockperf-refused.txt", wantError: "Connection refused"},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			r, err := ParseSockperf(readTestdata(t, tc.file))
			if !parsed(t, err, tc.wantError) {
				return
			}
			p50, err := r.P(50)
			if err != nil {
				t.Fatal(err)
			}
			if r.RTT != tc.rtt || r.Avg != tc.avg || p50 != tc.p50 {
				t.Errorf("got rtt=%v avg=%v p50=%v, want %v %v %v", r.RTT, r.Avg, p50, tc.rtt, tc.avg, tc.p50)
			}
			if tc.p99 != 0 {
				if p99, _ := r.P(99); p99 != tc.p99 || r.Min != tc.min || r.Max != tc.max || r.Observations != tc.obs {
					t.Errorf("got p99=%v min=%v max=%v obs=%d", p99, r.Min, r.Max, r.Observations)
				}
			}
			if _, err := r.P(42); err == nil {
				t.Error("P(42) did not fail")
			}
		})
	}
}

func TestParsePressure(t *testing.T) {
	avg, total, err := ParsePressure(readTestdata(t, "pressure-cpu.txt"))
	if err != nil || avg != 26.26 || total != 15623856 {
		t.Errorf("got %v %v %v", avg, total, err)
	}
	for _, bad := range []string{"", "full avg10=1 total=2", "some avg10=x total=1", "some avg60=1"} {
		if _, _, err := ParsePressure([]byte(bad)); err == nil {
			t.Errorf("ParsePressure(%q) succeeded", bad)
		}
	}
}

func TestParseProcNetTCP(t *testing.T) {
	tests := []struct {
		file string
		want []string
	}{
		{"proc-net-tcp.txt", []string{"198.18.99.2:5201", "127.0.0.1:11111"}},
		{"proc-net-tcp6.txt", []string{"[fd00::2]:11111", "[::ffff:198.18.99.1]:80"}},
	}
	for _, tc := range tests {
		got, err := parseProcNetTCP(readTestdata(t, tc.file))
		if err != nil {
			t.Fatalf("%s: %v", tc.file, err)
		}
		var s []string
		for _, a := range got {
			s = append(s, a.String())
		}
		if !slices.Equal(s, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.file, s, tc.want)
		}
	}
	if _, err := parseProcNetTCP([]byte("hdr\n 0: ZZ:0050 0:0 0A\n")); err == nil {
		t.Error("bad address accepted")
	}
}

func TestSummarizeAndRatio(t *testing.T) {
	nan := math.NaN()
	tests := []struct {
		in            []float64
		n             int
		min, med, max float64
	}{
		{[]float64{3, 1, 2}, 3, 1, 2, 3},
		{[]float64{4, 1, 3, 2}, 4, 1, 2.5, 4},
		{[]float64{5}, 1, 5, 5, 5},
		{[]float64{nan, 7, 1}, 2, 1, 4, 7},
	}
	for _, tc := range tests {
		s := Summarize(tc.in)
		if s.N != tc.n || s.Min != tc.min || s.Median != tc.med || s.Max != tc.max {
			t.Errorf("Summarize(%v) = %+v", tc.in, s)
		}
	}
	if s := Summarize([]float64{nan}); s.N != 0 || !math.IsNaN(s.Median) {
		t.Errorf("Summarize(NaN) = %+v", s)
	}
	for _, tc := range []struct{ v, ref, want float64 }{{9, 10, 0.9}, {10, 10, 1}, {1, 0, nan}, {nan, 1, nan}, {1, nan, nan}} {
		got := Ratio(tc.v, tc.ref)
		if !(got == tc.want || math.IsNaN(got) && math.IsNaN(tc.want)) {
			t.Errorf("Ratio(%v,%v) = %v, want %v", tc.v, tc.ref, got, tc.want)
		}
	}
}

func TestWrapAndSlug(t *testing.T) {
	tp := ToolPaths{Nsenter: "/n", Taskset: "/t"}
	tests := []struct {
		netns string
		cpu   int
		want  string
	}{
		{"/run/netns/x", 1, "/n --net=/run/netns/x /t -c 1 iperf3 -s"},
		{"", 0, "/t -c 0 iperf3 -s"},
		{"/run/netns/x", -1, "/n --net=/run/netns/x iperf3 -s"},
	}
	for _, tc := range tests {
		if got := strings.Join(tp.Wrap(tc.netns, tc.cpu, "iperf3", "-s"), " "); got != tc.want {
			t.Errorf("wrap(%q,%d) = %q, want %q", tc.netns, tc.cpu, got, tc.want)
		}
	}
	for in, want := range map[string]string{"axon pod-to-pod cross-node": "axon-pod-to-pod-cross-node", "A/B  (x)": "a-b-x", "--": ""} {
		if got := Slug(in); got != want {
			t.Errorf("Slug(%q) = %q, want %q", in, got, want)
		}
	}
	if got := ShellQuote([]string{"a", "b c", "it's", "--net=/run/netns/x"}); got != `a 'b c' 'it'\''s' --net=/run/netns/x` {
		t.Errorf("shellQuote = %s", got)
	}
}

func TestConfigValidation(t *testing.T) {
	ip := netip.MustParseAddr("198.18.99.2")
	ip6 := netip.MustParseAddr("fd00::1")
	good := Path{Name: "p", Server: Endpoint{IP: ip}}
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"no paths", Config{}, "no paths"},
		{"no name", Config{Paths: []Path{{Server: Endpoint{IP: ip}}}}, "has no name"},
		{"dup", Config{Paths: []Path{good, good}}, "used twice"},
		{"no server ip", Config{Paths: []Path{{Name: "p"}}}, "server has no IP"},
		{"family", Config{Paths: []Path{{Name: "p", Client: Endpoint{IP: ip6}, Server: Endpoint{IP: ip}}}}, "different IP families"},
		{"ipv6", Config{Paths: []Path{{Name: "p", Server: Endpoint{IP: ip6}}}}, "no IPv6 support"},
		{"netns", Config{Paths: []Path{{Name: "p", Server: Endpoint{IP: ip, Netns: "/run/netns/axt-bench-none"}}}}, "server netns"},
		{"cgroup", Config{Paths: []Path{{Name: "p", Client: Endpoint{Cgroup: t.TempDir()}, Server: Endpoint{IP: ip}}}}, "not a cgroup v2 directory"},
		{"reps", Config{Paths: []Path{good}, Reps: -1}, "reps"},
		{"duration", Config{Paths: []Path{good}, Duration: time.Millisecond}, "at least 1s"},
		{"ports", Config{Paths: []Path{good, {Name: "q", Server: Endpoint{IP: ip}}}, IperfPort: 5000, SockperfPort: 5001}, "overlap"},
		{"tool", Config{Paths: []Path{good}, Tools: ToolPaths{Sockperf: "/nonexistent/sockperf"}}, "make deps"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rep, err := Run(t.Context(), tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
			if rep != nil {
				t.Error("report returned for an invalid config")
			}
			if tc.name == "tool" && !errors.Is(err, ErrMissingTool) {
				t.Error("missing tool error is not ErrMissingTool")
			}
		})
	}
}

// fakeReport is a hand-made report: three paths, three reps, one failure.
func fakeReport() *Report {
	nan := math.NaN()
	start := time.Date(2026, 11, 22, 4, 30, 0, 0, time.UTC)
	mk := func(name string, tp, p50, p99 []float64) *Result {
		// CPU per GB: 0.4 s/GB at 20 Gbit/s, proportional to 1/throughput
		cpu := make([]float64, len(tp))
		for i, v := range tp {
			cpu[i] = 0.4 * 20e9 / v
		}
		return &Result{Path: name, Throughput: tp, CPUPerGB: cpu, Retransmits: []float64{0, 2, 1}, DSACKSegs: []float64{0, 2, 0}, RTTP50: p50, RTTP99: p99,
			RTTAvg: p50, Congestion: "bbr", Server: Endpoint{Name: "node2", IP: netip.MustParseAddr("198.18.0.12")}}
	}
	r := &Report{
		Started: start, Finished: start.Add(time.Minute), Reps: 3, Duration: 5 * time.Second, MessageSize: 64,
		ClientCPU: 0, ServerCPU: 1, Reference: "host-to-host",
		Host: Host{Kernel: "6.18.0", CPUModel: "Test CPU", NumCPU: 2, Iperf3: "iperf 3.12", Sockperf: "sockperf 3.7"},
		Results: []*Result{
			mk("host-to-host", []float64{20e9, 22e9, 21e9}, []float64{30, 32, 31}, []float64{50, 60, 55}),
			mk("axon pod-to-pod cross-node", []float64{20e9, 19e9, 21e9}, []float64{31, 33, 32}, []float64{52, 58, 70}),
			mk("baseline <&> pod|pod", []float64{10.5e9, nan, 10e9}, []float64{40, nan, 44}, []float64{80, nan, 90}),
		},
	}
	r.Results[2].Errors = []string{"rep 2 iperf3: timed out"}
	for n := 1; n <= 3; n++ {
		for _, res := range r.Results {
			for _, tool := range []string{"iperf3", "sockperf"} {
				m := Measurement{Rep: n, Path: res.Path, Tool: tool, Client: []string{"nsenter", "--net=/run/netns/x", tool, "-c"},
					Server: []string{"nsenter", tool, "-s"}, Elapsed: time.Second,
					Before: Pressure{Avg10: 1.5, Total: 100}, After: Pressure{Avg10: 2.5, Total: 600}, StallMicro: 500}
				if n == 2 && res.Path == "baseline <&> pod|pod" {
					m.Err = "timed out"
				}
				r.Measurements = append(r.Measurements, m)
			}
		}
	}
	return r
}

func TestReportCSV(t *testing.T) {
	r := fakeReport()
	rows, err := csv.NewReader(strings.NewReader(string(r.CSV()))).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(rows[0], ","); got != "rep,path,metric,value,unit" {
		t.Errorf("header = %s", got)
	}
	if got := strings.Join(rows[1], ","); got != "1,host-to-host,throughput,20000000000,bit/s" {
		t.Errorf("first row = %s", got)
	}
	count := map[string]int{}
	for _, row := range rows[1:] {
		if len(row) != 5 {
			t.Fatalf("row %v has %d fields", row, len(row))
		}
		count[row[2]]++
		if row[3] == "NaN" {
			t.Errorf("NaN written: %v", row)
		}
	}
	// 3 paths × 3 reps, minus the failed rep of the baseline path.
	for metric, want := range map[string]int{MetricThroughput: 8, MetricCPUPerGB: 8, MetricRTTP50: 8, MetricRetransmits: 9, MetricDSACK: 9, "iperf3.psi_before": 8, "sockperf.cpu_stall": 8} {
		if count[metric] != want {
			t.Errorf("%s rows = %d, want %d", metric, count[metric], want)
		}
	}
}

func TestReportPaired(t *testing.T) {
	nan := math.NaN()
	r := &Report{Reference: "host", Reps: 10, Results: []*Result{
		{Path: "host", RTTP50: []float64{20, 40, 20, 40, 20, 40, 20, nan, 20, 40}},
		// each repetition 5 % above its reference; one rep of the path
		// and one of the reference missing: 8 pairs
		{Path: "pod", RTTP50: []float64{21, 42, nan, 42, 21, 42, 21, 42, 21, 42}},
		{Path: "short", RTTP50: []float64{22, 44}},
	}}
	cases := []struct {
		path   string
		n      int
		median float64
		ci     bool
	}{
		{"pod", 8, 1.05, true},
		{"short", 2, 1.10, false}, // < 8 pairs: no interval
		{"nosuch", 0, nan, false},
	}
	for _, c := range cases {
		p := r.Paired(c.path, MetricRTTP50)
		if p.N != c.n || (c.n > 0 && math.Abs(p.Median-c.median) > 1e-9) || c.ci == math.IsNaN(p.Lo) || c.ci == math.IsNaN(p.Hi) {
			t.Errorf("%s: %+v, want n=%d median=%v interval=%v", c.path, p, c.n, c.median, c.ci)
		}
		if c.ci && (p.Lo > p.Median || p.Hi < p.Median) {
			t.Errorf("%s: interval %v–%v does not hold the median %v", c.path, p.Lo, p.Hi, p.Median)
		}
	}
	if p := r.Paired("pod", MetricRTTP50); p.Above != 8 || math.Abs(p.Min-1.05) > 1e-9 || math.Abs(p.Max-1.05) > 1e-9 {
		t.Errorf("pod: above %d min %v max %v, want 8, 1.05, 1.05", p.Above, p.Min, p.Max)
	}
	// against another path than the reference: short / pod = 22/21, 44/42
	if p := r.PairedTo("short", "pod", MetricRTTP50); p.N != 2 || p.Above != 2 || math.Abs(p.Median-22.0/21) > 1e-9 {
		t.Errorf("short to pod: %+v, want 2 pairs above 1, median %v", p, 22.0/21)
	}
	tab := r.PairedTable()
	for _, want := range []string{"| pod | n/a | n/a | n/a | 1.05× (1.050–1.050) |", "| short | n/a | n/a | n/a | 1.10× (CI: < 8 pairs) |"} {
		if !strings.Contains(tab, want) {
			t.Errorf("paired table lacks %q:\n%s", want, tab)
		}
	}
	if strings.Contains(tab, "| host |") {
		t.Errorf("the reference has a paired row:\n%s", tab)
	}
	// the reference's speed beside the throughput ratio: its median over the pairs only
	r.Results[0].Throughput = []float64{10e9, 30e9, 20e9, nan}
	r.Results[1].Throughput = []float64{10e9, 30e9, nan, 20e9} // pairs: reps 1 and 2
	if p := r.Paired("pod", MetricThroughput); p.N != 2 || math.Abs(p.RefMedian-20e9) > 1 {
		t.Errorf("pod throughput: %+v, want 2 pairs at a reference median of 20e9 (reps 1 and 2 only)", p)
	}
	if tab := r.PairedTable(); !strings.Contains(tab, "| pod | 1.00× (CI: < 8 pairs) | 20.00 |") || !strings.Contains(tab, "at host Gbit/s") {
		t.Errorf("paired table lacks the reference's speed beside the ratio:\n%s", tab)
	}
}

func TestReportMarkdown(t *testing.T) {
	r := fakeReport()
	md := r.Markdown()
	for _, want := range []string{
		"| host-to-host (reference) | 21.00 (20.00–22.00) | 1.00× | 0.381 (0.364–0.400) | 1.00× | 31.0 (30.0–32.0) | 1.00× | 55.0 (50.0–60.0) | 1.00× | 1 | 0 |",
		"| axon pod-to-pod cross-node | 20.00 (19.00–21.00) | 0.95× | 0.400 (0.381–0.421) | 1.05× | 32.0 (31.0–33.0) | 1.03× | 58.0 (52.0–70.0) | 1.05× | 1 | 0 |",
		`| baseline <&> pod\|pod | 10.25 (10.00–10.50) | 0.49× | 0.781 (0.762–0.800) | 2.05× | 42.0 (40.0–44.0) | 1.35× |`,
		"CPU per GB: busy time (user, system, irq, softirq; not steal) of CPUs 0 and 1 (client and server)",
		"of which not needed (DSACK)", "reordered, not lost",
		"round-trip time", "`--full-rtt`", "64-byte",
		"Client pinned to CPU 0, server to CPU 1",
		"kernel 6.18.0, Test CPU × 2 CPUs",
		"`/proc/pressure/cpu` some avg10",
		"nsenter --net=/run/netns/x iperf3 -c",
		"## Failed measurements",
		"rep 2 iperf3: timed out",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("Markdown lacks %q\n%s", want, md)
		}
	}
}

func TestReportSVGAndFiles(t *testing.T) {
	r := fakeReport()
	svg := r.SVG()
	if err := xmlWellFormed(svg); err != nil {
		t.Fatalf("SVG not well-formed: %v\n%s", err, svg)
	}
	for _, want := range []string{"<svg", "21.00 Gbit/s  1.00×", "32.0 µs  1.03×", "baseline &lt;&amp;&gt; pod|pod"} {
		if !strings.Contains(string(svg), want) {
			t.Errorf("SVG lacks %q", want)
		}
	}
	// A report with no data at all still renders.
	empty := &Report{Reps: 1, Reference: "x", Results: []*Result{{Path: "x", Throughput: []float64{math.NaN()}}}}
	if err := xmlWellFormed(empty.SVG()); err != nil {
		t.Errorf("empty SVG: %v", err)
	}
	if !strings.Contains(empty.Markdown(), "| x (reference) | n/a | n/a |") {
		t.Errorf("empty Markdown: %s", empty.Markdown())
	}

	dir := filepath.Join(t.TempDir(), "bench-x")
	for range 2 { // twice: overwrite works
		if err := r.WriteFiles(dir); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"results.csv", "results.md", "chart.svg", "results.json"} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
	js, _ := os.ReadFile(filepath.Join(dir, "results.json"))
	if !strings.Contains(string(js), `"ratioToReference"`) || !strings.Contains(string(js), "null") {
		t.Errorf("results.json lacks ratios or null for the failed sample")
	}
}

func TestPercentile(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	for _, tc := range []struct {
		xs      []float64
		p, want float64
	}{
		{[]float64{5}, 99, 5},
		{[]float64{4, 1, 3, 2}, 50, 2.5},
		{[]float64{4, 1, 3, 2}, 99, 3.97},
		{[]float64{nan, 4, inf, 1, 3, 2}, 50, 2.5},
	} {
		if got := Percentile(tc.xs, tc.p); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("Percentile(%v, %v) = %v, want %v", tc.xs, tc.p, got, tc.want)
		}
	}
	if !math.IsNaN(Percentile([]float64{nan}, 50)) {
		t.Error("the percentile of no finite value is not NaN")
	}
}

func TestParseQperf(t *testing.T) {
	tests := []struct {
		file      string
		want      QperfResult
		wantError string
	}{
		{file: "qperf-tcp_bw-64.txt", want: QperfResult{Test: "tcp_bw", BytesPerSec: 26172992, MsgSize: 64, MsgRate: 408953, Seconds: 1, RecvBytes: 26172992}},
		{file: "qperf-tcp_bw-16k.txt", want: QperfResult{Test: "tcp_bw", BytesPerSec: 1248788480, MsgSize: 16384, MsgRate: 76220, Seconds: 1, RecvBytes: 1248788480}},
		{file: "qperf-udp_bw-64.txt", want: QperfResult{Test: "udp_bw", BytesPerSec: 7103424, MsgSize: 64, MsgRate: 110991, Seconds: 1, RecvBytes: 7103424}},
		{file: "qperf-tcp_lat-1.txt", want: QperfResult{Test: "tcp_lat", LatencyNs: 8672, MsgSize: 1, MsgRate: 115320, Seconds: 1, RecvBytes: 57660}},
		{file: "qperf-refused.txt", wantError: "127.0.0.1: failed to connect"},
		{file: "qperf-not-unified.txt", wantError: `bw is in "GB/sec", want "bytes/sec": run qperf with -uu`},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			rs, err := ParseQperf(readTestdata(t, tc.file))
			if !parsed(t, err, tc.wantError) {
				return
			}
			if len(rs) != 1 || rs[0] != tc.want {
				t.Errorf("got %+v, want [%+v]", rs, tc.want)
			}
		})
	}
	for _, bad := range []struct{ out, wantError string }{
		{"", "no test result"},
		{"tcp_bw:\n    msg_size = 64 bytes\n", "test tcp_bw printed no bw"},
		{"tcp_lat:\n    bw = 10 bytes/sec\n", "test tcp_lat printed no latency"},
		{"tcp_lat:\n    latency = 1x2 ns\n", `latency = "1x2"`},
		{"tcp_lat:\n    latency =\n", "has no value"},
	} {
		if _, err := ParseQperf([]byte(bad.out)); err == nil || !strings.Contains(err.Error(), bad.wantError) {
			t.Errorf("ParseQperf(%q) = %v, want an error with %q", bad.out, err, bad.wantError)
		}
	}
	// two tests in one run, in order
	rs, err := ParseQperf([]byte("tcp_bw:\n    bw = 1,000 bytes/sec\ntcp_lat:\n    latency = 2000 ns\n"))
	if err != nil || len(rs) != 2 || rs[0].Test != "tcp_bw" || rs[0].BytesPerSec != 1000 || rs[1].Test != "tcp_lat" || rs[1].LatencyNs != 2000 {
		t.Errorf("two tests: %+v, %v", rs, err)
	}
}

func TestPairAndCPUPerGB(t *testing.T) {
	nan := math.NaN()
	p := Pair([]float64{2, 3, nan, 4, 1}, []float64{1, 2, 5, 0, 2})
	// pairs: 2/1, 3/2, (NaN skipped), (ref 0 skipped), 1/2
	if p.N != 3 || p.Above != 2 || p.Median != 1.5 || p.Min != 0.5 || p.Max != 2 || !math.IsNaN(p.Lo) {
		t.Errorf("Pair = %+v", p)
	}
	eight := Pair([]float64{1, 2, 3, 4, 5, 6, 7, 8}, []float64{1, 1, 1, 1, 1, 1, 1, 1})
	if eight.N != 8 || eight.Lo != 1 || eight.Hi != 8 || eight.Median != 4.5 {
		t.Errorf("Pair of 8 = %+v, want CI 1–8 (k = 1), median 4.5", eight)
	}
	if e := Pair(nil, nil); e.N != 0 || !math.IsNaN(e.Median) {
		t.Errorf("Pair(nil) = %+v", e)
	}
	if v := CPUSecondsPerGB(250, 5e9); v != 0.5 { // 2.5 s of CPU for 5 GB
		t.Errorf("CPUSecondsPerGB(250 ticks, 5 GB) = %v, want 0.5", v)
	}
	if v := CPUSecondsPerGB(250, 0); !math.IsNaN(v) {
		t.Errorf("CPUSecondsPerGB without bytes = %v, want NaN", v)
	}
	for _, tc := range []struct {
		c, s int
		want []int
	}{{0, 1, []int{0, 1}}, {1, 1, []int{1}}, {0, -1, []int{0}}, {-1, 1, nil}} {
		if got := MeasuredCPUs(tc.c, tc.s); !slices.Equal(got, tc.want) {
			t.Errorf("MeasuredCPUs(%d, %d) = %v, want %v", tc.c, tc.s, got, tc.want)
		}
	}
}
