package podpath

import (
	"net/netip"
	"testing"
	"time"

	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/axonhq/axon/internal/datapath/drops"
	"github.com/axonhq/axon/internal/datapath/drops/dropstest"
)

// TestDropEventsSpoof: a pod's spoofed packet, sent through a real veth,
// is counted in the shared drop counters (drop_spoof_src, ingress) whether
// or not anyone listens; its event reaches the ring buffer only while a
// reader listens (the emitted counter stays 0 before and does not move
// after the reader left), with the packet's addresses, ports and device.
func TestDropEventsSpoof(t *testing.T) {
	dptest.RequireRoot(t)
	node, _ := newTrafficNode(t)
	a := addPod(t, node, "lxcA", "10.244.1.2", "fd00:10:244:1::2")
	c := addPod(t, node, "lxcC", "10.244.1.4", "fd00:10:244:1::4")
	d := loadWithPods(t, node, a, c)
	var idxA int
	dptest.InNetns(t, node, func() { idxA = ifindex(t, "lxcA") })
	mp, hub := dropstest.Open(t, d.cfg.PinDir)

	outside := netip.MustParseAddr("203.0.113.9")
	frame := udpFrame(a.hmac, a.mac, outside, c.ip4, []byte("spoofed"))
	spoofCount := func() drops.Count { t.Helper(); return dropstest.Counter(t, mp, "drop_spoof_src", "ingress") }
	ring := func() drops.RingStats {
		t.Helper()
		s, err := mp.ReadRingStats()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	send := func() {
		t.Helper()
		for _, err := range dptest.SendRawEach(t, a.ns, "eth0", [][]byte{frame}) {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	// the veth's tc ingress runs after the send returned: wait for the counter
	waitCount := func(want uint64) drops.Count {
		t.Helper()
		deadline := time.Now().Add(3 * time.Second)
		for {
			c := spoofCount()
			if c.Packets >= want || time.Now().After(deadline) {
				return c
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	// nobody listens: counted, no event written
	c0 := spoofCount()
	send()
	c1 := waitCount(c0.Packets + 1)
	if c1.Packets != c0.Packets+1 || c1.Bytes-c0.Bytes != uint64(len(frame)) {
		t.Fatalf("without a listener drop_spoof_src moved %+v -> %+v, want +1 packet of %d bytes", c0, c1, len(frame))
	}
	if s := ring(); s.Emitted != 0 || s.Lost != 0 {
		t.Fatalf("without a listener the programs wrote events: %+v, want none", s)
	}

	// a listener: the event arrives with the packet's tuple
	sub, cancel, err := hub.Subscribe(16)
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := mp.Listeners(); n != 1 {
		t.Fatalf("listener count %d while subscribed, want 1", n)
	}
	send()
	select {
	case ev := <-sub.C:
		want := drops.Event{Time: ev.Time, Prog: "pod_egress", Reason: "drop_spoof_src", Direction: "ingress",
			Ifindex: uint32(idxA), Len: uint32(len(frame)), Proto: "udp", Src: outside, Dst: c.ip4, SrcPort: 40000, DstPort: guardPort}
		if ev != want {
			t.Errorf("event %+v\nwant  %+v", ev, want)
		}
		if age := time.Since(ev.Time); age < -time.Second || age > 10*time.Second {
			t.Errorf("event time %v is %v from now", ev.Time, age)
		}
		t.Logf("event: %+v", ev)
	case <-time.After(3 * time.Second):
		t.Fatalf("no event within 3 s (ring stats %+v)", ring())
	}
	if s := ring(); s.Emitted != 1 {
		t.Errorf("emitted %d with one listener and one drop, want 1", s.Emitted)
	}
	if c2 := waitCount(c1.Packets + 1); c2.Packets != c1.Packets+1 {
		t.Errorf("drop_spoof_src moved %d -> %d with a listener, want +1", c1.Packets, c2.Packets)
	}

	// the listener left: counted again, no event
	cancel()
	if n, _ := mp.Listeners(); n != 0 {
		t.Fatalf("listener count %d after the last reader left, want 0", n)
	}
	c3 := spoofCount()
	send()
	if c4 := waitCount(c3.Packets + 1); c4.Packets != c3.Packets+1 {
		t.Errorf("drop_spoof_src moved %d -> %d after the reader left, want +1", c3.Packets, c4.Packets)
	}
	if s := ring(); s.Emitted != 1 {
		t.Errorf("emitted %d after the reader left, want still 1", s.Emitted)
	}
}
