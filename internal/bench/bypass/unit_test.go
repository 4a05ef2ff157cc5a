package bypass

import (
	"encoding/csv"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/axonhq/axon/internal/bench"
)

// fakeReport is a run of 8 repetitions of tcp_lat and tcp_bw at 64 B and
// 16 KiB: latency bypass/stack 0.4 in every repetition but the ratio of
// repetition r at 64 B is 0.3 + 0.05·r (0.35..0.70, median 0.525: misses
// ≤ 0.5 with its CI crossing it); throughput at 16 KiB 3× the stack, at
// 64 B 0.5×. Repetition 8's 64 B tcp_bw bypass measurement failed.
func fakeReport() *Report {
	r := &Report{Reps: 8, Sizes: []int{64, 16384}, Tests: []string{TestLat, TestBW}, Duration: 2 * time.Second,
		Attach: AttachDirect, AttachDetail: "loaded by the test", AttachReason: "the agent keeps the bypass off: splice",
		Node: "node1", Client: PodRef{"c", "10.0.0.1"}, Server: PodRef{"s", "10.0.0.2"}, ClientCPU: 0, ServerCPU: 1,
		PSIStart: 1, PSIEnd: math.NaN(), LoadStart: "0.5 0.4 0.3"}
	for n := 1; n <= 8; n++ {
		for _, size := range r.Sizes {
			stackLat := 20.0 + float64(n)
			latRatio := 0.4
			if size == 64 {
				latRatio = 0.3 + 0.05*float64(n)
			}
			bwStack := 1e9 * float64(n)
			bwRatio := 0.5
			if size == 16384 {
				bwRatio = 3
			}
			add := func(test, arm string, v, cpu float64, redirect uint64, err string) {
				s := Sample{Rep: n, Test: test, Size: size, Arm: arm, First: arm == ArmStack, Value: v, CPUPerGB: cpu,
					PSIBefore: 2, PSIAfter: float64(n), Counters: map[string]uint64{}, Err: err}
				if redirect > 0 {
					s.Counters["redirect_bytes"] = redirect
				}
				r.Samples = append(r.Samples, s)
			}
			add(TestLat, ArmStack, stackLat, math.NaN(), 0, "")
			add(TestLat, ArmBypass, stackLat*latRatio, math.NaN(), 1000, "")
			add(TestBW, ArmStack, bwStack, 2, 0, "")
			if size == 64 && n == 8 {
				add(TestBW, ArmBypass, math.NaN(), math.NaN(), 0, "qperf: failed to connect")
			} else {
				add(TestBW, ArmBypass, bwStack*bwRatio, 1, 5000, "")
			}
			if size == 16384 { // the writer left the bypass: a quarter redirected
				last := &r.Samples[len(r.Samples)-1]
				last.Counters["pass_bytes"], last.Counters["backpressure"] = 15000, 1
			}
		}
	}
	return r
}

func TestTargets(t *testing.T) {
	tests := []struct {
		test    string
		size    int
		ratio   float64
		want    string
		met     bool
		lo, hi  float64
		verdict string
	}{
		{TestLat, 1, 0.45, "≤ 0.5×", true, 0.4, 0.49, "yes"},
		{TestLat, 16384, 0.5, "≤ 0.5×", true, 0.45, 0.55, "yes (CI crosses)"},
		{TestLat, 64, 0.51, "≤ 0.5×", false, math.NaN(), math.NaN(), "no"},
		{TestBW, 64, 1.0, "≥ 1.0×", true, 1.0, 1.1, "yes"},
		{TestBW, 4096, 0.99, "≥ 1.0×", false, 0.9, 1.05, "no (CI crosses)"},
		{TestBW, 16384, 2.4, "≥ 2.5×", false, 2.3, 2.45, "no"},
		{TestBW, 16384, 2.6, "≥ 2.5×", true, 2.55, 2.7, "yes"},
	}
	for _, tc := range tests {
		tg := TargetFor(tc.test, tc.size)
		if tg.String() != tc.want || tg.Met(tc.ratio) != tc.met {
			t.Errorf("%s %d: target %s, Met(%v) = %v; want %s, %v", tc.test, tc.size, tg, tc.ratio, tg.Met(tc.ratio), tc.want, tc.met)
		}
		if v := tg.Verdict(bench.PairedRatio{N: 8, Median: tc.ratio, Lo: tc.lo, Hi: tc.hi}); v != tc.verdict {
			t.Errorf("%s %d: Verdict = %q, want %q", tc.test, tc.size, v, tc.verdict)
		}
	}
	if tg := TargetFor(TestLat, 1); tg.Met(math.NaN()) || tg.Verdict(bench.PairedRatio{}) != "n/a" {
		t.Error("a missing ratio meets the target")
	}
}

func TestRows(t *testing.T) {
	r := fakeReport()
	rows := r.Rows()
	if len(rows) != 4 {
		t.Fatalf("%d rows, want 4 (2 tests × 2 sizes)", len(rows))
	}
	byKey := map[string]Row{}
	for _, row := range rows {
		byKey[row.Test+sizeLabel(row.Size)] = row
	}
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
	lat64 := byKey["tcp_lat64 B"]
	// ratios 0.35, 0.40, ..., 0.70: median 0.525, CI (k = 1) 0.35–0.70
	if lat64.Ratio.N != 8 || !near(lat64.Ratio.Median, 0.525) || !near(lat64.Ratio.Lo, 0.35) || !near(lat64.Ratio.Hi, 0.70) {
		t.Errorf("tcp_lat 64 B ratio = %+v", lat64.Ratio)
	}
	if lat64.Stack.Median != 24.5 || lat64.Target.Verdict(lat64.Ratio) != "no (CI crosses)" {
		t.Errorf("tcp_lat 64 B: stack median %v, verdict %q", lat64.Stack.Median, lat64.Target.Verdict(lat64.Ratio))
	}
	if lat16 := byKey["tcp_lat16 KiB"]; !near(lat16.Ratio.Median, 0.4) || lat16.Target.Verdict(lat16.Ratio) != "yes" {
		t.Errorf("tcp_lat 16 KiB: %+v", lat16.Ratio)
	}
	bw64 := byKey["tcp_bw64 B"]
	// repetition 8's bypass failed: 7 pairs, no interval
	if bw64.Ratio.N != 7 || !near(bw64.Ratio.Median, 0.5) || !math.IsNaN(bw64.Ratio.Lo) || bw64.BypassN != 7 || bw64.BypassRedirected != 7 {
		t.Errorf("tcp_bw 64 B: ratio %+v, bypass arm %d of %d redirected", bw64.Ratio, bw64.BypassRedirected, bw64.BypassN)
	}
	if bw64.CPURatio.N != 7 || !near(bw64.CPURatio.Median, 0.5) || bw64.CPUStack.Median != 2 {
		t.Errorf("tcp_bw 64 B CPU: %+v, stack %+v", bw64.CPURatio, bw64.CPUStack)
	}
	if bw16 := byKey["tcp_bw16 KiB"]; !near(bw16.Ratio.Median, 3) || !bw16.Target.Met(bw16.Ratio.Median) || bw16.StackN != 8 || bw16.StackRedirected != 0 {
		t.Errorf("tcp_bw 16 KiB: %+v, stack arm %d of %d redirected", bw16.Ratio, bw16.StackRedirected, bw16.StackN)
	}
	missed := r.Missed()
	if len(missed) != 2 || missed[0] != "tcp_lat 64 B (0.53×, want ≤ 0.5×)" || missed[1] != "tcp_bw 64 B (0.50×, want ≥ 1.0×)" {
		t.Errorf("Missed = %q", missed)
	}
	// a value per repetition, NaN where the measurement failed
	if v := r.Values(TestBW, 64, ArmBypass); len(v) != 8 || !math.IsNaN(v[7]) || v[0] != 0.5e9 {
		t.Errorf("Values(tcp_bw, 64, bypass) = %v", v)
	}
}

func TestReportFiles(t *testing.T) {
	r := fakeReport()
	md := r.Markdown()
	for _, want := range []string{
		"**Bypass attached by: direct** — loaded by the test. Why not the agent: the agent keeps the bypass off: splice.",
		"| 64 B | 24.50 (21.00–28.00) | 12.88 (7.35–19.60) | 0.53× [0.35–0.70] | ≤ 0.5× | no (CI crosses) |",
		"| 16 KiB | 4500.0 (1000.0–8000.0) | 13500.0 (3000.0–24000.0) | 3.00× [3.00–3.00] | ≥ 2.5× | yes |",
		"| 64 B | 2.000 (2.000–2.000) | 1.000 (1.000–1.000) | 0.50× [CI: < 8 pairs] |",
		"| tcp_bw | 64 B | 7 of 7 | 1.00 (1.00–1.00) | 0 of 7 | 0 of 7 | 0 of 7 | 0 of 8 |",
		"| tcp_bw | 16 KiB | 8 of 8 | 0.25 (0.25–0.25) | 8 of 8 | 0 of 8 | 0 of 8 | 0 of 8 |",
		"Missed (paired median): tcp_lat 64 B (0.53×, want ≤ 0.5×); tcp_bw 64 B (0.50×, want ≥ 1.0×).",
		"load average 0.5 0.4 0.3 at the start",
		"- rep 8 tcp_bw 64 B bypass: qperf: failed to connect",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("results.md lacks %q:\n%s", want, md)
		}
	}
	dir := t.TempDir()
	if err := r.WriteFiles(dir); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join(dir, "results.csv"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := csv.NewReader(f).ReadAll()
	if err != nil || len(recs) != 1+len(r.Samples) || recs[0][0] != "rep" || recs[0][9] != "redirect_bytes" {
		t.Fatalf("results.csv: %d records (want %d), header %v, %v", len(recs), 1+len(r.Samples), recs[0], err)
	}
	if got := recs[2]; got[1] != "tcp_lat" || got[3] != ArmBypass || got[9] != "1000" || got[6] != "us" {
		t.Errorf("results.csv row 2 = %v", got)
	}
	b, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var js struct {
		Attach  string `json:"attach"`
		PSIEnd  *float64
		Samples []struct {
			Value *float64 `json:"value"`
			Err   string   `json:"error"`
		} `json:"samples"`
		Rows []struct {
			Test  string `json:"test"`
			Met   bool   `json:"met"`
			Ratio struct {
				N      int      `json:"n"`
				Median *float64 `json:"median"`
				Lo     *float64 `json:"ci95Lo"`
			} `json:"ratio"`
		} `json:"rows"`
	}
	if err := json.Unmarshal(b, &js); err != nil {
		t.Fatalf("results.json: %v\n%s", err, b)
	}
	if js.Attach != AttachDirect || len(js.Samples) != len(r.Samples) || len(js.Rows) != 4 || js.PSIEnd != nil {
		t.Fatalf("results.json: attach %q, %d samples, %d rows, psiEnd %v", js.Attach, len(js.Samples), len(js.Rows), js.PSIEnd)
	}
	nulls := 0
	for _, s := range js.Samples {
		if s.Value == nil {
			nulls++
			if s.Err == "" {
				t.Error("a sample without value has no error")
			}
		}
	}
	back, err := ReadReport(filepath.Join(dir, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	if got := back.Markdown(); got != md {
		t.Errorf("results.md rendered from results.json differs:\n%s\nwant:\n%s", got, md)
	}
	if _, err := ReadReport(filepath.Join(dir, "results.csv")); err == nil || !strings.Contains(err.Error(), "not a sockmap benchmark's results.json") {
		t.Errorf("ReadReport(results.csv) = %v", err)
	}
	if nulls != 1 || js.Rows[2].Test != TestBW || js.Rows[2].Ratio.N != 7 || js.Rows[2].Ratio.Lo != nil || js.Rows[2].Met {
		t.Errorf("results.json: %d null values (want 1), row 3 %+v", nulls, js.Rows[2])
	}
}

func TestCounterDeltasAndSizes(t *testing.T) {
	d := counterDeltas(map[string]uint64{"redirect_bytes": 10, "pass_bytes": 5, "admit_pod": 2},
		map[string]uint64{"redirect_bytes": 25, "pass_bytes": 5, "admit_pod": 4, "backpressure": 1})
	if len(d) != 3 || d["redirect_bytes"] != 15 || d["admit_pod"] != 2 || d["backpressure"] != 1 {
		t.Errorf("counterDeltas = %v", d)
	}
	for n, want := range map[int]string{1: "1 B", 1024: "1 KiB", 16384: "16 KiB", 1500: "1500 B"} {
		if got := sizeLabel(n); got != want {
			t.Errorf("sizeLabel(%d) = %q, want %q", n, got, want)
		}
	}
	if _, err := (Config{}).withDefaults(); err == nil || !strings.Contains(err.Error(), "axon lab up") {
		t.Errorf("Config without a lab: %v", err)
	}
}

// The share of a measurement's bytes that the bypass redirected: over what
// qperf received for tcp_bw (a socket that left the map is in no counter),
// over the counters' bytes otherwise.
func TestRedirectShare(t *testing.T) {
	for _, tc := range []struct {
		name   string
		s      Sample
		want   float64
		wantOK bool
	}{
		{"bw, all redirected", Sample{Test: TestBW, RecvBytes: 1000, Counters: map[string]uint64{"redirect_bytes": 1000}}, 1, true},
		{"bw, left the map after a fifth", Sample{Test: TestBW, RecvBytes: 1000, Counters: map[string]uint64{"redirect_bytes": 200, "pass_bytes": 10}}, 0.2, true},
		{"bw, control connection counted too", Sample{Test: TestBW, RecvBytes: 1000, Counters: map[string]uint64{"redirect_bytes": 1040}}, 1, true},
		{"bw without received bytes: the counters", Sample{Test: TestBW, Counters: map[string]uint64{"redirect_bytes": 300, "pass_bytes": 100}}, 0.75, true},
		{"lat: the counters", Sample{Test: TestLat, RecvBytes: 5, Counters: map[string]uint64{"redirect_bytes": 90, "pass_bytes": 10}}, 0.9, true},
		{"nothing written", Sample{Test: TestLat, Counters: map[string]uint64{}}, 0, false},
	} {
		got, ok := redirectShare(tc.s)
		if ok != tc.wantOK || math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("%s: redirectShare = %v, %v; want %v, %v", tc.name, got, ok, tc.want, tc.wantOK)
		}
	}
}
