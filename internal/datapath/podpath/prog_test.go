package podpath

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/datapath/dptest"
)

// progFixture is a scratch node netns with a pod device, an uplink with
// routes and neighbours, and a datapath loaded (not attached) in it.
type progFixture struct {
	ns      string
	d       *Datapath
	podIf   int              // ifindex of the pod host-side veth (ctx of pod_egress)
	upIf    int              // ifindex of eth0
	upMAC   net.HardwareAddr // eth0's MAC: source of fib-dptest.Forwarded frames
	ep      Endpoint         // local pod (v4)
	ep6     Endpoint         // local pod (v6)
	gwMAC   net.HardwareAddr // neighbour of the reachable remote node
	podMAC  net.HardwareAddr // MAC of the sending pod
	hostMAC net.HardwareAddr // MAC of the sending pod's host-side veth
}

func newProgFixture(t testing.TB) *progFixture {
	t.Helper()
	return newProgFixtureWith(t, nil)
}

// newProgFixtureWith is newProgFixture with the datapath Config changed by
// mod (may be nil) before the programs load.
func newProgFixtureWith(t testing.TB, mod func(*Config)) *progFixture {
	t.Helper()
	dptest.RequireRoot(t)
	f := &progFixture{
		gwMAC:   dptest.MustMAC(t, "02:00:00:00:00:12"),
		podMAC:  dptest.MustMAC(t, "02:00:00:00:01:01"),
		hostMAC: dptest.MustMAC(t, "02:00:00:00:02:01"),
	}
	f.ns = dptest.NewNetns(t, "prog")
	c := dptest.NSConf(t, f.ns)
	c.Veth("lxcA", f.hostMAC.String(), "peerA", f.podMAC.String(), "")
	c.Veth("eth0", "", "wire", "", "")
	c.Up("lxcA", "peerA", "eth0", "wire")
	c.Addr("eth0", "198.18.0.11/24")
	c.Addr("eth0", "fd00:198:18::11/64")
	c.Route("10.244.2.0/24", "198.18.0.12", "eth0")
	c.Route("10.244.3.0/24", "198.18.0.13", "eth0")
	c.Route("10.244.9.0/24", "", "") // unreachable
	c.Neigh("eth0", "198.18.0.12", f.gwMAC.String())
	c.Route("fd00:10:244:2::/64", "fd00:198:18::12", "eth0")
	c.Route("fd00:10:244:3::/64", "fd00:198:18::13", "eth0")
	c.Neigh("eth0", "fd00:198:18::12", f.gwMAC.String())
	c.Sysctl("net.ipv4.ip_forward", "1")
	c.Sysctl("net.ipv6.conf.all.forwarding", "1")
	pin := newPinDir(t)
	dptest.InNetns(t, f.ns, func() {
		for name, dst := range map[string]*int{"lxcA": &f.podIf, "eth0": &f.upIf} {
			l, err := netlink.LinkByName(name)
			if err != nil {
				t.Fatal(err)
			}
			*dst = l.Attrs().Index
			if name == "eth0" {
				f.upMAC = l.Attrs().HardwareAddr
			}
		}
		cfg := Config{PinDir: pin, Uplink: "eth0", Logger: dptest.Logger(t)}
		if mod != nil {
			mod(&cfg)
		}
		if err := cfg.normalise(); err != nil {
			t.Fatal(err)
		}
		if err := datapath.EnsurePinDir(pin); err != nil {
			t.Fatal(err)
		}
		d := &Datapath{cfg: cfg, log: cfg.Logger, feats: datapath.Probe()}
		if err := d.decide(); err != nil {
			t.Fatal(err)
		}
		if d.hostRouting != datapath.RoutingBPF {
			t.Fatalf("host routing %s on this kernel: %v", d.hostRouting, d.decisions)
		}
		if err := d.loadObjects(); err != nil {
			t.Fatal(err)
		}
		f.d = d
	})
	t.Cleanup(func() { f.d.Close() })

	f.ep = Endpoint{IP: netip.MustParseAddr("10.244.1.5"), IfIndex: 4242,
		PodMAC: dptest.MustMAC(t, "02:00:00:00:01:05"), HostMAC: dptest.MustMAC(t, "02:00:00:00:02:05")}
	f.ep6 = f.ep
	f.ep6.IP = netip.MustParseAddr("fd00:10:244:1::5")
	for _, ep := range []Endpoint{f.ep, f.ep6} {
		if err := f.d.UpsertEndpoint(ep); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

type progCase struct {
	desc      string
	prog      string // "pod_egress" | "uplink_ingress"
	pkt       []byte
	verdict   uint32
	want      []byte // expected output frame
	reason    string // the one counter of the direction that must move by 1
	validIPv4 bool   // output must carry a valid IPv4 header checksum
	gso       bool   // run as a GSO skb (gso_size 1448), as BIG TCP sends it
}

func TestPrograms(t *testing.T) {
	f := newProgFixture(t)
	v4 := netip.MustParseAddr
	srcPod := v4("10.244.1.7")
	srcPod6 := v4("fd00:10:244:1::7")
	remote := v4("10.244.2.9")
	remote6 := v4("fd00:10:244:2::9")
	fromPod := func(dst netip.Addr, ttl uint8) []byte {
		if dst.Is4() {
			return dptest.IPv4Packet(f.hostMAC, f.podMAC, srcPod, dst, ttl, nil)
		}
		return dptest.IPv6Packet(f.hostMAC, f.podMAC, srcPod6, dst, ttl)
	}
	fromWire := func(dst netip.Addr, ttl uint8) []byte {
		if dst.Is4() {
			return dptest.IPv4Packet(f.upMAC, f.gwMAC, remote, dst, ttl, nil)
		}
		return dptest.IPv6Packet(f.upMAC, f.gwMAC, remote6, dst, ttl)
	}
	withOpts := dptest.IPv4Packet(f.hostMAC, f.podMAC, srcPod, f.ep.IP, 64, []byte{0x01, 0x01, 0x01, 0x00}) // NOP NOP NOP EOL
	badIHL := fromPod(f.ep.IP, 64)
	badIHL[14] = 0x4f
	shortTotLen := fromPod(f.ep.IP, 64)
	binary.BigEndian.PutUint16(shortTotLen[16:], 12)
	badVersion := fromPod(f.ep6.IP, 64)
	badVersion[14] = 0x40
	same := func(b []byte) []byte { return b }
	const tcp, udp = unix.IPPROTO_TCP, unix.IPPROTO_UDP
	big := func(b []byte) []byte { return dptest.BigTCP4(b, tcp) }

	cases := []progCase{
		{desc: "local pod v4: redirect_peer, pod MACs, TTL-1, valid checksum", prog: "pod_egress",
			pkt: fromPod(f.ep.IP, 64), verdict: dptest.TCActRedirect, reason: "redirect_peer_local", validIPv4: true,
			want: dptest.Forwarded(fromPod(f.ep.IP, 64), f.ep.PodMAC, f.ep.HostMAC)},
		{desc: "local pod v4 with IP options: accepted and dptest.Forwarded", prog: "pod_egress",
			pkt: withOpts, verdict: dptest.TCActRedirect, reason: "redirect_peer_local", validIPv4: true,
			want: dptest.Forwarded(withOpts, f.ep.PodMAC, f.ep.HostMAC)},
		{desc: "local pod v6: redirect_peer, pod MACs, hop limit-1", prog: "pod_egress",
			pkt: fromPod(f.ep6.IP, 64), verdict: dptest.TCActRedirect, reason: "redirect_peer_local",
			want: dptest.Forwarded(fromPod(f.ep6.IP, 64), f.ep6.PodMAC, f.ep6.HostMAC)},
		{desc: "local pod v4 with TTL 1: stack sends time exceeded", prog: "pod_egress",
			pkt: fromPod(f.ep.IP, 1), verdict: dptest.TCActOK, reason: "pass_ttl", want: same(fromPod(f.ep.IP, 1))},
		{desc: "remote pod v4, neighbour known: fib SUCCESS, bpf_redirect with fib MACs", prog: "pod_egress",
			pkt: fromPod(remote, 64), verdict: dptest.TCActRedirect, reason: "redirect_fib", validIPv4: true,
			want: dptest.Forwarded(fromPod(remote, 64), f.gwMAC, f.upMAC)},
		{desc: "remote pod v6, neighbour known: fib SUCCESS", prog: "pod_egress",
			pkt: fromPod(remote6, 64), verdict: dptest.TCActRedirect, reason: "redirect_fib",
			want: dptest.Forwarded(fromPod(remote6, 64), f.gwMAC, f.upMAC)},
		{desc: "remote pod v4, no neighbour: fib NO_NEIGH, bpf_redirect_neigh, MACs left to the kernel", prog: "pod_egress",
			pkt: fromPod(v4("10.244.3.9"), 64), verdict: dptest.TCActRedirect, reason: "redirect_neigh", validIPv4: true,
			want: dptest.Forwarded(fromPod(v4("10.244.3.9"), 64), f.hostMAC, f.podMAC)},
		{desc: "remote pod v6, no neighbour: fib NO_NEIGH", prog: "pod_egress",
			pkt: fromPod(v4("fd00:10:244:3::9"), 64), verdict: dptest.TCActRedirect, reason: "redirect_neigh",
			want: dptest.Forwarded(fromPod(v4("fd00:10:244:3::9"), 64), f.hostMAC, f.podMAC)},
		{desc: "host-bound v4 (node address): fib NOT_FWDED, stack", prog: "pod_egress",
			pkt: fromPod(v4("198.18.0.11"), 64), verdict: dptest.TCActOK, reason: "pass_host_bound", want: same(fromPod(v4("198.18.0.11"), 64))},
		{desc: "host-bound v6 (node address): stack", prog: "pod_egress",
			pkt: fromPod(v4("fd00:198:18::11"), 64), verdict: dptest.TCActOK, reason: "pass_host_bound", want: same(fromPod(v4("fd00:198:18::11"), 64))},
		{desc: "v6 link-local destination (NDP and friends): stack", prog: "pod_egress",
			pkt: fromPod(v4("fe80::1"), 255), verdict: dptest.TCActOK, reason: "pass_host_bound", want: same(fromPod(v4("fe80::1"), 255))},
		{desc: "unknown destination without route: stack", prog: "pod_egress",
			pkt: fromPod(v4("192.0.2.1"), 64), verdict: dptest.TCActOK, reason: "pass_host_bound", want: same(fromPod(v4("192.0.2.1"), 64))},
		{desc: "unreachable route: stack answers with ICMP", prog: "pod_egress",
			pkt: fromPod(v4("10.244.9.1"), 64), verdict: dptest.TCActOK, reason: "pass_no_route", want: same(fromPod(v4("10.244.9.1"), 64))},
		{desc: "ARP: stack", prog: "pod_egress",
			pkt: dptest.ARPPacket(f.podMAC), verdict: dptest.TCActOK, reason: "pass_arp_non_ip", want: dptest.ARPPacket(f.podMAC)},
		{desc: "IPv4 IHL 15 beyond the end of the frame (options truncated)", prog: "pod_egress",
			pkt: badIHL, verdict: dptest.TCActOK, reason: "pass_malformed", want: same(badIHL)},
		{desc: "IPv4 IHL < 5", prog: "pod_egress",
			pkt: func() []byte { b := fromPod(f.ep.IP, 64); b[14] = 0x43; return b }(), verdict: dptest.TCActOK, reason: "pass_malformed",
			want: func() []byte { b := fromPod(f.ep.IP, 64); b[14] = 0x43; return b }()},
		{desc: "IPv4 total length shorter than its header", prog: "pod_egress",
			pkt: shortTotLen, verdict: dptest.TCActOK, reason: "pass_malformed", want: same(shortTotLen)},
		{desc: "BIG TCP v4 to a remote pod (tot_len 0, GSO): fib SUCCESS, not the stack", prog: "pod_egress",
			pkt: big(fromPod(remote, 64)), gso: true, verdict: dptest.TCActRedirect, reason: "redirect_fib", validIPv4: true,
			want: dptest.Forwarded(big(fromPod(remote, 64)), f.gwMAC, f.upMAC)},
		{desc: "BIG TCP v4 to a local pod: redirect_peer", prog: "pod_egress",
			pkt: big(fromPod(f.ep.IP, 64)), gso: true, verdict: dptest.TCActRedirect, reason: "redirect_peer_local", validIPv4: true,
			want: dptest.Forwarded(big(fromPod(f.ep.IP, 64)), f.ep.PodMAC, f.ep.HostMAC)},
		{desc: "IPv4 total length 0 without GSO", prog: "pod_egress",
			pkt: big(fromPod(remote, 64)), verdict: dptest.TCActOK, reason: "pass_malformed", want: big(fromPod(remote, 64))},
		{desc: "IPv4 total length 0 with GSO but UDP (BIG TCP is TCP only)", prog: "pod_egress",
			pkt: dptest.BigTCP4(fromPod(remote, 64), udp), gso: true, verdict: dptest.TCActOK, reason: "pass_malformed",
			want: dptest.BigTCP4(fromPod(remote, 64), udp)},
		{desc: "IPv6 ethertype with version 4", prog: "pod_egress",
			pkt: badVersion, verdict: dptest.TCActOK, reason: "pass_malformed", want: same(badVersion)},
		{desc: "uplink: local pod v4: redirect_peer", prog: "uplink_ingress",
			pkt: fromWire(f.ep.IP, 63), verdict: dptest.TCActRedirect, reason: "redirect_peer_local", validIPv4: true,
			want: dptest.Forwarded(fromWire(f.ep.IP, 63), f.ep.PodMAC, f.ep.HostMAC)},
		{desc: "uplink: local pod v6: redirect_peer", prog: "uplink_ingress",
			pkt: fromWire(f.ep6.IP, 63), verdict: dptest.TCActRedirect, reason: "redirect_peer_local",
			want: dptest.Forwarded(fromWire(f.ep6.IP, 63), f.ep6.PodMAC, f.ep6.HostMAC)},
		{desc: "uplink: BIG TCP v4 to a local pod (tot_len 0, GSO): redirect_peer", prog: "uplink_ingress",
			pkt: big(fromWire(f.ep.IP, 63)), gso: true, verdict: dptest.TCActRedirect, reason: "redirect_peer_local", validIPv4: true,
			want: dptest.Forwarded(big(fromWire(f.ep.IP, 63)), f.ep.PodMAC, f.ep.HostMAC)},
		{desc: "uplink: not a local pod (node address): stack untouched", prog: "uplink_ingress",
			pkt: fromWire(v4("198.18.0.11"), 64), verdict: dptest.TCActOK, reason: "pass_not_local", want: fromWire(v4("198.18.0.11"), 64)},
		{desc: "uplink: unknown pod of this node's range: stack", prog: "uplink_ingress",
			pkt: fromWire(v4("10.244.1.99"), 64), verdict: dptest.TCActOK, reason: "pass_not_local", want: fromWire(v4("10.244.1.99"), 64)},
		{desc: "uplink: local pod with TTL 1", prog: "uplink_ingress",
			pkt: fromWire(f.ep.IP, 1), verdict: dptest.TCActOK, reason: "pass_ttl", want: fromWire(f.ep.IP, 1)},
		{desc: "uplink: ARP", prog: "uplink_ingress",
			pkt: dptest.ARPPacket(f.gwMAC), verdict: dptest.TCActOK, reason: "pass_arp_non_ip", want: dptest.ARPPacket(f.gwMAC)},
		{desc: "uplink: IPv4 IHL < 5", prog: "uplink_ingress",
			pkt: func() []byte { b := fromWire(f.ep.IP, 64); b[14] = 0x42; return b }(), verdict: dptest.TCActOK, reason: "pass_malformed",
			want: func() []byte { b := fromWire(f.ep.IP, 64); b[14] = 0x42; return b }()},
	}

	// Frames shorter than their L2/L3 headers cannot be fed through
	// PROG_TEST_RUN (the kernel answers EINVAL before the program runs);
	// TestTrafficRedirectPeer sends them through a real veth instead.
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			prog, ifindex := f.d.podProg, f.podIf
			if tc.prog == "uplink_ingress" {
				prog, ifindex = f.d.upProg, f.upIf
			}
			before, err := f.d.MetricsByDirection()
			if err != nil {
				t.Fatal(err)
			}
			out := make([]byte, len(tc.pkt)+256)
			var verdict uint32
			dptest.InNetns(t, f.ns, func() {
				ctx := dptest.SKBCtx(ifindex)
				if tc.gso {
					ctx = dptest.SKBFields{Ifindex: ifindex, GSOSize: 1448, GSOSegs: 2}.Ctx()
				}
				opts := &ebpf.RunOptions{Data: tc.pkt, DataOut: out, Context: ctx}
				verdict, err = prog.Run(opts)
				out = opts.DataOut
			})
			if err != nil {
				t.Fatalf("prog run: %v", err)
			}
			if verdict != tc.verdict {
				t.Errorf("verdict = %d, want %d", verdict, tc.verdict)
			}
			if !bytes.Equal(out, tc.want) {
				t.Errorf("output frame differs\n got %x\nwant %x", out, tc.want)
			}
			if tc.validIPv4 && !dptest.IPv4HeaderValid(out) {
				t.Errorf("output IPv4 header checksum is invalid: %x", out[14:34])
			}
			after, err := f.d.MetricsByDirection()
			if err != nil {
				t.Fatal(err)
			}
			for r, v := range after[tc.prog] {
				delta := v - before[tc.prog][r]
				want := uint64(0)
				if r == tc.reason {
					want = 1
				}
				if delta != want {
					t.Errorf("counter %s/%s moved by %d, want %d", tc.prog, r, delta, want)
				}
			}
		})
	}
	m, err := f.d.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	if m["pass_malformed"] < 5 {
		t.Errorf("summed pass_malformed = %d, want >= 5", m["pass_malformed"])
	}
}

func TestVerifiedInstructions(t *testing.T) {
	f := newProgFixture(t)
	got, err := f.d.VerifiedInstructions()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"pod_egress", "uplink_ingress"} {
		if got[name] == 0 || got[name] > 100000 {
			t.Errorf("%s: %d verified instructions", name, got[name])
		}
		t.Logf("%s: %d instructions processed by the verifier", name, got[name])
	}
}

func TestEndpointsMap(t *testing.T) {
	f := newProgFixture(t)
	got, err := f.d.Endpoints()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].IP != f.ep.IP || got[1].IP != f.ep6.IP ||
		got[0].IfIndex != f.ep.IfIndex || got[0].PodMAC.String() != f.ep.PodMAC.String() ||
		got[1].HostMAC.String() != f.ep6.HostMAC.String() {
		t.Fatalf("Endpoints() = %+v", got)
	}
	bad := []struct {
		desc string
		ep   Endpoint
	}{
		{"no IP", Endpoint{IfIndex: 3, PodMAC: f.podMAC, HostMAC: f.hostMAC}},
		{"zero ifindex", Endpoint{IP: f.ep.IP, PodMAC: f.podMAC, HostMAC: f.hostMAC}},
		{"short pod MAC", Endpoint{IP: f.ep.IP, IfIndex: 3, PodMAC: f.podMAC[:4], HostMAC: f.hostMAC}},
		{"missing host MAC", Endpoint{IP: f.ep.IP, IfIndex: 3, PodMAC: f.podMAC}},
	}
	for _, b := range bad {
		if err := f.d.UpsertEndpoint(b.ep); err == nil {
			t.Errorf("%s: UpsertEndpoint accepted %+v", b.desc, b.ep)
		}
	}
	if got2, _ := f.d.Endpoints(); len(got2) != 2 || got2[0].IfIndex != f.ep.IfIndex {
		t.Fatalf("bad input changed the map: %+v", got2)
	}
	// IPv4-mapped IPv6 is stored as IPv4; update in place.
	upd := f.ep
	upd.IP = netip.AddrFrom16(f.ep.IP.As16())
	upd.IfIndex = 77
	if err := f.d.UpsertEndpoint(upd); err != nil {
		t.Fatal(err)
	}
	got, _ = f.d.Endpoints()
	if len(got) != 2 || got[0].IfIndex != 77 {
		t.Fatalf("after update: %+v", got)
	}
	for _, ip := range []netip.Addr{f.ep.IP, f.ep6.IP, f.ep.IP /* absent now */} {
		if err := f.d.DeleteEndpoint(ip); err != nil {
			t.Fatalf("DeleteEndpoint(%s): %v", ip, err)
		}
	}
	if got, _ := f.d.Endpoints(); len(got) != 0 {
		t.Fatalf("after delete: %+v", got)
	}
}
