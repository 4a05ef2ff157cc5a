package bypass

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/axonhq/axon/internal/bench"
	"github.com/axonhq/axon/internal/bench/jsonnum"
)

// PodRef names a bench pod and its address.
type PodRef struct {
	Name string `json:"name"`
	IP   string `json:"ip"`
}

// Report is the outcome of Run.
type Report struct {
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished"`
	Command  string    `json:"command,omitempty"`
	Node     string    `json:"node"`
	// Attach is AttachAgent or AttachDirect; AttachReason says why direct
	// (the agent's reason for keeping the bypass off), AttachDetail what
	// was loaded where.
	Attach       string        `json:"attach"`
	AttachReason string        `json:"attachReason,omitempty"`
	AttachDetail string        `json:"attachDetail,omitempty"`
	Reps         int           `json:"reps"`
	Duration     time.Duration `json:"duration"`
	Sizes        []int         `json:"sizes"`
	BWSizes      []int         `json:"bwSizes,omitempty"` // tcp_bw's sizes; none: Sizes
	Tests        []string      `json:"tests"`
	ClientCPU    int           `json:"clientCPU"`
	ServerCPU    int           `json:"serverCPU"`
	Host         bench.Host    `json:"host"`
	Qperf        string        `json:"qperf"`
	// Machine load: /proc/loadavg and CPU pressure (some avg10, %) at the
	// start and at the end.
	LoadStart string  `json:"loadavgStart"`
	LoadEnd   string  `json:"loadavgEnd"`
	PSIStart  float64 `json:"-"`
	PSIEnd    float64 `json:"-"`
	Client    PodRef  `json:"client"`
	Server    PodRef  `json:"server"`
	ServerCmd string  `json:"serverCommand"`
	ClientCmd string  `json:"clientCommand"`
	// Chain is the sidecar chain's setup (nil: the pods talk directly).
	Chain   *ChainInfo `json:"chain,omitempty"`
	Samples []Sample   `json:"-"` // in results.json through JSON()
}

// Target is a feature target for the ratio bypass/stack; the zero Target
// is none.
type Target struct {
	AtMost bool    // ratio ≤ Bound (latency); otherwise ratio ≥ Bound
	Bound  float64 // 0: no target
}

// None reports whether there is no target.
func (t Target) None() bool { return t.Bound == 0 }

// TargetFor is the same-node TCP bypass's target for test at size: latency
// ≤ 0.5× the stack at every size; throughput ≥ 1.0× at every size and
// ≥ 2.5× at 16 KiB.
func TargetFor(test string, size int) Target {
	switch {
	case test == TestLat:
		return Target{AtMost: true, Bound: 0.5}
	case size == 16384:
		return Target{Bound: 2.5}
	}
	return Target{Bound: 1.0}
}

// ChainTargetFor is the sidecar chain's target: request/response latency
// ≤ 0.6× the chain without the bypass; throughput has none (its CPU per GB
// is reported).
func ChainTargetFor(test string, _ int) Target {
	if test == TestLat {
		return Target{AtMost: true, Bound: 0.6}
	}
	return Target{}
}

// target is the run's target for test at size.
func (r *Report) target(test string, size int) Target {
	if r.Chain != nil {
		return ChainTargetFor(test, size)
	}
	return TargetFor(test, size)
}

// measured reports whether the run measures test at size (tcp_bw only at
// BWSizes when set).
func (r *Report) measured(test string, size int) bool {
	return test != TestBW || len(r.BWSizes) == 0 || slices.Contains(r.BWSizes, size)
}

// Met reports whether ratio meets the target (false for NaN; true when
// there is none).
func (t Target) Met(ratio float64) bool {
	if t.None() {
		return true
	}
	if math.IsNaN(ratio) {
		return false
	}
	if t.AtMost {
		return ratio <= t.Bound
	}
	return ratio >= t.Bound
}

func (t Target) String() string {
	if t.None() {
		return "—"
	}
	op := "≥"
	if t.AtMost {
		op = "≤"
	}
	return op + " " + strconv.FormatFloat(t.Bound, 'f', 1, 64) + "×"
}

// Verdict renders whether the paired median meets t: "yes", "no" or
// "n/a", with "(CI crosses)" when the 95 % interval lies on both sides of
// the bound.
func (t Target) Verdict(p bench.PairedRatio) string {
	if t.None() {
		return "—"
	}
	if p.N == 0 {
		return "n/a"
	}
	v := "no"
	if t.Met(p.Median) {
		v = "yes"
	}
	if !math.IsNaN(p.Lo) && t.Met(p.Lo) != t.Met(p.Hi) {
		v += " (CI crosses)"
	}
	return v
}

// Values are the values of test at size in arm, one per repetition (index
// rep-1), NaN where not measured.
func (r *Report) Values(test string, size int, arm string) []float64 {
	return r.values(test, size, arm, func(s Sample) float64 { return s.Value })
}

// CPUPerGB is like Values for the CPU seconds per GB (tcp_bw).
func (r *Report) CPUPerGB(size int, arm string) []float64 {
	return r.values(TestBW, size, arm, func(s Sample) float64 { return s.CPUPerGB })
}

func (r *Report) values(test string, size int, arm string, v func(Sample) float64) []float64 {
	out := make([]float64, r.Reps)
	for i := range out {
		out[i] = math.NaN()
	}
	for _, s := range r.Samples {
		if s.Test == test && s.Size == size && s.Arm == arm && s.Rep >= 1 && s.Rep <= r.Reps {
			out[s.Rep-1] = v(s)
		}
	}
	return out
}

// Row is the summary of one test at one size.
type Row struct {
	Test          string
	Size          int
	Stack, Bypass bench.Stats
	Ratio         bench.PairedRatio // bypass/stack per repetition
	Target        Target
	// CPU seconds per GB (tcp_bw).
	CPUStack, CPUBypass bench.Stats
	CPURatio            bench.PairedRatio
	// Bypassed: measurements of each arm, and of those the ones during
	// which redirect_bytes moved (bypass: all; stack: none).
	BypassN, BypassRedirected int
	StackN, StackRedirected   int
	// RedirectShare: per bypass-arm measurement, the bytes redirected over
	// all the bytes written: for tcp_bw the bytes qperf received (a socket
	// that left the map writes as plain TCP, which no counter sees), else
	// redirect_bytes + pass_bytes. Below 1 when a writer took the stack
	// (BackpressureN: the peer fell more than the back-pressure bound
	// behind; SwitchedN: the small-write rule) and LeftN: sockets left the
	// map.
	RedirectShare                   bench.Stats
	BackpressureN, SwitchedN, LeftN int
}

// redirectShare is the share of a bypass-arm measurement's bytes that
// axon_sk_msg redirected: over the bytes qperf received for tcp_bw (the
// bytes of a socket that left the map appear in no counter), over
// redirect_bytes + pass_bytes otherwise; capped at 1 (the tcp_bw count
// includes qperf's control connection). ok is false without bytes.
func redirectShare(s Sample) (float64, bool) {
	red := float64(s.Counters["redirect_bytes"])
	all := float64(s.Counters["redirect_bytes"] + s.Counters["pass_bytes"])
	if s.Test == TestBW && s.RecvBytes > 0 {
		all = s.RecvBytes
	}
	if all <= 0 {
		return 0, false
	}
	return min(1, red/all), true
}

// Rows summarises every test and size, in the run's order.
func (r *Report) Rows() []Row {
	var rows []Row
	for _, test := range r.Tests {
		for _, size := range r.Sizes {
			if !r.measured(test, size) {
				continue
			}
			st, by := r.Values(test, size, ArmStack), r.Values(test, size, ArmBypass)
			row := Row{Test: test, Size: size, Stack: bench.Summarize(st), Bypass: bench.Summarize(by),
				Ratio: bench.Pair(by, st), Target: r.target(test, size)}
			if test == TestBW {
				cs, cb := r.CPUPerGB(size, ArmStack), r.CPUPerGB(size, ArmBypass)
				row.CPUStack, row.CPUBypass, row.CPURatio = bench.Summarize(cs), bench.Summarize(cb), bench.Pair(cb, cs)
			}
			var share []float64
			for _, s := range r.Samples {
				if s.Test != test || s.Size != size || s.Err != "" {
					continue
				}
				moved := s.Counters["redirect_bytes"] > 0
				if s.Arm == ArmBypass {
					row.BypassN++
					if moved {
						row.BypassRedirected++
					}
					if sh, ok := redirectShare(s); ok {
						share = append(share, sh)
					}
					if s.Counters["backpressure"] > 0 {
						row.BackpressureN++
					}
					if s.Counters["switch_stack"] > 0 {
						row.SwitchedN++
					}
					if s.Counters["left"] > 0 {
						row.LeftN++
					}
				} else {
					row.StackN++
					if moved {
						row.StackRedirected++
					}
				}
			}
			row.RedirectShare = bench.Summarize(share)
			rows = append(rows, row)
		}
	}
	return rows
}

// Missed lists the rows whose paired median misses its target, as
// "tcp_bw 64 B (0.71×, want ≥ 1.0×)".
func (r *Report) Missed() []string {
	var out []string
	for _, row := range r.Rows() {
		if !row.Target.None() && !row.Target.Met(row.Ratio.Median) {
			out = append(out, fmt.Sprintf("%s %s (%s, want %s)", row.Test, sizeLabel(row.Size), bench.FormatRatio(row.Ratio.Median), row.Target))
		}
	}
	return out
}

// sizeLabel renders 16384 as "16 KiB", 64 as "64 B".
func sizeLabel(n int) string {
	if n >= 1024 && n%1024 == 0 {
		return strconv.Itoa(n/1024) + " KiB"
	}
	return strconv.Itoa(n) + " B"
}

// formatCI renders a paired ratio as "0.42× [0.40–0.45]".
func formatCI(p bench.PairedRatio) string {
	if p.N == 0 {
		return "n/a"
	}
	if math.IsNaN(p.Lo) {
		return bench.FormatRatio(p.Median) + " [CI: < 8 pairs]"
	}
	return fmt.Sprintf("%s [%s–%s]", bench.FormatRatio(p.Median), bench.FormatNum(p.Lo, 2), bench.FormatNum(p.Hi, 2))
}

// Table renders the two results tables (latency, throughput): size, stack
// and bypass medians, the paired ratio with its 95 % interval, the target
// and whether it is met.
func (r *Report) Table() string {
	var b strings.Builder
	rows := r.Rows()
	for _, test := range r.Tests {
		unit, scale, prec := "one-way latency µs (qperf: half the round trip)", 1.0, 2
		if test == TestBW {
			unit, scale, prec = "throughput Mbit/s", 1e6, 1
		}
		fmt.Fprintf(&b, "**%s**, %s, median (min–max) of %s\n\n", test, unit, plural(r.Reps, "repetition"))
		fmt.Fprintf(&b, "| size | %s | %s | bypass/stack, paired median [95 %% CI] | target | met? |\n|---:|---:|---:|---:|---:|---|\n", r.armLabel(ArmStack), r.armLabel(ArmBypass))
		for _, row := range rows {
			if row.Test != test {
				continue
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s |\n", sizeLabel(row.Size), bench.Cell(row.Stack, scale, prec),
				bench.Cell(row.Bypass, scale, prec), formatCI(row.Ratio), row.Target, row.Target.Verdict(row.Ratio))
		}
		b.WriteString("\n")
	}
	return b.String()
}

// Markdown renders results.md: how it was measured, the tables, the CPU
// cost per byte, the check that the bypass arm was bypassed, the targets
// missed, the machine's load, the commands and any failures.
func (r *Report) Markdown() string {
	var b strings.Builder
	if r.Chain != nil {
		b.WriteString("# Same-node TCP bypass benchmark: sidecar chain\n\n")
		b.WriteString(r.chainIntro())
	} else {
		b.WriteString("# Same-node TCP bypass benchmark\n\n")
	}
	fmt.Fprintf(&b, "Run %s → %s UTC on %s (kernel %s, %d CPUs). qperf (%s) between two pods of %s, "+
		"%s (%s) → %s (%s), client pinned to CPU %d and server to CPU %d; `-t %s` per measurement, %s. "+
		"In every repetition each test and size is measured with the bypass and without it (the TCP stack) back to back, "+
		"the order alternating between pairs and repetitions; qperf connects anew for every measurement. "+
		"Ratios are bypass/stack per repetition (paired), median with its distribution-free 95 %% interval (8 repetitions or more).\n\n",
		r.Started.Format("2006-01-02 15:04:05"), r.Finished.Format("15:04:05"), bench.OrNA(r.Host.CPUModel), r.Host.Kernel, r.Host.NumCPU,
		bench.OrNA(r.Qperf), r.Node, r.Client.Name, r.Client.IP, r.Server.Name, r.Server.IP, r.ClientCPU, r.ServerCPU,
		strconv.Itoa(int(math.Ceil(r.Duration.Seconds()))), plural(r.Reps, "repetition"))
	fmt.Fprintf(&b, "**Bypass attached by: %s** — %s.", r.Attach, r.AttachDetail)
	if r.AttachReason != "" {
		fmt.Fprintf(&b, " Why not the agent: %s.", strings.TrimSuffix(r.AttachReason, "."))
	}
	b.WriteString("\n\n")
	fmt.Fprintf(&b, "**Machine load** (shared 2-CPU machine): load average %s at the start, %s at the end; "+
		"CPU pressure (some avg10) %s at the start, %s at the end, %s during the measurements (median, min–max).\n\n",
		r.LoadStart, bench.OrNA(r.LoadEnd), pct(r.PSIStart), pct(r.PSIEnd), r.psiDuring())

	b.WriteString("## Results\n\n")
	b.WriteString(r.Table())

	rows := r.Rows()
	if hasTest(r.Tests, TestBW) {
		b.WriteString("## CPU per byte (tcp_bw)\n\n")
		b.WriteString("Busy time (user, system, irq, softirq) of the client's and the server's CPUs during the run, " +
			"over the bytes received: CPU seconds per GB, median (min–max).\n\n")
		fmt.Fprintf(&b, "| size | %s | %s | bypass/stack, paired median [95 %% CI] |\n|---:|---:|---:|---:|\n", r.armLabel(ArmStack), r.armLabel(ArmBypass))
		for _, row := range rows {
			if row.Test == TestBW {
				fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", sizeLabel(row.Size), bench.Cell(row.CPUStack, 1, 3), bench.Cell(row.CPUBypass, 1, 3), formatCI(row.CPURatio))
			}
		}
		b.WriteString("\n")
	}

	b.WriteString("## Was the bypass arm bypassed?\n\n")
	b.WriteString("The bypass's counters read before and after every measurement: `redirect_bytes` (bytes `axon_sk_msg` moved into the peer socket), " +
		"`pass_bytes` (bytes of bypassed sockets' writes that took TCP), `backpressure` (writers moved to the stack because the peer fell behind), " +
		"`switch_stack` (writers moved to the stack by the small-write rule), `left` (sockets that left the map and continued as plain TCP). " +
		"Share redirected = redirect_bytes over the bytes qperf received (tcp_bw; a socket that left the map is in no counter) " +
		"or over redirect_bytes + pass_bytes (tcp_lat), per bypass-arm measurement, median (min–max).\n\n")
	b.WriteString("| test | size | bypass arm: redirect_bytes moved | share redirected | back-pressure switched | small-write rule switched | left the map | stack arm: redirect_bytes moved |\n|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, row := range rows {
		fmt.Fprintf(&b, "| %s | %s | %d of %d | %s | %d of %d | %d of %d | %d of %d | %d of %d |\n", row.Test, sizeLabel(row.Size), row.BypassRedirected, row.BypassN,
			bench.Cell(row.RedirectShare, 1, 2), row.BackpressureN, row.BypassN, row.SwitchedN, row.BypassN, row.LeftN, row.BypassN, row.StackRedirected, row.StackN)
	}
	b.WriteString("\n")

	if r.Chain != nil {
		b.WriteString(r.hopsMarkdown())
	}

	b.WriteString("## Targets\n\n")
	if missed := r.Missed(); len(missed) > 0 {
		fmt.Fprintf(&b, "Missed (paired median): %s.\n\n", strings.Join(missed, "; "))
	} else {
		b.WriteString("Every target met (paired median).\n\n")
	}

	b.WriteString("## Commands\n\n```sh\n")
	if r.Command != "" {
		b.WriteString(r.Command + "\n")
	}
	fmt.Fprintf(&b, "# server, in pod %s's cgroup:\n%s\n# client, in pod %s's cgroup, per test (tcp_lat|tcp_bw) and size:\n%s\n```\n",
		r.Server.Name, r.ServerCmd, r.Client.Name, r.ClientCmd)
	if r.Chain != nil {
		b.WriteString(r.chainSetup())
	}

	var fails []string
	for _, s := range r.Samples {
		if s.Err != "" {
			fails = append(fails, fmt.Sprintf("- rep %d %s %s %s: %s", s.Rep, s.Test, sizeLabel(s.Size), s.Arm, s.Err))
		}
	}
	if len(fails) > 0 {
		b.WriteString("\n## Failures\n\n" + strings.Join(fails, "\n") + "\n")
	}
	return b.String()
}

// plural renders "1 repetition", "8 repetitions".
func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return strconv.Itoa(n) + " " + word + "s"
}

func hasTest(tests []string, t string) bool {
	for _, x := range tests {
		if x == t {
			return true
		}
	}
	return false
}

func pct(v float64) string {
	if math.IsNaN(v) {
		return "n/a"
	}
	return strconv.FormatFloat(v, 'f', 1, 64) + " %"
}

// psiDuring is the CPU pressure after each measurement: median (min–max).
func (r *Report) psiDuring() string {
	var xs []float64
	for _, s := range r.Samples {
		xs = append(xs, s.PSIAfter)
	}
	st := bench.Summarize(xs)
	if st.N == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.1f %% (%.1f–%.1f)", st.Median, st.Min, st.Max)
}

// CSV renders one row per measurement.
func (r *Report) CSV() []byte {
	var buf bytes.Buffer
	w := csv.NewWriter(&buf)
	_ = w.Write([]string{"rep", "test", "size", "arm", "first", "value", "unit", "cpu_s_per_gb", "recv_bytes",
		"redirect_bytes", "pass_bytes", "backpressure", "admit_pod", "skip_not_pod", "psi_before", "psi_after", "error"})
	num := func(v float64, prec int) string {
		if math.IsNaN(v) {
			return ""
		}
		return strconv.FormatFloat(v, 'f', prec, 64)
	}
	for _, s := range r.Samples {
		unit := "us"
		if s.Test == TestBW {
			unit = "bit/s"
		}
		_ = w.Write([]string{strconv.Itoa(s.Rep), s.Test, strconv.Itoa(s.Size), s.Arm, strconv.FormatBool(s.First),
			num(s.Value, 3), unit, num(s.CPUPerGB, 4), num(s.RecvBytes, 0),
			strconv.FormatUint(s.Counters["redirect_bytes"], 10), strconv.FormatUint(s.Counters["pass_bytes"], 10), strconv.FormatUint(s.Counters["backpressure"], 10),
			strconv.FormatUint(s.Counters["admit_pod"], 10), strconv.FormatUint(s.Counters["skip_not_pod"], 10),
			num(s.PSIBefore, 2), num(s.PSIAfter, 2), s.Err})
	}
	w.Flush()
	return buf.Bytes()
}

// JSON renders results.json: the report, every sample, and each row's
// summary (NaN as null).
func (r *Report) JSON() ([]byte, error) {
	type sample struct {
		Sample
		Value     *float64 `json:"value"`
		CPUPerGB  *float64 `json:"cpuSecondsPerGB,omitempty"`
		PSIBefore *float64 `json:"psiBefore"`
		PSIAfter  *float64 `json:"psiAfter"`
	}
	type paired struct {
		N      int      `json:"n"`
		Median *float64 `json:"median"`
		Lo     *float64 `json:"ci95Lo"`
		Hi     *float64 `json:"ci95Hi"`
	}
	pr := func(p bench.PairedRatio) paired {
		return paired{p.N, jsonnum.From(p.Median), jsonnum.From(p.Lo), jsonnum.From(p.Hi)}
	}
	type row struct {
		Test         string   `json:"test"`
		Size         int      `json:"size"`
		StackMedian  *float64 `json:"stackMedian"`
		BypassMedian *float64 `json:"bypassMedian"`
		Ratio        paired   `json:"ratio"`
		Target       string   `json:"target"`
		Met          bool     `json:"met"`
		CPURatio     *paired  `json:"cpuPerGBRatio,omitempty"`
		Redirected   [2]int   `json:"bypassArmRedirected"` // measurements with redirect_bytes moved, of all
		StackRedir   [2]int   `json:"stackArmRedirected"`
	}
	v := struct {
		*Report
		PSIStart *float64 `json:"psiStart"`
		PSIEnd   *float64 `json:"psiEnd"`
		Samples  []sample `json:"samples"`
		Rows     []row    `json:"rows"`
	}{Report: r, PSIStart: jsonnum.From(r.PSIStart), PSIEnd: jsonnum.From(r.PSIEnd)}
	for _, s := range r.Samples {
		v.Samples = append(v.Samples, sample{s, jsonnum.From(s.Value), jsonnum.From(s.CPUPerGB), jsonnum.From(s.PSIBefore), jsonnum.From(s.PSIAfter)})
	}
	for _, rw := range r.Rows() {
		x := row{Test: rw.Test, Size: rw.Size, StackMedian: jsonnum.From(rw.Stack.Median), BypassMedian: jsonnum.From(rw.Bypass.Median),
			Ratio: pr(rw.Ratio), Target: rw.Target.String(), Met: rw.Target.Met(rw.Ratio.Median),
			Redirected: [2]int{rw.BypassRedirected, rw.BypassN}, StackRedir: [2]int{rw.StackRedirected, rw.StackN}}
		if rw.Test == TestBW {
			c := pr(rw.CPURatio)
			x.CPURatio = &c
		}
		v.Rows = append(v.Rows, x)
	}
	return json.MarshalIndent(v, "", "  ")
}

// ReadReport reads the results.json that WriteFiles wrote (to render the
// report again).
func ReadReport(path string) (*Report, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read the benchmark's results: %w", err)
	}
	var v struct {
		Report
		PSIStart *float64 `json:"psiStart"`
		PSIEnd   *float64 `json:"psiEnd"`
		Samples  []struct {
			Sample
			Value     *float64 `json:"value"`
			CPUPerGB  *float64 `json:"cpuSecondsPerGB"`
			PSIBefore *float64 `json:"psiBefore"`
			PSIAfter  *float64 `json:"psiAfter"`
		} `json:"samples"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, fmt.Errorf("%s is not a sockmap benchmark's results.json: %w", path, err)
	}
	r := v.Report
	r.PSIStart, r.PSIEnd = jsonnum.To(v.PSIStart), jsonnum.To(v.PSIEnd)
	for _, s := range v.Samples {
		x := s.Sample
		x.Value, x.CPUPerGB, x.PSIBefore, x.PSIAfter = jsonnum.To(s.Value), jsonnum.To(s.CPUPerGB), jsonnum.To(s.PSIBefore), jsonnum.To(s.PSIAfter)
		r.Samples = append(r.Samples, x)
	}
	if r.Reps < 1 || len(r.Tests) == 0 || len(r.Sizes) == 0 {
		return nil, fmt.Errorf("%s has no repetitions, tests or sizes: not a sockmap benchmark's results.json", path)
	}
	return &r, nil
}

// WriteFiles writes results.csv, results.md and results.json into dir.
func (r *Report) WriteFiles(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create results dir: %w", err)
	}
	js, err := r.JSON()
	if err != nil {
		return fmt.Errorf("encode results.json: %w", err)
	}
	return bench.WriteResultFiles(dir,
		bench.ResultFile{Name: "results.csv", Data: r.CSV()},
		bench.ResultFile{Name: "results.md", Data: []byte(r.Markdown())},
		bench.ResultFile{Name: "results.json", Data: append(js, '\n')})
}

// armLabel is the tables' name of arm: "stack"/"bypass", or for the chain
// "chain, stack"/"chain, bypass".
func (r *Report) armLabel(arm string) string {
	if r.Chain != nil {
		return "chain, " + arm
	}
	return arm
}
