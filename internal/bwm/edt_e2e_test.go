package bwm

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/axonhq/axon/internal/lab"
	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/stats"
	"github.com/axonhq/axon/internal/testutil"
)

// measureDur is the length of one measured flow ("over 10 s" in the targets).
var measureDur = envDuration("AXON_BW_DURATION", 10*time.Second)

// repsOf: repetitions of each interleaved configuration (AXON_BW_REPS, 1).
func repsOf(t *testing.T) int { return testutil.EnvInt(t, "AXON_BW_REPS", 1) }

func envDuration(k string, d time.Duration) time.Duration {
	if v, err := time.ParseDuration(os.Getenv(k)); err == nil && v > 0 {
		return v
	}
	return d
}

// record appends a result line to $AXON_BW_RESULTS (a JSON-lines file) when
// set, so the numbers of a VM run can be copied into docs/bandwidth.md.
func record(t *testing.T, v map[string]any) {
	t.Helper()
	v["test"] = t.Name()
	v["cpu_pressure"] = pressure()
	b, _ := json.Marshal(v)
	t.Log(string(b))
	path := os.Getenv("AXON_BW_RESULTS")
	if path == "" {
		if d := os.Getenv("AXON_VM_OUT"); d != "" {
			path = filepath.Join(d, "bandwidth.jsonl")
		} else if _, err := os.Stat("/run/axon-vm"); err == nil {
			path = "/run/axon-vm/out/bandwidth.jsonl"
		}
	}
	if path == "" {
		return
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Logf("record: %v", err)
		return
	}
	defer f.Close()
	f.Write(append(b, '\n'))
}

// TestEDTRateAccuracy: a single TCP flow from a pod limited to 10/50/100
// Mbit/s, interleaved with an unlimited run (the path's capacity in this
// run), lands near its limit. The limit counts L2 bytes (like TBF): the
// flow's rate is its L2 rate, measured from the pod's own byte counter in
// the BPF map (skb->wire_len); TCP goodput with 1500-byte frames is
// 1448/1514 = 95.6 % of it, reported next to it. Under TCG the VM may not
// reach a limit at all: the lower bound is relative to the capacity
// measured in the same repetition.
func TestEDTRateAccuracy(t *testing.T) {
	requireE2E(t)
	requireFQ(t)
	tp := newTopo(t)
	tp.server("iperf3", "-s", "-B", peerIP, "-p", "5301")
	rates := []uint64{0, 10_000_000, 50_000_000, 100_000_000} // 0: unlimited, the reference
	got := map[uint64][]rateSample{}
	if _, err := tp.iperf(3*time.Second, 5301, false); err != nil { // warm-up: page cache, ARP, TCG code cache
		t.Fatal(err)
	}
	for rep := range repsOf(t) {
		for _, r := range rates {
			res := tp.rateRun(t, r, agentPolicy, 5301)
			got[r] = append(got[r], res)
			v := map[string]any{"rep": rep, "limit_bits": r, "goodput_bits": res.goodput, "retransmits": res.retrans, "virtio": tp.virtio}
			if r > 0 {
				v["goodput_ratio"], v["l2_bits"], v["l2_ratio"] = res.goodput/float64(r), res.l2, res.l2/float64(r)
			}
			record(t, v)
		}
	}
	counters, _ := tp.bwm.Stats()
	t.Logf("bwm counters: %v", counters)
	var capacity []float64
	for _, res := range got[0] {
		capacity = append(capacity, res.goodput)
	}
	capMed := stats.Median(capacity)
	t.Logf("unlimited (capacity of this path in this run): %.1f Mbit/s median", capMed/1e6)
	for _, r := range rates[1:] {
		var l2, gp []float64
		var rt []int
		for _, res := range got[r] {
			l2 = append(l2, res.l2/float64(r))
			gp = append(gp, res.goodput/float64(r))
			rt = append(rt, res.retrans)
		}
		med := stats.Median(l2)
		t.Logf("limit %s: L2/limit median %.3f %v, goodput/limit median %.3f %v, retransmits %v", FormatBits(r), med, l2, stats.Median(gp), gp, rt)
		if med > 1.05 {
			t.Errorf("limit %s: L2 rate %.3f of the limit: over the limit", FormatBits(r), med)
		}
		// TCG tolerance: the target is ±5 %; under TCG on a shared host the
		// guest cannot always carry the limit: >= 70 % of min(limit,
		// capacity at L2) passes, the numbers go to docs/bandwidth.md.
		if expect := min(float64(r), capMed/0.956); med*float64(r) < 0.70*expect {
			t.Errorf("limit %s: L2 rate %.1f Mbit/s, want >= 70%% of min(limit, capacity %.1f Mbit/s at L2)", FormatBits(r), med*float64(r)/1e6, capMed/0.956/1e6)
		}
	}
	if counters["egress_paced"] == 0 {
		t.Error("egress_paced is 0: the EDT program did not see the pod's packets")
	}
	// skb->sk must survive to the uplink (bpf_redirect_neigh, no ip_forward orphaning)
	if s := counters["egress_with_socket"]; s*10 < counters["egress_paced"]*9 {
		t.Errorf("only %d of %d paced packets carried their socket to the uplink: TCP small queues cannot push back", s, counters["egress_paced"])
	}
}

func retrans(rs []iperfResult) []int {
	var out []int
	for _, r := range rs {
		out = append(out, r.retrans)
	}
	return out
}

// TestEDTIngressPolicer: a flow toward a pod with an ingress limit lands
// near it (token bucket before bpf_redirect_peer; TCP reacts to the drops).
func TestEDTIngressPolicer(t *testing.T) {
	requireE2E(t)
	tp := newTopo(t)
	tp.server("iperf3", "-s", "-B", peerIP, "-p", "5302")
	for _, r := range []uint64{10_000_000, 50_000_000} {
		tp.setLimit(0, r)
		res, err := tp.iperf(measureDur, 5302, true)
		if err != nil { // the control connection shares the policed path: one retry
			t.Logf("retrying once: %v", err)
			res, err = tp.iperf(measureDur, 5302, true)
		}
		if err != nil {
			t.Fatal(err)
		}
		ratio := res.bits / float64(r)
		record(t, map[string]any{"limit_bits": r, "goodput_bits": res.bits, "ratio": ratio, "retransmits": res.retrans, "virtio": tp.virtio})
		if ratio > 1.10 || ratio < 0.60 {
			t.Errorf("ingress limit %s: goodput %.3f of the limit, want 0.60..1.10", FormatBits(r), ratio)
		}
	}
	counters, _ := tp.bwm.Stats()
	t.Logf("bwm counters: %v", counters)
	if counters["ingress_drop"] == 0 {
		t.Error("ingress_drop is 0: the policer never acted")
	}
}

// tbfBaseline chains the reference bandwidth CNI plugin (ifb + TBF) on the
// pod's host veth, the way kubelet would for kubernetes.io/egress-bandwidth.
// The axon pod program is detached first: the plugin's mirred filter lives
// on the legacy ingress hook, which a tcx redirect would bypass; the
// baseline pod is routed by the kernel like the lab's baseline datapath.
func (tp *topo) tbfBaseline(t *testing.T, bits uint64, on bool) {
	t.Helper()
	plugin, err := lab.DepPath("bandwidth")
	if err != nil {
		t.Skipf("reference bandwidth plugin not built (%v): run make deps", err)
	}
	cmd := "ADD"
	if !on {
		cmd = "DEL"
	}
	burst := tbfBurst(bits)
	conf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"axt-bw","type":"bandwidth",
"runtimeConfig":{"bandwidth":{"egressRate":%d,"egressBurst":%d}},
"prevResult":{"cniVersion":"1.0.0","interfaces":[{"name":%q,"mac":%q},{"name":"eth0","mac":%q,"sandbox":"/run/netns/%s"}],
"ips":[{"address":"%s/32","interface":1}]}}`, bits, burst, tp.hostIf, tp.hostMAC, tp.podMAC, tp.pod, podIP)
	c := inNS(tp.node, plugin)
	c.Env = append(os.Environ(), "CNI_COMMAND="+cmd, "CNI_CONTAINERID=axtbw"+tp.hostIf, "CNI_NETNS=/run/netns/"+tp.pod,
		"CNI_IFNAME=eth0", "CNI_PATH="+filepath.Dir(plugin))
	c.Stdin = strings.NewReader(conf)
	if out, err := c.CombinedOutput(); err != nil {
		t.Fatalf("bandwidth plugin %s: %v\n%s", cmd, err, out)
	}
	if !on {
		// The plugin's DEL removes its ifb but leaves the ingress qdisc it
		// put on the host veth (kubelet deletes the veth with the pod); the
		// next ADD on this veth would fail with "file exists".
		// A missing qdisc is fine; a failure to remove one shows at that ADD.
		_ = inNS(tp.node, "tc", "qdisc", "del", "dev", tp.hostIf, "ingress").Run()
	}
}

// tbfBurst is the TBF bucket used for the baseline: 64 KiB (one GSO packet)
// or 10 ms of traffic, whichever is larger, in bits.
func tbfBurst(bits uint64) uint64 { return max(64<<10*8, bits/100) }

// TestEDTLatencyVsTBF: a limited pod runs a bulk TCP flow at its limit and
// a TCP request/response flow from the same pod measures latency; axon's
// EDT (fq on the uplink, skb->sk kept, the agent's GSO cap) against the
// bandwidth CNI plugin's TBF, interleaved.
func TestEDTLatencyVsTBF(t *testing.T) {
	requireE2E(t)
	requireFQ(t)
	tp := newTopo(t)
	tp.server("iperf3", "-s", "-B", peerIP, "-p", "5303")
	tp.server("sockperf", "server", "--tcp", "-i", peerIP, "-p", "11311")
	bits := uint64(testutil.EnvInt(t, "AXON_BW_LAT_MBIT", 10)) * 1_000_000 // below what the TCG VM can push: the limiter, not the CPU, is the bottleneck
	res := map[string][]latSample{}
	for rep := range repsOf(t) {
		for _, mode := range []string{"edt", "tbf"} {
			s := tp.latRun(t, mode, bits, agentPolicy, 5303)
			res[mode] = append(res[mode], s)
			record(t, map[string]any{"rep": rep, "mode": mode, "limit_bits": bits, "pod_gso_cap": mode == "edt" && os.Getenv("AXON_BW_POD_GSO") != "off", "rtt_p50_us": s.p50, "rtt_p90_us": s.p90,
				"rtt_p99_us": s.p99, "transactions_per_s": s.tps, "bulk_goodput_bits": s.bulk, "bulk_retransmits": s.retrans, "virtio": tp.virtio})
		}
	}
	med := func(mode string, f func(latSample) float64) float64 {
		var v []float64
		for _, s := range res[mode] {
			v = append(v, f(s))
		}
		return stats.Median(v)
	}
	p99 := func(s latSample) float64 { return s.p99 }
	tps := func(s latSample) float64 { return s.tps }
	for _, m := range []string{"edt", "tbf"} {
		t.Logf("%s: p50 %.0f µs, p90 %.0f µs, p99 %.0f µs, %.0f transactions/s, bulk %.1f Mbit/s", m,
			med(m, func(s latSample) float64 { return s.p50 }), med(m, func(s latSample) float64 { return s.p90 }), med(m, p99), med(m, tps),
			med(m, func(s latSample) float64 { return s.bulk })/1e6)
	}
	// Targets: p99 <= 0.25x TBF's, transactions/s >= 2x. Under TCG the
	// pass/fail bar is looser (0.5x, 1.5x); the docs report the numbers.
	if r := med("edt", p99) / med("tbf", p99); r > 0.5 {
		t.Errorf("EDT p99 is %.2fx TBF's, want <= 0.5x under TCG (target 0.25x)", r)
	}
	if r := med("edt", tps) / med("tbf", tps); r < 1.5 {
		t.Errorf("EDT transactions/s is %.2fx TBF's, want >= 1.5x under TCG (target 2x)", r)
	}
}

func (tp *topo) dpAttachPod() error {
	var err error
	_ = netnsutil.Do(tp.node, func() error { err = tp.dp.AttachPod(tp.hostIf); return nil })
	return err
}

func (tp *topo) dpDetachPod() error {
	var err error
	_ = netnsutil.Do(tp.node, func() error { err = tp.dp.DetachPod(tp.hostIf); return nil })
	return err
}

// TestEDTWithBBR: BBR inside the pod netns; its pacing stamps arrive at the
// uplink as mono delivery times (kept across the netns switch, >= 5.18) and
// the rate still holds.
func TestEDTWithBBR(t *testing.T) {
	requireE2E(t)
	requireFQ(t)
	if err := CheckCongestionControl("bbr"); err != nil {
		if os.Getenv("AXON_VM_NIC_MACS") == "" {
			t.Skipf("BBR not usable in pod netns on this node: %v", err)
		}
		// inside the throwaway VM only: allow bbr for non-initial netns
		allowed, _ := readWords(allowedCCPath)
		if werr := os.WriteFile(allowedCCPath, []byte(strings.Join(append(allowed, "bbr"), " ")), 0o644); werr != nil {
			t.Fatalf("%v; allowing it in the VM: %v", err, werr)
		}
	}
	tp := newTopo(t)
	prev, err := SetCongestionControl("/run/netns/"+tp.pod, "bbr")
	if err != nil {
		t.Fatal(err)
	}
	if cc, _ := CongestionControl("/run/netns/" + tp.pod); cc != "bbr" {
		t.Fatalf("pod netns congestion control %q after setting bbr (was %q)", cc, prev)
	}
	tp.server("iperf3", "-s", "-B", peerIP, "-p", "5304")
	before, _ := tp.bwm.Stats()
	const bits = 20_000_000 // below what the TCG VM pushes under load
	tp.setLimit(bits, 0)
	res, err := tp.iperf(measureDur, 5304, false)
	if err != nil {
		t.Fatal(err)
	}
	after, _ := tp.bwm.Stats()
	dt := after["egress_delivery_time"] - before["egress_delivery_time"]
	paced := after["egress_paced"] - before["egress_paced"]
	ratio := res.bits / float64(bits)
	record(t, map[string]any{"limit_bits": bits, "goodput_bits": res.bits, "ratio": ratio, "retransmits": res.retrans,
		"packets_paced": paced, "packets_with_delivery_time": dt, "virtio": tp.virtio})
	if ratio > 1.05 || ratio < 0.80 {
		t.Errorf("BBR pod limited to 20M: goodput %.3f of the limit, want 0.80..1.05", ratio)
	}
	if dt == 0 {
		t.Errorf("no packet reached the uplink with a mono delivery time: the pod's pacing stamps were cleared across the netns switch")
	}
}

var _ = exec.Command
