package bandwidth

import (
	"net/netip"
	"testing"
	"time"

	"github.com/axonhq/axon/internal/datapath/dptest"
	"golang.org/x/sys/unix"
)

func newBWMFixture(t *testing.T, pin string) *Manager {
	t.Helper()
	dptest.RequireRoot(t)
	if pin == "" {
		pin = newPinDir(t)
	}
	b, err := loadObjects(Config{PinDir: pin, Uplink: "eth0", Logger: dptest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func (b *Manager) stat(t *testing.T, name string) uint64 {
	t.Helper()
	s, err := b.Stats()
	if err != nil {
		t.Fatal(err)
	}
	return s[name]
}

func (b *Manager) egressState(t *testing.T, a netip.Addr) bwState {
	t.Helper()
	var id uint32
	if err := b.objs.AxonBwAddr.Lookup(bwKey(a), &id); err != nil {
		t.Fatalf("lookup id of %s: %v", a, err)
	}
	var st bwState
	if err := b.objs.AxonBwState.Lookup(bwStateKey{Id: id, Dir: Egress}, &st); err != nil {
		t.Fatalf("lookup state of %s: %v", a, err)
	}
	return st
}

// TestEDTProgram runs bpf/uplink_egress.c with BPF_PROG_TEST_RUN: the
// departure times it writes into skb->tstamp are the whole contract with fq.
func TestEDTProgram(t *testing.T) {
	b := newBWMFixture(t, "")
	b.SetEgressSlack(0) // strict: exact stamps (the catch-up window has its own subtest)
	prog := b.Program()
	mac1, mac2 := dptest.MustMAC(t, "02:00:00:00:00:01"), dptest.MustMAC(t, "02:00:00:00:00:02")
	pod := netip.MustParseAddr("10.244.1.5")
	pod6 := netip.MustParseAddr("fd00:10:244:1::5")
	other := netip.MustParseAddr("10.244.1.6")
	dst := netip.MustParseAddr("198.18.0.250")
	dst6 := netip.MustParseAddr("fd00:198:18::250")
	pkt := dptest.IPv4Packet(mac2, mac1, pod, dst, 64, nil)
	pkt6 := dptest.IPv6Packet(mac2, mac1, pod6, dst6, 64)
	const horizon = 2 * time.Second
	apply := func(bits uint64) {
		t.Helper()
		if err := b.Apply([]Limit{{Addrs: []netip.Addr{pod, pod6}, EgressBits: bits}}, horizon); err != nil {
			t.Fatal(err)
		}
	}
	delay := func(bits uint64, wire uint32) uint64 { return uint64(wire) * 1e9 / (bits / 8) }

	apply(10_000_000) // 10 Mbit/s = 1.25 MB/s

	t.Run("timestamps advance by len*8/rate", func(t *testing.T) {
		const wire = 1514
		before := dptest.MonoNow(t)
		r1 := dptest.RunEDT(t, prog, pkt, 0, wire)
		if r1.Verdict != dptest.TCActOK {
			t.Fatalf("verdict %d, want TC_ACT_OK", r1.Verdict)
		}
		after := dptest.MonoNow(t)
		d := delay(10_000_000, wire) // 1.2112 ms
		// an idle pod's first packet leaves now; it books the link for d
		if r1.Tstamp < before || r1.Tstamp > after {
			t.Fatalf("first departure %d not now (%d..%d)", r1.Tstamp, before, after)
		}
		prev := r1.Tstamp
		for i := range 5 {
			r := dptest.RunEDT(t, prog, pkt, 0, wire)
			if r.Verdict != dptest.TCActOK || !r.DepartsAfter(prev, d) {
				t.Fatalf("packet %d: verdict %d, departure +%d ns after the previous one, want +%d", i+2, r.Verdict, r.Tstamp-prev, d)
			}
			prev = r.Tstamp
		}
		// a GSO packet is charged every segment's headers (wire_len), and
		// the pod's IPv6 address shares the IPv4 address's clock
		r := dptest.RunEDT(t, prog, pkt6, 0, 64000)
		if !r.DepartsAfter(prev, d) || !bytesEqual(r.Out, pkt6) {
			t.Fatalf("IPv6 packet: +%d ns, want +%d (shared clock); bytes changed: %v", r.Tstamp-prev, d, !bytesEqual(r.Out, pkt6))
		}
		prev = r.Tstamp
		r = dptest.RunEDT(t, prog, pkt, 0, wire)
		if !r.DepartsAfter(prev, delay(10_000_000, 64000)) {
			t.Fatalf("after a 64000-byte GSO packet: +%d ns, want +%d", r.Tstamp-prev, delay(10_000_000, 64000))
		}
	})

	t.Run("beyond the horizon is dropped and counted", func(t *testing.T) {
		apply(10_000_000)
		drops0 := b.stat(t, "egress_drop_horizon")
		const wire = 64000 // 51.2 ms each at 10 Mbit/s: 2 s = ~39 packets
		var passed, dropped int
		var last uint64
		for range 60 {
			r := dptest.RunEDT(t, prog, pkt, 0, wire)
			switch r.Verdict {
			case dptest.TCActOK:
				passed++
				last = r.Tstamp
			case dptest.TCActShot:
				dropped++
			default:
				t.Fatalf("verdict %d", r.Verdict)
			}
		}
		now := dptest.MonoNow(t)
		if dropped == 0 || passed < 30 {
			t.Fatalf("passed %d, dropped %d: want ~39 passed then drops", passed, dropped)
		}
		if last-now > uint64(horizon) {
			t.Fatalf("last departure %v ahead, beyond the horizon %v", time.Duration(last-now), horizon)
		}
		if got := b.stat(t, "egress_drop_horizon") - drops0; got != uint64(dropped) {
			t.Fatalf("egress_drop_horizon moved by %d, want %d", got, dropped)
		}
		if st := b.egressState(t, pod); st.Drops < uint64(dropped) || st.T_last != last+delay(10_000_000, wire) {
			t.Fatalf("state %+v: want drops >= %d and t_last = last departure %d + its %d ns", st, dropped, last, delay(10_000_000, wire))
		}
	})

	t.Run("an unlimited pod is untouched", func(t *testing.T) {
		un0 := b.stat(t, "egress_unlimited")
		in := dptest.IPv4Packet(mac2, mac1, other, dst, 64, nil)
		r := dptest.RunEDT(t, prog, in, 777, 0)
		if r.Verdict != dptest.TCActOK || r.Tstamp != 777 || !bytesEqual(r.Out, in) {
			t.Fatalf("verdict %d tstamp %d, want OK and the input stamp 777, bytes unchanged", r.Verdict, r.Tstamp)
		}
		if b.stat(t, "egress_unlimited") != un0+1 {
			t.Fatal("egress_unlimited did not count the packet")
		}
		// a limit of 0 in one direction is no limit: the pod with only an
		// ingress limit is not paced on egress
		if err := b.Apply([]Limit{{Addrs: []netip.Addr{pod}, IngressBits: 1_000_000}}, horizon); err != nil {
			t.Fatal(err)
		}
		if r := dptest.RunEDT(t, prog, pkt, 0, 0); r.Verdict != dptest.TCActOK || r.Tstamp != 0 {
			t.Fatalf("ingress-only pod: verdict %d tstamp %d, want untouched", r.Verdict, r.Tstamp)
		}
	})

	t.Run("rate change takes effect on the next packet", func(t *testing.T) {
		if err := b.Apply(nil, horizon); err != nil { // removal: state gone
			t.Fatal(err)
		}
		if rows, _ := b.List(); len(rows) != 0 {
			t.Fatalf("after removing every limit: %+v", rows)
		}
		apply(10_000_000)
		r1 := dptest.RunEDT(t, prog, pkt, 0, 1500)
		r2 := dptest.RunEDT(t, prog, pkt, 0, 1500)
		apply(100_000_000) // r2 booked the link at 10 Mbit/s; the next charge is at 100
		r3 := dptest.RunEDT(t, prog, pkt, 0, 1500)
		r4 := dptest.RunEDT(t, prog, pkt, 0, 1500)
		if got, want := r2.Tstamp-r1.Tstamp, delay(10_000_000, 1500); !r2.DepartsAfter(r1.Tstamp, want) {
			t.Fatalf("at 10 Mbit/s: +%d ns, want +%d", got, want)
		}
		if got, want := r4.Tstamp-r3.Tstamp, delay(100_000_000, 1500); !r4.DepartsAfter(r3.Tstamp, want) {
			t.Fatalf("after 10 -> 100 Mbit/s: +%d ns, want +%d", got, want)
		}
		apply(1_000_000)
		r5 := dptest.RunEDT(t, prog, pkt, 0, 1500)
		r6 := dptest.RunEDT(t, prog, pkt, 0, 1500)
		if got, want := r6.Tstamp-r5.Tstamp, delay(1_000_000, 1500); !r6.DepartsAfter(r5.Tstamp, want) {
			t.Fatalf("after 100 -> 1 Mbit/s: +%d ns, want +%d", got, want)
		}
	})

	t.Run("a late pod catches up within the slack", func(t *testing.T) {
		if err := b.Apply(nil, horizon); err != nil {
			t.Fatal(err)
		}
		// 1 Mbit/s and 50 ms: each packet books 12 ms, far more than a
		// run takes even under QEMU TCG on a loaded host (~1 ms)
		b.SetEgressSlack(50 * time.Millisecond)
		defer b.SetEgressSlack(0)
		apply(1_000_000)
		d := delay(1_000_000, 1500) // 12 ms
		const slack = uint64(50 * time.Millisecond)
		// An idle pod starts 50 ms in the past: the first 4 packets leave
		// now (50 ms / 12 ms of catch-up), then the schedule runs ahead of
		// now. How many packets that takes depends on how fast they arrive:
		// each one spends d of the catch-up while the clock moves on by the
		// time a run takes, so send until a departure is ahead of its run's
		// "after".
		now := dptest.MonoNow(t)
		var ts []uint64
		var last dptest.EDTRun
		for len(ts) < 64 {
			last = dptest.RunEDT(t, prog, pkt, 0, 1500)
			ts = append(ts, last.Tstamp)
			if last.Tstamp > last.After {
				break
			}
		}
		end := dptest.MonoNow(t)
		if last.Tstamp <= last.After {
			t.Fatalf("64 packets of 12 ms each never got ahead of now: the catch-up is unbounded: %v", ts)
		}
		if len(ts) < 5 {
			t.Fatalf("packet %d already ahead of now, want at least 4 sent at once from 50 ms of slack: %v", len(ts), ts)
		}
		for i, x := range ts[:4] {
			if x < now || x > end {
				t.Fatalf("packet %d left at %d, want now (%d..%d): %v", i+1, x, now, end, ts)
			}
		}
		// once ahead, strict pacing again: one booking of d per packet
		next := dptest.RunEDT(t, prog, pkt, 0, 1500)
		if !next.DepartsAfter(last.Tstamp, d) {
			t.Fatalf("after catching up: +%d ns, want +%d", next.Tstamp-last.Tstamp, d)
		}
		// With the slack, packet k starts no later than the last arrival -
		// slack + (k-1)*d; strict pacing would put it at the first arrival +
		// (k-1)*d, slack later. Bounded by the last run's end, not now: a
		// slow CPU only moves the bound, never the verdict.
		n := uint64(len(ts)) // next is packet n+1
		if bound := next.After + n*d - slack; next.Tstamp > bound {
			t.Fatalf("packet %d leaves %v after its run, want <= %v: the slack was not used",
				n+1, time.Duration(next.Tstamp-next.After), time.Duration(n*d-slack))
		}
	})

	t.Run("time going backwards restarts at now", func(t *testing.T) {
		apply(10_000_000)
		var id uint32
		if err := b.objs.AxonBwAddr.Lookup(bwKey(pod), &id); err != nil {
			t.Fatal(err)
		}
		k := bwStateKey{Id: id, Dir: Egress}
		st := b.egressState(t, pod)
		st.T_last = dptest.MonoNow(t) + uint64(time.Hour) // state from a clock that ran ahead
		if err := b.objs.AxonBwState.Put(k, st); err != nil {
			t.Fatal(err)
		}
		resets := b.stat(t, "egress_clock_reset")
		before := dptest.MonoNow(t)
		r := dptest.RunEDT(t, prog, pkt, 0, 1500)
		after := dptest.MonoNow(t)
		if r.Verdict != dptest.TCActOK || r.Tstamp < before || r.Tstamp > after {
			t.Fatalf("verdict %d departure %d, want OK at now (%d..%d)", r.Verdict, r.Tstamp, before, after)
		}
		if b.stat(t, "egress_clock_reset") != resets+1 {
			t.Fatal("egress_clock_reset not counted")
		}
		// a stamp in the past (the pod's clock is behind) never moves the
		// departure before now
		r = dptest.RunEDT(t, prog, pkt, 1, 1500)
		if r.Tstamp < after {
			t.Fatalf("departure %d before now %d", r.Tstamp, after)
		}
	})

	t.Run("an RX timestamp is not a departure time", func(t *testing.T) {
		apply(10_000_000)
		if err := b.Apply(nil, horizon); err != nil {
			t.Fatal(err)
		}
		apply(10_000_000)
		// tstamp_type 0 (not mono delivery time): a far-future value in
		// another clock must be ignored, not honoured or dropped
		rx := dptest.MonoNow(t) + uint64(50*365*24*time.Hour)
		before := dptest.MonoNow(t)
		r := dptest.RunEDT(t, prog, pkt, rx, 1500)
		if r.Verdict != dptest.TCActOK || r.Tstamp > before+uint64(time.Second) {
			t.Fatalf("verdict %d departure %d, want OK near now %d", r.Verdict, r.Tstamp, before)
		}
	})

	// IPv4 BIG TCP sends GSO packets over 64 KiB with tot_len 0: they are
	// the bulk of a pod's bytes and must be paced like any other.
	t.Run("IPv4 BIG TCP packets (tot_len 0) are paced", func(t *testing.T) {
		if err := b.Apply(nil, horizon); err != nil {
			t.Fatal(err)
		}
		apply(100_000_000)
		big := dptest.BigTCP4(pkt, unix.IPPROTO_TCP)
		const wire = 60_000 // 4.8 ms at 100 Mbit/s; PROG_TEST_RUN refuses wire_len > 64 KiB
		un0 := b.stat(t, "egress_unlimited")
		r1 := dptest.RunEDTCtx(t, prog, big, dptest.SKBFields{WireLen: wire, GSOSize: 1448}.Ctx())
		r2 := dptest.RunEDTCtx(t, prog, big, dptest.SKBFields{WireLen: wire, GSOSize: 1448}.Ctx())
		if r1.Verdict != dptest.TCActOK || r2.Verdict != dptest.TCActOK || r1.Tstamp == 0 {
			t.Fatalf("verdicts %d %d, first departure %d: want OK and a stamp", r1.Verdict, r2.Verdict, r1.Tstamp)
		}
		if d := delay(100_000_000, wire); !r2.DepartsAfter(r1.Tstamp, d) {
			t.Fatalf("second BIG TCP packet +%d ns after the first, want +%d", r2.Tstamp-r1.Tstamp, d)
		}
		if got := b.stat(t, "egress_unlimited") - un0; got != 0 {
			t.Fatalf("egress_unlimited moved by %d: the limited pod's BIG TCP packets were not recognised", got)
		}
		if got := b.egressState(t, pod).Bytes; got < 2*wire {
			t.Fatalf("state charged %d bytes, want >= %d", got, 2*wire)
		}
	})
}

func bytesEqual(a, b []byte) bool { return string(a) == string(b) }

// TestBWMApply checks id allocation and restart: two loads on one pin dir
// share the maps, ids survive, stale entries go.
func TestBWMApply(t *testing.T) {
	pin := newPinDir(t)
	b := newBWMFixture(t, pin)
	a := netip.MustParseAddr
	want := []Limit{
		{Addrs: []netip.Addr{a("10.244.1.5"), a("fd00:10:244:1::5")}, EgressBits: 10_000_000, IngressBits: 20_000_000},
		{Addrs: []netip.Addr{a("10.244.1.6")}, EgressBits: 50_000_000},
		{Addrs: []netip.Addr{a("10.244.1.7")}}, // no limit: no entry
	}
	if err := b.Apply(want, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	rows, err := b.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 3 || rows[0].ID != 1 || rows[0].Dir != "egress" || rows[0].Bits != 10_000_000 ||
		rows[1].Dir != "ingress" || rows[1].Bits != 20_000_000 || rows[1].Burst != IngressBurst(20_000_000) ||
		len(rows[0].Addrs) != 2 || rows[2].ID != 2 || rows[2].Bits != 50_000_000 || rows[0].Horizon != 2*time.Second {
		t.Fatalf("rows %+v", rows)
	}
	// a second loader (agent restart) sees the same ids and keeps them
	b2 := newBWMFixture(t, pin)
	want[1].EgressBits = 60_000_000
	if err := b2.Apply(want[1:], 2*time.Second); err != nil {
		t.Fatal(err)
	}
	rows, err = b2.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].ID != 2 || rows[0].Bits != 60_000_000 {
		t.Fatalf("after restart + removal: %+v", rows)
	}
	addrs, err := b2.readAddrs()
	if err != nil {
		t.Fatal(err)
	}
	if len(addrs) != 1 || addrs[a("10.244.1.6")] != 2 {
		t.Fatalf("addresses %v", addrs)
	}
	if err := b2.Apply(nil, 0); err == nil {
		t.Fatal("horizon 0 accepted")
	}
}
