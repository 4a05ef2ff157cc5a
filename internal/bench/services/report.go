package services

// The Service benchmark's report: connect rate per scale level and path
// (medians, min–max, ratios to the reference in the same run), the scale
// curve, and the control-plane numbers, as CSV, Markdown, JSON and SVG.

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/axonhq/axon/internal/bench"
	"github.com/axonhq/axon/internal/bench/clip"
	"github.com/axonhq/axon/internal/bench/connrate"
	"github.com/axonhq/axon/internal/bench/jsonnum"
)

// PathInfo describes a measured path.
type PathInfo struct {
	Name    string         `json:"name"`
	Client  bench.Endpoint `json:"client"`
	Target  string         `json:"target"`
	Needs   string         `json:"needsKubeProxy,omitempty"`
	Command string         `json:"command"`
}

// Sync is how one agent or kube-proxy applied a scale level.
type Sync struct {
	Synced bool `json:"synced"`
	// AfterLastWrite: last apiserver write → applied (kube-proxy: the end of
	// its sync by its own clock; agent: every ClusterIP in the pinned map).
	AfterLastWrite time.Duration `json:"afterLastWriteNs"`
	LastLogged     time.Duration `json:"lastLoggedSyncNs,omitempty"` // kube-proxy's last "SyncProxyRules complete" elapsed
	MaxLogged      time.Duration `json:"maxLoggedSyncNs,omitempty"`
	Syncs          int           `json:"syncs,omitempty"` // kube-proxy syncs logged while the level was written
	Frontends      int           `json:"frontends,omitempty"`
	RSS            float64       `json:"peakRssBytes,omitempty"`
	Err            string        `json:"error,omitempty"`
}

// Level is one scale level.
type Level struct {
	Services  int             `json:"services"` // generated (plus the target Service)
	Endpoints int             `json:"endpointsPerService"`
	Created   int             `json:"objectsCreated"`
	Apply     time.Duration   `json:"applyNs"`
	KubeProxy map[string]Sync `json:"kubeProxy"`
	Agents    map[string]Sync `json:"agents"`
	PSIBefore float64         `json:"psiBefore"`
	PSIAfter  float64         `json:"psiAfter"`
}

// Sample is one connect-rate run.
type Sample struct {
	Level      int             `json:"services"`
	Rep        int             `json:"rep"`
	Path       string          `json:"path"`
	Result     connrate.Result `json:"result"`
	Start      time.Time       `json:"start"`
	Before     bench.Pressure  `json:"-"`
	After      bench.Pressure  `json:"-"`
	StallMicro uint64          `json:"cpuStallUs"`
	Err        string          `json:"error,omitempty"`
}

// RSS is a process's memory.
type RSS struct {
	Who string `json:"who"`
	HWM uint64 `json:"vmHWMBytes"`
	RSS uint64 `json:"vmRSSBytes"`
}

// FullSync is a kube-proxy restart: start → first complete sync.
type FullSync struct {
	Mode          string        `json:"mode"`
	StartToSynced time.Duration `json:"startToSyncedNs"`
	Logged        time.Duration `json:"loggedSyncNs"` // its first "SyncProxyRules complete" elapsed
	HWM, RSS      uint64
	Err           string `json:"error,omitempty"`
}

// ControlPlane holds the control-plane measurements at the last level.
type ControlPlane struct {
	Services  int `json:"services"`
	Endpoints int `json:"endpointsPerService"`
	// EndpointSlice change → applied, ms, one sample per change.
	AxonChange      []float64            `json:"axonChangeMs"`
	KubeProxyChange map[string][]float64 `json:"kubeProxyChangeMs"`
	// AxonChangeIdle: the same measurement for axon alone, in a window where
	// the kube-proxies were idle (paused with SIGSTOP, resumed afterwards),
	// so their sync storms do not compete for the CPU; PSI around it.
	AxonChangeIdle    []float64  `json:"axonChangeIdleMs,omitempty"`
	AxonChangeIdlePSI [2]float64 `json:"axonChangeIdlePsi"`
	// ChangeWrite, ChangeIdleWrite: how long the change's own API write
	// (the EndpointSlice update, acknowledged once etcd has it) took, ms, one
	// per sample of AxonChange / AxonChangeIdle: the part of every "change →
	// applied" time that no datapath controls.
	ChangeWrite     []float64 `json:"changeWriteMs,omitempty"`
	ChangeIdleWrite []float64 `json:"changeIdleWriteMs,omitempty"`
	// AgentChange, AgentChangeIdle: the samples of AxonChange /
	// AxonChangeIdle timed by the agent's own clock, as kube-proxy's are by
	// its sync timestamp: write → node1's agent's
	// axon_services_last_write_timestamp_seconds (its map write done), ms.
	// Unlike AxonChange they leave out how late the benchmark itself wakes
	// up to see the map changed.
	AgentChange     []float64 `json:"agentChangeMs,omitempty"`
	AgentChangeIdle []float64 `json:"agentChangeIdleMs,omitempty"`
	// AgentFullSyncIdle: the kube-proxies were paused during the agent's full sync.
	AgentFullSyncIdle bool `json:"agentFullSyncKubeProxiesPaused,omitempty"`
	// Agent restart with empty maps → every Service in the maps.
	AgentFullSync      time.Duration `json:"agentFullSyncNs"`      // restart begins → all in the map
	AgentStartToSynced time.Duration `json:"agentStartToSyncedNs"` // new process start → all in the map
	AgentLoggedSync    time.Duration `json:"agentLoggedSyncNs"`    // the agent's own "services synced took="
	AgentFrontends     int           `json:"agentFrontends"`
	AgentBackends      int           `json:"agentBackends"`
	AgentMapMasters    int           `json:"agentMapFrontends"`
	KubeProxyFullSync  []FullSync    `json:"kubeProxyFullSync"`
	AgentRSS           []RSS         `json:"agentRss"`
	KubeProxyRSS       []RSS         `json:"kubeProxyRss"`
	Notes              []string      `json:"notes,omitempty"`
	PSIBefore          float64       `json:"psiBefore"`
	PSIAfter           float64       `json:"psiAfter"`
}

// Report is the outcome of Run.
type Report struct {
	Started           time.Time     `json:"started"`
	Finished          time.Time     `json:"finished"`
	Reps              int           `json:"reps"`
	Duration          time.Duration `json:"durationNs"`
	Endpoints         int           `json:"endpointsPerService"`
	ClientCPU         int           `json:"clientCPU"`
	ServerCPU         int           `json:"serverCPU"`
	Host              bench.Host    `json:"host"`
	Reference         string        `json:"reference"`
	Command           string        `json:"command,omitempty"` // how the run was started
	ServerCommand     string        `json:"serverCommand"`
	KubeProxyCommands []string      `json:"kubeProxyCommands"`
	Paths             []PathInfo    `json:"paths"`
	Levels            []Level       `json:"levels"`
	Samples           []Sample      `json:"samples"`
	ControlPlane      *ControlPlane `json:"controlPlane,omitempty"`
	Paired            []Paired      `json:"paired,omitempty"`
	Errors            []string      `json:"errors,omitempty"`
}

// Paired is one paired run at one level (connrate.RunPaired): two paths
// measured in alternating slices, the ratio a noisy machine cannot blur,
// since both sides of every pair share its state. Kind says which
// (PairedClusterIP, PairedRules; empty in reports written before
// there was more than one: ClusterIP).
type Paired struct {
	Kind     string                `json:"kind,omitempty"`
	Services int                   `json:"services"`
	Client   string                `json:"client"`
	Result   connrate.PairedResult `json:"result"`
	Err      string                `json:"err,omitempty"`
}

func (p Paired) kind() string {
	if p.Kind == "" {
		return PairedClusterIP
	}
	return p.Kind
}

// svcPairedSides names the two sides of each kind of paired run (A, B).
var svcPairedSides = map[string][2]string{
	PairedClusterIP: {"ClusterIP", "pod IP"},
	PairedRules:     {"iptables-rules node", "rules-free node"},
}

// Label is "A / B" of the run's kind, e.g. "ClusterIP / pod IP".
func (p Paired) Label() string {
	s := svcPairedSides[p.kind()]
	return s[0] + " / " + s[1]
}

// PairedOf returns the paired runs of one kind, in level order.
func (r *Report) PairedOf(kind string) []Paired {
	var out []Paired
	for _, p := range r.Paired {
		if p.kind() == kind {
			out = append(out, p)
		}
	}
	return out
}

// PairedTable renders the paired ratios of one kind, one row per level.
func (r *Report) PairedTable(kind string) string {
	s := svcPairedSides[kind]
	var b strings.Builder
	fmt.Fprintf(&b, "| Services | pairs × slice | %s / %s per pair: median [95 %% CI] (IQR) | all slices: %s conn/s | %s conn/s | ratio | connect p50 µs %s / %s |\n",
		s[0], s[1], s[0], s[1], s[0], s[1])
	b.WriteString("|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, p := range r.PairedOf(kind) {
		if p.Err != "" {
			fmt.Fprintf(&b, "| %d | – | %s | | | | |\n", p.Services, bench.MarkdownEscape(p.Err))
			continue
		}
		x := p.Result
		fmt.Fprintf(&b, "| %d | %d × %.0f ms | %.3f %s (%.3f–%.3f) | %.0f | %.0f | %.3f | %.1f / %.1f |\n", p.Services, x.Pairs, x.SliceSec*1e3,
			x.RatioMedian, ciText(x), x.RatioP25, x.RatioP75, x.A.Rate, x.B.Rate, bench.Ratio(x.A.Rate, x.B.Rate), x.A.ConnectP50, x.B.ConnectP50)
	}
	return b.String()
}

// ciText is "[lo–hi]", the 95 % confidence interval of a paired run's
// median ratio, or "[CI n/a]" (too few pairs, or a report from before it
// was recorded).
func ciText(x connrate.PairedResult) string {
	if math.IsNaN(x.RatioCILo) || math.IsNaN(x.RatioCIHi) {
		return "[CI n/a]"
	}
	return fmt.Sprintf("[%.3f–%.3f]", x.RatioCILo, x.RatioCIHi)
}

// Connect-rate metrics of a sample.
const (
	MetricRate       = "conn_per_s"
	MetricConnectP50 = "connect_p50_us"
	MetricConnectP99 = "connect_p99_us"
	MetricCycleP50   = "cycle_p50_us"
	// MetricCycleRate is 1 / (median connection cycle): the rate the loop
	// runs at when it is not preempted. On a shared machine the measured
	// conn/s mostly reflects how often client or server lose their CPU; the
	// median cycle filters those stalls out, so this is the robust number.
	MetricCycleRate = "conn_per_s_at_median_cycle"
)

func (s Sample) value(metric string) float64 {
	if s.Err != "" {
		return math.NaN()
	}
	switch metric {
	case MetricRate:
		return s.Result.Rate
	case MetricConnectP50:
		return s.Result.ConnectP50
	case MetricConnectP99:
		return s.Result.ConnectP99
	case MetricCycleP50:
		return s.Result.CycleP50
	case MetricCycleRate:
		if !(s.Result.CycleP50 > 0) {
			return math.NaN()
		}
		return 1e6 / s.Result.CycleP50
	}
	return math.NaN()
}

// Stats summarises metric over the repetitions of path at level.
func (r *Report) Stats(level int, path, metric string) bench.Stats {
	var xs []float64
	for _, s := range r.Samples {
		if s.Level == level && s.Path == path {
			xs = append(xs, s.value(metric))
		}
	}
	return bench.Summarize(xs)
}

// Ratio is path's median over the reference's median at the same level.
func (r *Report) Ratio(level int, path, metric string) float64 {
	return bench.Ratio(r.Stats(level, path, metric).Median, r.Stats(level, r.Reference, metric).Median)
}

func (r *Report) levelNums() []int {
	var out []int
	for _, l := range r.Levels {
		out = append(out, l.Services)
	}
	return out
}

func (r *Report) skipReason(level int, path string) string {
	for _, s := range r.Samples {
		if s.Level == level && s.Path == path && strings.HasPrefix(s.Err, "skipped") {
			return s.Err
		}
	}
	return ""
}

// Table renders the connect-rate table of one level.
func (r *Report) Table(level int) string {
	var b strings.Builder
	b.WriteString("| path | conn/s measured, median (min–max) | ratio | conn/s at median cycle (1/cycle p50) | ratio | connect p50 µs | connect p99 µs | cycle p50 µs |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, p := range r.Paths {
		name := bench.MarkdownEscape(p.Name)
		if p.Name == r.Reference {
			name += " (reference)"
		}
		rate := r.Stats(level, p.Name, MetricRate)
		if rate.N == 0 {
			why := "no data"
			if s := r.skipReason(level, p.Name); s != "" {
				why = s
			}
			fmt.Fprintf(&b, "| %s | %s | | | | | | |\n", name, bench.MarkdownEscape(why))
			continue
		}
		cr := r.Stats(level, p.Name, MetricCycleRate)
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", name, bench.Cell(rate, 1, 0), bench.FormatRatio(r.Ratio(level, p.Name, MetricRate)),
			bench.Cell(cr, 1, 0), bench.FormatRatio(r.Ratio(level, p.Name, MetricCycleRate)),
			bench.FormatNum(r.Stats(level, p.Name, MetricConnectP50).Median, 1), bench.FormatNum(r.Stats(level, p.Name, MetricConnectP99).Median, 1),
			bench.FormatNum(r.Stats(level, p.Name, MetricCycleP50).Median, 1))
	}
	return b.String()
}

// ScaleTable renders the median of metric (MetricRate or
// MetricCycleRate) per path and level, and the change from the first
// level to the last.
func (r *Report) ScaleTable(metric string) string {
	lv := r.levelNums()
	if len(lv) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("| path |")
	for _, n := range lv {
		fmt.Fprintf(&b, " %d Services |", n)
	}
	fmt.Fprintf(&b, " change %d → %d |\n|---|", lv[0], lv[len(lv)-1])
	for range lv {
		b.WriteString("---:|")
	}
	b.WriteString("---:|\n")
	for _, p := range r.Paths {
		fmt.Fprintf(&b, "| %s |", bench.MarkdownEscape(p.Name))
		for _, n := range lv {
			s := r.Stats(n, p.Name, metric)
			if s.N == 0 {
				b.WriteString(" n/a |")
			} else {
				fmt.Fprintf(&b, " %s (%s) |", bench.FormatNum(s.Median, 0), bench.FormatRatio(r.Ratio(n, p.Name, metric)))
			}
		}
		first, lastS := r.Stats(lv[0], p.Name, metric), r.Stats(lv[len(lv)-1], p.Name, metric)
		if first.N == 0 || lastS.N == 0 {
			b.WriteString(" n/a |\n")
		} else {
			fmt.Fprintf(&b, " %+.1f %% |\n", 100*(lastS.Median/first.Median-1))
		}
	}
	return b.String()
}

func msStats(xs []float64) string {
	s := bench.Summarize(xs)
	if s.N == 0 {
		return "n/a"
	}
	return fmt.Sprintf("p50 %s, p99 %s, max %s (n=%d)", bench.FormatNum(bench.Percentile(xs, 50), 1), bench.FormatNum(bench.Percentile(xs, 99), 1), bench.FormatNum(s.Max, 1), s.N)
}

func mib(b uint64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }

// ControlPlaneTable renders the control-plane comparison.
func (r *Report) ControlPlaneTable() string {
	cp := r.ControlPlane
	if cp == nil {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d Services × %d endpoints (+ the target Service):\n\n", cp.Services-1, cp.Endpoints)
	b.WriteString("| measurement | axon | kube-proxy nftables | kube-proxy iptables |\n|---|---|---|---|\n")
	fs := map[string]FullSync{}
	for _, f := range cp.KubeProxyFullSync {
		fs[f.Mode] = f
	}
	kpFull := func(mode string) string {
		f, ok := fs[mode]
		switch {
		case !ok:
			return "not measured"
		case f.Err != "":
			return "failed: " + bench.MarkdownEscape(clip.String(f.Err, 120))
		}
		return fmt.Sprintf("%s (logged SyncProxyRules %s)", f.StartToSynced.Round(time.Millisecond), f.Logged.Round(time.Millisecond))
	}
	axonFull := "not measured"
	if cp.AgentFullSync > 0 {
		own := ""
		if cp.AgentLoggedSync > 0 {
			own = fmt.Sprintf("; agent's own table build + write %s", cp.AgentLoggedSync.Round(time.Millisecond))
		}
		axonFull = fmt.Sprintf("%s (restart incl. stopping the old agent: %s%s; %d frontends in the map)",
			cp.AgentStartToSynced.Round(time.Millisecond), cp.AgentFullSync.Round(time.Millisecond), own, cp.AgentMapMasters)
	}
	fmt.Fprintf(&b, "| full sync: process start → all Services applied | %s | %s | %s |\n", axonFull, kpFull("nftables"), kpFull("iptables"))
	fmt.Fprintf(&b, "| one EndpointSlice change → applied, ms | %s | %s | %s |\n", msStats(cp.AxonChange),
		msStats(cp.KubeProxyChange["nftables"]), msStats(cp.KubeProxyChange["iptables"]))
	if len(cp.ChangeWrite) > 0 {
		fmt.Fprintf(&b, "| … of which the API write (EndpointSlice update acknowledged), ms | %s | (same writes) | (same writes) |\n", msStats(cp.ChangeWrite))
		fmt.Fprintf(&b, "| … and after it (watch → agent → BPF map), ms | %s | – | – |\n", msStats(afterWrite(cp.AxonChange, cp.ChangeWrite)))
	}
	if len(cp.AgentChange) > 0 {
		fmt.Fprintf(&b, "| the same changes by the agent's own clock (its map write done), ms | %s | – | – |\n", msStats(cp.AgentChange))
	}
	if len(cp.AxonChangeIdle) > 0 {
		fmt.Fprintf(&b, "| the same for axon alone, kube-proxies idle (paused), ms | %s (CPU pressure %.0f → %.0f %%) | – | – |\n",
			msStats(cp.AxonChangeIdle), cp.AxonChangeIdlePSI[0], cp.AxonChangeIdlePSI[1])
	}
	if len(cp.ChangeIdleWrite) > 0 {
		fmt.Fprintf(&b, "| … of which the API write, ms | %s | – | – |\n", msStats(cp.ChangeIdleWrite))
		fmt.Fprintf(&b, "| … and after it, ms | %s | – | – |\n", msStats(afterWrite(cp.AxonChangeIdle, cp.ChangeIdleWrite)))
	}
	if len(cp.AgentChangeIdle) > 0 {
		fmt.Fprintf(&b, "| … by the agent's own clock, ms | %s | – | – |\n", msStats(cp.AgentChangeIdle))
	}
	// Memory: the largest VmHWM of the long-running processes, and of the
	// restarted one after its full sync.
	peak := func(list []RSS, pick func(RSS) bool) (uint64, string) {
		var best uint64
		who := ""
		for _, x := range list {
			if pick(x) && x.HWM > best {
				best, who = x.HWM, x.Who
			}
		}
		return best, who
	}
	axonMem := "n/a"
	if hwm, who := peak(cp.AgentRSS, func(x RSS) bool { return !strings.Contains(x.Who, "after full sync") }); hwm > 0 {
		axonMem = fmt.Sprintf("VmHWM %s (%s, largest of %d agents)", mib(hwm), who, len(cp.AgentRSS))
		if h, _ := peak(cp.AgentRSS, func(x RSS) bool { return strings.Contains(x.Who, "after full sync") }); h > 0 {
			axonMem = fmt.Sprintf("VmHWM %s (%s, largest of the long-running agents); restarted agent after its full sync: %s", mib(hwm), who, mib(h))
		}
	}
	kpMem := func(mode string) string {
		out := "n/a"
		if hwm, _ := peak(cp.KubeProxyRSS, func(x RSS) bool { return strings.Contains(x.Who, mode) }); hwm > 0 {
			out = "VmHWM " + mib(hwm)
		}
		if f, ok := fs[mode]; ok && f.Err == "" && f.HWM > 0 {
			out += "; restarted, after its full sync: " + mib(f.HWM)
		}
		return out
	}
	fmt.Fprintf(&b, "| memory (/proc/<pid>/status) | %s | %s | %s |\n", bench.MarkdownEscape(axonMem), kpMem("nftables"), kpMem("iptables"))
	for _, n := range cp.Notes {
		fmt.Fprintf(&b, "\n- %s", n)
	}
	if len(cp.Notes) > 0 {
		b.WriteString("\n")
	}
	return b.String()
}

// SyncTable renders how each level was applied.
func (r *Report) SyncTable() string {
	var b strings.Builder
	b.WriteString("| Services | objects written | write time | kube-proxy nftables: synced after last write (last logged sync, syncs) | kube-proxy iptables | axon agents: all ClusterIPs in the BPF maps after last write (max over nodes) | CPU psi % |\n")
	b.WriteString("|---:|---:|---:|---|---|---|---|\n")
	for _, l := range r.Levels {
		kp := func(mode string) string {
			s, ok := l.KubeProxy[mode]
			switch {
			case !ok:
				return "n/a"
			case !s.Synced:
				return "**not synced**: " + bench.MarkdownEscape(clip.String(s.Err, 140))
			}
			return fmt.Sprintf("%s (%s, %d)", s.AfterLastWrite.Round(time.Millisecond), s.LastLogged.Round(time.Millisecond), s.Syncs)
		}
		var worst time.Duration
		agents := "ok"
		for node, s := range l.Agents {
			if !s.Synced {
				agents = node + ": " + s.Err
				break
			}
			worst = max(worst, s.AfterLastWrite)
		}
		if agents == "ok" {
			agents = worst.Round(time.Millisecond).String()
		}
		fmt.Fprintf(&b, "| %d | %d | %s | %s | %s | %s | %s→%s |\n", l.Services, l.Created, l.Apply.Round(time.Millisecond),
			kp("nftables"), kp("iptables"), bench.MarkdownEscape(agents), bench.FormatNum(l.PSIBefore, 1), bench.FormatNum(l.PSIAfter, 1))
	}
	return b.String()
}

// Markdown renders the whole report.
func (r *Report) Markdown() string {
	var b strings.Builder
	b.WriteString("# axon Service benchmark: socket LB vs kube-proxy\n\n")
	fmt.Fprintf(&b, "Run %s → %s UTC. Connect rate: %d repetitions × %s per path and level, paths interleaved in every repetition; "+
		"client pinned to CPU %d, server to CPU %d. Ratios: median conn/s over the median of **%s** at the same level, same run.\n\n",
		r.Started.Format("2006-01-02 15:04:05"), r.Finished.Format("15:04:05"), r.Reps, r.Duration, r.ClientCPU, r.ServerCPU, bench.MarkdownEscape(r.Reference))
	b.WriteString("Each connection: socket → connect → 32-byte request → 32-byte response → server closes → client closes " +
		"(`axon lab bench _connrate`, blocking system calls on one thread). connect p50/p99 are of the connect(2) call; " +
		"cycle is the whole connection.\n\n")
	b.WriteString("## Targets\n\n")
	b.WriteString(r.TargetsTable())
	b.WriteString("\n")
	for _, l := range r.Levels {
		fmt.Fprintf(&b, "## %d Services × %d endpoints\n\n", l.Services, l.Endpoints)
		b.WriteString(r.Table(l.Services))
		b.WriteString("\n")
	}
	if len(r.Levels) > 1 {
		b.WriteString("## Scale: conn/s at the median connection cycle (ratio to the reference at that level)\n\n")
		b.WriteString(r.ScaleTable(MetricCycleRate))
		b.WriteString("\n## Scale: measured conn/s, median of the repetitions (ratio to the reference at that level)\n\n")
		b.WriteString(r.ScaleTable(MetricRate))
		b.WriteString("\n")
	}
	if len(r.PairedOf(PairedClusterIP)) > 0 {
		b.WriteString("## axon ClusterIP vs the backend pod IP, paired\n\n")
		b.WriteString("One client (the ClusterIP path's pod) alternates between the ClusterIP and the backend pod IP in short slices, " +
			"in pairs (random order within a pair, slice lengths 0.75–1.25 × the nominal so no once-a-second timer keeps hitting one side), " +
			"and each pair gives one rate ratio (`axon lab bench _connrate paired`): both sides of a pair " +
			"see the same machine, so CPU contention that moves separate samples by ±10 % cancels out.\n\n")
		b.WriteString(r.PairedTable(PairedClusterIP))
		b.WriteString("\n")
	}
	if len(r.PairedOf(PairedRules)) > 0 {
		b.WriteString("## axon pod → pod IP: a node with kube-proxy's iptables rules vs a rules-free node, paired\n\n")
		b.WriteString("The same alternating slices, from two clients: one process moves between the axon pod on the node where " +
			"kube-proxy iptables runs (`" + PathAxonDirectIPT + "`) and the axon pod on a node without kube-proxy (`" + PathAxonDirect + "`) " +
			"before each slice (their network namespace and cgroup, so each slice's sockets are that pod's), both connecting to the backend pod IP. " +
			"Axon's pods bypass the node's netfilter, so the ratio should be 1.\n\n")
		b.WriteString(r.PairedTable(PairedRules))
		b.WriteString("\n")
	}
	b.WriteString("## Applying each level\n\n")
	b.WriteString(r.SyncTable())
	b.WriteString("\n")
	if r.ControlPlane != nil {
		b.WriteString("## Control plane\n\n")
		b.WriteString(r.ControlPlaneTable())
		b.WriteString("\nEndpointSlice change: one endpoint added to a random generated Service, then removed again (two samples). " +
			"axon: apiserver write → the master entry in node1's pinned `axon_lb_svc` shows the new backend count (polled every 0.5 ms). " +
			"kube-proxy: apiserver write → the end of the sync that applied it, from its own `kubeproxy_sync_proxy_rules_last_timestamp_seconds` " +
			"(with no changes pending). Full sync: axon agent of node2 restarted with its socket-LB maps unpinned (it rebuilds them from " +
			"nothing); kube-proxy restarted, start → end of its first complete sync.\n\n")
	}
	b.WriteString("## Machine\n\n")
	fmt.Fprintf(&b, "- kernel %s, %s × %d CPUs\n", bench.OrNA(r.Host.Kernel), bench.OrNA(r.Host.CPUModel), r.Host.NumCPU)
	var before, after []float64
	var stallTotal uint64
	var busy float64
	for _, s := range r.Samples {
		if s.Err != "" {
			continue
		}
		before, after = append(before, s.Before.Avg10), append(after, s.After.Avg10)
		stallTotal += s.StallMicro
		busy += s.Result.Seconds
	}
	if pb, pa := bench.Summarize(before), bench.Summarize(after); pb.N > 0 {
		fmt.Fprintf(&b, "- CPU pressure (`/proc/pressure/cpu` some avg10, %%) around connect-rate samples: before %s–%s (median %s), after %s–%s (median %s); "+
			"stalled %.1f s of %.1f s measured. The machine is shared (2 CPUs, other engineers compiling): read ratios, not absolute rates.\n",
			bench.FormatNum(pb.Min, 1), bench.FormatNum(pb.Max, 1), bench.FormatNum(pb.Median, 1), bench.FormatNum(pa.Min, 1), bench.FormatNum(pa.Max, 1), bench.FormatNum(pa.Median, 1),
			float64(stallTotal)/1e6, busy)
	}
	b.WriteString("\n## Commands\n\n```\n")
	if r.Command != "" {
		fmt.Fprintf(&b, "%s\n", r.Command)
	}
	fmt.Fprintf(&b, "# server (backend pod)\n%s\n", r.ServerCommand)
	for _, c := range r.KubeProxyCommands {
		fmt.Fprintf(&b, "# kube-proxy\n%s\n", c)
	}
	for _, p := range r.Paths {
		cg := ""
		if p.Client.Cgroup != "" {
			cg = " (in cgroup " + p.Client.Cgroup + ")"
		}
		fmt.Fprintf(&b, "# %s%s\n%s\n", p.Name, cg, p.Command)
	}
	b.WriteString("```\n")
	var fails []string
	for _, s := range r.Samples {
		if s.Err != "" && !strings.HasPrefix(s.Err, "skipped") {
			fails = append(fails, fmt.Sprintf("- %d Services, rep %d, %s: %s", s.Level, s.Rep, bench.MarkdownEscape(s.Path), bench.MarkdownEscape(s.Err)))
		}
	}
	for _, e := range r.Errors {
		if strings.TrimSpace(e) != "" {
			fails = append(fails, "- "+bench.MarkdownEscape(e))
		}
	}
	if len(fails) > 0 {
		b.WriteString("\n## Failures\n\n" + strings.Join(fails, "\n") + "\n")
	}
	return b.String()
}

// CSV: one row per sample and metric, plus CPU pressure.
func (r *Report) CSV() []byte {
	var buf bytes.Buffer
	w := csv.NewWriter(&buf)
	_ = w.Write([]string{"services", "rep", "path", "metric", "value", "unit"})
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }
	for _, s := range r.Samples {
		row := func(metric string, v float64, unit string) {
			if !math.IsNaN(v) {
				_ = w.Write([]string{strconv.Itoa(s.Level), strconv.Itoa(s.Rep), s.Path, metric, f(v), unit})
			}
		}
		if s.Err != "" {
			continue
		}
		row(MetricRate, s.Result.Rate, "1/s")
		row(MetricConnectP50, s.Result.ConnectP50, "us")
		row(MetricConnectP99, s.Result.ConnectP99, "us")
		row(MetricCycleP50, s.Result.CycleP50, "us")
		row(MetricCycleRate, s.value(MetricCycleRate), "1/s")
		row("cycle_p99_us", s.Result.CycleP99, "us")
		row("errors", float64(s.Result.Errors), "count")
		row("psi_before", s.Before.Avg10, "%")
		row("psi_after", s.After.Avg10, "%")
		row("cpu_stall", float64(s.StallMicro), "us")
	}
	if cp := r.ControlPlane; cp != nil {
		for i, v := range cp.AxonChange {
			_ = w.Write([]string{strconv.Itoa(cp.Services - 1), strconv.Itoa(i + 1), "axon", "endpointslice_change", f(v), "ms"})
		}
		for _, mode := range slices.Sorted(maps.Keys(cp.KubeProxyChange)) { // a stable order: re-rendered reports diff clean
			for i, v := range cp.KubeProxyChange[mode] {
				_ = w.Write([]string{strconv.Itoa(cp.Services - 1), strconv.Itoa(i + 1), "kube-proxy " + mode, "endpointslice_change", f(v), "ms"})
			}
		}
	}
	w.Flush()
	return buf.Bytes()
}

// SVG: one panel per level, a bar per path (median conn/s, whiskers min–max).
func (r *Report) SVG() []byte {
	const (
		width, labelW, barW, rowH, headH, pad = 980, 340, 420, 22, 30, 16
	)
	panelH := headH + len(r.Paths)*rowH + pad
	height := 44 + len(r.Levels)*panelH + 20
	var b bytes.Buffer
	esc := bench.XMLEscape
	bench.SVGStart(&b, width, height, 12)
	fmt.Fprintf(&b, `<text x="%d" y="24" font-size="15" font-weight="bold">TCP connect+request+close rate — median conn/s, whiskers min–max, ratio to %s (same run)</text>`+"\n", pad, esc(r.Reference))
	maxV := 1.0
	for _, s := range r.Samples {
		if v := s.value(MetricRate); !math.IsNaN(v) {
			maxV = math.Max(maxV, v)
		}
	}
	colors := []string{"#4e79a7", "#59a14f", "#f28e2b", "#e15759", "#b07aa1", "#edc948", "#76b7b2", "#9c755f"}
	for li, l := range r.Levels {
		y0 := 44 + li*panelH
		fmt.Fprintf(&b, `<text x="%d" y="%d" font-weight="bold">%d Services × %d endpoints</text>`+"\n", pad, y0+18, l.Services, l.Endpoints)
		x0 := pad + labelW
		for i, p := range r.Paths {
			y := y0 + headH + i*rowH
			fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">%s</text>`+"\n", x0-8, y+14, esc(p.Name))
			s := r.Stats(l.Services, p.Name, MetricRate)
			if s.N == 0 {
				fmt.Fprintf(&b, `<text x="%d" y="%d" fill="#999">not measured</text>`+"\n", x0+4, y+14)
				continue
			}
			w := func(v float64) float64 { return math.Max(0, v/maxV*barW) }
			fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>`+"\n", x0, y+3, w(s.Median), rowH-7, colors[i%len(colors)])
			cy := y + rowH/2
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="black"/>`+"\n", float64(x0)+w(s.Min), cy, float64(x0)+w(s.Max), cy)
			fmt.Fprintf(&b, `<text x="%.1f" y="%d">%s conn/s  %s</text>`+"\n", float64(x0)+w(s.Max)+8, y+14,
				bench.FormatNum(s.Median, 0), bench.FormatRatio(r.Ratio(l.Services, p.Name, MetricRate)))
		}
	}
	bench.SVGEnd(&b, pad, height-6, r.Host, r.ClientCPU, r.ServerCPU)
	return b.Bytes()
}

// WriteFiles writes results.csv, results.md, results.json and chart.svg.
func (r *Report) WriteFiles(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create results dir: %w", err)
	}
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("encode results.json: %w", err)
	}
	return bench.WriteResultFiles(dir,
		bench.ResultFile{Name: "results.csv", Data: r.CSV()},
		bench.ResultFile{Name: "results.md", Data: []byte(r.Markdown())},
		bench.ResultFile{Name: "chart.svg", Data: r.SVG()},
		bench.ResultFile{Name: "results.json", Data: append(js, '\n')})
}

// MarshalJSON writes NaN (unavailable pressure) as null.
func (l Level) MarshalJSON() ([]byte, error) {
	type plain Level
	return json.Marshal(struct {
		plain
		PSIBefore *float64 `json:"psiBefore"`
		PSIAfter  *float64 `json:"psiAfter"`
	}{plain(l), jsonnum.From(l.PSIBefore), jsonnum.From(l.PSIAfter)})
}

// afterWrite is each change's time after its API write was acknowledged
// (total - write, sample by sample; NaN where the change failed).
func afterWrite(total, write []float64) []float64 {
	out := make([]float64, 0, len(total))
	for i, t := range total {
		if i < len(write) {
			out = append(out, t-write[i])
		}
	}
	return out
}

// MarshalJSON writes NaN (a failed measurement, unavailable pressure) as null.
func (cp ControlPlane) MarshalJSON() ([]byte, error) {
	type plain ControlPlane
	kp := map[string][]*float64{}
	for k, v := range cp.KubeProxyChange {
		kp[k] = jsonnum.FromAll(v)
	}
	return json.Marshal(struct {
		plain
		AxonChange      []*float64            `json:"axonChangeMs"`
		KubeProxyChange map[string][]*float64 `json:"kubeProxyChangeMs"`
		PSIBefore       *float64              `json:"psiBefore"`
		PSIAfter        *float64              `json:"psiAfter"`
	}{plain(cp), jsonnum.FromAll(cp.AxonChange), kp, jsonnum.From(cp.PSIBefore), jsonnum.From(cp.PSIAfter)})
}

// MarshalJSON adds the CPU pressure around the sample (null when unavailable).
func (s Sample) MarshalJSON() ([]byte, error) {
	type plain Sample
	return json.Marshal(struct {
		plain
		PSIBefore *float64 `json:"psiBefore"`
		PSIAfter  *float64 `json:"psiAfter"`
	}{plain(s), jsonnum.From(s.Before.Avg10), jsonnum.From(s.After.Avg10)})
}

// UnmarshalJSON reads what MarshalJSON wrote (for ReadReport).
func (s *Sample) UnmarshalJSON(b []byte) error {
	type plain Sample
	var v struct {
		plain
		PSIBefore *float64 `json:"psiBefore"`
		PSIAfter  *float64 `json:"psiAfter"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*s = Sample(v.plain)
	s.Before.Avg10, s.After.Avg10 = jsonnum.To(v.PSIBefore), jsonnum.To(v.PSIAfter)
	return nil
}

// UnmarshalJSON reads what MarshalJSON wrote (null → NaN).
func (l *Level) UnmarshalJSON(b []byte) error {
	type plain Level
	var v struct {
		plain
		PSIBefore *float64 `json:"psiBefore"`
		PSIAfter  *float64 `json:"psiAfter"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*l = Level(v.plain)
	l.PSIBefore, l.PSIAfter = jsonnum.To(v.PSIBefore), jsonnum.To(v.PSIAfter)
	return nil
}

// UnmarshalJSON reads what MarshalJSON wrote (null → NaN).
func (cp *ControlPlane) UnmarshalJSON(b []byte) error {
	type plain ControlPlane
	var v struct {
		plain
		AxonChange      []*float64            `json:"axonChangeMs"`
		KubeProxyChange map[string][]*float64 `json:"kubeProxyChangeMs"`
		PSIBefore       *float64              `json:"psiBefore"`
		PSIAfter        *float64              `json:"psiAfter"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*cp = ControlPlane(v.plain)
	cp.AxonChange = jsonnum.ToAll(v.AxonChange)
	cp.KubeProxyChange = map[string][]float64{}
	for k, xs := range v.KubeProxyChange {
		cp.KubeProxyChange[k] = jsonnum.ToAll(xs)
	}
	cp.PSIBefore, cp.PSIAfter = jsonnum.To(v.PSIBefore), jsonnum.To(v.PSIAfter)
	return nil
}

// ReadReport reads a results.json written by WriteFiles, so a report can
// be rendered again (`axon lab bench services --render <dir>`).
func ReadReport(path string) (*Report, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r Report
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("parse %s: %w", path, err)
	}
	return &r, nil
}

// Target is one of the Service benchmark's targets, checked against this run.
type Target struct {
	Target string
	Got    string
	Met    string // "yes", "no" or "n/a"
}

func yesNo(ok bool) string {
	if ok {
		return "yes"
	}
	return "no"
}

// Targets checks the Service benchmark's targets against the run.
func (r *Report) Targets() []Target {
	var out []Target
	lv := r.levelNums()
	ratioAt := func(metric string, n int, a, b string) float64 {
		return bench.Ratio(r.Stats(n, a, metric).Median, r.Stats(n, b, metric).Median)
	}
	metrics := []struct{ key, name string }{{MetricCycleRate, "at median cycle"}, {MetricRate, "measured"}}
	// Separate samples swing ±10 % with the machine's load (the reference
	// itself moves that much between levels); where a paired run of kind
	// measures the same target, it is the measurement, and the separate
	// samples' row keeps its verdict only as information.
	scoredBy := func(kind string, t Target) Target {
		if kind != "" && len(r.PairedOf(kind)) > 0 {
			t.Met = "not scored (separate samples: " + t.Met + "); the paired row scores this target"
		}
		return t
	}
	perLevel := func(target, a, b string, min float64, pairedKind string) {
		var gots, mets []string
		for _, m := range metrics {
			var parts []string
			ok, any := true, false
			for _, n := range lv {
				v := ratioAt(m.key, n, a, b)
				if math.IsNaN(v) {
					parts = append(parts, fmt.Sprintf("%d: n/a", n))
					continue
				}
				any = true
				ok = ok && v >= min
				parts = append(parts, fmt.Sprintf("%d: %.3f×", n, v))
			}
			met := "n/a"
			if any {
				met = yesNo(ok)
			}
			gots = append(gots, m.name+" — "+strings.Join(parts, ", "))
			mets = append(mets, m.name+": "+met)
		}
		out = append(out, scoredBy(pairedKind, Target{target, strings.Join(gots, "; "), strings.Join(mets, "; ")}))
	}
	perLevel("axon ClusterIP conn/s ≥ 0.99 × direct pod IP (axon), by Service count", PathAxonClusterIP, PathAxonDirect, 0.99, PairedClusterIP)
	pairedTarget := func(target, kind string) {
		runs := r.PairedOf(kind)
		if len(runs) == 0 {
			return
		}
		var parts []string
		ok := true
		for _, p := range runs {
			if p.Err != "" || p.Result.Pairs == 0 {
				parts, ok = append(parts, fmt.Sprintf("%d: n/a", p.Services)), false
				continue
			}
			ci := "no CI recorded"
			if x := p.Result; !math.IsNaN(x.RatioCILo) && !math.IsNaN(x.RatioCIHi) {
				ci = fmt.Sprintf("95 %% CI %.3f–%.3f", x.RatioCILo, x.RatioCIHi)
			}
			parts = append(parts, fmt.Sprintf("%d: %.3f× (%s, IQR %.3f–%.3f, %d pairs)", p.Services, p.Result.RatioMedian,
				ci, p.Result.RatioP25, p.Result.RatioP75, p.Result.Pairs))
			ok = ok && p.Result.RatioMedian >= 0.99
		}
		out = append(out, Target{target, strings.Join(parts, ", "), yesNo(ok)})
	}
	pairedTarget("the same, paired (one client alternating ClusterIP and pod IP slices; median ratio per pair)", PairedClusterIP)
	if runs := r.PairedOf(PairedClusterIP); len(runs) > 1 && runs[0].Err == "" && runs[len(runs)-1].Err == "" {
		a, b := runs[0].Result.RatioMedian, runs[len(runs)-1].Result.RatioMedian
		ch := 100 * (b/a - 1)
		out = append(out, Target{fmt.Sprintf("flat from %d to %d Services (≤ 3 %% change), paired", runs[0].Services, runs[len(runs)-1].Services),
			fmt.Sprintf("ClusterIP / pod IP %.3f → %.3f (%+.1f %%)", a, b, ch), yesNo(math.Abs(ch) <= 3)})
	}
	perLevel("axon ClusterIP conn/s ≥ 1.03 × kube-proxy nftables ClusterIP", PathAxonClusterIP, PathNFTClusterIP, 1.03, "")
	perLevel("axon direct pod IP on a node with kube-proxy iptables rules at the no-rules rate (≥ 0.97 × axon on a rules-free node)",
		PathAxonDirectIPT, PathAxonDirect, 0.97, PairedRules)
	pairedTarget("the same, paired (one client alternating between the two nodes' axon pods; ≥ 0.99, median ratio per pair)", PairedRules)
	if len(lv) > 1 {
		first, last := lv[0], lv[len(lv)-1]
		t := Target{Target: fmt.Sprintf("axon per-connection cost flat from %d to %d Services (≤ 3 %% change)", first, last)}
		var gots, mets []string
		for _, m := range metrics {
			a, b := ratioAt(m.key, first, PathAxonClusterIP, PathAxonDirect), ratioAt(m.key, last, PathAxonClusterIP, PathAxonDirect)
			raw := bench.Ratio(r.Stats(last, PathAxonClusterIP, m.key).Median, r.Stats(first, PathAxonClusterIP, m.key).Median)
			if math.IsNaN(a) || math.IsNaN(b) {
				mets = append(mets, m.name+": n/a")
				continue
			}
			ch := 100 * (b/a - 1)
			gots = append(gots, fmt.Sprintf("%s — ClusterIP/direct %.3f → %.3f (%+.1f %%), ClusterIP alone %+.1f %%", m.name, a, b, ch, 100*(raw-1)))
			mets = append(mets, m.name+": "+yesNo(math.Abs(ch) <= 3))
		}
		p50a, p50b := r.Stats(first, PathAxonClusterIP, MetricConnectP50).Median, r.Stats(last, PathAxonClusterIP, MetricConnectP50).Median
		if !math.IsNaN(p50a) && !math.IsNaN(p50b) {
			gots = append(gots, fmt.Sprintf("connect p50 %.1f → %.1f µs", p50a, p50b))
		}
		t.Got, t.Met = strings.Join(gots, "; "), strings.Join(mets, "; ")
		out = append(out, scoredBy(PairedClusterIP, t))
	}
	if cp := r.ControlPlane; cp != nil {
		t := Target{Target: fmt.Sprintf("axon agent full sync of %d Services × %d endpoints ≤ 2 s", cp.Services-1, cp.Endpoints), Met: "n/a"}
		if cp.AgentStartToSynced > 0 {
			t.Got = fmt.Sprintf("process start → all in the BPF map: %s", cp.AgentStartToSynced.Round(time.Millisecond))
			t.Met = yesNo(cp.AgentStartToSynced <= 2*time.Second)
		}
		out = append(out, t)
		t = Target{Target: "one EndpointSlice change in the BPF maps, p99 ≤ 50 ms", Met: "n/a"}
		if p99 := bench.Percentile(cp.AxonChangeIdle, 99); !math.IsNaN(p99) {
			t.Got = fmt.Sprintf("kube-proxies idle: p99 %.1f ms (p50 %.1f ms, n=%d); while they sync the same change: p99 %.1f ms",
				p99, bench.Percentile(cp.AxonChangeIdle, 50), bench.Summarize(cp.AxonChangeIdle).N, bench.Percentile(cp.AxonChange, 99))
			if len(cp.ChangeIdleWrite) > 0 {
				t.Got += fmt.Sprintf(" (the API write alone, idle: p50 %.1f, p99 %.1f ms)", bench.Percentile(cp.ChangeIdleWrite, 50), bench.Percentile(cp.ChangeIdleWrite, 99))
			}
			if len(cp.AgentChangeIdle) > 0 {
				t.Got += fmt.Sprintf("; by the agent's own clock, as kube-proxy's: idle p99 %.1f ms, syncing p99 %.1f ms",
					bench.Percentile(cp.AgentChangeIdle, 99), bench.Percentile(cp.AgentChange, 99))
			}
			t.Met = yesNo(p99 <= 50)
		} else if p99 := bench.Percentile(cp.AxonChange, 99); !math.IsNaN(p99) {
			t.Got = fmt.Sprintf("p99 %.1f ms (p50 %.1f ms, n=%d)", p99, bench.Percentile(cp.AxonChange, 50), bench.Summarize(cp.AxonChange).N)
			t.Met = yesNo(p99 <= 50)
		}
		out = append(out, t)
		t = Target{Target: "agent RSS ≤ 150 MiB", Met: "n/a"}
		var worst uint64
		for _, x := range cp.AgentRSS {
			worst = max(worst, x.HWM)
		}
		if worst > 0 {
			t.Got = fmt.Sprintf("largest VmHWM of any agent: %s", mib(worst))
			t.Met = yesNo(worst <= 150<<20)
		}
		out = append(out, t)
	}
	return out
}

// TargetsTable renders Targets as Markdown.
func (r *Report) TargetsTable() string {
	var b strings.Builder
	b.WriteString("| target | this run | met |\n|---|---|---|\n")
	for _, t := range r.Targets() {
		fmt.Fprintf(&b, "| %s | %s | %s |\n", bench.MarkdownEscape(t.Target), bench.MarkdownEscape(bench.OrNA(t.Got)), t.Met)
	}
	return b.String()
}
