package bench

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/axonhq/axon/internal/bench/jsonnum"
	"github.com/axonhq/axon/internal/stats"
)

// metricInfo lists the per-rep metrics in CSV order with their units.
var metricInfo = []struct{ name, unit string }{
	{MetricThroughput, "bit/s"},
	{MetricRetransmits, "count"},
	{MetricDSACK, "count"},
	{MetricCPUPerGB, "s/GB"},
	{MetricRTTP50, "us"},
	{MetricRTTP99, "us"},
	{MetricRTTAvg, "us"},
}

// Stats returns min/median/max of one metric of the named path.
func (r *Report) Stats(path, metric string) Stats {
	res := r.Result(path)
	if res == nil {
		return Summarize(nil)
	}
	return Summarize(res.Values(metric))
}

// Ratio returns the named path's median of metric divided by the reference
// path's median of the same metric (NaN when either is missing).
func (r *Report) Ratio(path, metric string) float64 {
	return Ratio(r.Stats(path, metric).Median, r.Stats(r.Reference, metric).Median)
}

// PairedRatio is one path's metric divided by the reference's, repetition
// by repetition: both were measured back to back within each repetition, so
// drift of the machine between repetitions cancels out of each ratio.
type PairedRatio struct {
	N        int     // repetitions where both were measured
	Above    int     // of those, repetitions whose ratio is above 1
	Median   float64 // median of the per-repetition ratios
	Lo, Hi   float64 // distribution-free 95 % CI of that median (NaN below 8 pairs)
	Min, Max float64 // smallest and largest per-repetition ratio
	// RefMedian is the median of the reference's values in those pairs: the
	// speed (or latency) at which the ratio holds.
	RefMedian float64
}

// Paired returns the named path's per-repetition ratios of metric to the
// reference path (NaN fields when none can be formed).
func (r *Report) Paired(path, metric string) PairedRatio {
	return r.PairedTo(path, r.Reference, metric)
}

// PairedTo is Paired against any other path of the run (both measured in
// every repetition, so each ratio is of two back-to-back measurements).
func (r *Report) PairedTo(path, ref, metric string) PairedRatio {
	res, rr := r.Result(path), r.Result(ref)
	if res == nil || rr == nil {
		return Pair(nil, nil)
	}
	return Pair(res.Values(metric), rr.Values(metric))
}

// Pair is the per-repetition ratios vs[i]/refs[i] summarised: the pairs
// where both were measured (finite and refs[i] not 0), the median ratio and
// its 95 % interval (stats.MedianCI), the range and how many are above 1.
func Pair(vs, refs []float64) PairedRatio {
	nan := math.NaN()
	out := PairedRatio{Median: nan, Lo: nan, Hi: nan, Min: nan, Max: nan, RefMedian: nan}
	var ratios, paired []float64
	for i := range min(len(vs), len(refs)) {
		if q := Ratio(vs[i], refs[i]); !math.IsNaN(q) && !math.IsInf(q, 0) {
			ratios = append(ratios, q)
			paired = append(paired, refs[i])
			if q > 1 {
				out.Above++
			}
		}
	}
	out.N = len(ratios)
	st := Summarize(ratios)
	out.Median, out.Min, out.Max = st.Median, st.Min, st.Max
	out.Lo, out.Hi = stats.MedianCI(ratios)
	if len(paired) > 0 {
		out.RefMedian = stats.Median(paired)
	}
	return out
}

// FormatPaired renders "1.04× (1.020–1.060)", the interval replaced by a
// note when there are fewer than 8 pairs, "n/a" without any.
func FormatPaired(p PairedRatio) string {
	if p.N == 0 {
		return "n/a"
	}
	if math.IsNaN(p.Lo) {
		return FormatRatio(p.Median) + " (CI: < 8 pairs)"
	}
	return fmt.Sprintf("%s (%s–%s)", FormatRatio(p.Median), strconv.FormatFloat(p.Lo, 'f', 3, 64), strconv.FormatFloat(p.Hi, 'f', 3, 64))
}

// PairedTable renders the per-repetition ratios of every path but the
// reference, with their 95 % intervals.
func (r *Report) PairedTable() string {
	var b strings.Builder
	fmt.Fprintf(&b, "| path | throughput ratio, paired (95 %% CI) | at %s Gbit/s (its median in the pairs) | CPU per GB ratio, paired (95 %% CI) | RTT p50 ratio, paired (95 %% CI) | RTT p99 ratio, paired (95 %% CI) | pairs |\n", MarkdownEscape(r.Reference))
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|\n")
	for _, res := range r.Results {
		if res.Path == r.Reference {
			continue
		}
		tp, p50, p99 := r.Paired(res.Path, MetricThroughput), r.Paired(res.Path, MetricRTTP50), r.Paired(res.Path, MetricRTTP99)
		cpu := r.Paired(res.Path, MetricCPUPerGB)
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %d |\n", MarkdownEscape(res.Path), FormatPaired(tp), FormatNum(tp.RefMedian/1e9, 2),
			FormatPaired(cpu), FormatPaired(p50), FormatPaired(p99), max(tp.N, p50.N))
	}
	return b.String()
}

// CSV renders one row per sample: rep, path, metric, value, unit. Besides the
// metrics it has, per measurement, the CPU pressure (some avg10, %) before and
// after and the CPU stall time during it (µs), named <tool>.psi_before,
// <tool>.psi_after, <tool>.cpu_stall.
func (r *Report) CSV() []byte {
	var buf bytes.Buffer
	w := csv.NewWriter(&buf)
	_ = w.Write([]string{"rep", "path", "metric", "value", "unit"})
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }
	for n := 1; n <= r.Reps; n++ {
		for _, res := range r.Results {
			for _, mi := range metricInfo {
				vals := res.Values(mi.name)
				if n-1 < len(vals) && !math.IsNaN(vals[n-1]) {
					_ = w.Write([]string{strconv.Itoa(n), res.Path, mi.name, f(vals[n-1]), mi.unit})
				}
			}
			for _, m := range r.Measurements {
				if m.Rep != n || m.Path != res.Path || m.Err != "" {
					continue
				}
				if !math.IsNaN(m.Before.Avg10) {
					_ = w.Write([]string{strconv.Itoa(n), res.Path, m.Tool + ".psi_before", f(m.Before.Avg10), "%"})
				}
				if !math.IsNaN(m.After.Avg10) {
					_ = w.Write([]string{strconv.Itoa(n), res.Path, m.Tool + ".psi_after", f(m.After.Avg10), "%"})
					_ = w.Write([]string{strconv.Itoa(n), res.Path, m.Tool + ".cpu_stall", strconv.FormatUint(m.StallMicro, 10), "us"})
				}
			}
		}
	}
	w.Flush()
	return buf.Bytes()
}

func FormatNum(v float64, prec int) string {
	if math.IsNaN(v) {
		return "n/a"
	}
	return strconv.FormatFloat(v, 'f', prec, 64)
}

func FormatRatio(v float64) string {
	if math.IsNaN(v) {
		return "n/a"
	}
	return strconv.FormatFloat(v, 'f', 2, 64) + "×"
}

// Cell renders "median (min–max)" after dividing by scale.
func Cell(s Stats, scale float64, prec int) string {
	if s.N == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%s (%s–%s)", FormatNum(s.Median/scale, prec), FormatNum(s.Min/scale, prec), FormatNum(s.Max/scale, prec))
}

// Table renders the Markdown results table alone (for a README).
func (r *Report) Table() string {
	var b strings.Builder
	b.WriteString("| path | throughput Gbit/s median (min–max) | ratio | CPU s per GB median (min–max) | ratio | RTT p50 µs median (min–max) | ratio | RTT p99 µs median (min–max) | ratio | retransmits median | of which not needed (DSACK) |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, res := range r.Results {
		tp := r.Stats(res.Path, MetricThroughput)
		p50 := r.Stats(res.Path, MetricRTTP50)
		p99 := r.Stats(res.Path, MetricRTTP99)
		retr := r.Stats(res.Path, MetricRetransmits)
		dsack := r.Stats(res.Path, MetricDSACK)
		cpu := r.Stats(res.Path, MetricCPUPerGB)
		name := MarkdownEscape(res.Path)
		if res.Path == r.Reference {
			name += " (reference)"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", name,
			Cell(tp, 1e9, 2), FormatRatio(r.Ratio(res.Path, MetricThroughput)),
			Cell(cpu, 1, 3), FormatRatio(r.Ratio(res.Path, MetricCPUPerGB)),
			Cell(p50, 1, 1), FormatRatio(r.Ratio(res.Path, MetricRTTP50)),
			Cell(p99, 1, 1), FormatRatio(r.Ratio(res.Path, MetricRTTP99)),
			FormatNum(retr.Median, 0), FormatNum(dsack.Median, 0))
	}
	return b.String()
}

// cpuScope names the CPUs MetricCPUPerGB counted (runner.measuredCPUs).
func cpuScope(client, server int) string {
	switch {
	case client < 0:
		return "all CPUs"
	case server < 0 || server == client:
		return fmt.Sprintf("CPU %d", client)
	}
	return fmt.Sprintf("CPUs %d and %d (client and server)", client, server)
}

func MarkdownEscape(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

// ShellQuote renders argv as a copy-pasteable shell command.
func ShellQuote(argv []string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		if a != "" && strings.IndexFunc(a, func(c rune) bool {
			return !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("-_./=:,+@%", c))
		}) < 0 {
			q[i] = a
		} else {
			q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
	}
	return strings.Join(q, " ")
}

// Markdown renders the whole report: the table, how it was measured, the
// machine, CPU pressure, the exact commands and any failures.
func (r *Report) Markdown() string {
	var b strings.Builder
	b.WriteString("# axon benchmark\n\n")
	fmt.Fprintf(&b, "Run %s → %s UTC: %d repetitions × %s per path and metric, interleaved across paths (A B C …, A B C …).\n",
		r.Started.Format("2006-01-02 15:04:05"), r.Finished.Format("15:04:05"), r.Reps, r.Duration)
	fmt.Fprintf(&b, "Ratios are each path's median divided by the median of the reference path **%s** measured in the same run "+
		"(throughput: higher is better; RTT: lower is better).\n\n", MarkdownEscape(r.Reference))
	b.WriteString(r.Table())
	b.WriteString("\n")
	fmt.Fprintf(&b, "Paired: each repetition's value divided by the reference's of the same repetition (measured back to back), "+
		"median over repetitions with its distribution-free 95 %% confidence interval (sign-test order statistics; needs 8 pairs):\n\n")
	b.WriteString(r.PairedTable())
	b.WriteString("\n")
	fmt.Fprintf(&b, "- Throughput: single TCP flow, iperf3, bits/s received (`end.sum_received`), retransmits from the sender; \"not needed\" are the segments the receiver reported as duplicates (DSACK, TcpExt TCPDSACKRecvSegs in the client's netns): reordered, not lost.\n")
	fmt.Fprintf(&b, "- CPU per GB: busy time (user, system, irq, softirq; not steal) of %s during the iperf3 run, in CPU-seconds per 10⁹ bytes received. "+
		"The flow's packet processing runs there (softirqs run where the sender and the receiver run), so it compares the work per byte of two paths whatever limited their throughput; "+
		"anything else that ran on those CPUs is counted too.\n", cpuScope(r.ClientCPU, r.ServerCPU))
	fmt.Fprintf(&b, "- Latency: TCP request/response **round-trip time** (sockperf ping-pong `--full-rtt`, %d-byte messages, one connection), "+
		"percentiles over all messages of the run after sockperf's warm-up.\n", r.MessageSize)
	if r.ClientCPU >= 0 {
		fmt.Fprintf(&b, "- Client pinned to CPU %d, server to CPU %d (taskset).\n", r.ClientCPU, r.ServerCPU)
	} else {
		b.WriteString("- Client and server not pinned.\n")
	}

	b.WriteString("\n## Machine\n\n")
	fmt.Fprintf(&b, "- kernel %s, %s × %d CPUs\n", OrNA(r.Host.Kernel), OrNA(r.Host.CPUModel), r.Host.NumCPU)
	fmt.Fprintf(&b, "- %s; %s\n", OrNA(r.Host.Iperf3), OrNA(r.Host.Sockperf))
	var cong []string
	for _, res := range r.Results {
		if res.Congestion != "" && !slices.Contains(cong, res.Congestion) {
			cong = append(cong, res.Congestion)
		}
	}
	if len(cong) > 0 {
		fmt.Fprintf(&b, "- TCP congestion control: %s\n", strings.Join(cong, ", "))
	}
	var before, after []float64
	var stallTotal uint64
	var busy time.Duration
	for _, m := range r.Measurements {
		if m.Err != "" {
			continue
		}
		before = append(before, m.Before.Avg10)
		after = append(after, m.After.Avg10)
		stallTotal += m.StallMicro
		busy += m.Elapsed
	}
	pb, pa := Summarize(before), Summarize(after)
	if pb.N > 0 {
		fmt.Fprintf(&b, "- CPU pressure (`/proc/pressure/cpu` some avg10, %%): before measurements %s–%s (median %s), after %s–%s (median %s); "+
			"stalled %.2f s of %.1f s measured (%.1f%%)\n",
			FormatNum(pb.Min, 2), FormatNum(pb.Max, 2), FormatNum(pb.Median, 2), FormatNum(pa.Min, 2), FormatNum(pa.Max, 2), FormatNum(pa.Median, 2),
			float64(stallTotal)/1e6, busy.Seconds(), 100*float64(stallTotal)/math.Max(1, float64(busy.Microseconds())))
	} else {
		b.WriteString("- CPU pressure: not available (`/proc/pressure/cpu` missing or no measurement succeeded)\n")
	}

	b.WriteString("\n## Commands\n\n")
	for _, res := range r.Results {
		fmt.Fprintf(&b, "**%s**", MarkdownEscape(res.Path))
		if res.Client.Name != "" || res.Server.Name != "" {
			fmt.Fprintf(&b, " (%s %s → %s %s)", OrNA(res.Client.Name), res.Client.IP, OrNA(res.Server.Name), res.Server.IP)
		}
		b.WriteString("\n\n```\n")
		for _, tool := range []string{"iperf3", "sockperf"} {
			for _, m := range r.Measurements {
				if m.Path == res.Path && m.Tool == tool {
					if len(m.Server) > 0 {
						fmt.Fprintf(&b, "%s\n", ShellQuote(m.Server))
					}
					if len(m.Client) > 0 {
						fmt.Fprintf(&b, "%s\n", ShellQuote(m.Client))
					}
					break
				}
			}
		}
		b.WriteString("```\n\n")
	}

	var failures []string
	for _, res := range r.Results {
		for _, e := range res.Errors {
			failures = append(failures, fmt.Sprintf("- %s: %s", MarkdownEscape(res.Path), strings.ReplaceAll(e, "\n", " ")))
		}
	}
	if len(failures) > 0 {
		b.WriteString("## Failed measurements\n\n")
		b.WriteString(strings.Join(failures, "\n"))
		b.WriteString("\n")
	}
	return b.String()
}

func OrNA(s string) string {
	if s == "" {
		return "n/a"
	}
	return s
}

// SVG renders a hand-written chart: two panels of horizontal bars, median
// throughput and median RTT p50 per path, whiskers from min to max, each bar
// labelled with its value and its ratio to the reference.
func (r *Report) SVG() []byte {
	const (
		width   = 960
		labelW  = 300
		barW    = 440
		rowH    = 26
		headH   = 34
		padding = 16
	)
	type panel struct {
		title, metric string
		scale         float64
		unit          string
		prec          int
	}
	panels := []panel{
		{"Single-flow TCP throughput (iperf3), median, whiskers min–max — higher is better", MetricThroughput, 1e9, "Gbit/s", 2},
		{"TCP request/response round-trip time p50 (sockperf), median, whiskers min–max — lower is better", MetricRTTP50, 1, "µs", 1},
	}
	rows := len(r.Results)
	panelH := headH + rows*rowH + padding
	height := 40 + len(panels)*panelH + 24
	var b bytes.Buffer
	esc := XMLEscape
	SVGStart(&b, width, height, 13)
	fmt.Fprintf(&b, `<text x="%d" y="24" font-size="16" font-weight="bold">axon benchmark — %d reps × %s, ratios to %s (same run)</text>`+"\n",
		padding, r.Reps, r.Duration, esc(r.Reference))
	colors := []string{"#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7"}
	for pi, p := range panels {
		y0 := 40 + pi*panelH
		fmt.Fprintf(&b, `<text x="%d" y="%d" font-weight="bold">%s</text>`+"\n", padding, y0+20, esc(p.title))
		maxV := 0.0
		for _, res := range r.Results {
			if s := r.Stats(res.Path, p.metric); s.N > 0 {
				maxV = math.Max(maxV, s.Max)
			}
		}
		if maxV <= 0 {
			maxV = 1
		}
		x0 := padding + labelW
		for i, res := range r.Results {
			y := y0 + headH + i*rowH
			s := r.Stats(res.Path, p.metric)
			fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">%s</text>`+"\n", x0-8, y+15, esc(res.Path))
			if s.N == 0 {
				fmt.Fprintf(&b, `<text x="%d" y="%d" fill="#999">no data</text>`+"\n", x0+4, y+15)
				continue
			}
			w := func(v float64) float64 { return math.Max(0, v/maxV*barW) }
			fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>`+"\n", x0, y+3, w(s.Median), rowH-8, colors[i%len(colors)])
			cy := y + rowH/2 - 1
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="black"/>`+"\n", float64(x0)+w(s.Min), cy, float64(x0)+w(s.Max), cy)
			for _, v := range []float64{s.Min, s.Max} {
				fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="black"/>`+"\n", float64(x0)+w(v), cy-5, float64(x0)+w(v), cy+5)
			}
			label := fmt.Sprintf("%s %s  %s", FormatNum(s.Median/p.scale, p.prec), p.unit, FormatRatio(r.Ratio(res.Path, p.metric)))
			fmt.Fprintf(&b, `<text x="%.1f" y="%d">%s</text>`+"\n", float64(x0)+w(s.Max)+8, y+15, esc(label))
		}
	}
	SVGEnd(&b, padding, height-8, r.Host, r.ClientCPU, r.ServerCPU)
	return b.Bytes()
}

// WriteFiles writes results.csv, results.md, chart.svg and results.json
// (the whole report) into dir, creating it if needed.
func (r *Report) WriteFiles(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create results dir: %w", err)
	}
	js, err := json.MarshalIndent(r.jsonView(), "", "  ")
	if err != nil {
		return fmt.Errorf("encode results.json: %w", err)
	}
	return WriteResultFiles(dir,
		ResultFile{Name: "results.csv", Data: r.CSV()},
		ResultFile{Name: "results.md", Data: []byte(r.Markdown())},
		ResultFile{Name: "chart.svg", Data: r.SVG()},
		ResultFile{Name: "results.json", Data: append(js, '\n')})
}

// ResultFile is one file of a benchmark's results directory.
type ResultFile struct {
	Name string
	Data []byte
}

// WriteResultFiles writes the files into dir, each through a temporary file
// renamed over the old one, so a reader sees either the old or the new
// file, never half of one.
func WriteResultFiles(dir string, files ...ResultFile) error {
	for _, f := range files {
		p := filepath.Join(dir, f.Name)
		tmp := p + ".tmp"
		if err := os.WriteFile(tmp, f.Data, 0o644); err != nil {
			return fmt.Errorf("write %s: %w", p, err)
		}
		if err := os.Rename(tmp, p); err != nil {
			return fmt.Errorf("write %s: %w", p, err)
		}
	}
	return nil
}

// WriteRun writes a run's results.json ({"meta": meta, "samples": samples})
// and results.md into dir, creating it if needed.
func WriteRun[M, S any](dir string, meta M, samples []S, md string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create results dir: %w", err)
	}
	js, err := json.MarshalIndent(struct {
		Meta    M   `json:"meta"`
		Samples []S `json:"samples"`
	}{meta, samples}, "", " ")
	if err != nil {
		return fmt.Errorf("encode results.json: %w", err)
	}
	return WriteResultFiles(dir, ResultFile{Name: "results.json", Data: js}, ResultFile{Name: "results.md", Data: []byte(md)})
}

// ReadRun reads what WriteRun wrote into dir (to render results.md again).
func ReadRun[M, S any](dir string) (meta M, samples []S, err error) {
	b, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		return meta, nil, err
	}
	var run struct {
		Meta    M   `json:"meta"`
		Samples []S `json:"samples"`
	}
	if err := json.Unmarshal(b, &run); err != nil {
		return meta, nil, fmt.Errorf("%s/results.json: %w", dir, err)
	}
	return run.Meta, run.Samples, nil
}

// pairedRatioJSON is a PairedRatio in results.json (NaN as null).
type pairedRatioJSON struct {
	N      int      `json:"n"`
	Median *float64 `json:"median"`
	Lo     *float64 `json:"ci95Lo"`
	Hi     *float64 `json:"ci95Hi"`
}

// jsonView replaces NaN (which encoding/json rejects) by null.
func (r *Report) jsonView() any {
	type res struct {
		Path       string                     `json:"path"`
		Client     Endpoint                   `json:"client"`
		Server     Endpoint                   `json:"server"`
		Samples    map[string][]*float64      `json:"samples"`
		Median     map[string]*float64        `json:"median"`
		Ratio      map[string]*float64        `json:"ratioToReference"`
		Paired     map[string]pairedRatioJSON `json:"pairedRatioToReference,omitempty"`
		Congestion string                     `json:"congestion,omitempty"`
		Errors     []string                   `json:"errors,omitempty"`
	}
	type meas struct {
		Rep         int       `json:"rep"`
		Path        string    `json:"path"`
		Tool        string    `json:"tool"`
		Client      string    `json:"client"`
		Server      string    `json:"server"`
		Start       time.Time `json:"start"`
		ElapsedMS   int64     `json:"elapsedMs"`
		PSIBefore   *float64  `json:"psiSomeAvg10Before"`
		PSIAfter    *float64  `json:"psiSomeAvg10After"`
		StallMicros uint64    `json:"cpuStallUs"`
		Err         string    `json:"error,omitempty"`
	}
	out := struct {
		Started      time.Time         `json:"started"`
		Finished     time.Time         `json:"finished"`
		Reps         int               `json:"reps"`
		DurationS    float64           `json:"durationSeconds"`
		MessageSize  int               `json:"messageSize"`
		ClientCPU    int               `json:"clientCPU"`
		ServerCPU    int               `json:"serverCPU"`
		Host         Host              `json:"host"`
		Reference    string            `json:"reference"`
		Units        map[string]string `json:"units"`
		Results      []res             `json:"results"`
		Measurements []meas            `json:"measurements"`
	}{Started: r.Started, Finished: r.Finished, Reps: r.Reps, DurationS: r.Duration.Seconds(), MessageSize: r.MessageSize,
		ClientCPU: r.ClientCPU, ServerCPU: r.ServerCPU, Host: r.Host, Reference: r.Reference, Units: map[string]string{}}
	for _, mi := range metricInfo {
		out.Units[mi.name] = mi.unit
	}
	for _, rr := range r.Results {
		x := res{Path: rr.Path, Client: rr.Client, Server: rr.Server, Congestion: rr.Congestion, Errors: rr.Errors,
			Samples: map[string][]*float64{}, Median: map[string]*float64{}, Ratio: map[string]*float64{}}
		for _, mi := range metricInfo {
			for _, v := range rr.Values(mi.name) {
				x.Samples[mi.name] = append(x.Samples[mi.name], jsonnum.From(v))
			}
			x.Median[mi.name] = jsonnum.From(r.Stats(rr.Path, mi.name).Median)
			x.Ratio[mi.name] = jsonnum.From(r.Ratio(rr.Path, mi.name))
			if rr.Path != r.Reference {
				if x.Paired == nil {
					x.Paired = map[string]pairedRatioJSON{}
				}
				p := r.Paired(rr.Path, mi.name)
				x.Paired[mi.name] = pairedRatioJSON{N: p.N, Median: jsonnum.From(p.Median), Lo: jsonnum.From(p.Lo), Hi: jsonnum.From(p.Hi)}
			}
		}
		out.Results = append(out.Results, x)
	}
	for _, m := range r.Measurements {
		out.Measurements = append(out.Measurements, meas{Rep: m.Rep, Path: m.Path, Tool: m.Tool,
			Client: ShellQuote(m.Client), Server: ShellQuote(m.Server), Start: m.Start, ElapsedMS: m.Elapsed.Milliseconds(),
			PSIBefore: jsonnum.From(m.Before.Avg10), PSIAfter: jsonnum.From(m.After.Avg10), StallMicros: m.StallMicro, Err: m.Err})
	}
	return out
}

// XMLEscape escapes s for SVG text and attributes.
func XMLEscape(s string) string {
	var e bytes.Buffer
	_ = xml.EscapeText(&e, []byte(s))
	return e.String()
}

// SVGEnd writes a chart's footer at (x, y), the machine and CPUs the
// numbers were measured on, and closes the <svg> element.
func SVGEnd(b *bytes.Buffer, x, y int, host Host, clientCPU, serverCPU int) {
	fmt.Fprintf(b, `<text x="%d" y="%d" font-size="11" fill="#555">%s</text>`+"\n", x, y,
		XMLEscape(fmt.Sprintf("kernel %s, %d CPUs; client CPU %d, server CPU %d; numbers in results.csv / results.md", host.Kernel, host.NumCPU, clientCPU, serverCPU)))
	b.WriteString("</svg>\n")
}

// SVGStart writes the XML declaration, the opening <svg> element of a
// width × height chart in sans-serif at fontSize, and a white background.
func SVGStart(b *bytes.Buffer, width, height, fontSize int) {
	fmt.Fprintf(b, `<?xml version="1.0" encoding="UTF-8"?>`+"\n")
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="%d">`+"\n",
		width, height, width, height, fontSize)
	fmt.Fprintf(b, `<rect x="0" y="0" width="%d" height="%d" fill="white"/>`+"\n", width, height)
}
