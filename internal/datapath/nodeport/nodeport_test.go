package nodeport

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/axonhq/axon/internal/inetcsum"
	"github.com/axonhq/axon/internal/lb"
	"github.com/axonhq/axon/internal/netnsutil"
)

// BPF_PROG_TEST_RUN fixtures of the north-south load balancer
// (bpf/lb_tc.c, bpf/lb_xdp.c). Every case runs through the tc and the XDP
// program with a clean flow state, and compares the output frame byte for
// byte with one built from scratch (so incremental checksums are checked).

// Return codes.
const (
	npTCUnspec    = 0xffffffff // TC_ACT_UNSPEC (-1): next tcx program
	npTCShot      = 2
	npXDPDrop     = 1
	npXDPPass     = 2
	npXDPTX       = 3
	npXDPRedirect = 4
)

// npVerdict is a verdict independent of the hook.
type npVerdict int

const (
	npNext npVerdict = iota // untouched or DNATed for local delivery: continue
	npPass                  // to the stack now
	npDrop
	npFwd // sent on (tc redirect, XDP_TX / XDP_REDIRECT)
)

func (v npVerdict) String() string { return [...]string{"next", "pass", "drop", "fwd"}[v] }

func npVerdictOf(hook string, ret uint32) (npVerdict, error) {
	switch hook {
	case "decap":
		if ret == npTCUnspec {
			return npNext, nil
		}
	case "xdp":
		switch ret {
		case npXDPPass:
			return npNext, nil // XDP cannot tell next from pass: both go up the stack
		case npXDPDrop:
			return npDrop, nil
		case npXDPTX, npXDPRedirect:
			return npFwd, nil
		}
	default:
		switch ret {
		case npTCUnspec:
			return npNext, nil
		case dptest.TCActOK:
			return npPass, nil
		case npTCShot:
			return npDrop, nil
		case dptest.TCActRedirect:
			return npFwd, nil
		}
	}
	return 0, fmt.Errorf("hook %s: unexpected return code %d", hook, ret)
}

var npHooks = []string{"tc", "xdp"}

// npFix is a scratch node netns with an uplink, neighbours and routes, and
// a LB loaded (not attached).
type npFix struct {
	ns     string
	pin    string
	n      *LB
	upIf   int
	upMAC  net.HardwareAddr
	gwMAC  net.HardwareAddr // node2 (198.18.0.12), next hop of 10.244.2.0/24
	cliMAC net.HardwareAddr // the client 198.18.0.250 on the wire
}

var (
	npNode   = netip.MustParseAddr("198.18.0.11")
	npNode6  = netip.MustParseAddr("fd00:198:18::11")
	npClient = netip.MustParseAddr("198.18.0.250")
	npCli6   = netip.MustParseAddr("fd00:198:18::250")
)

func newNPFix(t testing.TB, mod func(*Options)) *npFix {
	t.Helper()
	dptest.RequireRoot(t)
	f := &npFix{gwMAC: dptest.MustMAC(t, "02:00:00:00:00:12"), cliMAC: dptest.MustMAC(t, "02:00:00:00:00:fa")}
	f.ns = dptest.NewNetns(t, "np")
	c := dptest.NSConf(t, f.ns)
	c.Veth("eth0", "", "wire", "", "")
	c.Up("eth0", "wire")
	c.Addr("eth0", "198.18.0.11/24")
	c.Addr("eth0", "fd00:198:18::11/64")
	c.Neigh("eth0", "198.18.0.12", f.gwMAC.String())
	c.Neigh("eth0", "fd00:198:18::12", f.gwMAC.String())
	c.Neigh("eth0", "198.18.0.250", f.cliMAC.String())
	c.Neigh("eth0", "fd00:198:18::250", f.cliMAC.String())
	c.Route("10.244.2.0/24", "198.18.0.12", "eth0")
	c.Route("fd00:10:244:2::/64", "fd00:198:18::12", "eth0")
	c.Route("10.244.3.0/24", "198.18.0.13", "eth0") // no neighbour
	c.Route("10.244.9.0/24", "", "")                // unreachable
	c.Sysctl("net.ipv4.ip_forward", "1")
	c.Sysctl("net.ipv6.conf.all.forwarding", "1")
	l := c.Link("eth0")
	f.upIf, f.upMAC = l.Attrs().Index, l.Attrs().HardwareAddr
	f.pin = newPinDir(t)
	o := Options{PinDir: f.pin, NodeName: "node1", NodeAddrs: []netip.Addr{npNode, npNode6}, Logger: dptest.Logger(t)}
	if mod != nil {
		mod(&o)
	}
	n, err := Load(o)
	if err != nil {
		t.Fatal(err)
	}
	f.n = n
	// the next-hop cache on, as Attach turns it on: every fixture's later
	// packets take their next hop from it
	if err := netnsutil.Do(f.ns, n.WatchNeighbours); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		n.Close()
		if err := Uninstall(f.pin); err != nil {
			t.Errorf("uninstall: %v", err)
		}
	})
	return f
}

func npXDPCtx(ifindex, size int) []byte {
	b := make([]byte, 24) // struct xdp_md
	binary.LittleEndian.PutUint32(b[4:], uint32(size))
	binary.LittleEndian.PutUint32(b[12:], uint32(ifindex))
	return b
}

// run runs one packet through hook ("tc", "xdp", "egress") in the netns.
func (f *npFix) run(t testing.TB, hook string, pkt []byte) (npVerdict, []byte) {
	t.Helper()
	v, out, err := f.runErr(hook, pkt)
	if err != nil {
		t.Fatal(err)
	}
	return v, out
}

// runErr is run without failing the test (t.Fatal must not be called on
// the netns goroutine: dptest.InNetns would never return).
func (f *npFix) runErr(hook string, pkt []byte) (npVerdict, []byte, error) {
	var prog *ebpf.Program
	var ctx []byte
	switch hook {
	case "tc":
		prog, ctx = f.n.tc.AxonLbIngress, dptest.SKBCtx(f.upIf)
	case "egress":
		prog, ctx = f.n.tc.AxonLbEgress, dptest.SKBCtx(f.upIf)
	case "decap":
		prog, ctx = f.n.tc.AxonLbDecap, dptest.SKBCtx(f.upIf)
	case "xdp":
		p, err := f.n.XDPProgram()
		if err != nil {
			return 0, nil, err
		}
		prog, ctx = p, npXDPCtx(f.upIf, len(pkt))
	}
	out := make([]byte, len(pkt)+256)
	var ret uint32
	var err error
	err = netnsutil.Do(f.ns, func() error {
		opts := &ebpf.RunOptions{Data: pkt, DataOut: out, Context: ctx}
		if hook == "xdp" {
			opts.ContextOut = make([]byte, len(ctx))
		}
		r, rerr := prog.Run(opts)
		ret, out = r, opts.DataOut
		return rerr
	})
	if err != nil {
		return 0, nil, fmt.Errorf("%s: run: %w", hook, err)
	}
	v, err := npVerdictOf(hook, ret)
	return v, out, err
}

// resetFlows empties CT, NAT and affinity (between tc and XDP runs).
func (f *npFix) resetFlows(t testing.TB) {
	t.Helper()
	for _, m := range []*ebpf.Map{f.n.tc.AxonNpCt, f.n.tc.AxonNpCtNew, f.n.tc.AxonNpNat, f.n.tc.AxonNpAff, f.n.tc.AxonNpFrag} {
		if err := npClearMap(m); err != nil {
			t.Fatal(err)
		}
	}
}

func (f *npFix) counters(t testing.TB) map[string]map[string]uint64 {
	t.Helper()
	m, err := f.n.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// moved returns the reasons of hook whose counters changed, with deltas.
func npMoved(before, after map[string]map[string]uint64, hook string) map[string]uint64 {
	out := map[string]uint64{}
	for r, v := range after[hook] {
		if d := v - before[hook][r]; d != 0 {
			out[r] = d
		}
	}
	return out
}

func (f *npFix) upsert(t testing.TB, fe lb.Frontend, o FrontendOptions) {
	t.Helper()
	if err := f.n.UpsertFrontendWith(fe, o); err != nil {
		t.Fatal(err)
	}
}

func (f *npFix) ctFor(t testing.TB, flow Tuple) (CTEntry, bool) {
	t.Helper()
	es, err := f.n.CT()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		if e.Flow == flow {
			return e, true
		}
	}
	return CTEntry{}, false
}

func npAP(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

func npTCP(src, dst string) Tuple { return Tuple{Proto: lb.TCP, Src: npAP(src), Dst: npAP(dst)} }
func npUDP(src, dst string) Tuple { return Tuple{Proto: lb.UDP, Src: npAP(src), Dst: npAP(dst)} }

// wirePkt is a packet of flow t as it arrives from the wire (client MAC ->
// uplink MAC).
func (f *npFix) wirePkt(t Tuple, flags uint8) []byte {
	b := npPacket(t, flags)
	copy(b[0:6], f.upMAC)
	copy(b[6:12], f.cliMAC)
	return b
}

// translated is pkt rewritten to tuple nt as the LB must emit it: same
// MACs and TTL unless fwd (then TTL-1 and MACs dst/src), checksums fresh.
func npTranslated(pkt []byte, nt Tuple, flags uint8, dstMAC, srcMAC net.HardwareAddr) []byte {
	b := npPacket(nt, flags)
	copy(b[0:12], pkt[0:12])
	if dstMAC != nil {
		b = dptest.Forwarded(b, dstMAC, srcMAC)
	}
	return b
}

// dsrFrame is pkt IPIP-encapsulated from src to dst with fwd MACs.
func npDSRFrame(pkt []byte, src, dst netip.Addr, dstMAC, srcMAC net.HardwareAddr) []byte {
	inner := pkt[14:]
	var outer []byte
	eth := append(append(append([]byte{}, dstMAC...), srcMAC...), pkt[12], pkt[13])
	if src.Is4() {
		outer = make([]byte, 20)
		outer[0] = 0x45
		outer[1] = inner[1]
		binary.BigEndian.PutUint16(outer[2:], uint16(20+len(inner)))
		outer[8] = 64
		outer[9] = 4
		s, d := src.As4(), dst.As4()
		copy(outer[12:], s[:])
		copy(outer[16:], d[:])
		binary.BigEndian.PutUint16(outer[10:], inetcsum.Checksum(outer, 0))
	} else {
		outer = make([]byte, 40)
		outer[0] = 0x60
		binary.BigEndian.PutUint16(outer[4:], uint16(len(inner)))
		outer[6] = 41
		outer[7] = 64
		s, d := src.As16(), dst.As16()
		copy(outer[8:], s[:])
		copy(outer[24:], d[:])
	}
	return append(append(eth, outer...), inner...)
}

func npBE(addr string, node string) lb.Backend {
	a := npAP(addr)
	return lb.Backend{Addr: a.Addr(), Port: a.Port(), NodeName: node}
}

func npNodePort(port uint16, proto lb.Proto, v6 bool, bes ...lb.Backend) lb.Frontend {
	addr := netip.IPv4Unspecified()
	if v6 {
		addr = netip.IPv6Unspecified()
	}
	return lb.Frontend{Key: lb.FrontendKey{Addr: addr, Port: port, Proto: proto, Scope: lb.ScopeNodePort}, Kind: lb.KindNodePort, Backends: bes}
}

func npVIP(addrPort string, proto lb.Proto, bes ...lb.Backend) lb.Frontend {
	a := npAP(addrPort)
	return lb.Frontend{Key: lb.FrontendKey{Addr: a.Addr(), Port: a.Port(), Proto: proto, Scope: lb.ScopeCluster}, Kind: lb.KindLoadBalancer, Backends: bes}
}

// npCase is one packet through each hook with clean flows.
type npCase struct {
	desc    string
	pkt     []byte
	want    npVerdict
	wantXDP *npVerdict               // when XDP differs from tc
	out     func(hook string) []byte // expected output (nil: unchanged)
	reason  string                   // counter of the hook that must move
	reasonX string                   // XDP's, when different
}

func npVP(v npVerdict) *npVerdict { return &v }

// npAny: the output is not compared.
func npAny(string) []byte { return []byte{} }

func TestNodePortPrograms(t *testing.T) {
	f := newNPFix(t, nil)
	// frontends
	f.upsert(t, npNodePort(30080, lb.TCP, false, npBE("10.244.2.5:8080", "node2")), FrontendOptions{})
	f.upsert(t, npNodePort(30080, lb.TCP, true, npBE("[fd00:10:244:2::5]:8080", "node2")), FrontendOptions{})
	f.upsert(t, npNodePort(30053, lb.UDP, false, npBE("10.244.2.6:53", "node2")), FrontendOptions{})
	f.upsert(t, npNodePort(30081, lb.TCP, false, npBE("10.244.1.5:8080", "node1")), FrontendOptions{})
	f.upsert(t, npVIP("192.0.2.10:80", lb.TCP, npBE("10.244.2.7:80", "node2")), FrontendOptions{Mode: ModeDSR})
	f.upsert(t, npVIP("[2001:db8::10]:80", lb.TCP, npBE("[fd00:10:244:2::7]:80", "node2")), FrontendOptions{Mode: ModeDSR})
	f.upsert(t, npVIP("192.0.2.30:80", lb.TCP, npBE("10.244.2.8:80", "node2")),
		FrontendOptions{SourceRanges: []netip.Prefix{netip.MustParsePrefix("198.18.0.0/25")}})
	etpLocal := npVIP("192.0.2.40:80", lb.TCP, npBE("10.244.2.9:80", "node2"))
	etpLocal.LocalOnly = true
	f.upsert(t, etpLocal, FrontendOptions{})
	f.upsert(t, npVIP("192.0.2.50:80", lb.TCP), FrontendOptions{})
	f.upsert(t, npVIP("192.0.2.60:80", lb.TCP, npBE("10.244.3.5:80", "node3")), FrontendOptions{})
	f.upsert(t, npVIP("192.0.2.70:80", lb.TCP, npBE("10.244.9.5:80", "node9")), FrontendOptions{})
	hostPort := npNodePort(8443, lb.TCP, false, npBE("10.244.1.6:443", "node1"))
	hostPort.Key.Scope, hostPort.Kind = lb.ScopeHostPort, lb.KindHostPort
	f.upsert(t, hostPort, FrontendOptions{})

	cli := "198.18.0.250:40000"
	np4 := npTCP(cli, "198.18.0.11:30080")
	np6 := npTCP("[fd00:198:18::250]:40000", "[fd00:198:18::11]:30080")
	npUDP := npUDP(cli, "198.18.0.11:30053")
	npLocal := npTCP(cli, "198.18.0.11:30081")
	dsr4 := npTCP(cli, "192.0.2.10:80")
	dsr6 := npTCP("[fd00:198:18::250]:40000", "[2001:db8::10]:80")
	frag := f.wirePkt(np4, npSYN)
	frag[14+6] = 0x20 // MF
	frag[14+10], frag[14+11] = 0, 0
	binary.BigEndian.PutUint16(frag[14+10:], inetcsum.Checksum(frag[14:34], 0))
	fragLater := f.wirePkt(np4, npSYN)
	fragLater[14+6], fragLater[14+7] = 0x00, 0x10 // offset 128 bytes, last fragment
	fragLater[14+10], fragLater[14+11] = 0, 0
	binary.BigEndian.PutUint16(fragLater[14+10:], inetcsum.Checksum(fragLater[14:34], 0))
	frag6 := f.wirePkt(np6, npSYN)
	frag6[14+6] = 44 // next header: fragment
	truncated := f.wirePkt(np4, npSYN)[:14+20+2]
	ttl1 := f.wirePkt(np4, npSYN)
	ttl1[14+8] = 1
	ttl1[14+10], ttl1[14+11] = 0, 0
	binary.BigEndian.PutUint16(ttl1[14+10:], inetcsum.Checksum(ttl1[14:34], 0))
	arp := dptest.ARPPacket(f.cliMAC)

	// SNAT's source port is picked in BPF: read it from the CT entry
	snat := func(flow Tuple, be string, v6 bool) func(string) []byte {
		return func(string) []byte {
			e, ok := f.ctFor(t, flow)
			if !ok {
				t.Fatalf("no CT entry for %s", flow)
			}
			src := npNode
			if v6 {
				src = npNode6
			}
			nt := Tuple{Proto: flow.Proto, Src: netip.AddrPortFrom(src, e.NATPort), Dst: npAP(be)}
			return npTranslated(f.wirePkt(flow, npSYN), nt, npSYN, f.gwMAC, f.upMAC)
		}
	}
	cases := []npCase{
		{desc: "unknown service: TCP to a node address without frontend, untouched",
			pkt: f.wirePkt(npTCP(cli, "198.18.0.11:22"), npSYN), want: npNext, reason: "not_service"},
		{desc: "unknown service: a pod address, untouched",
			pkt: f.wirePkt(npTCP(cli, "10.244.1.9:80"), npSYN), want: npNext, reason: "not_service"},
		{desc: "ARP: untouched, not counted", pkt: arp, want: npNext},
		{desc: "NodePort v4 TCP, remote backend: SNAT to node:port, DNAT to backend, TTL-1, FIB MACs",
			pkt: f.wirePkt(np4, npSYN), want: npFwd, out: snat(np4, "10.244.2.5:8080", false), reason: "snat_fwd"},
		{desc: "NodePort v6 TCP, remote backend: SNAT + DNAT",
			pkt: f.wirePkt(np6, npSYN), want: npFwd, out: snat(np6, "[fd00:10:244:2::5]:8080", true), reason: "snat_fwd"},
		{desc: "NodePort v4 UDP, remote backend: SNAT + DNAT, UDP checksum updated",
			pkt: f.wirePkt(npUDP, 0), want: npFwd, out: func(h string) []byte {
				e, _ := f.ctFor(t, npUDP)
				nt := Tuple{Proto: lb.UDP, Src: netip.AddrPortFrom(npNode, e.NATPort), Dst: npAP("10.244.2.6:53")}
				return npTranslated(f.wirePkt(npUDP, 0), nt, 0, f.gwMAC, f.upMAC)
			}, reason: "snat_fwd"},
		{desc: "NodePort, local backend: DNAT only (client address kept), continue to uplink_ingress",
			pkt: f.wirePkt(npLocal, npSYN), want: npNext, out: func(string) []byte {
				return npTranslated(f.wirePkt(npLocal, npSYN), npTCP(cli, "10.244.1.5:8080"), npSYN, nil, nil)
			}, reason: "dnat_local"},
		{desc: "HostPort: DNAT to the local pod",
			pkt: f.wirePkt(npTCP(cli, "198.18.0.11:8443"), npSYN), want: npNext, out: func(string) []byte {
				return npTranslated(f.wirePkt(npLocal, npSYN), npTCP(cli, "10.244.1.6:443"), npSYN, nil, nil)
			}, reason: "dnat_local"},
		{desc: "LoadBalancer IP, DSR v4: IPIP node -> backend, inner packet unchanged",
			pkt: f.wirePkt(dsr4, npSYN), want: npFwd, out: func(string) []byte {
				return npDSRFrame(f.wirePkt(dsr4, npSYN), npNode, netip.MustParseAddr("10.244.2.7"), f.gwMAC, f.upMAC)
			}, reason: "dsr_encap"},
		{desc: "LoadBalancer IP, DSR v6: IPv6-in-IPv6 node -> backend",
			pkt: f.wirePkt(dsr6, npSYN), want: npFwd, out: func(string) []byte {
				return npDSRFrame(f.wirePkt(dsr6, npSYN), npNode6, netip.MustParseAddr("fd00:10:244:2::7"), f.gwMAC, f.upMAC)
			}, reason: "dsr_encap"},
		{desc: "loadBalancerSourceRanges: client inside 198.18.0.0/25 is served",
			pkt: f.wirePkt(npTCP("198.18.0.100:40000", "192.0.2.30:80"), npSYN), want: npFwd, reason: "snat_fwd", out: npAny},
		{desc: "loadBalancerSourceRanges: client outside is dropped",
			pkt: f.wirePkt(npTCP(cli, "192.0.2.30:80"), npSYN), want: npDrop, reason: "drop_src_range"},
		{desc: "externalTrafficPolicy Local without a local backend: dropped",
			pkt: f.wirePkt(npTCP(cli, "192.0.2.40:80"), npSYN), want: npDrop, reason: "drop_not_local"},
		{desc: "frontend without backends: dropped",
			pkt: f.wirePkt(npTCP(cli, "192.0.2.50:80"), npSYN), want: npDrop, reason: "drop_no_backend"},
		{desc: "backend without a resolved neighbour: tc redirect_neigh; XDP passes it up untouched for tc",
			pkt: f.wirePkt(npTCP(cli, "192.0.2.60:80"), npSYN), want: npFwd, wantXDP: npVP(npNext),
			reason: "snat_fwd", reasonX: "xdp_punt",
			out: func(h string) []byte {
				if h == "xdp" {
					return nil
				}
				e, _ := f.ctFor(t, npTCP(cli, "192.0.2.60:80"))
				nt := Tuple{Proto: lb.TCP, Src: netip.AddrPortFrom(npNode, e.NATPort), Dst: npAP("10.244.3.5:80")}
				return npTranslated(f.wirePkt(npTCP(cli, "192.0.2.60:80"), npSYN), nt, npSYN, nil, nil)[0:0]
			}},
		{desc: "backend behind an unreachable route: dropped",
			pkt: f.wirePkt(npTCP(cli, "192.0.2.70:80"), npSYN), want: npDrop, reason: "drop_no_route"},
		{desc: "IPv4 first fragment to a NodePort: ports recorded, translated (nodeport_frag_test.go checks the bytes)",
			pkt: frag, want: npFwd, out: npAny, reason: "frag_tracked"},
		{desc: "IPv4 non-first fragment whose first was not seen: untouched, counted",
			pkt: fragLater, want: npNext, reason: "frag_not_found"},
		{desc: "IPv6 fragment header of a protocol other than TCP/UDP: untouched",
			pkt: frag6, want: npNext, reason: "fragment"},
		{desc: "SCTP to a node address: untouched (only TCP and UDP are translated per packet)",
			pkt: func() []byte { b := f.wirePkt(np4, npSYN); b[14+9] = 132; return b }(), want: npNext, reason: "not_service"},
		{desc: "truncated TCP header: untouched",
			pkt: truncated, want: npNext, reason: "malformed"},
		// the checks of the parser (bpf/lib/eth_ip.h) every program shares
		{desc: "IPv4 IHL below 5: untouched, malformed",
			pkt: func() []byte { b := f.wirePkt(np4, npSYN); b[14] = 0x44; return b }(), want: npNext, reason: "malformed"},
		{desc: "IPv4 version 5 under ethertype IPv4: untouched, malformed",
			pkt: func() []byte { b := f.wirePkt(np4, npSYN); b[14] = 0x55; return b }(), want: npNext, reason: "malformed"},
		{desc: "IPv6 version 4 under ethertype IPv6: untouched, malformed",
			pkt: func() []byte {
				b := f.wirePkt(npTCP("[fd00:198:18::250]:40000", "[fd00:198:18::11]:30080"), npSYN)
				b[14] = 0x40 | b[14]&0x0f
				return b
			}(), want: npNext, reason: "malformed"},
		// The pod path (PARSE_STRICT) takes an IPv4 total length shorter
		// than the header for malformed (prog_test.go); the LB leaves that
		// check to the stack its untranslated packets go on to.
		{desc: "IPv4 total length shorter than the header, not a service: untouched, not malformed",
			pkt: func() []byte {
				b := f.wirePkt(npTCP(cli, "198.18.0.11:9"), npSYN)
				b[14+2], b[14+3] = 0, 19
				return b
			}(), want: npNext, reason: "not_service"},
		{desc: "TTL 1 toward a remote backend: the stack answers time exceeded",
			pkt: ttl1, want: npPass, wantXDP: npVP(npNext), reason: "ttl"},
	}
	for _, c := range cases {
		for _, hook := range npHooks {
			t.Run(hook+"/"+c.desc, func(t *testing.T) {
				f.resetFlows(t)
				before := f.counters(t)
				v, out := f.run(t, hook, c.pkt)
				want := c.want
				if hook == "xdp" && c.wantXDP != nil {
					want = *c.wantXDP
				}
				if v != want {
					t.Fatalf("verdict %s, want %s (counters moved: %v)", v, want, npMoved(before, f.counters(t), hook))
				}
				var exp []byte
				if c.out != nil {
					exp = c.out(hook)
				}
				switch {
				case exp == nil:
					if !bytes.Equal(out, c.pkt) {
						t.Errorf("packet changed:\n got %x\nwant %x", out, c.pkt)
					}
				case len(exp) == 0:
					// output not compared (MACs left to the kernel)
				default:
					if !bytes.Equal(out, exp) {
						t.Errorf("output:\n got %x\nwant %x", out, exp)
					}
				}
				reason := c.reason
				if hook == "xdp" && c.reasonX != "" {
					reason = c.reasonX
				}
				got := npMoved(before, f.counters(t), hook)
				if reason != "" && got[reason] != 1 {
					t.Errorf("counter %s of %s moved by %d, want 1 (moved: %v)", reason, hook, got[reason], got)
				}
				if reason == "" && len(got) != 0 {
					t.Errorf("counters moved: %v", got)
				}
			})
		}
	}
}

// TestNodePortCutShort: an IP header cut short is malformed for the LB's
// parser (bpf/lib/eth_ip.h) and left untouched. XDP only: BPF_PROG_TEST_RUN
// refuses a tc skb whose IP header is incomplete.
func TestNodePortCutShort(t *testing.T) {
	f := newNPFix(t, nil)
	for _, c := range []struct {
		desc string
		pkt  []byte
	}{
		{"IPv4", f.wirePkt(npTCP("198.18.0.250:40000", "198.18.0.11:30080"), npSYN)[:14+19]},
		{"IPv6", f.wirePkt(npTCP("[fd00:198:18::250]:40000", "[fd00:198:18::11]:30080"), npSYN)[:14+39]},
	} {
		t.Run(c.desc, func(t *testing.T) {
			before := f.counters(t)
			v, out := f.run(t, "xdp", c.pkt)
			if got := npMoved(before, f.counters(t), "xdp"); v != npNext || got["malformed"] != 1 || len(got) != 1 || !bytes.Equal(out, c.pkt) {
				t.Fatalf("verdict %s, counters %v, changed %v; want next, malformed 1, unchanged", v, got, !bytes.Equal(out, c.pkt))
			}
		})
	}
}

// npClearMap deletes every key of a hash map.
func npClearMap(m *ebpf.Map) error {
	var keys [][]byte
	var k, v []byte
	it := m.Iterate()
	for it.Next(&k, &v) {
		keys = append(keys, bytes.Clone(k))
	}
	if err := it.Err(); err != nil {
		return err
	}
	for _, k := range keys {
		if err := m.Delete(k); err != nil {
			return err
		}
	}
	return nil
}
