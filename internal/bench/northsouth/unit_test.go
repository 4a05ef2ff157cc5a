package northsouth

import (
	"encoding/json"
	"math"
	"os"
	"strings"
	"testing"
)

func TestParseStatSoftirq(t *testing.T) {
	stat := "cpu  4705 356 584 3699176 23060 0 1277 0 0 0\ncpu0 1393 280 234 1848686 13166 0 1000 0 0 0\n"
	if got := parseStatSoftirq(stat); got != 1277 {
		t.Errorf("softirq = %d, want 1277", got)
	}
	if got := parseStatSoftirq("garbage"); got != 0 {
		t.Errorf("garbage = %d", got)
	}
	softirqs := "                    CPU0       CPU1\n          HI:          1          0\n      NET_TX:        10         20\n      NET_RX:     1000       2345\n"
	if got := parseSoftirqsRow(softirqs, "NET_RX:"); got != 3345 {
		t.Errorf("NET_RX = %d, want 3345", got)
	}
}

func TestNSReport(t *testing.T) {
	nan := math.NaN()
	s := func(rep int, cfg string, rate, tput, sq float64) Sample {
		return Sample{Rep: rep, Config: cfg, ConnRate: rate, Throughput: tput, SoftirqUsPerConn: sq, NetRxPerConn: 2,
			Retransmits: 0, PSIBefore: 50, PSIAfter: 60,
			// forwarding: the rate is a tenth of the connection rate in Mpps, the cost its inverse
			FwdPPS: rate * 100, FwdNsPerPacket: 1e7 / rate, FwdBusy: 0.9, FwdOfferedPPS: 5e6, FwdRxPPS: rate * 100}
	}
	r := &Report{Configs: []string{"axon-tc", "axon-xdp", Reference, Floor}, Reference: Reference, Reps: 2}
	r.Samples = []Sample{
		s(1, "axon-tc", 3000, 10e9, 20), s(1, Reference, 1000, 5e9, 40),
		s(2, "axon-tc", 5000, 12e9, 30), s(2, Reference, 2000, 7e9, 60),
		{Rep: 1, Config: "axon-xdp", Skipped: "the north-south LB did not attach at XDP: tc on eth0", ConnRate: nan, Throughput: nan,
			SoftirqUsPerConn: nan, NetRxPerConn: nan, Retransmits: nan, PSIBefore: nan, PSIAfter: nan,
			FwdPPS: nan, FwdNsPerPacket: nan, FwdBusy: nan, FwdOfferedPPS: nan, FwdRxPPS: nan},
	}
	floor := func(rep int, mpps float64) Sample {
		f := s(rep, Floor, nan, nan, nan)
		f.FwdPPS, f.FwdNsPerPacket, f.FwdRxPPS = mpps*1e6, 1e3/mpps, mpps*1e6
		return f
	}
	r.Samples = append(r.Samples, floor(1, 4), floor(2, 5))
	if got := r.Ratio("axon-tc", MetricConnRate); math.Abs(got-4000.0/1500) > 1e-9 {
		t.Errorf("conn/s ratio = %v", got)
	}
	if got := r.Stats("axon-tc", MetricThroughput); got.Median != 11e9 || got.Min != 10e9 || got.Max != 12e9 {
		t.Errorf("throughput stats %+v", got)
	}
	tbl := r.Table()
	for _, want := range []string{"| axon-tc | 4000 (3000–5000) | 2.67× | 11.00 (10.00–12.00) | 1.83× | 25.0 | 0.50×", "axon-xdp | skipped: the north-south LB did not attach", "kube-proxy-iptables (reference)"} {
		if !strings.Contains(tbl, want) {
			t.Errorf("table lacks %q:\n%s", want, tbl)
		}
	}
	if strings.Contains(tbl, Floor) {
		t.Errorf("the connection table has the forwarding floor's row:\n%s", tbl)
	}
	// axon-tc forwards 0.3 and 0.5 Mpps at 3 333 and 2 000 ns (0.3 and 0.5 Mpps
	// per CPU); the reference 0.1 and 0.2 Mpps at 10 000 and 5 000 ns.
	if got := r.Ratio("axon-tc", MetricFwdPerCPU); math.Abs(got-0.4/0.15) > 1e-9 {
		t.Errorf("per-CPU forwarding ratio = %v", got)
	}
	ft := r.FwdTable()
	for _, want := range []string{"| axon-tc | 0.400 (0.300–0.500) | 2.67× | 2667 (2000–3333) | 0.36× | 0.400 | 2.67× | 90 |",
		"| kube-proxy-iptables (reference) | 0.150 (0.100–0.200) | 1.00× |", "axon-xdp | skipped: the north-south LB did not attach",
		"| xdp-forwarder | 4.500 (4.000–5.000) | 30.00× | 225 (200–250) | 0.03× | 4.500 | 30.00× | 90 |"} {
		if !strings.Contains(ft, want) {
			t.Errorf("forwarding table lacks %q:\n%s", want, ft)
		}
	}
	// axon-xdp was skipped: nothing to pair with the floor
	if strings.Contains(ft, "paired by repetition") {
		t.Errorf("a floor comparison without axon-xdp samples:\n%s", ft)
	}
	// axon-xdp forwards 2 and 4 Mpps (at 500 and 250 ns) against the floor's 4 and 5
	xdp := func(rep int, mpps float64) Sample {
		x := s(rep, XDP, 1, 1, 1)
		x.FwdPPS, x.FwdNsPerPacket = mpps*1e6, 1e3/mpps
		return x
	}
	r2 := *r
	r2.Samples = append([]Sample{xdp(1, 2), xdp(2, 4)}, r.Samples[:4]...)
	r2.Samples = append(r2.Samples, floor(1, 4), floor(2, 5))
	if got, want := r2.FloorLine(), "axon-xdp against xdp-forwarder, paired by repetition: forwarded Mpps 0.65× (CI: < 8 pairs), Mpps per CPU 0.65× (CI: < 8 pairs) (2 pairs;"; !strings.HasPrefix(got, want) {
		t.Errorf("floor line\n%s\nwant prefix\n%s", got, want)
	}
	if got := r2.FloorLine(); !strings.Contains(got, "receive CPU was 90 % busy") {
		r2.Samples[len(r2.Samples)-1].FwdBusy, r2.Samples[len(r2.Samples)-2].FwdBusy = 0.3, 0.4
		if got := r2.FloorLine(); !strings.Contains(got, "The forwarder's receive CPU was 35 % busy: its Mpps is what the generator") {
			t.Errorf("floor line of a forwarder 35 %% busy: %s", got)
		}
	} else {
		t.Errorf("floor line of a busy forwarder says it was not the limit: %s", got)
	}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatalf("JSON with NaN samples: %v", err)
	}
	if !strings.Contains(string(b), `"connPerSec":null`) || !strings.Contains(string(b), `"connPerSec":3000`) ||
		!strings.Contains(string(b), `"fwdPps":null`) || !strings.Contains(string(b), `"fwdPps":300000`) {
		t.Errorf("JSON: %s", b)
	}
	if md := r.Markdown(); !strings.Contains(md, "## Samples") || !strings.Contains(md, "## Forwarding rate") || !strings.Contains(md, "5.000 / 0.500 / 0.500 | 2000 | 90 |") || strings.Count(md, "\n| 1 |")+strings.Count(md, "\n| 2 |") != 7 {
		t.Errorf("markdown:\n%s", md)
	}
	if csv := string(r.CSV()); strings.Count(csv, "\n") != 1+7*len(nsMetrics) || !strings.Contains(csv, "2,axon-tc,fwd_ns_per_packet,2000\n") {
		t.Errorf("csv rows: %d\n%s", strings.Count(csv, "\n"), csv)
	}
}

func TestRunNorthSouthRefusesRunningLab(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(dir+"/lab.json", []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Run(t.Context(), Config{StateDir: dir})
	if err == nil || !strings.Contains(err.Error(), "axon lab down") {
		t.Errorf("Run with a lab up: %v", err)
	}
	if _, err := Run(t.Context(), Config{StateDir: dir, Configs: []string{"ipvs"}}); err == nil || !strings.Contains(err.Error(), "unknown configuration") {
		t.Errorf("unknown config: %v", err)
	}
}
