package vmguest

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/axonhq/axon/internal/bench"
	"github.com/axonhq/axon/internal/cpustat"
	"github.com/axonhq/axon/internal/testutil"
)

// qperfSample is one qperf measurement of the benchmark.
type qperfSample struct {
	Round   int     `json:"round"`
	Test    string  `json:"test"`     // udp_lat, tcp_lat, udp_bw, tcp_bw
	MsgSize int     `json:"msg_size"` // bytes
	Arm     string  `json:"arm"`      // bridge or bypass
	Value   float64 `json:"value"`    // latency in ns (_lat) or received bytes/s (_bw)
	// QEMUCPU is the guest's QEMU process's CPU time (user+system) during the
	// measurement, HostCPU every host CPU's busy time (from /proc/stat).
	QEMUCPU float64 `json:"qemu_cpu_s"`
	HostCPU float64 `json:"host_cpu_s"`
	Wall    float64 `json:"wall_s"`
	// Ops is what the measurement moved: round trips (_lat: run time / latency)
	// or messages received (_bw: bytes / message size).
	Ops float64 `json:"ops"`
}

// TestQperfBench is the KubeVirt talk's method on a real guest: qperf udp_lat,
// tcp_lat, udp_bw and tcp_bw at message sizes 1 B..16 KiB (×4) between the guest
// (server) and an ordinary pod behind the same node (client), over KubeVirt's bridge
// and over the bypass, the same guest, interleaved: per round, test and size, both
// arms back to back, their order alternating. Medians per arm and paired ratios
// bypass/bridge (bench.Pair) with their 95 % intervals.
//
// AXON_VMB_QPERF=1 runs it; AXON_VMB_QPERF_ROUNDS (default 8), AXON_VMB_QPERF_TIME
// (qperf -t seconds, default 1), AXON_VMB_QPERF_SIZES (default 1,4,...,16384),
// AXON_VMB_QPERF_OUT (a dir: results.md and results.json); AXON_VMB_QPERF_RENDER=<dir>
// only renders <dir>/results.md again from its results.json. About 13 min at the
// defaults on a 2-core host under TCG.
func TestQperfBench(t *testing.T) {
	if os.Getenv("AXON_VMB_QPERF") != "1" {
		t.Skip("benchmark: set AXON_VMB_QPERF=1 to run it (about 13 min)")
	}
	t.Setenv("AXON_VMGUEST", "1")
	rounds := testutil.EnvInt(t, "AXON_VMB_QPERF_ROUNDS", 8)
	secs := testutil.EnvInt(t, "AXON_VMB_QPERF_TIME", 1)
	sizes := testutil.EnvSizes(t, "AXON_VMB_QPERF_SIZES", []int{1, 4, 16, 64, 256, 1024, 4096, 16384})
	tests := []string{"udp_lat", "tcp_lat", "udp_bw", "tcp_bw"}
	if dir := os.Getenv("AXON_VMB_QPERF_RENDER"); dir != "" {
		renderQperf(t, dir, tests)
		return
	}
	l := newVMLab(t)
	load0, pres0 := bench.LoadAvg(), bench.ReadPressure()
	start := time.Now()
	var samples []qperfSample
	for r := range rounds {
		i := 0
		for _, test := range tests {
			for _, size := range sizes {
				arms := []string{"bridge", "bypass"}
				if (r+i)%2 == 1 {
					arms[0], arms[1] = arms[1], arms[0]
				}
				i++
				for _, arm := range arms {
					l.setBypass(arm == "bypass")
					s, err := l.measure(test, size, secs)
					if err != nil {
						t.Fatalf("round %d %s %d B %s: %v", r, test, size, arm, err)
					}
					s.Round, s.Arm = r, arm
					samples = append(samples, s)
				}
			}
		}
		t.Logf("round %d of %d done (%s)", r+1, rounds, time.Since(start).Round(time.Second))
	}
	l.setBypass(false)
	meta := benchMeta{
		Command: "AXON_VMB_QPERF=1 go test ./internal/vmguest -run TestQperfBench -v -timeout 60m",
		Kernel:  l.kernelRelease, Accel: l.guest.Accel(), Rounds: rounds, QperfSeconds: secs,
		LoadStart: load0, LoadEnd: bench.LoadAvg(), CPUPressureAvg10Start: pres0.Avg10, CPUPressureAvg10End: bench.ReadPressure().Avg10,
		HostCPUs: runtime.NumCPU(), Took: time.Since(start).Round(time.Second).String(), BootTime: l.bootTime.Round(time.Millisecond).String(),
	}
	md := qperfMarkdown(meta, tests, sizes, samples)
	t.Log("\n" + md)
	if dir := os.Getenv("AXON_VMB_QPERF_OUT"); dir != "" {
		if err := bench.WriteRun(dir, meta, samples, md); err != nil {
			t.Fatal(err)
		}
	}
}

// renderQperf writes dir/results.md from dir/results.json.
func renderQperf(t *testing.T, dir string, tests []string) {
	meta, samples, err := bench.ReadRun[benchMeta, qperfSample](dir)
	if err != nil {
		t.Fatal(err)
	}
	var sizes []int
	seen := map[int]bool{}
	for _, s := range samples {
		if !seen[s.MsgSize] {
			seen[s.MsgSize] = true
			sizes = append(sizes, s.MsgSize)
		}
	}
	md := qperfMarkdown(meta, tests, sizes, samples)
	t.Log("\n" + md)
	if err := os.WriteFile(filepath.Join(dir, "results.md"), []byte(md), 0o644); err != nil {
		t.Fatal(err)
	}
}

type benchMeta struct {
	Command               string  `json:"command"`
	Kernel                string  `json:"guest_kernel"`
	Accel                 string  `json:"accel"`
	Rounds                int     `json:"rounds"`
	QperfSeconds          int     `json:"qperf_seconds"`
	LoadStart             string  `json:"load_start"`
	LoadEnd               string  `json:"load_end"`
	CPUPressureAvg10Start float64 `json:"cpu_pressure_avg10_start"`
	CPUPressureAvg10End   float64 `json:"cpu_pressure_avg10_end"`
	HostCPUs              int     `json:"host_cpus"`
	Took                  string  `json:"took"`
	BootTime              string  `json:"guest_boot"`
}

// measure runs one qperf test from the peer pod against the guest.
func (l *vmLab) measure(test string, size, secs int) (qperfSample, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(secs)*time.Second+30*time.Second)
	defer cancel()
	s := qperfSample{Test: test, MsgSize: size}
	q0, h0, w0 := procCPU(l.guest.PID()), hostBusy(), time.Now()
	out, err := l.qperf(ctx, "-t", strconv.Itoa(secs), "-m", strconv.Itoa(size), test)
	s.QEMUCPU, s.HostCPU, s.Wall = procCPU(l.guest.PID())-q0, hostBusy()-h0, time.Since(w0).Seconds()
	if err != nil {
		return s, err
	}
	res, err := bench.ParseQperf([]byte(out))
	if err != nil {
		return s, err
	}
	if len(res) != 1 {
		return s, fmt.Errorf("qperf printed %d results, want 1: %s", len(res), out)
	}
	s.Value, s.Ops = res[0].Measure(secs, size)
	return s, nil
}

// procCPU is a process's user+system CPU seconds (NaN when unreadable).
func procCPU(pid int) float64 {
	v, err := cpustat.ProcessSeconds(pid)
	if err != nil {
		return math.NaN()
	}
	return v
}

// hostBusy is every CPU's non-idle time in seconds (/proc/stat).
func hostBusy() float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return math.NaN()
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	var busy float64
	for i, v := range f[1:] {
		n, _ := strconv.ParseFloat(v, 64)
		if i != 3 && i != 4 && i < 8 { // not idle, iowait; guest time is inside user
			busy += n
		}
	}
	return busy / 100
}

func values(samples []qperfSample, test string, size int, arm string, f func(qperfSample) float64) []float64 {
	var out []float64
	for _, s := range samples {
		if s.Test == test && s.MsgSize == size && s.Arm == arm {
			out = append(out, f(s))
		}
	}
	return out
}

// targetVerdict says whether the paired ratio's 95 % interval lies past the target
// (UDP latency ≤ 0.8× the bridge, throughput ≥ 1.3×; none for TCP latency): "met" only
// when the whole interval does, "missed" when it lies wholly on the other side, "not
// resolved" when it spans the target.
func targetVerdict(test string, p bench.PairedRatio) string {
	var target string
	var met, missed bool
	switch {
	case test == "tcp_lat":
		return "–"
	case strings.HasSuffix(test, "_lat"):
		target, met, missed = "≤ 0.8×", p.Hi <= 0.8, p.Lo > 0.8
	default:
		target, met, missed = "≥ 1.3×", p.Lo >= 1.3, p.Hi < 1.3
	}
	switch {
	case p.N == 0 || math.IsNaN(p.Lo):
		return target + ": no interval"
	case met:
		return target + ": met"
	case missed:
		return target + ": missed"
	}
	return target + ": not resolved"
}

// qperfMarkdown renders the run: per test and size the medians of both arms, the paired
// ratio bypass/bridge with its 95 % interval and whether the target holds, and the QEMU
// process's CPU time per operation (the guest's own cost) next to the host's.
func qperfMarkdown(m benchMeta, tests []string, sizes []int, samples []qperfSample) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Guest kernel %s (%s), %d rounds × qperf -t %d s per test, size and arm, interleaved; took %s; host %d CPUs, load %s → %s, CPU pressure avg10 %.0f %% → %.0f %%.\n\n",
		m.Kernel, m.Accel, m.Rounds, m.QperfSeconds, m.Took, m.HostCPUs, m.LoadStart, m.LoadEnd, m.CPUPressureAvg10Start, m.CPUPressureAvg10End)
	b.WriteString("| test | msg size | bridge median (min–max) | bypass median (min–max) | bypass / bridge, paired (95 % CI) | target | QEMU CPU µs per op, bridge → bypass |\n")
	b.WriteString("|---|---:|---:|---:|---:|---|---:|\n")
	val := func(s qperfSample) float64 { return s.Value }
	perOp := func(s qperfSample) float64 { return s.QEMUCPU / s.Ops * 1e6 }
	for _, test := range tests {
		lat := strings.HasSuffix(test, "_lat")
		scale, unit, prec := 1e3, "µs", 1
		if !lat {
			scale, unit, prec = 1e6/8, "Mbit/s", 2
		}
		for _, size := range sizes {
			br, by := values(samples, test, size, "bridge", val), values(samples, test, size, "bypass", val)
			p := bench.Pair(by, br)
			verdict := targetVerdict(test, p)
			qb := bench.Summarize(values(samples, test, size, "bridge", perOp)).Median
			qy := bench.Summarize(values(samples, test, size, "bypass", perOp)).Median
			fmt.Fprintf(&b, "| %s | %d | %s %s | %s %s | %s | %s | %s → %s |\n", test, size,
				bench.Cell(bench.Summarize(br), scale, prec), unit, bench.Cell(bench.Summarize(by), scale, prec), unit,
				bench.FormatPaired(p), verdict, bench.FormatNum(qb, 1), bench.FormatNum(qy, 1))
		}
	}
	return b.String()
}

func TestTargetVerdict(t *testing.T) {
	nan := math.NaN()
	for _, tc := range []struct {
		test   string
		p      bench.PairedRatio
		expect string
	}{
		{"udp_lat", bench.PairedRatio{N: 10, Median: 0.6, Lo: 0.5, Hi: 0.7}, "≤ 0.8×: met"},
		{"udp_lat", bench.PairedRatio{N: 10, Median: 0.7, Lo: 0.5, Hi: 0.9}, "≤ 0.8×: not resolved"},
		{"udp_lat", bench.PairedRatio{N: 10, Median: 1.0, Lo: 0.9, Hi: 1.1}, "≤ 0.8×: missed"},
		{"udp_bw", bench.PairedRatio{N: 10, Median: 1.5, Lo: 1.3, Hi: 1.7}, "≥ 1.3×: met"},
		{"tcp_bw", bench.PairedRatio{N: 10, Median: 1.5, Lo: 1.1, Hi: 1.7}, "≥ 1.3×: not resolved"},
		{"tcp_bw", bench.PairedRatio{N: 10, Median: 1.0, Lo: 0.9, Hi: 1.2}, "≥ 1.3×: missed"},
		{"udp_bw", bench.PairedRatio{N: 5, Median: 2, Lo: nan, Hi: nan}, "≥ 1.3×: no interval"},
		{"tcp_lat", bench.PairedRatio{N: 10, Median: 0.5, Lo: 0.4, Hi: 0.6}, "–"},
	} {
		if got := targetVerdict(tc.test, tc.p); got != tc.expect {
			t.Errorf("targetVerdict(%s, %+v) = %q, want %q", tc.test, tc.p, got, tc.expect)
		}
	}
}
