package northsouth

// Report of the north-south benchmark (ns.go): medians with min–max per
// configuration, ratios to kube-proxy iptables from the same run, CPU
// pressure, every sample and exact command (results.json, results.csv,
// results.md).

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/axonhq/axon/internal/bench"
	"github.com/axonhq/axon/internal/bench/jsonnum"
)

// Report is the outcome of Run.
type Report struct {
	Started   time.Time     `json:"started"`
	Finished  time.Time     `json:"finished"`
	Command   string        `json:"command,omitempty"`
	Kernel    string        `json:"kernel"`
	Reps      int           `json:"reps"`
	Duration  time.Duration `json:"duration"`
	Configs   []string      `json:"configs"`
	Reference string        `json:"reference"`
	Samples   []Sample      `json:"samples"`
}

// NS metric names.
const (
	MetricConnRate   = "conn_per_sec"
	MetricThroughput = "throughput"
	MetricSoftirq    = "softirq_us_per_conn"
	MetricNetRx      = "net_rx_per_conn"
	MetricPSI        = "psi_some_avg10"
	// forwarding rate (forward.go)
	MetricFwdPPS    = "fwd_pps"           // packets forwarded per second
	MetricFwdNs     = "fwd_ns_per_packet" // entry node CPU per forwarded packet
	MetricFwdPerCPU = "fwd_pps_per_cpu"   // 1e9 / fwd_ns_per_packet: what one busy CPU forwards
	MetricFwdBusy   = "fwd_cpu_busy"      // entry node receive CPU / wall time
)

// nsMetrics are the per-sample metrics, in CSV order.
var nsMetrics = []string{MetricConnRate, MetricThroughput, MetricSoftirq, MetricNetRx,
	MetricFwdPPS, MetricFwdNs, MetricFwdPerCPU, MetricFwdBusy, MetricPSI}

func (s Sample) value(metric string) float64 {
	if s.Skipped != "" {
		return math.NaN()
	}
	switch metric {
	case MetricConnRate:
		return s.ConnRate
	case MetricThroughput:
		return s.Throughput
	case MetricSoftirq:
		return s.SoftirqUsPerConn
	case MetricNetRx:
		return s.NetRxPerConn
	case MetricPSI:
		return s.PSIAfter
	case MetricFwdPPS:
		return s.FwdPPS
	case MetricFwdNs:
		return s.FwdNsPerPacket
	case MetricFwdPerCPU:
		return 1e9 / s.FwdNsPerPacket
	case MetricFwdBusy:
		return s.FwdBusy
	}
	return math.NaN()
}

// Values returns the samples of one configuration and metric, in rep order.
func (r *Report) Values(config, metric string) []float64 {
	var out []float64
	for _, s := range r.Samples {
		if s.Config == config {
			out = append(out, s.value(metric))
		}
	}
	return out
}

// Stats returns min/median/max of a configuration's metric.
func (r *Report) Stats(config, metric string) bench.Stats {
	return bench.Summarize(r.Values(config, metric))
}

// Ratio is the configuration's median over the reference's median.
func (r *Report) Ratio(config, metric string) float64 {
	return bench.Ratio(r.Stats(config, metric).Median, r.Stats(r.Reference, metric).Median)
}

func (r *Report) skipped(config string) string {
	for _, s := range r.Samples {
		if s.Config == config && s.Skipped != "" {
			return s.Skipped
		}
	}
	return ""
}

// rowName is a configuration's name in a table, the reference marked.
func (r *Report) rowName(c string) string {
	if c == r.Reference {
		return c + " (reference)"
	}
	return c
}

// skipRow is the table row (with cols more columns) of a configuration that
// was skipped and has no sample of metric; skip is false otherwise.
func (r *Report) skipRow(c, metric string, cols int) (row string, skip bool) {
	why := r.skipped(c)
	if why == "" || r.Stats(c, metric).N != 0 {
		return "", false
	}
	return fmt.Sprintf("| %s | skipped: %s %s\n", c, bench.MarkdownEscape(why), strings.Repeat("|", cols)), true
}

// Table is the Markdown summary table.
func (r *Report) Table() string {
	var b strings.Builder
	fmt.Fprintf(&b, "| configuration | new conn/s median (min–max) | ratio | throughput Gbit/s median (min–max) | ratio | softirq µs/conn | ratio | NET_RX/conn | failed conns | CPU pressure avg10 %% |\n")
	fmt.Fprintf(&b, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, c := range r.Configs {
		if isFloor(c) {
			continue // forwarding rate only
		}
		if row, skip := r.skipRow(c, MetricConnRate, 9); skip {
			b.WriteString(row)
			continue
		}
		cr, tp, sq, nr, psi := r.Stats(c, MetricConnRate), r.Stats(c, MetricThroughput), r.Stats(c, MetricSoftirq), r.Stats(c, MetricNetRx), r.Stats(c, MetricPSI)
		fails := 0
		for _, s := range r.Samples {
			if s.Config == c {
				fails += s.ConnErrs
			}
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s | %d | %s |\n", r.rowName(c),
			bench.Cell(cr, 1, 0), bench.FormatRatio(r.Ratio(c, MetricConnRate)),
			bench.Cell(tp, 1e9, 2), bench.FormatRatio(r.Ratio(c, MetricThroughput)),
			bench.FormatNum(sq.Median, 1), bench.FormatRatio(r.Ratio(c, MetricSoftirq)),
			bench.FormatNum(nr.Median, 2), fails, bench.FormatNum(psi.Median, 0))
	}
	return b.String()
}

// FwdTable is the Markdown table of the forwarding rate.
func (r *Report) FwdTable() string {
	var b strings.Builder
	fmt.Fprintf(&b, "| configuration | forwarded Mpps median (min–max) | ratio | entry node CPU ns/packet median (min–max) | ratio | Mpps per CPU (10⁹ / ns) | ratio | entry CPU busy %% |\n")
	fmt.Fprintf(&b, "|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, c := range r.Configs {
		if row, skip := r.skipRow(c, MetricFwdPPS, 7); skip {
			b.WriteString(row)
			continue
		}
		pps, ns, per, busy := r.Stats(c, MetricFwdPPS), r.Stats(c, MetricFwdNs), r.Stats(c, MetricFwdPerCPU), r.Stats(c, MetricFwdBusy)
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", r.rowName(c),
			bench.Cell(pps, 1e6, 3), bench.FormatRatio(r.Ratio(c, MetricFwdPPS)),
			bench.Cell(ns, 1, 0), bench.FormatRatio(r.Ratio(c, MetricFwdNs)),
			bench.FormatNum(per.Median/1e6, 3), bench.FormatRatio(r.Ratio(c, MetricFwdPerCPU)),
			bench.FormatNum(100*busy.Median, 0))
	}
	if line := r.FloorLine(); line != "" {
		b.WriteString("\n" + line + "\n")
	}
	return b.String()
}

// FloorLine compares the XDP LB to the trivial XDP forwarder measured in the
// same repetitions (paired ratios, 95 % interval of their median); "" when
// the run has not both.
func (r *Report) FloorLine() string {
	has := func(c string) bool {
		for _, s := range r.Samples {
			if s.Config == c && s.Skipped == "" {
				return true
			}
		}
		return false
	}
	if !has(XDP) || !has(Floor) {
		return ""
	}
	pps := bench.Pair(r.Values(XDP, MetricFwdPPS), r.Values(Floor, MetricFwdPPS))
	per := bench.Pair(r.Values(XDP, MetricFwdPerCPU), r.Values(Floor, MetricFwdPerCPU))
	line := fmt.Sprintf("%s against %s, paired by repetition: forwarded Mpps %s, Mpps per CPU %s (%d pairs; ≥ 0.70× is the aim).",
		XDP, Floor, bench.FormatPaired(pps), bench.FormatPaired(per), max(pps.N, per.N))
	if busy := r.Stats(Floor, MetricFwdBusy).Median; busy < floorBusy {
		line += fmt.Sprintf(" The forwarder's receive CPU was %.0f %% busy: its Mpps is what the generator and the sink on the other CPU "+
			"delivered, not its own limit, so only the per-CPU ratio compares the two.", 100*busy)
	}
	return line
}

// floorBusy: below this busy fraction of its receive CPU the forwarder was
// not what limited its forwarded Mpps.
const floorBusy = 0.8

// Markdown is results.md: the table, how it was measured, every sample.
func (r *Report) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# North-south forwarding: external client → NodePort (backend on another node)\n\n")
	fmt.Fprintf(&b, "Kernel %s, %d repetitions × %s per metric, configurations interleaved in every repetition (one lab each). Started %s, finished %s.\n\n",
		r.Kernel, r.Reps, r.Duration, r.Started.Format(time.RFC3339), r.Finished.Format(time.RFC3339))
	if r.Command != "" {
		fmt.Fprintf(&b, "Command: `%s`\n\n", r.Command)
	}
	b.WriteString(r.Table())
	b.WriteString("\nRatios are medians over the reference's median (kube-proxy iptables) from the same run; for softirq µs/conn lower is better. " +
		"softirq time is /proc/stat's softirq column (all CPUs, machine-wide: includes other users of this shared machine) over the connect loop, divided by its connections; NET_RX/conn likewise from /proc/softirqs.\n\n")
	b.WriteString("## Forwarding rate\n\n64-byte UDP frames from the external client's addresses to node2's NodePort (backend on node1), written by an XDP generator " +
		"(BPF_PROG_RUN live frames, internal/pktgen) straight into node2's eth0 receive ring, as a NIC's DMA would; node2's receive processing runs in threaded NAPI alone on CPU 1; " +
		"a sink at node2's wire port counts and drops what node2 forwarded toward the backend. " +
		"xdp-forwarder is the floor: a trivial XDP forwarder (check Ethernet and IPv4 headers, write both MACs, XDP_TX; no lookup) in place of any LB on node2's eth0, " +
		"offered what the LB sends on (the backend's address and port) and sending it to the LB's next hop, in its own lab with the same wire, generator, sink and CPU. " +
		"Forwarded Mpps is that count per second; " +
		"entry node CPU ns/packet is the CPU time of node2's receive thread per forwarded packet (lower is better); Mpps per CPU is what one fully busy CPU would forward at that cost. " +
		"node2's eth0 runs with GRO on and TSO off in every configuration (docs/lab-northsouth.md).\n\n")
	b.WriteString(r.FwdTable())
	b.WriteString("\n")
	b.WriteString("## Samples\n\n| rep | configuration | lab up s | conn/s | connect p50/p99 µs | conns | errors | Gbit/s | retransmits | softirq µs/conn | NET_RX/conn | fwd offered / taken / forwarded Mpps | fwd ns/packet | fwd CPU % | PSI before/after % | attach / note |\n|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---|---|\n")
	for _, s := range r.Samples {
		note := s.Attach
		if s.Skipped != "" {
			note = "skipped: " + s.Skipped
		}
		if s.Err != "" {
			note += " ERROR: " + s.Err
		}
		if s.FirstErr != "" {
			note += " first conn error: " + s.FirstErr
		}
		fmt.Fprintf(&b, "| %d | %s | %.1f | %s | %s/%s | %d | %d | %s | %s | %s | %s | %s / %s / %s | %s | %s | %s/%s | %s |\n", s.Rep, s.Config, s.UpSec,
			bench.FormatNum(s.ConnRate, 0), bench.FormatNum(s.ConnectP50, 0), bench.FormatNum(s.ConnectP99, 0), s.Conns, s.ConnErrs, bench.FormatNum(s.Throughput/1e9, 2), bench.FormatNum(s.Retransmits, 0),
			bench.FormatNum(s.SoftirqUsPerConn, 1), bench.FormatNum(s.NetRxPerConn, 2),
			bench.FormatNum(s.FwdOfferedPPS/1e6, 3), bench.FormatNum(s.FwdRxPPS/1e6, 3), bench.FormatNum(s.FwdPPS/1e6, 3), bench.FormatNum(s.FwdNsPerPacket, 0), bench.FormatNum(100*s.FwdBusy, 0),
			bench.FormatNum(s.PSIBefore, 0), bench.FormatNum(s.PSIAfter, 0), bench.MarkdownEscape(note))
	}
	b.WriteString("\n## Commands (first sample of each configuration)\n\n")
	done := map[string]bool{}
	for _, s := range r.Samples {
		if done[s.Config] || len(s.Commands) == 0 {
			continue
		}
		done[s.Config] = true
		fmt.Fprintf(&b, "%s:\n\n```sh\n%s\n```\n\n", s.Config, strings.Join(s.Commands, "\n"))
	}
	return b.String()
}

// CSV is one row per sample and metric.
func (r *Report) CSV() []byte {
	var buf bytes.Buffer
	w := csv.NewWriter(&buf)
	_ = w.Write([]string{"rep", "config", "metric", "value"})
	for _, s := range r.Samples {
		for _, m := range nsMetrics {
			v := s.value(m)
			txt := ""
			if !math.IsNaN(v) {
				txt = strconv.FormatFloat(v, 'g', 8, 64)
			}
			_ = w.Write([]string{strconv.Itoa(s.Rep), s.Config, m, txt})
		}
	}
	w.Flush()
	return buf.Bytes()
}

// MarshalJSON writes NaN as null.
func (s Sample) MarshalJSON() ([]byte, error) {
	type plain Sample
	return json.Marshal(struct {
		plain
		ConnRate         *float64 `json:"connPerSec"`
		SoftirqUsPerConn *float64 `json:"softirqUsPerConn"`
		NetRxPerConn     *float64 `json:"netRxPerConn"`
		Throughput       *float64 `json:"throughputBps"`
		Retransmits      *float64 `json:"retransmits"`
		PSIBefore        *float64 `json:"psiBefore"`
		PSIAfter         *float64 `json:"psiAfter"`
		ConnectP50       *float64 `json:"connectP50Us"`
		ConnectP99       *float64 `json:"connectP99Us"`
		CycleP50         *float64 `json:"cycleP50Us"`
		FwdPPS           *float64 `json:"fwdPps"`
		FwdNsPerPacket   *float64 `json:"fwdNsPerPacket"`
		FwdBusy          *float64 `json:"fwdBusy"`
		FwdOfferedPPS    *float64 `json:"fwdOfferedPps"`
		FwdRxPPS         *float64 `json:"fwdRxPps"`
	}{plain(s), jsonnum.From(s.ConnRate), jsonnum.From(s.SoftirqUsPerConn), jsonnum.From(s.NetRxPerConn), jsonnum.From(s.Throughput),
		jsonnum.From(s.Retransmits), jsonnum.From(s.PSIBefore), jsonnum.From(s.PSIAfter), jsonnum.From(s.ConnectP50), jsonnum.From(s.ConnectP99), jsonnum.From(s.CycleP50),
		jsonnum.From(s.FwdPPS), jsonnum.From(s.FwdNsPerPacket), jsonnum.From(s.FwdBusy), jsonnum.From(s.FwdOfferedPPS), jsonnum.From(s.FwdRxPPS)})
}

// WriteFiles writes results.json, results.csv and results.md into dir.
func (r *Report) WriteFiles(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	j, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("encode results.json: %w", err)
	}
	return bench.WriteResultFiles(dir,
		bench.ResultFile{Name: "results.json", Data: j},
		bench.ResultFile{Name: "results.csv", Data: r.CSV()},
		bench.ResultFile{Name: "results.md", Data: []byte(r.Markdown())})
}
