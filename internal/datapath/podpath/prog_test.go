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
	sender  Endpoint         // the pod behind lxcA, which sends the pod_egress fixtures (v4)
	sender6 Endpoint         // the same (v6)
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
	// the sending pod behind lxcA: pod_egress forwards only what it sends
	// as itself (source address validation, bpf/lib/srcguard.h)
	f.sender = Endpoint{IP: netip.MustParseAddr("10.244.1.7"), IfIndex: f.podIf, PodMAC: f.podMAC, HostMAC: f.hostMAC}
	f.sender6 = f.sender
	f.sender6.IP = netip.MustParseAddr("fd00:10:244:1::7")
	for _, ep := range []Endpoint{f.ep, f.ep6, f.sender, f.sender6} {
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
	ifindex   int    // the device it comes from, when not the program's own (lxcA / eth0)
}

func TestPrograms(t *testing.T) {
	f := newProgFixture(t)
	v4 := netip.MustParseAddr
	srcPod, srcPod6 := f.sender.IP, f.sender6.IP
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
	from4 := func(src, dst netip.Addr) []byte { return dptest.IPv4Packet(f.hostMAC, f.podMAC, src, dst, 64, nil) }
	from6 := func(src, dst netip.Addr) []byte { return dptest.IPv6Packet(f.hostMAC, f.podMAC, src, dst, 255) }
	gw := v4("169.254.1.1")
	arpGW := arpFrame(bcastMAC, f.podMAC, 1, f.podMAC, srcPod, nil, gw)
	arpProbe := arpFrame(bcastMAC, f.podMAC, 1, f.podMAC, netip.IPv4Unspecified(), nil, srcPod)
	arpSpoof := arpFrame(f.hostMAC, f.podMAC, 2, f.podMAC, f.ep.IP, f.hostMAC, gw)
	arpBadType := arpFrame(bcastMAC, f.podMAC, 1, f.podMAC, srcPod, nil, gw)
	arpBadType[14+3] = 0x06 // protocol type 0x0806
	arpShort := arpGW[: 14+20 : 14+20]
	lldp := append(dptest.EthHdr(net.HardwareAddr{0x01, 0x80, 0xc2, 0, 0, 0x0e}, f.podMAC, 0x88cc), make([]byte, 46)...)
	spoof4, spoof6 := from4(f.ep.IP, remote), from6(f.ep6.IP, remote6)
	ll := v4("fe80::7")
	naOwn := icmp6Frame(f.podMAC, ll, allNodes, ndNA(srcPod6, f.podMAC), false)
	naSpoof := icmp6Frame(f.podMAC, ll, allNodes, ndNA(f.ep6.IP, f.podMAC), true)
	naShort := icmp6Frame(f.podMAC, ll, allNodes, ndNA(f.ep6.IP, f.podMAC)[:16], false)
	redirect := icmp6Frame(f.podMAC, ll, allNodes, append([]byte{137, 0, 0, 0, 0, 0, 0, 0}, make([]byte, 32)...), false)
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
		{desc: "ARP request of the pod for its gateway, none configured: stack", prog: "pod_egress",
			pkt: arpGW, verdict: dptest.TCActOK, reason: "pass_arp_non_ip", want: arpGW},
		{desc: "ARP probe (sender 0.0.0.0): stack", prog: "pod_egress",
			pkt: arpProbe, verdict: dptest.TCActOK, reason: "pass_arp_non_ip", want: arpProbe},
		{desc: "ARP claiming another pod's address: dropped", prog: "pod_egress",
			pkt: arpSpoof, verdict: dptest.TCActShot, reason: "drop_spoof_arp", want: arpSpoof},
		{desc: "ARP of another protocol type: dropped", prog: "pod_egress",
			pkt: arpBadType, verdict: dptest.TCActShot, reason: "drop_spoof_arp", want: arpBadType},
		{desc: "ARP cut short: dropped", prog: "pod_egress",
			pkt: arpShort, verdict: dptest.TCActShot, reason: "drop_spoof_arp", want: arpShort},
		{desc: "LLDP (neither IP nor ARP): dropped", prog: "pod_egress",
			pkt: lldp, verdict: dptest.TCActShot, reason: "drop_l2", want: lldp},
		{desc: "v4 from another local pod's address: dropped", prog: "pod_egress",
			pkt: spoof4, verdict: dptest.TCActShot, reason: "drop_spoof_src", want: spoof4},
		{desc: "v4 from the pod's address on another device (ifindex mismatch): dropped", prog: "pod_egress",
			pkt: fromPod(remote, 64), ifindex: f.upIf, verdict: dptest.TCActShot, reason: "drop_spoof_src", want: fromPod(remote, 64)},
		{desc: "v4 from 0.0.0.0: dropped", prog: "pod_egress",
			pkt: from4(v4("0.0.0.0"), remote), verdict: dptest.TCActShot, reason: "drop_spoof_src", want: from4(v4("0.0.0.0"), remote)},
		{desc: "v4 from an outside address to the node: dropped", prog: "pod_egress",
			pkt: from4(v4("203.0.113.9"), v4("198.18.0.11")), verdict: dptest.TCActShot, reason: "drop_spoof_src",
			want: from4(v4("203.0.113.9"), v4("198.18.0.11"))},
		{desc: "v6 from another local pod's address: dropped", prog: "pod_egress",
			pkt: spoof6, verdict: dptest.TCActShot, reason: "drop_spoof_src", want: spoof6},
		{desc: "v6 link-local source to a link-local destination: stack", prog: "pod_egress",
			pkt: from6(ll, v4("fe80::1")), verdict: dptest.TCActOK, reason: "pass_host_bound", want: from6(ll, v4("fe80::1"))},
		{desc: "v6 link-local source to a remote pod: dropped", prog: "pod_egress",
			pkt: from6(ll, remote6), verdict: dptest.TCActShot, reason: "drop_spoof_src", want: from6(ll, remote6)},
		{desc: "v6 unspecified source to multicast (DAD, MLD): stack", prog: "pod_egress",
			pkt: from6(v4("::"), v4("ff02::16")), verdict: dptest.TCActOK, reason: "pass_host_bound", want: from6(v4("::"), v4("ff02::16"))},
		{desc: "v6 unspecified source to a unicast address: dropped", prog: "pod_egress",
			pkt: from6(v4("::"), f.ep6.IP), verdict: dptest.TCActShot, reason: "drop_spoof_src", want: from6(v4("::"), f.ep6.IP)},
		{desc: "NA for the pod's own address: stack", prog: "pod_egress",
			pkt: naOwn, verdict: dptest.TCActOK, reason: "pass_host_bound", want: naOwn},
		{desc: "NA for another pod's address, behind a hop-by-hop header: dropped", prog: "pod_egress",
			pkt: naSpoof, verdict: dptest.TCActShot, reason: "drop_spoof_nd", want: naSpoof},
		{desc: "NA cut short before its target: dropped", prog: "pod_egress",
			pkt: naShort, verdict: dptest.TCActShot, reason: "drop_spoof_nd", want: naShort},
		{desc: "redirect from the pod: dropped", prog: "pod_egress",
			pkt: redirect, verdict: dptest.TCActShot, reason: "drop_spoof_nd", want: redirect},
		{desc: "IPv4 IHL 15 beyond the end of the frame (options truncated)", prog: "pod_egress",
			pkt: badIHL, verdict: dptest.TCActShot, reason: "drop_malformed", want: same(badIHL)},
		{desc: "IPv4 IHL < 5", prog: "pod_egress",
			pkt: func() []byte { b := fromPod(f.ep.IP, 64); b[14] = 0x43; return b }(), verdict: dptest.TCActShot, reason: "drop_malformed",
			want: func() []byte { b := fromPod(f.ep.IP, 64); b[14] = 0x43; return b }()},
		{desc: "IPv4 total length shorter than its header", prog: "pod_egress",
			pkt: shortTotLen, verdict: dptest.TCActShot, reason: "drop_malformed", want: same(shortTotLen)},
		{desc: "BIG TCP v4 to a remote pod (tot_len 0, GSO): fib SUCCESS, not the stack", prog: "pod_egress",
			pkt: big(fromPod(remote, 64)), gso: true, verdict: dptest.TCActRedirect, reason: "redirect_fib", validIPv4: true,
			want: dptest.Forwarded(big(fromPod(remote, 64)), f.gwMAC, f.upMAC)},
		{desc: "BIG TCP v4 to a local pod: redirect_peer", prog: "pod_egress",
			pkt: big(fromPod(f.ep.IP, 64)), gso: true, verdict: dptest.TCActRedirect, reason: "redirect_peer_local", validIPv4: true,
			want: dptest.Forwarded(big(fromPod(f.ep.IP, 64)), f.ep.PodMAC, f.ep.HostMAC)},
		{desc: "IPv4 total length 0 without GSO", prog: "pod_egress",
			pkt: big(fromPod(remote, 64)), verdict: dptest.TCActShot, reason: "drop_malformed", want: big(fromPod(remote, 64))},
		{desc: "IPv4 total length 0 with GSO but UDP (BIG TCP is TCP only)", prog: "pod_egress",
			pkt: dptest.BigTCP4(fromPod(remote, 64), udp), gso: true, verdict: dptest.TCActShot, reason: "drop_malformed",
			want: dptest.BigTCP4(fromPod(remote, 64), udp)},
		{desc: "IPv6 ethertype with version 4", prog: "pod_egress",
			pkt: badVersion, verdict: dptest.TCActShot, reason: "drop_malformed", want: same(badVersion)},
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
	// TestTrafficRedirectPeer sends them through a real veth instead. Nor
	// can a VLAN tag in the skb's metadata: TestSourceGuardFrames sends
	// one.
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) { f.run(t, tc) })
	}
	m, err := f.d.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	if m["drop_malformed"] < 6 || m["pass_malformed"] < 1 {
		t.Errorf("summed drop_malformed = %d, pass_malformed = %d, want >= 6 (pod egress) and >= 1 (uplink)", m["drop_malformed"], m["pass_malformed"])
	}
}

// run feeds tc.pkt to its program through BPF_PROG_TEST_RUN and checks
// the verdict, the output frame and that exactly tc.reason moved.
func (f *progFixture) run(t *testing.T, tc progCase) {
	t.Helper()
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
		if tc.ifindex != 0 {
			ifindex = tc.ifindex
		}
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
}

// TestProgramsGatewayARP: with the pods' gateway configured, pod_egress
// turns the pod's ARP request for it into the reply (the host-side MAC,
// addressed to the asker) and redirects it back out of the pod's device;
// a request for another address, and a reply, pass as before.
func TestProgramsGatewayARP(t *testing.T) {
	gw := netip.MustParseAddr("169.254.1.1")
	f := newProgFixtureWith(t, func(c *Config) { c.GatewayV4 = gw })
	src := f.sender.IP
	req := arpFrame(bcastMAC, f.podMAC, 1, f.podMAC, src, nil, gw)
	reply := arpFrame(f.podMAC, f.hostMAC, 2, f.hostMAC, gw, f.podMAC, src)
	other := arpFrame(bcastMAC, f.podMAC, 1, f.podMAC, src, nil, f.ep.IP)
	gwReply := arpFrame(f.hostMAC, f.podMAC, 2, f.podMAC, src, f.hostMAC, gw)
	padded := append(append([]byte(nil), req...), make([]byte, 60-len(req))...)
	for _, tc := range []progCase{
		{desc: "request for the gateway: answered back to the pod", prog: "pod_egress",
			pkt: req, verdict: dptest.TCActRedirect, reason: "redirect_arp_reply", want: reply},
		{desc: "padded to 60 bytes: answered, the padding kept", prog: "pod_egress",
			pkt: padded, verdict: dptest.TCActRedirect, reason: "redirect_arp_reply", want: append(append([]byte(nil), reply...), make([]byte, 60-len(reply))...)},
		{desc: "request for another address: stack", prog: "pod_egress",
			pkt: other, verdict: dptest.TCActOK, reason: "pass_arp_non_ip", want: other},
		{desc: "a reply naming the gateway: stack", prog: "pod_egress",
			pkt: gwReply, verdict: dptest.TCActOK, reason: "pass_arp_non_ip", want: gwReply},
	} {
		t.Run(tc.desc, func(t *testing.T) { f.run(t, tc) })
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
	for _, ip := range []netip.Addr{f.sender.IP, f.sender6.IP} { // this test counts the entries
		if err := f.d.DeleteEndpoint(ip); err != nil {
			t.Fatal(err)
		}
	}
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
