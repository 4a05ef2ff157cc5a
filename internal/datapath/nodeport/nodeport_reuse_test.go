package nodeport

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/axonhq/axon/internal/lb"
)

// TestNodePortDirectReuse: a client that reaches a local backend through a
// NodePort and then, with the same source port, straight at the pod (a
// client node's socket LB connects to backends directly, and a new socket
// may get the old port) must see the pod's own address in the replies of
// the new flow: the old flow's reverse entry (B:port -> client:port, local
// DNAT) would otherwise give them the NodePort as source. UDP: any
// datagram of the direct flow ends the old one; TCP: a SYN once the old
// flow is closing (while it is open the pod itself refuses the SYN's
// tuple, and the old flow keeps its translation). With XDP, the packet XDP
// translated reaches tc addressed to the pod: that is not a reuse.
func TestNodePortDirectReuse(t *testing.T) {
	f := newNPFix(t, nil)
	if err := f.n.SetPodCIDRs([]netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:10:244:1::/64")}); err != nil {
		t.Fatal(err)
	}
	for _, proto := range []lb.Proto{lb.TCP, lb.UDP} {
		f.upsert(t, npNodePort(30081, proto, false, npBE("10.244.1.5:8080", "node1")), FrontendOptions{})
		f.upsert(t, npNodePort(30081, proto, true, npBE("[fd00:10:244:1::5]:8080", "node1")), FrontendOptions{})
	}
	cases := []struct {
		desc       string
		flow       Tuple // client -> NodePort
		backend    string
		closeFirst bool // TCP: the client's FIN ends the NodePort flow first
		reused     bool // the direct flow takes over: its replies keep the pod's address
	}{
		{"v4 UDP", npUDP("198.18.0.250:40000", "198.18.0.11:30081"), "10.244.1.5:8080", false, true},
		{"v6 UDP", npUDP("[fd00:198:18::250]:40000", "[fd00:198:18::11]:30081"), "[fd00:10:244:1::5]:8080", false, true},
		{"v4 TCP after FIN", npTCP("198.18.0.250:40000", "198.18.0.11:30081"), "10.244.1.5:8080", true, true},
		{"v6 TCP after FIN", npTCP("[fd00:198:18::250]:40000", "[fd00:198:18::11]:30081"), "[fd00:10:244:1::5]:8080", true, true},
		{"v4 TCP while open: the old flow keeps its entry", npTCP("198.18.0.250:40000", "198.18.0.11:30081"), "10.244.1.5:8080", false, false},
	}
	for _, c := range cases {
		for _, hook := range npHooks {
			t.Run(hook+"/"+c.desc, func(t *testing.T) {
				f.resetFlows(t)
				be := npAP(c.backend)
				direct := Tuple{Proto: c.flow.Proto, Src: c.flow.Src, Dst: be}
				reply := Tuple{Proto: c.flow.Proto, Src: be, Dst: c.flow.Src}
				open, ack := uint8(0), uint8(0)
				if c.flow.Proto == lb.TCP {
					open, ack = npSYN, npACK
				}
				// the reply of the pod as it leaves the uplink
				egress := func() (npVerdict, []byte, []byte) {
					pkt := npPacket(reply, ack)
					copy(pkt[0:6], f.cliMAC)
					copy(pkt[6:12], f.upMAC)
					v, out := f.run(t, "egress", pkt)
					return v, out, pkt
				}

				// the NodePort flow: translated at hook; with XDP, tc then
				// sees the translated packet addressed to the pod
				v, out := f.run(t, hook, f.wirePkt(c.flow, open))
				if v != npNext {
					t.Fatalf("NodePort packet: verdict %s, want next (local DNAT)", v)
				}
				if hook == "xdp" {
					before := f.counters(t)
					if v, _ := f.run(t, "tc", out[:len(f.wirePkt(c.flow, open))]); v != npNext {
						t.Fatalf("tc after XDP: verdict %s", v)
					}
					if got := npMoved(before, f.counters(t), "tc"); got["direct_reuse"] != 0 {
						t.Fatalf("tc took XDP's translation for a reuse: %v", got)
					}
				}
				beforeEg := f.counters(t)
				_, out, pkt := egress()
				want := npPacket(Tuple{Proto: c.flow.Proto, Src: c.flow.Dst, Dst: c.flow.Src}, ack)
				copy(want[0:12], pkt[0:12])
				if !bytes.Equal(out[:len(want)], want) || npMoved(beforeEg, f.counters(t), "egress")["egress_rev"] != 1 {
					t.Fatalf("reply of the NodePort flow: got %x, want the NodePort as source %x", out[:len(pkt)], want)
				}
				if c.closeFirst {
					if v, _ := f.run(t, hook, f.wirePkt(c.flow, npFIN|npACK)); v != npNext {
						t.Fatalf("FIN: verdict %s", v)
					}
				}

				// the same client port, now straight at the pod
				before := f.counters(t)
				in := f.wirePkt(direct, open)
				v, out = f.run(t, hook, in)
				if v != npNext || !bytes.Equal(out[:len(in)], in) {
					t.Fatalf("direct packet: verdict %s, changed %v; want next, untouched", v, !bytes.Equal(out[:len(in)], in))
				}
				moved := npMoved(before, f.counters(t), hook)
				beforeEg = f.counters(t)
				v, out, pkt = egress()
				egMoved := npMoved(beforeEg, f.counters(t), "egress")
				if !c.reused {
					if moved["direct_reuse"] != 0 || egMoved["egress_rev"] != 1 {
						t.Fatalf("open TCP flow: counters %v, egress %v; want no direct_reuse and the old flow still translated", moved, egMoved)
					}
					return
				}
				if moved["direct_reuse"] != 1 {
					t.Errorf("%s counters %v, want direct_reuse 1", hook, moved)
				}
				if v != npNext || !bytes.Equal(out[:len(pkt)], pkt) || egMoved["egress_rev"] != 0 {
					t.Fatalf("reply of the direct flow: verdict %s, egress counters %v\n got %x\nwant %x (the pod's own address)", v, egMoved, out[:len(pkt)], pkt)
				}
				if _, ok := f.ctFor(t, c.flow); ok {
					t.Errorf("the NodePort flow's CT entry is still there")
				}
				nat, err := f.n.NAT()
				if err != nil {
					t.Fatal(err)
				}
				for _, e := range nat {
					if e.Reply == reply {
						t.Errorf("the NodePort flow's reverse entry is still there: %+v", e)
					}
				}
			})
		}
	}
}
