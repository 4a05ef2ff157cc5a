package services

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/axonhq/axon/internal/bench"
	"github.com/axonhq/axon/internal/bench/connrate"
)

const kubeProxyMetricsSample = `# HELP kubeproxy_sync_proxy_rules_last_timestamp_seconds [ALPHA] The last time proxy rules were successfully synced
# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"} 1.7637900001234e+09
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv6"} 1.7637900005e+09
kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds 1.7637899995e+09
kubeproxy_sync_proxy_rules_endpoint_changes_pending 0
kubeproxy_sync_proxy_rules_service_changes_pending{ip_family="IPv4"} 2
kubeproxy_sync_proxy_rules_service_changes_pending{ip_family="IPv6"} 1
kubeproxy_sync_proxy_rules_duration_seconds_bucket{le="0.001"} 3
kubeproxy_sync_proxy_rules_duration_seconds_sum 12.5
kubeproxy_sync_proxy_rules_duration_seconds_count 7
process_resident_memory_bytes 4.5e+08
go_goroutines 80
`

// kube-proxy's own exposition declares the sync duration a histogram
const kubeProxyHistogramSample = `# TYPE kubeproxy_sync_proxy_rules_duration_seconds histogram
kubeproxy_sync_proxy_rules_duration_seconds_bucket{le="0.001"} 3
kubeproxy_sync_proxy_rules_duration_seconds_bucket{le="+Inf"} 7
kubeproxy_sync_proxy_rules_duration_seconds_sum 12.5
kubeproxy_sync_proxy_rules_duration_seconds_count 7
`

func TestParseKubeProxyMetrics(t *testing.T) {
	untyped, _, _ := strings.Cut(kubeProxyMetricsSample, "kubeproxy_sync_proxy_rules_duration_seconds_bucket")
	untyped += "process_resident_memory_bytes 4.5e+08\n"
	for name, in := range map[string]string{
		"sync duration without a TYPE line": kubeProxyMetricsSample,
		"sync duration as a histogram":      untyped + kubeProxyHistogramSample,
	} {
		m, err := ParseKubeProxyMetrics(strings.NewReader(in))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		want := KubeProxyMetrics{LastSync: 1.7637900001234e+09, LastQueued: 1.7637899995e+09, ServicesPending: 3, SyncCount: 7, SyncSum: 12.5, RSS: 4.5e8}
		if m != want {
			t.Errorf("%s: got %+v\nwant %+v", name, m, want)
		}
	}
	m, _ := ParseKubeProxyMetrics(strings.NewReader(kubeProxyMetricsSample))
	if m.Synced(time.Unix(1763789999, 0)) {
		t.Error("Synced with 3 service changes pending")
	}
	m.ServicesPending = 0
	if !m.Synced(time.Unix(1763789999, 0)) {
		t.Error("not Synced: nothing pending, last sync after t and after the last queued change")
	}
	if m.Synced(time.Unix(1763790001, 0)) {
		t.Error("Synced although the last sync ended before t")
	}
	if _, err := ParseKubeProxyMetrics(strings.NewReader("go_goroutines 3\n")); err == nil {
		t.Error("no kube-proxy metrics: want an error")
	}
	if _, err := ParseKubeProxyMetrics(strings.NewReader("kubeproxy_sync_proxy_rules_endpoint_changes_pending x\n")); err == nil {
		t.Error("bad value: want an error")
	}
}

func TestAgentLastWrite(t *testing.T) {
	tests := []struct {
		name, in string
		want     time.Time
		err      string
	}{
		{"written", "# HELP axon_services_last_write_timestamp_seconds x\n# TYPE axon_services_last_write_timestamp_seconds gauge\n" +
			"axon_services_last_write_timestamp_seconds 1.7640672005e+09\naxon_services_writes_total 3\n", time.Unix(1764067200, 500000000), ""},
		{"never written", "axon_services_last_write_timestamp_seconds 0\n", time.Time{}, "no Service change yet"},
		{"older agent", "axon_agent_ready 1\n", time.Time{}, "no axon_services_last_write_timestamp_seconds"},
		{"garbage", "axon_services_last_write_timestamp_seconds{ 1\n", time.Time{}, "parse metrics"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := AgentLastWrite(strings.NewReader(tt.in))
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("error %v, want one with %q", err, tt.err)
				}
				return
			}
			if err != nil || got.Sub(tt.want).Abs() > time.Microsecond {
				t.Errorf("got %v, %v; want %v", got, err, tt.want)
			}
		})
	}
}

func TestParseVmStatus(t *testing.T) {
	hwm, rss, err := parseVmStatus("Name:\tkube-proxy\nVmPeak:\t 1000 kB\nVmHWM:\t  440320 kB\nVmRSS:\t  400000 kB\n")
	if err != nil || hwm != 440320<<10 || rss != 400000<<10 {
		t.Errorf("got %d %d %v", hwm, rss, err)
	}
	if _, _, err := parseVmStatus("Name:\tkthreadd\n"); err == nil {
		t.Error("no VmHWM: want an error")
	}
	if _, _, err := parseVmStatus("VmHWM:\t12 MB\n"); err == nil {
		t.Error("bad unit: want an error")
	}
	// The real thing: this test process.
	if hwm, _, err := VmHWM(os.Getpid()); err != nil || hwm == 0 {
		t.Errorf("VmHWM(self) = %d, %v", hwm, err)
	}
}

func TestParseLevels(t *testing.T) {
	tests := []struct {
		in   string
		want []int
		ok   bool
	}{
		{"10,1000,10000", []int{10, 1000, 10000}, true},
		{"10, 1k, 10k", []int{10, 1000, 10000}, true},
		{"10_000", []int{10000}, true},
		{"", nil, false},
		{"1000,10", nil, false},
		{"0", nil, false},
		{"ten", nil, false},
	}
	for _, tt := range tests {
		got, err := ParseLevels(tt.in)
		if (err == nil) != tt.ok || tt.ok && !equalInts(got, tt.want) {
			t.Errorf("ParseLevels(%q) = %v, %v; want %v ok=%v", tt.in, got, err, tt.want, tt.ok)
		}
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestSvcKeyBytes(t *testing.T) {
	k := svcKeyBytes(netip.MustParseAddr("10.96.0.10"), 80, 0)
	if len(k) != lbSvcKeySize {
		t.Fatalf("key is %d bytes", len(k))
	}
	want := []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 96, 0, 10, 0, 80, 6, 0, 0, 0, 0, 0}
	if string(k) != string(want) {
		t.Errorf("key\n got %v\nwant %v", k, want)
	}
	k = svcKeyBytes(netip.MustParseAddr("10.96.0.10"), 443, 3)
	if binary.BigEndian.Uint16(k[16:]) != 443 || binary.NativeEndian.Uint16(k[20:]) != 3 {
		t.Errorf("port/slot encoding: %v", k)
	}
}

// testReport is a two-level report with the reference, a ClusterIP path and
// a path skipped at the second level.
func testReport() *Report {
	r := &Report{Reps: 2, Duration: time.Second, Reference: "ref", Endpoints: 10,
		Paths:  []PathInfo{{Name: "ref"}, {Name: "cip"}, {Name: "ipt"}},
		Levels: []Level{{Services: 10, Endpoints: 10, PSIBefore: math.NaN(), PSIAfter: 1}, {Services: 1000, Endpoints: 10}}}
	add := func(level, rep int, path string, rate float64, err string) {
		r.Samples = append(r.Samples, Sample{Level: level, Rep: rep, Path: path, Err: err,
			Result: connrate.Result{Rate: rate, ConnectP50: 30, ConnectP99: 60, CycleP50: 80, CycleP99: math.NaN()},
			Before: bench.Pressure{Avg10: 2}, After: bench.Pressure{Avg10: 3}})
	}
	for rep := 1; rep <= 2; rep++ {
		add(10, rep, "ref", 10000, "")
		add(10, rep, "cip", 9900, "")
		add(10, rep, "ipt", 8000, "")
		add(1000, rep, "ref", 10000, "")
		add(1000, rep, "cip", 10100, "")
		add(1000, rep, "ipt", 0, "skipped: kube-proxy iptables has not applied this level")
	}
	r.ControlPlane = &ControlPlane{Services: 1001, Endpoints: 10, AxonChange: []float64{1, 2, math.NaN()},
		ChangeWrite:     []float64{0.5, 1.5, 3},
		KubeProxyChange: map[string][]float64{"nftables": {500, 700}}, PSIBefore: math.NaN()}
	return r
}

func TestSvcReportRendering(t *testing.T) {
	r := testReport()
	if got := r.Ratio(10, "cip", MetricRate); math.Abs(got-0.99) > 1e-9 {
		t.Errorf("ratio = %v, want 0.99", got)
	}
	md := r.Markdown()
	for _, want := range []string{
		"| ref (reference) | 10000 (10000–10000) | 1.00× | 12500 (12500–12500) | 1.00× |",
		"| cip | 9900 (9900–9900) | 0.99× | 12500 (12500–12500) | 1.00× |",
		"skipped: kube-proxy iptables has not applied this level",
		"| cip | 9900 (0.99×) | 10100 (1.01×) | +2.0 % |",
		"| ipt | 8000 (0.80×) | n/a | n/a |",
		// percentiles interpolate between order statistics (stats.Quantile): of {500, 700}, p50 600 and p99 698
		"p50 600.0, p99 698.0, max 700.0 (n=2)",
		// the failed change (NaN) has no "after the write" sample
		"| … of which the API write (EndpointSlice update acknowledged), ms | p50 1.5, p99 3.0, max 3.0 (n=3) |",
		"| … and after it (watch → agent → BPF map), ms | p50 0.5, p99 0.5, max 0.5 (n=2) |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "## Failures") {
		t.Errorf("skipped samples are not failures:\n%s", md)
	}
	csv := string(r.CSV())
	if !strings.Contains(csv, "10,1,cip,conn_per_s,9900,1/s") || strings.Contains(csv, "1000,1,ipt,conn_per_s") {
		t.Errorf("csv:\n%s", csv)
	}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatalf("report with NaN must marshal: %v", err)
	}
	if !strings.Contains(string(b), `"axonChangeMs":[1,2,null]`) {
		t.Errorf("json: NaN change should be null: %s", b)
	}
	svg := string(r.SVG())
	if !strings.HasPrefix(svg, "<?xml") || !strings.Contains(svg, "not measured") || !strings.Contains(svg, "9900 conn/s") {
		t.Errorf("svg:\n%s", svg)
	}
	dir := t.TempDir()
	if err := r.WriteFiles(dir); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"results.csv", "results.md", "results.json", "chart.svg"} {
		if st, err := os.Stat(dir + "/" + f); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
}

func TestSvcConfigValidation(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"defaults", Config{Axon: "/bin/axon"}, true},
		{"no binary", Config{}, false},
		{"descending", Config{Axon: "x", Levels: []int{100, 10}}, false},
		{"too many endpoints", Config{Axon: "x", Levels: []int{100000}, Endpoints: 100}, false},
		{"tiny duration", Config{Axon: "x", Duration: time.Millisecond}, false},
		{"one pairing", Config{Axon: "x", Pairings: []string{PairedRules}}, true},
		{"unknown pairing", Config{Axon: "x", Pairings: []string{"clusterIP"}}, false},
	}
	for _, tt := range tests {
		c, err := tt.cfg.withDefaults()
		if (err == nil) != tt.ok {
			t.Errorf("%s: err = %v, want ok=%v", tt.name, err, tt.ok)
		}
		if tt.ok && (len(c.Levels) != 3 || c.Endpoints != 10 || c.Reps != 5 || c.ServerCPU != 1) {
			t.Errorf("%s: defaults: %+v", tt.name, c)
		}
	}
}

func TestSvcTargetsAndRoundTrip(t *testing.T) {
	r := &Report{Reps: 1, Reference: PathAxonDirect,
		Paths:  []PathInfo{{Name: PathAxonDirect}, {Name: PathAxonClusterIP}, {Name: PathNFTClusterIP}, {Name: PathAxonDirectIPT}},
		Levels: []Level{{Services: 10, PSIBefore: math.NaN()}, {Services: 10000}}}
	add := func(level int, path string, rate float64) {
		r.Samples = append(r.Samples, Sample{Level: level, Rep: 1, Path: path, Result: connrate.Result{Rate: rate, CycleP50: 1e6 / rate},
			Before: bench.Pressure{Avg10: math.NaN()}, After: bench.Pressure{Avg10: 5}})
	}
	add(10, PathAxonDirect, 1000)
	add(10, PathAxonClusterIP, 995)
	add(10, PathNFTClusterIP, 960)
	add(10, PathAxonDirectIPT, 1000)
	add(10000, PathAxonDirect, 1000)
	add(10000, PathAxonClusterIP, 990)
	add(10000, PathNFTClusterIP, 950)
	r.ControlPlane = &ControlPlane{Services: 10001, Endpoints: 10, AgentStartToSynced: 1500 * time.Millisecond,
		AxonChange: []float64{5, 7, 60}, AgentRSS: []RSS{{Who: "a", HWM: 100 << 20}}}
	paired := func(kind string, level int, ratio float64) Paired {
		return Paired{Kind: kind, Services: level, Result: connrate.PairedResult{Pairs: 100, RatioMedian: ratio, RatioP25: ratio - 0.02, RatioP75: ratio + 0.02,
			RatioCILo: ratio - 0.01, RatioCIHi: ratio + 0.01}}
	}
	// Kind "" is a report from before the rules pairing: ClusterIP
	r.Paired = []Paired{paired("", 10, 0.995), paired(PairedRules, 10, 1.002),
		paired(PairedClusterIP, 10000, 0.993), paired(PairedRules, 10000, 0.985)}
	r.Paired[1].Result.RatioCILo, r.Paired[1].Result.RatioCIHi = math.NaN(), math.NaN() // e.g. a report from before the interval
	const both = "at median cycle: yes; measured: yes"
	got := map[string]string{}
	for _, tg := range r.Targets() {
		got[tg.Target] = tg.Met
	}
	const informational = "not scored (separate samples: " + both + "); the paired row scores this target"
	want := map[string]string{
		"axon ClusterIP conn/s ≥ 0.99 × direct pod IP (axon), by Service count":                                                 informational,
		"axon ClusterIP conn/s ≥ 1.03 × kube-proxy nftables ClusterIP":                                                          both,
		"axon per-connection cost flat from 10 to 10000 Services (≤ 3 % change)":                                                informational,
		"axon direct pod IP on a node with kube-proxy iptables rules at the no-rules rate (≥ 0.97 × axon on a rules-free node)": informational,
		"axon agent full sync of 10000 Services × 10 endpoints ≤ 2 s":                                                           "yes",
		"one EndpointSlice change in the BPF maps, p99 ≤ 50 ms":                                                                 "no",
		"agent RSS ≤ 150 MiB": "yes",
		"the same, paired (one client alternating ClusterIP and pod IP slices; median ratio per pair)":              "yes",
		"flat from 10 to 10000 Services (≤ 3 % change), paired":                                                     "yes",
		"the same, paired (one client alternating between the two nodes' axon pods; ≥ 0.99, median ratio per pair)": "no",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("target %q: met %q, want %q (all: %v)", k, got[k], v, got)
		}
	}
	md := r.Markdown()
	for _, w := range []string{"| target | this run | met |\n", "| 10 | 100 × 0 ms | 0.995 [0.985–1.005] (0.975–1.015) |", "| 10000 | 100 × 0 ms | 0.985 [0.975–0.995] (0.965–1.005) |",
		"| 10 | 100 × 0 ms | 1.002 [CI n/a] (0.982–1.022) |",
		"iptables-rules node / rules-free node per pair", "## axon pod → pod IP: a node with kube-proxy's iptables rules vs a rules-free node, paired"} {
		if !strings.Contains(md, w) {
			t.Errorf("results.md lacks %q:\n%s", w, md)
		}
	}
	dir := t.TempDir()
	if err := r.WriteFiles(dir); err != nil {
		t.Fatal(err)
	}
	back, err := ReadReport(dir + "/results.json")
	if err != nil {
		t.Fatal(err)
	}
	if back.Markdown() != r.Markdown() {
		t.Errorf("re-rendered report differs:\n%s\n---\n%s", back.Markdown(), r.Markdown())
	}
}

// hasChildren sees a child process of ours while it runs and not after it
// is reaped (pauseKubeProxies waits on it for kube-proxy's rule restores).
func TestHasChildren(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if !hasChildren(os.Getpid()) {
		t.Error("a running child was not seen")
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if hasChildren(os.Getpid()) {
		t.Error("a reaped child is still seen")
	}
}
