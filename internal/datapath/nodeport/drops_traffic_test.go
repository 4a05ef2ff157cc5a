package nodeport

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/axonhq/axon/internal/datapath/drops"
	"github.com/axonhq/axon/internal/datapath/drops/dropstest"
	"github.com/axonhq/axon/internal/lb"
	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/testutil"
)

// TestDropEventsNoBackend: a real UDP datagram from the client to a
// LoadBalancer IP without endpoints is dropped by the LB at tc and at XDP
// (generic); each drop moves drop_no_backend/ingress in the shared drop
// counters and, with a reader listening, arrives as an event naming the
// program, the uplink and the client's tuple.
func TestDropEventsNoBackend(t *testing.T) {
	var pin string
	f := newNPTrafficFixWith(t, func(o *Options) { pin = o.PinDir })
	svc := netip.MustParseAddrPort("192.0.2.50:53")
	if err := f.nodeLB.UpsertFrontendWith(npVIP(svc.String(), lb.UDP), FrontendOptions{}); err != nil {
		t.Fatal(err)
	}
	var uplink int
	dptest.InNetns(t, f.node, func() {
		l, err := net.InterfaceByName("eth0")
		if err != nil {
			t.Fatal(err)
		}
		uplink = l.Index
	})
	mp, hub := dropstest.Open(t, pin)
	sub, cancel, err := hub.Subscribe(16)
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()
	noBackend := func() uint64 { t.Helper(); return dropstest.Counter(t, mp, "drop_no_backend", "ingress").Packets }

	for _, c := range []struct{ xdp, prog string }{{XDPNone, "lb_tc"}, {XDPGeneric, "lb_xdp"}} {
		t.Run(c.prog, func(t *testing.T) {
			var err error
			dptest.InNetns(t, f.node, func() { _, err = f.nodeLB.Attach("eth0", c.xdp) })
			if err != nil {
				t.Fatal(err)
			}
			before := noBackend()
			var src netip.AddrPort
			if err := netnsutil.Do(f.client, func() error {
				conn, err := net.Dial("udp4", svc.String())
				if err != nil {
					return err
				}
				defer conn.Close()
				src = conn.LocalAddr().(*net.UDPAddr).AddrPort()
				_, err = conn.Write([]byte("anyone?"))
				return err
			}); err != nil {
				t.Fatal(err)
			}
			select {
			case ev := <-sub.C:
				want := drops.Event{Time: ev.Time, Prog: c.prog, Reason: "drop_no_backend", Direction: "ingress",
					Ifindex: uint32(uplink), Len: ev.Len, Proto: "udp", Src: src.Addr(), Dst: svc.Addr(), SrcPort: src.Port(), DstPort: svc.Port()}
				if ev != want || ev.Len < 14+20+8+7 {
					t.Errorf("event %+v\nwant  %+v (len >= %d)", ev, want, 14+20+8+7)
				}
				t.Logf("event: %+v", ev)
			case <-time.After(testutil.Stretch(t, 3*time.Second)):
				t.Fatalf("no event within 3 s; drop_no_backend %d -> %d", before, noBackend())
			}
			if after := noBackend(); after != before+1 {
				t.Errorf("drop_no_backend/ingress %d -> %d, want +1", before, after)
			}
		})
	}
	dptest.InNetns(t, f.node, func() {
		if err := f.nodeLB.Detach("eth0"); err != nil {
			t.Error(err)
		}
	})
}
