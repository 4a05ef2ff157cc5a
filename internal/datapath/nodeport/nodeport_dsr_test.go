package nodeport

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/axonhq/axon/internal/lb"
)

// TestNodePortDSRBackend: the backend side of DSR in the uplink ingress
// program (np_dsr_accept). The fixture node is node1; node2's LB sends it
// IPIP / IPv6-in-IPv6 requests for pods on node1. A request is
// decapsulated and DNATed to the pod in one pass, the pod's reply gets the
// frontend back as source at egress (straight to the client), and anything
// that is not a request for a local backend of that very frontend is left
// exactly as it came.
func TestNodePortDSRBackend(t *testing.T) {
	f := newNPFix(t, func(o *Options) { o.UplinkMTU = 1500 })
	// the outer destination of a DSR request is a pod of this node: the
	// pod-traffic shortcut (axon_np_pods) must not take it for pod traffic
	if err := f.n.SetPodCIDRs([]netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:10:244:1::/64")}); err != nil {
		t.Fatal(err)
	}
	node2 := netip.MustParseAddr("198.18.0.12")
	node2v6 := netip.MustParseAddr("fd00:198:18::12")
	pod := netip.MustParseAddr("10.244.1.7")
	pod6 := netip.MustParseAddr("fd00:10:244:1::7")
	other := netip.MustParseAddr("10.244.1.8") // a local pod, backend of another frontend
	f.upsert(t, npVIP("192.0.2.10:80", lb.TCP, npBE("10.244.1.7:8080", "node1"), npBE("10.244.2.7:8080", "node2")), FrontendOptions{Mode: ModeDSR})
	f.upsert(t, npVIP("[2001:db8::10]:80", lb.TCP, npBE("[fd00:10:244:1::7]:8080", "node1")), FrontendOptions{Mode: ModeDSR})
	f.upsert(t, npNodePort(30080, lb.UDP, false, npBE("10.244.1.7:5353", "node1")), FrontendOptions{Mode: ModeDSR})
	f.upsert(t, npVIP("192.0.2.20:80", lb.TCP, npBE("10.244.1.8:80", "node1")), FrontendOptions{})

	// DSR entries: one per local backend of each frontend
	if n := dptest.MapLen(t, f.n.tc.AxonNpDsr); n != 4 {
		t.Fatalf("axon_np_dsr holds %d entries, want 4 (the local backends)", n)
	}

	encap := func(inner Tuple, flags uint8, to netip.Addr) []byte {
		from := node2
		if to.Is6() {
			from = node2v6
		}
		return npDSRFrame(f.wirePkt(inner, flags), from, to, f.upMAC, f.gwMAC)
	}
	// dnat is the inner packet of in DNATed to be, with in's MACs
	dnat := func(in []byte, inner Tuple, flags uint8, be netip.AddrPort) []byte {
		nt := inner
		nt.Dst = be
		b := npPacket(nt, flags)
		copy(b[0:12], in[0:12])
		return b
	}

	accept := []struct {
		desc  string
		inner Tuple
		pod   netip.Addr
		be    netip.AddrPort
	}{
		{"IPv4 LoadBalancer IP", npTCP("198.18.0.250:40000", "192.0.2.10:80"), pod, npAP("10.244.1.7:8080")},
		{"IPv6 LoadBalancer IP", npTCP("[fd00:198:18::250]:40000", "[2001:db8::10]:80"), pod6, npAP("[fd00:10:244:1::7]:8080")},
		{"NodePort of node2's address (UDP)", npUDP("198.18.0.250:40001", "198.18.0.12:30080"), pod, npAP("10.244.1.7:5353")},
	}
	for _, c := range accept {
		t.Run("accept "+c.desc, func(t *testing.T) {
			f.resetFlows(t)
			flags := uint8(npSYN)
			if c.inner.Proto == lb.UDP {
				flags = 0
			}
			in := encap(c.inner, flags, c.pod)
			before := f.counters(t)
			v, out := f.run(t, "tc", in)
			if want := dnat(in, c.inner, flags, c.be); v != npNext || !bytes.Equal(out, want) {
				t.Fatalf("verdict %s (want next)\n got %x\nwant %x", v, out, want)
			}
			got := npMoved(before, f.counters(t), "tc")
			for _, r := range []string{"dsr_decap", "ct_new", "dnat_local"} {
				if got[r] != 1 {
					t.Errorf("counter %s moved by %d, want 1 (moved: %v)", r, got[r], got)
				}
			}
			ct, ok := f.ctFor(t, c.inner)
			if !ok || ct.Mode != "local" || ct.Backend != c.be {
				t.Fatalf("CT of %s: %+v (found %v), want local to %s", c.inner, ct, ok, c.be)
			}
			// the pod's reply leaves with the frontend as source; a SYN-ACK's
			// MSS is clamped to what fits the wire behind the LB's outer
			// header (MTU 1500: 1440 for IPv4, 1400 for IPv6)
			reply := Tuple{Proto: c.inner.Proto, Src: c.be, Dst: c.inner.Src}
			rev := Tuple{Proto: c.inner.Proto, Src: c.inner.Dst, Dst: c.inner.Src}
			rin, want := npPacket(reply, 0), npPacket(rev, 0)
			if c.inner.Proto == lb.TCP {
				clamped := uint16(1440)
				if c.be.Addr().Is6() {
					clamped = 1400
				}
				rin, want = npTCPWithMSS(reply, npSYN|npACK, 1460), npTCPWithMSS(rev, npSYN|npACK, clamped)
			}
			v, out = f.run(t, "egress", rin)
			copy(want[0:12], rin[0:12])
			if v != npNext || !bytes.Equal(out, want) {
				t.Fatalf("reply: verdict %s\n got %x\nwant %x", v, out, want)
			}
			// later packets of the flow keep their pod even when the agent
			// has rewritten axon_np_dsr in between (CT decides)
			if err := npClearMap(f.n.tc.AxonNpDsr); err != nil {
				t.Fatal(err)
			}
			defer f.upsertAgain(t)
			if c.inner.Proto == lb.TCP {
				flags = npACK
			}
			in = encap(c.inner, flags, c.pod)
			if v, out := f.run(t, "tc", in); v != npNext || !bytes.Equal(out, dnat(in, c.inner, flags, c.be)) {
				t.Fatalf("established flow without its DSR entry: verdict %s\n got %x", v, out)
			}
		})
	}

	t.Run("no MSS clamp: a smaller MSS, a flow that did not come by DSR", func(t *testing.T) {
		f.resetFlows(t)
		dsrFlow := accept[0].inner
		f.run(t, "tc", encap(dsrFlow, npSYN, pod))
		direct := npTCP("198.18.0.250:40010", "192.0.2.20:80") // local backend, no DSR
		if v, _ := f.run(t, "tc", f.wirePkt(direct, npSYN)); v != npNext {
			t.Fatalf("direct flow: verdict %s", v)
		}
		for _, c := range []struct {
			reply, rev Tuple
			mss        uint16
		}{
			{Tuple{Proto: lb.TCP, Src: npAP("10.244.1.7:8080"), Dst: dsrFlow.Src}, Tuple{Proto: lb.TCP, Src: dsrFlow.Dst, Dst: dsrFlow.Src}, 1200},
			{Tuple{Proto: lb.TCP, Src: npAP("10.244.1.8:80"), Dst: direct.Src}, Tuple{Proto: lb.TCP, Src: direct.Dst, Dst: direct.Src}, 1460},
		} {
			rin := npTCPWithMSS(c.reply, npSYN|npACK, c.mss)
			want := npTCPWithMSS(c.rev, npSYN|npACK, c.mss)
			copy(want[0:12], rin[0:12])
			if v, out := f.run(t, "egress", rin); v != npNext || !bytes.Equal(out, want) {
				t.Errorf("%s MSS %d: verdict %s\n got %x\nwant %x", c.reply, c.mss, v, out, want)
			}
		}
	})

	reject := []struct {
		desc string
		in   []byte
	}{
		{"to a local pod that is not a backend of the inner frontend",
			encap(npTCP("198.18.0.250:40002", "192.0.2.10:80"), npSYN, other)},
		{"to a pod of another node",
			encap(npTCP("198.18.0.250:40003", "192.0.2.10:80"), npSYN, netip.MustParseAddr("10.244.2.7"))},
		{"inner destination is no frontend",
			encap(npTCP("198.18.0.250:40004", "192.0.2.99:80"), npSYN, pod)},
		{"inner port is no frontend port",
			encap(npTCP("198.18.0.250:40005", "192.0.2.10:81"), npSYN, pod)},
		{"inner packet truncated (no L4 header)",
			npDSRFrame(f.wirePkt(npTCP("198.18.0.250:40006", "192.0.2.10:80"), npSYN), node2, pod, f.upMAC, f.gwMAC)[:14+20+20]},
	}
	for _, c := range reject {
		t.Run("untouched: "+c.desc, func(t *testing.T) {
			f.resetFlows(t)
			before := f.counters(t)
			v, out := f.run(t, "tc", c.in)
			if v != npNext || !bytes.Equal(out, c.in) {
				t.Fatalf("verdict %s (want next), changed:\n got %x\nwant %x", v, out, c.in)
			}
			if got := npMoved(before, f.counters(t), "tc"); got["dsr_decap"] != 0 || got["ct_new"] != 0 {
				t.Errorf("counters moved: %v", got)
			}
		})
	}
	t.Run("XDP passes requests up to tc", func(t *testing.T) {
		f.resetFlows(t)
		in := encap(accept[0].inner, npSYN, pod)
		if v, out := f.run(t, "xdp", in); v != npNext || !bytes.Equal(out, in) {
			t.Fatalf("XDP verdict %s, changed: %v", v, !bytes.Equal(out, in))
		}
	})
	t.Run("a backend that leaves the frontend loses its DSR entry", func(t *testing.T) {
		f.resetFlows(t)
		f.upsert(t, npVIP("192.0.2.10:80", lb.TCP, npBE("10.244.2.7:8080", "node2")), FrontendOptions{Mode: ModeDSR})
		in := encap(accept[0].inner, npSYN, pod)
		if v, out := f.run(t, "tc", in); v != npNext || !bytes.Equal(out, in) {
			t.Fatalf("verdict %s, changed: %v", v, !bytes.Equal(out, in))
		}
		if err := f.n.DeleteFrontend(npVIP("[2001:db8::10]:80", lb.TCP).Key); err != nil {
			t.Fatal(err)
		}
		if n := dptest.MapLen(t, f.n.tc.AxonNpDsr); n != 2 {
			t.Errorf("axon_np_dsr holds %d entries, want 2", n)
		}
	})
}

// upsertAgain rewrites the frontends' maps as the agent's next sync does
// (restores axon_np_dsr after a case emptied it).
func (f *npFix) upsertAgain(t testing.TB) {
	t.Helper()
	fes, err := f.n.Frontends()
	if err != nil {
		t.Fatal(err)
	}
	for _, fe := range fes {
		f.n.mu.Lock()
		st := f.n.fe[fe.Key]
		f.n.mu.Unlock()
		if st == nil || st.meta == nil {
			t.Fatalf("frontend %v has no metadata", fe.Key)
		}
		mode := ModeSNAT
		if st.master.Flags&npFlagDSR != 0 {
			mode = ModeDSR
		}
		f.upsert(t, *st.meta, FrontendOptions{Mode: mode})
	}
}

// npTCPWithMSS is a TCP segment of flow t with flags and an MSS option as
// its first (only) option.
func npTCPWithMSS(t Tuple, flags uint8, mss uint16) []byte {
	l4 := make([]byte, 24)
	binary.BigEndian.PutUint16(l4[0:], t.Src.Port())
	binary.BigEndian.PutUint16(l4[2:], t.Dst.Port())
	l4[12] = 6 << 4
	l4[13] = flags
	binary.BigEndian.PutUint16(l4[14:], 64240)
	l4[20], l4[21] = 2, 4
	binary.BigEndian.PutUint16(l4[22:], mss)
	return npFrame(t.Src.Addr().Unmap(), t.Dst.Addr().Unmap(), uint8(lb.TCP), l4, true)
}

// TestNodePortDSRClusterClients: a DSR frontend serves clients of the
// cluster itself (pods, nodes: axon_np_cluster) by SNAT, because their
// replies would not pass the backend node's uplink egress; everyone else
// gets DSR. The agent's Node watch fills the ranges; empty = DSR for all.
func TestNodePortDSRClusterClients(t *testing.T) {
	f := newNPFix(t, nil)
	f.upsert(t, npVIP("192.0.2.10:80", lb.TCP, npBE("10.244.2.7:80", "node2")), FrontendOptions{Mode: ModeDSR})
	f.upsert(t, npVIP("[2001:db8::10]:80", lb.TCP, npBE("[fd00:10:244:2::7]:80", "node2")), FrontendOptions{Mode: ModeDSR})
	cluster := []netip.Prefix{
		netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("10.244.2.0/24"),
		netip.MustParsePrefix("fd00:10:244:1::/64"), netip.MustParsePrefix("198.18.0.12/32"),
	}
	cases := []struct {
		flow Tuple
		in   bool // a cluster address
	}{
		{npTCP("198.18.0.250:40000", "192.0.2.10:80"), false},
		{npTCP("10.244.1.5:40000", "192.0.2.10:80"), true},
		{npTCP("198.18.0.12:40000", "192.0.2.10:80"), true},
		{npTCP("10.244.3.5:40000", "192.0.2.10:80"), false}, // not a listed podCIDR
		{npTCP("[fd00:10:244:1::5]:40000", "[2001:db8::10]:80"), true},
		{npTCP("[fd00:198:18::250]:40000", "[2001:db8::10]:80"), false},
	}
	for _, set := range []bool{true, false} {
		ps := cluster
		if !set {
			ps = nil
		}
		if err := f.n.SetClusterPrefixes(ps); err != nil {
			t.Fatal(err)
		}
		if n := dptest.MapLen(t, f.n.tc.AxonNpCluster); n != len(ps) {
			t.Fatalf("axon_np_cluster holds %d entries, want %d", n, len(ps))
		}
		for _, hook := range npHooks {
			f.resetFlows(t)
			for _, c := range cases {
				if v, _ := f.run(t, hook, f.wirePkt(c.flow, npSYN)); v != npFwd {
					t.Fatalf("%s %s: verdict %s, want fwd", hook, c.flow, v)
				}
				e, ok := f.ctFor(t, c.flow)
				want := "dsr"
				if set && c.in {
					want = "snat"
				}
				if !ok || e.Mode != want {
					t.Errorf("cluster ranges set %v, %s %s: CT %+v, want mode %s", set, hook, c.flow, e, want)
				}
			}
		}
	}
	if err := f.n.SetClusterPrefixes([]netip.Prefix{{}}); err == nil {
		t.Error("an invalid prefix was accepted")
	}
}
