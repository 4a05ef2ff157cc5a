package bwm

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/axonhq/axon/internal/bench"
	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/datapath/bandwidth"
	"github.com/axonhq/axon/internal/testutil"
)

// The per-limit state as the BPF maps hold it (bpf/lib/edt.h struct
// bw_state / bw_state_key), read straight from the pins: the tests measure
// a pod's rate from its own L2 byte counter.
type mapStateKey struct {
	ID  uint32
	Dir uint8
	Pad [3]uint8
}

type mapState struct {
	Rate, TLast, Horizon, Burst, Tokens, Drops, Bytes, Flags uint64
}

// Flags of bw_state (bpf/lib/edt.h).
const (
	flagIgnorePodTstamp = 1 // AXON_BW_F_IGNORE_POD_TSTAMP
	flagNoSmallBypass   = 2 // AXON_BW_F_NO_SMALL_BYPASS
)

// statPodPaced is AXON_BW_EGRESS_POD_PACED, the index in axon_bw_stats.
const statPodPaced = 8

// setEgressFlags writes bw_state.flags of a's egress limit.
func setEgressFlags(pin string, a netip.Addr, flags uint64) error {
	addrs, err := ebpf.LoadPinnedMap(filepath.Join(pin, datapath.MapBWAddr), nil)
	if err != nil {
		return err
	}
	defer addrs.Close()
	states, err := ebpf.LoadPinnedMap(filepath.Join(pin, datapath.MapBWState), nil)
	if err != nil {
		return err
	}
	defer states.Close()
	var id uint32
	if err := addrs.Lookup(a.Unmap().As16(), &id); err != nil {
		return fmt.Errorf("id of %s: %w", a, err)
	}
	k := mapStateKey{ID: id, Dir: bandwidth.Egress}
	var st mapState
	if err := states.Lookup(k, &st); err != nil {
		return err
	}
	st.Flags = flags
	return states.Put(k, st)
}

// statCount reads one node-wide counter of axon_bw_stats, summed over CPUs.
func statCount(pin string, idx uint32) uint64 {
	m, err := ebpf.LoadPinnedMap(filepath.Join(pin, datapath.MapBWStats), nil)
	if err != nil {
		return 0
	}
	defer m.Close()
	var per []uint64
	if err := m.Lookup(idx, &per); err != nil {
		return 0
	}
	var s uint64
	for _, v := range per {
		s += v
	}
	return s
}

// podBytes reads the L2 byte counters of every pod address with a limit in
// direction dir (bandwidth.Egress / BWIngress) from the maps pinned in pin.
func podBytes(pin string, dir uint8) (map[netip.Addr]uint64, error) {
	addrs, err := ebpf.LoadPinnedMap(filepath.Join(pin, datapath.MapBWAddr), nil)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", datapath.MapBWAddr, err)
	}
	defer addrs.Close()
	states, err := ebpf.LoadPinnedMap(filepath.Join(pin, datapath.MapBWState), nil)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", datapath.MapBWState, err)
	}
	defer states.Close()
	out := map[netip.Addr]uint64{}
	var k [16]byte
	var id uint32
	it := addrs.Iterate()
	for it.Next(&k, &id) {
		var st mapState
		if err := states.Lookup(mapStateKey{ID: id, Dir: dir}, &st); err != nil {
			if errors.Is(err, ebpf.ErrKeyNotExist) {
				continue
			}
			return nil, fmt.Errorf("read %s id %d: %w", datapath.MapBWState, id, err)
		}
		out[netip.AddrFrom16(k).Unmap()] = st.Bytes
	}
	return out, it.Err()
}

// rateSample is one limited flow: receiver goodput and the pod's L2 rate
// from its egress byte counter (skb->wire_len: every GSO segment's headers,
// what the limit counts), in bits per second.
type rateSample struct {
	goodput, l2 float64
	retrans     int
	podPaced    float64 // share of the paced packets whose departure the pod's own TCP delivery time set
}

// rateRun runs one TCP flow from the pod for measureDur under policy p with
// an egress limit of bits (0: unlimited) and samples the L2 counter inside
// the flow (from 1.5 s, after iperf3's 1 s omitted warm-up, to 0.5 s before
// its end).
func (tp *topo) rateRun(t *testing.T, bits uint64, p edtPolicy, port int) rateSample {
	t.Helper()
	tp.setLimitWith(bits, 0, p)
	type l2s struct {
		bytes uint64
		at    time.Time
	}
	sample := func() (l2s, bool) {
		m, err := podBytes(tp.pin, bandwidth.Egress)
		if err != nil || bits == 0 {
			return l2s{}, false
		}
		return l2s{m[netip.MustParseAddr(podIP)], time.Now()}, true
	}
	paced0, pod0 := statCount(tp.pin, 0), statCount(tp.pin, statPodPaced)
	done := make(chan struct{})
	var l2 float64
	go func() {
		defer close(done)
		time.Sleep(1500 * time.Millisecond)
		a, ok := sample()
		time.Sleep(measureDur - time.Second)
		b, ok2 := sample()
		if ok && ok2 && b.bytes > a.bytes {
			l2 = float64(b.bytes-a.bytes) * 8 / b.at.Sub(a.at).Seconds()
		}
	}()
	res, err := tp.iperf(measureDur, port, false)
	<-done
	if err != nil {
		t.Fatal(err)
	}
	s := rateSample{goodput: res.bits, l2: l2, retrans: res.retrans}
	if d := statCount(tp.pin, 0) - paced0; d > 0 {
		s.podPaced = float64(statCount(tp.pin, statPodPaced)-pod0) / float64(d)
	}
	return s
}

// latSample is one latency-under-load run.
type latSample struct {
	p50, p90, p99, tps, bulk float64
	retrans                  int
}

// latRun: a bulk TCP flow from the pod at its limit plus a sockperf TCP
// ping-pong from the same pod. mode "tbf": the reference bandwidth plugin's
// TBF on the pod's host veth (kernel-routed pod); otherwise axon's EDT under
// policy p. Servers: iperf3 on iperfPort, sockperf on 11311.
func (tp *topo) latRun(t *testing.T, mode string, bits uint64, p edtPolicy, iperfPort int) latSample {
	t.Helper()
	if mode == "tbf" {
		tp.setLimitWith(0, 0, p) // GSO back to 64 KiB
		if err := tp.dpDetachPod(); err != nil {
			t.Fatal(err)
		}
		tp.tbfBaseline(t, bits, true)
		defer func() {
			tp.tbfBaseline(t, bits, false)
			if err := tp.dpAttachPod(); err != nil {
				t.Fatal(err)
			}
		}()
	} else {
		tp.setLimitWith(bits, 0, p)
	}
	bulk := inNS(tp.pod, "iperf3", "-c", peerIP, "-p", fmt.Sprint(iperfPort), "-t", fmt.Sprint(int(measureDur.Seconds())+3), "-J")
	var bulkOut strings.Builder
	bulk.Stdout = &bulkOut
	if err := bulk.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // bulk at its limit first
	secs := fmt.Sprint(int(measureDur.Seconds()))
	out, err := inNS(tp.pod, "sockperf", "ping-pong", "--tcp", "-i", peerIP, "-p", "11311", "-t", secs, "-m", "64", "--full-rtt").CombinedOutput()
	werr := bulk.Wait()
	if err != nil {
		t.Fatalf("%s: sockperf: %v\n%s", mode, err, out)
	}
	if werr != nil {
		t.Fatalf("%s: bulk iperf3: %v", mode, werr)
	}
	sp, err := bench.ParseSockperf(out)
	if err != nil {
		t.Fatalf("%s: %v\n%s", mode, err, out)
	}
	var bj struct {
		End struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
			SumSent struct{ Retransmits int } `json:"sum_sent"`
		} `json:"end"`
	}
	_ = json.Unmarshal([]byte(bulkOut.String()), &bj)
	return latSample{p50: sp.Percentiles[50], p90: sp.Percentiles[90], p99: sp.Percentiles[99],
		tps: float64(sp.Observations) / measureDur.Seconds(), bulk: bj.End.SumReceived.BitsPerSecond, retrans: bj.End.SumSent.Retransmits}
}

// namedOnly skips a benchmark unless -test.run names it: it is a program
// for docs/bandwidth.md (minutes of TCG time), not part of a test sweep.
func namedOnly(t *testing.T) {
	t.Helper()
	f := flag.Lookup("test.run")
	if f == nil || !strings.Contains(f.Value.String(), t.Name()) {
		t.Skipf("benchmark: runs only when named (-run %s)", t.Name())
	}
}

// benchPolicies are the EDT settings compared by TestBWBench: the pod GSO
// cap (time of the rate per GSO packet, floor 16 KiB or 2 full frames) by
// the catch-up credit after late packets.
var benchPolicies = []edtPolicy{
	{name: "cap5ms-16k-slack1ms-nobypass", capTime: 5 * time.Millisecond, capMin: 16 << 10, slack: time.Millisecond, noBypass: true},
	{name: "cap5ms-16k-slack1ms", capTime: 5 * time.Millisecond, capMin: 16 << 10, slack: time.Millisecond},
	{name: "cap5ms-16k-slack10ms", capTime: 5 * time.Millisecond, capMin: 16 << 10, slack: 10 * time.Millisecond},
	{name: "cap10ms-16k-slack10ms", capTime: 10 * time.Millisecond, capMin: 16 << 10, slack: 10 * time.Millisecond},
}

// benchReps: repetitions of the whole interleaved round in TestBWBench.
const benchReps = 2

// TestBWBench is the interleaved benchmark of docs/bandwidth.md, in one VM
// boot: per repetition, the unlimited path (capacity), then every policy at
// 10/50/100 Mbit/s (goodput and L2), then latency under load at 10 Mbit/s
// for every policy and the TBF baseline. Results go to bandwidth.jsonl.
//
//	go run ./hack/vm -kernels debian-6.12 -pkgs ./internal/bwm -run TestBWBench -lab=false -out /tmp/axt-bwm-vm
func TestBWBench(t *testing.T) {
	namedOnly(t)
	requireE2E(t)
	requireFQ(t)
	tp := newTopo(t)
	tp.server("iperf3", "-s", "-B", peerIP, "-p", "5305")
	tp.server("iperf3", "-s", "-B", peerIP, "-p", "5306")
	tp.server("sockperf", "server", "--tcp", "-i", peerIP, "-p", "11311")
	if _, err := tp.iperf(3*time.Second, 5305, false); err != nil { // warm-up
		t.Fatal(err)
	}
	latBits := uint64(testutil.EnvInt(t, "AXON_BW_LAT_MBIT", 10)) * 1_000_000
	for rep := range max(repsOf(t), benchReps) {
		capRun := tp.rateRun(t, 0, benchPolicies[0], 5305)
		record(t, map[string]any{"kind": "rate", "rep": rep, "policy": "unlimited", "limit_bits": 0, "goodput_bits": capRun.goodput, "retransmits": capRun.retrans})
		for _, bits := range []uint64{10_000_000, 50_000_000, 100_000_000} {
			for _, p := range benchPolicies {
				r := tp.rateRun(t, bits, p, 5305)
				record(t, map[string]any{"kind": "rate", "rep": rep, "policy": p.name, "limit_bits": bits, "goodput_bits": r.goodput,
					"goodput_ratio": r.goodput / float64(bits), "l2_bits": r.l2, "l2_ratio": r.l2 / float64(bits), "retransmits": r.retrans, "pod_paced_share": r.podPaced,
					"capacity_bits": capRun.goodput})
			}
		}
		for _, p := range append([]edtPolicy{{name: "tbf"}}, benchPolicies...) {
			mode := "edt"
			if p.name == "tbf" {
				mode = "tbf"
			}
			s := tp.latRun(t, mode, latBits, p, 5306)
			record(t, map[string]any{"kind": "latency", "rep": rep, "policy": p.name, "limit_bits": latBits, "rtt_p50_us": s.p50, "rtt_p90_us": s.p90,
				"rtt_p99_us": s.p99, "transactions_per_s": s.tps, "bulk_goodput_bits": s.bulk, "bulk_retransmits": s.retrans})
		}
	}
	tp.setLimit(0, 0)
	stats, _ := tp.bwm.Stats()
	t.Logf("bwm counters: %v", stats)
}
