package podpath

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/axonhq/axon/internal/inetcsum"
)

// Source address validation at pod egress, tried as an attacker would: pod
// A writes frames with a packet socket on its eth0 (IP with a neighbour's
// or an outside source, ARP and Neighbor Advertisements claiming a
// neighbour's address, a VLAN tag, a frame whose headers are not in the
// linear area). Each spoofed frame must not reach its receiver (the pod or
// external host it was sent to over UDP, or the node's stack on A's
// host-side device for ARP/ND) and must move the counter of its reason;
// the legitimate frames, sent after the spoofed ones on the same path, must
// arrive, which shows the receivers were listening when the spoofed ones
// would have come.

// guardPort is the UDP port the receivers listen on.
const guardPort = 9999

// guardFrame is one frame pod A sends.
type guardFrame struct {
	desc  string
	frame []byte
	// where it would arrive: "udp:<netns tag>" (the payload, which is desc,
	// read by that netns' UDP socket) or "l2:<ethertype>" (the frame, read
	// by a packet socket of that protocol on A's host-side device)
	at   string
	drop string // "": legitimate, must arrive; else the pod_egress counter that counts it
}

func TestSourceGuardFrames(t *testing.T) {
	dptest.RequireRoot(t)
	t.Run("veth", func(t *testing.T) { sourceGuardFrames(t, addPod, false) })
	// On a netkit pod the program runs on the peer, in the pod's transmit
	// path, where skb->ifindex is the primary's (L2 mode: ARP and ND exist).
	t.Run("netkit-l2", func(t *testing.T) {
		if c := datapath.ProbeNetkit(); !c.Available {
			t.Skipf("no netkit on this kernel (%s): the kernel-matrix VM (6.12) runs it", c.Reason)
		}
		sourceGuardFrames(t, addNetkitPod, true)
	})
}

// sourceGuardFrames is TestSourceGuardFrames with pod A's device made by
// addA (addPod: veth; addNetkitPod, netkit true). On netkit the program runs
// in A's own transmit path and a frame it drops fails A's send with ENOBUFS
// (a veth's tc ingress runs after the send returned): there every dropped
// frame must fail so and every legitimate one must not.
func sourceGuardFrames(t *testing.T, addA func(t *testing.T, node, hostIf, ip4, ip6 string) pod, netkit bool) {
	node, ext := newTrafficNode(t)
	a := addA(t, node, "lxcA", "10.244.1.2", "fd00:10:244:1::2")
	b := addPod(t, node, "lxcB", "10.244.1.3", "fd00:10:244:1::3")
	c := addPod(t, node, "lxcC", "10.244.1.4", "fd00:10:244:1::4")
	d := loadWithPods(t, node, a, b, c)
	// frames over a page: pod and host side take them
	for _, l := range []struct{ ns, dev string }{{a.ns, "eth0"}, {node, "lxcA"}} {
		nc := dptest.NSConf(t, l.ns)
		if err := nc.H.LinkSetMTU(nc.Link(l.dev), 9000); err != nil {
			t.Fatal(err)
		}
	}
	// the outside host also listens on VLAN 100 of its wire
	ec := dptest.NSConf(t, ext)
	vlan := &netlink.Vlan{LinkAttrs: netlink.LinkAttrs{Name: "wire.100", ParentIndex: ec.Index("wire")}, VlanId: 100}
	if err := ec.H.LinkAdd(vlan); err != nil {
		// no 8021q here: the tagged frame could not arrive anyway, its
		// counter still has to move
		t.Logf("no VLAN device on the outside host (%v): the VLAN case checks its counter only", err)
	} else {
		ec.Up("wire.100")
	}

	ext4, ext6 := netip.MustParseAddr("198.18.0.250"), netip.MustParseAddr("fd00:198:18::250")
	outside := netip.MustParseAddr("203.0.113.9")
	ll := netip.MustParseAddr("fe80::a")
	m, h := a.mac, a.hmac
	udp := func(src, dst netip.Addr, desc string) []byte { return udpFrame(h, m, src, dst, []byte(desc)) }
	var frames []guardFrame
	add := func(desc, at, drop string, frame func(desc string) []byte) {
		frames = append(frames, guardFrame{desc: desc, frame: frame(desc), at: at, drop: drop})
	}
	to := func(src, dst netip.Addr) func(string) []byte {
		return func(desc string) []byte { return udp(src, dst, desc) }
	}
	fixed := func(b []byte) func(string) []byte { return func(string) []byte { return b } }
	// spoofed, in the order they are sent
	add("v4 UDP from neighbour B to pod C", "udp:c", "drop_spoof_src", to(b.ip4, c.ip4))
	add("v4 UDP from neighbour B off-node", "udp:ext", "drop_spoof_src", to(b.ip4, ext4))
	add("v4 UDP from an outside address to pod C", "udp:c", "drop_spoof_src", to(outside, c.ip4))
	add("v4 UDP from an outside address off-node", "udp:ext", "drop_spoof_src", to(outside, ext4))
	add("v6 UDP from neighbour B to pod C", "udp:c", "drop_spoof_src", to(b.ip6, c.ip6))
	add("v6 UDP from neighbour B off-node", "udp:ext", "drop_spoof_src", to(b.ip6, ext6))
	// (the outside host's stack finds no route for a link-local source and
	// drops this one itself: here the counter is what shows the drop)
	add("v6 UDP from a link-local source off-node", "udp:ext", "drop_spoof_src", to(ll, ext6))
	add("gratuitous ARP request claiming B", "l2:0806", "drop_spoof_arp",
		fixed(arpFrame(bcastMAC, m, 1, m, b.ip4, nil, b.ip4)))
	add("ARP reply claiming B", "l2:0806", "drop_spoof_arp",
		fixed(arpFrame(h, m, 2, m, b.ip4, h, netip.MustParseAddr("169.254.1.1"))))
	add("unsolicited NA for B from a link-local source", "l2:86dd", "drop_spoof_nd",
		fixed(icmp6Frame(m, ll, allNodes, ndNA(b.ip6, m), false)))
	add("NA for B behind a hop-by-hop header", "l2:86dd", "drop_spoof_nd",
		fixed(icmp6Frame(m, ll, allNodes, ndNA(b.ip6, m), true)))
	add("router advertisement", "l2:86dd", "drop_spoof_nd",
		fixed(icmp6Frame(m, ll, allNodes, []byte{134, 0, 0, 0, 64, 0, 0x07, 0x08, 0, 0, 0, 0, 0, 0, 0, 0}, false)))
	add("VLAN 100 tagged v4 UDP from A's own address", "udp:ext", "drop_l2", func(desc string) []byte {
		return vlanTag(udp(a.ip4, ext4, desc), 100)
	})
	// a packet socket puts only the Ethernet header of a frame over a page
	// in the linear area; passed to the stack, the node forwarded it to C
	add("v4 UDP from B over a page, headers not linear", "udp:c", "drop_malformed", func(desc string) []byte {
		return udp(b.ip4, c.ip4, desc+strings.Repeat(".", 5000))
	})
	// legitimate, sent after the spoofed ones on the same path
	add("v4 UDP from A to pod C", "udp:c", "", to(a.ip4, c.ip4))
	add("v4 UDP from A off-node", "udp:ext", "", to(a.ip4, ext4))
	add("v6 UDP from A to pod C", "udp:c", "", to(a.ip6, c.ip6))
	add("v6 UDP from A off-node", "udp:ext", "", to(a.ip6, ext6))
	add("ARP request from A for its gateway", "l2:0806", "",
		fixed(arpFrame(bcastMAC, m, 1, m, a.ip4, nil, netip.MustParseAddr("169.254.1.1"))))
	add("ARP probe (sender 0.0.0.0)", "l2:0806", "",
		fixed(arpFrame(bcastMAC, m, 1, m, netip.IPv4Unspecified(), nil, a.ip4)))
	add("NA for A's own address", "l2:86dd", "", fixed(icmp6Frame(m, ll, allNodes, ndNA(a.ip6, m), false)))
	add("NA for a link-local address", "l2:86dd", "", fixed(icmp6Frame(m, ll, allNodes, ndNA(ll, m), false)))
	add("router solicitation from a link-local source", "l2:86dd", "",
		fixed(icmp6Frame(m, ll, netip.MustParseAddr("ff02::2"), []byte{133, 0, 0, 0, 0, 0, 0, 0}, false)))
	add("DAD neighbor solicitation from ::", "l2:86dd", "",
		fixed(icmp6Frame(m, netip.IPv6Unspecified(), solicitedNode(a.ip6), ndNS(a.ip6), false)))

	rx := map[string]*receiver{
		"udp:c":   guardUDP(t, c.ns),
		"udp:ext": guardUDP(t, ext),
		"l2:0806": guardL2(t, node, "lxcA", unix.ETH_P_ARP),
		"l2:86dd": guardL2(t, node, "lxcA", unix.ETH_P_IPV6),
	}
	m0, err := d.MetricsByDirection()
	if err != nil {
		t.Fatal(err)
	}
	var raw [][]byte
	for _, f := range frames {
		raw = append(raw, f.frame)
	}
	for i, err := range dptest.SendRawEach(t, a.ns, "eth0", raw) {
		f := frames[i]
		switch {
		case netkit && f.drop != "" && !errors.Is(err, unix.ENOBUFS):
			t.Errorf("%s: send answered %v; on netkit a frame the peer program drops fails the send with ENOBUFS", f.desc, err)
		case (!netkit || f.drop == "") && err != nil:
			t.Errorf("%s: send %d-byte frame: %v", f.desc, len(f.frame), err)
		}
	}

	// wait until every legitimate frame arrived (3 s at most)
	arrived := func(f guardFrame) bool {
		r := rx[f.at]
		if strings.HasPrefix(f.at, "udp:") {
			// the payload is desc, padded with dots to make a frame large
			return r.has(func(p []byte) bool { return strings.TrimRight(string(p), ".") == f.desc })
		}
		return r.has(func(p []byte) bool { return len(p) >= len(f.frame) && bytes.Equal(p[:len(f.frame)], f.frame) })
	}
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		all := true
		for _, f := range frames {
			all = all && (f.drop != "" || arrived(f))
		}
		if all {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	m1, err := d.MetricsByDirection()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]uint64{}
	for _, f := range frames {
		got := arrived(f)
		switch {
		case f.drop == "" && !got:
			t.Errorf("%s: did not arrive (%s); it must", f.desc, f.at)
		case f.drop != "" && got:
			t.Errorf("%s: arrived at %s; it must be dropped at pod egress (%s)", f.desc, f.at, f.drop)
		}
		if f.drop != "" {
			want[f.drop]++
		}
	}
	for r, n := range want {
		if got := m1["pod_egress"][r] - m0["pod_egress"][r]; got != n {
			t.Errorf("pod_egress %s +%d, want +%d (one per spoofed frame of that reason)", r, got, n)
		}
	}
	t.Logf("pod_egress counters after: %v", m1["pod_egress"])
}

// addNetkitPod is addPod with a netkit pair in L2 mode (as axon-cni makes
// it for --device-mode=netkit-l2: both policies blackhole until AttachPod
// opens it) instead of a veth.
func addNetkitPod(t *testing.T, node, hostIf, ip4, ip6 string) pod {
	t.Helper()
	p := pod{ns: dptest.NewNetns(t, "pod"), hostIf: hostIf, ip4: netip.MustParseAddr(ip4), ip6: netip.MustParseAddr(ip6)}
	nc := dptest.NSConf(t, node)
	podNS, err := netns.GetFromName(p.ns)
	if err != nil {
		t.Fatal(err)
	}
	defer podNS.Close()
	nk := &netlink.Netkit{
		LinkAttrs:  netlink.LinkAttrs{Name: hostIf},
		Mode:       netlink.NETKIT_MODE_L2,
		Policy:     netlink.NETKIT_POLICY_BLACKHOLE,
		PeerPolicy: netlink.NETKIT_POLICY_BLACKHOLE,
	}
	nk.SetPeerAttrs(&netlink.LinkAttrs{Name: "eth0", Namespace: netlink.NsFd(int(podNS))})
	if err := nc.H.LinkAdd(nk); err != nil {
		t.Fatalf("create netkit %s: %v", hostIf, err)
	}
	wirePod(t, node, &p)
	return p
}

// ---- receivers ----

// receiver collects what a socket reads until the test ends.
type receiver struct {
	mu  sync.Mutex
	got [][]byte
}

func (r *receiver) add(p []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, append([]byte(nil), p...))
}

func (r *receiver) has(match func([]byte) bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.got {
		if match(p) {
			return true
		}
	}
	return false
}

// guardUDP reads the datagrams that reach UDP port guardPort of netns ns,
// IPv4 and IPv6.
func guardUDP(t *testing.T, ns string) *receiver {
	t.Helper()
	r := &receiver{}
	for _, network := range []string{"udp4", "udp6"} {
		var pc net.PacketConn
		dptest.InNetns(t, ns, func() {
			var err error
			if pc, err = net.ListenPacket(network, fmt.Sprintf(":%d", guardPort)); err != nil {
				t.Fatalf("listen %s in %s: %v", network, ns, err)
			}
		})
		t.Cleanup(func() { pc.Close() })
		go func() {
			buf := make([]byte, 65536)
			for {
				n, _, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				r.add(buf[:n])
			}
		}()
	}
	return r
}

// guardL2 reads the frames of ethertype proto that the stack of netns ns
// receives on dev: a packet socket bound to one protocol is handed frames
// after the device's tc ingress (a program's drop keeps them from it),
// unlike an ETH_P_ALL tap, which sees them before.
func guardL2(t *testing.T, ns, dev string, proto uint16) *receiver {
	t.Helper()
	r := &receiver{}
	var fd int
	dptest.InNetns(t, ns, func() {
		l, err := netlink.LinkByName(dev)
		if err != nil {
			t.Fatal(err)
		}
		if fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(dptest.Htons(proto))); err != nil {
			t.Fatalf("packet socket: %v", err)
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: dptest.Htons(proto), Ifindex: l.Attrs().Index}); err != nil {
			t.Fatalf("bind packet socket to %s: %v", dev, err)
		}
	})
	tv := unix.Timeval{Usec: 100_000}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	stopped := make(chan struct{})
	t.Cleanup(func() { close(done); <-stopped; unix.Close(fd) })
	go func() {
		defer close(stopped)
		buf := make([]byte, 65536)
		for {
			select {
			case <-done:
				return
			default:
			}
			n, from, err := unix.Recvfrom(fd, buf, 0)
			if err != nil {
				continue
			}
			if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
				continue
			}
			r.add(buf[:n])
		}
	}()
	return r
}

// ---- frames ----

var (
	bcastMAC = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	allNodes = netip.MustParseAddr("ff02::1")
)

// udpFrame is Ethernet + IPv4 (TTL 64) or IPv6 (hop limit 64) + UDP from
// port 40000 to guardPort, with valid checksums (IPv4 UDP: none).
func udpFrame(dstMAC, srcMAC net.HardwareAddr, src, dst netip.Addr, payload []byte) []byte {
	u := make([]byte, 8, 8+len(payload))
	binary.BigEndian.PutUint16(u[0:], 40000)
	binary.BigEndian.PutUint16(u[2:], guardPort)
	binary.BigEndian.PutUint16(u[4:], uint16(8+len(payload)))
	u = append(u, payload...)
	if src.Is4() {
		ip := make([]byte, 20)
		ip[0] = 0x45
		binary.BigEndian.PutUint16(ip[2:], uint16(20+len(u)))
		ip[8], ip[9] = 64, unix.IPPROTO_UDP
		s, d := src.As4(), dst.As4()
		copy(ip[12:], s[:])
		copy(ip[16:], d[:])
		binary.BigEndian.PutUint16(ip[10:], inetcsum.Checksum(ip, 0))
		return append(append(dptest.EthHdr(dstMAC, srcMAC, unix.ETH_P_IP), ip...), u...)
	}
	binary.BigEndian.PutUint16(u[6:], inetcsum.Checksum(u, pseudo6(src, dst, unix.IPPROTO_UDP, len(u))))
	return append(append(dptest.EthHdr(dstMAC, srcMAC, unix.ETH_P_IPV6), ip6Hdr(src, dst, unix.IPPROTO_UDP, 64, len(u))...), u...)
}

func ip6Hdr(src, dst netip.Addr, next byte, hop byte, plen int) []byte {
	ip := make([]byte, 40)
	ip[0] = 0x60
	binary.BigEndian.PutUint16(ip[4:], uint16(plen))
	ip[6], ip[7] = next, hop
	s, d := src.As16(), dst.As16()
	copy(ip[8:], s[:])
	copy(ip[24:], d[:])
	return ip
}

// pseudo6 is the partial sum of the IPv6 pseudo-header.
func pseudo6(src, dst netip.Addr, next byte, n int) uint32 {
	b := make([]byte, 40)
	s, d := src.As16(), dst.As16()
	copy(b[0:], s[:])
	copy(b[16:], d[:])
	binary.BigEndian.PutUint32(b[32:], uint32(n))
	b[39] = next
	var sum uint32
	for i := 0; i < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	return sum
}

// icmp6Frame is an ICMPv6 message (msg: type, code, zero checksum, body)
// from srcMAC and src to the multicast group dst, hop limit 255 as ND
// wants; hbh puts an empty hop-by-hop options header in front of it.
func icmp6Frame(srcMAC net.HardwareAddr, src, dst netip.Addr, msg []byte, hbh bool) []byte {
	msg = append([]byte(nil), msg...)
	binary.BigEndian.PutUint16(msg[2:], inetcsum.Checksum(msg, pseudo6(src, dst, unix.IPPROTO_ICMPV6, len(msg))))
	d := dst.As16()
	dstMAC := net.HardwareAddr{0x33, 0x33, d[12], d[13], d[14], d[15]}
	if !hbh {
		return append(append(dptest.EthHdr(dstMAC, srcMAC, unix.ETH_P_IPV6), ip6Hdr(src, dst, unix.IPPROTO_ICMPV6, 255, len(msg))...), msg...)
	}
	opts := []byte{unix.IPPROTO_ICMPV6, 0, 1, 4, 0, 0, 0, 0} // next header, length 0, PadN of 4
	out := append(dptest.EthHdr(dstMAC, srcMAC, unix.ETH_P_IPV6), ip6Hdr(src, dst, 0, 255, len(opts)+len(msg))...)
	return append(append(out, opts...), msg...)
}

// ndNA is an unsolicited Neighbor Advertisement (override) of target with
// mac as its target link-layer address.
func ndNA(target netip.Addr, mac net.HardwareAddr) []byte {
	b := make([]byte, 32)
	b[0] = 136
	b[4] = 0x20 // O
	t := target.As16()
	copy(b[8:], t[:])
	b[24], b[25] = 2, 1 // target link-layer address option, 8 bytes
	copy(b[26:], mac)
	return b
}

// ndNS is a Neighbor Solicitation for target without options (DAD).
func ndNS(target netip.Addr) []byte {
	b := make([]byte, 24)
	b[0] = 135
	t := target.As16()
	copy(b[8:], t[:])
	return b
}

// solicitedNode is the solicited-node multicast group of a.
func solicitedNode(a netip.Addr) netip.Addr {
	b := netip.MustParseAddr("ff02::1:ff00:0").As16()
	s := a.As16()
	copy(b[13:], s[13:])
	return netip.AddrFrom16(b)
}

// arpFrame is an Ethernet/IPv4 ARP message (op 1 request, 2 reply).
func arpFrame(dstMAC, srcMAC net.HardwareAddr, op uint16, sha net.HardwareAddr, spa netip.Addr, tha net.HardwareAddr, tpa netip.Addr) []byte {
	b := make([]byte, 28)
	binary.BigEndian.PutUint16(b[0:], 1)
	binary.BigEndian.PutUint16(b[2:], unix.ETH_P_IP)
	b[4], b[5] = 6, 4
	binary.BigEndian.PutUint16(b[6:], op)
	copy(b[8:], sha)
	s, t := spa.As4(), tpa.As4()
	copy(b[14:], s[:])
	copy(b[18:], tha)
	copy(b[24:], t[:])
	return append(dptest.EthHdr(dstMAC, srcMAC, unix.ETH_P_ARP), b...)
}

// vlanTag inserts an 802.1Q tag with id into an Ethernet frame.
func vlanTag(frame []byte, id uint16) []byte {
	tag := make([]byte, 4)
	binary.BigEndian.PutUint16(tag[0:], unix.ETH_P_8021Q)
	binary.BigEndian.PutUint16(tag[2:], id)
	out := append(append([]byte(nil), frame[:12]...), tag...)
	return append(out, frame[12:]...)
}

// TestSourceGuardTraffic: what pods legitimately send keeps working with
// source address validation, through real sockets: TCP and UDP from the
// pod's own IPv4 and IPv6 addresses to a neighbour pod (redirect_peer) and
// off-node (FIB), UDP between link-local addresses of the pod and the node
// after Neighbor Discovery (the pod's solicitation from its link-local
// address, no static entry), and the ICMP port-unreachable errors a pod's
// kernel sends. No drop counter may move, and the forwarding counters must.
func TestSourceGuardTraffic(t *testing.T) {
	dptest.RequireRoot(t)
	node, ext := newTrafficNode(t)
	a := addPod(t, node, "lxcA", "10.244.1.2", "fd00:10:244:1::2")
	c := addPod(t, node, "lxcC", "10.244.1.4", "fd00:10:244:1::4")
	d := loadWithPods(t, node, a, c)
	ext4, ext6 := netip.MustParseAddr("198.18.0.250"), netip.MustParseAddr("fd00:198:18::250")
	m0, err := d.MetricsByDirection()
	if err != nil {
		t.Fatal(err)
	}

	const n = 3
	for _, e := range []struct {
		desc string
		srv  string
		addr netip.Addr
	}{
		{"to neighbour pod C, IPv4", c.ns, c.ip4},
		{"to neighbour pod C, IPv6", c.ns, c.ip6},
		{"off-node, IPv4", ext, ext4},
		{"off-node, IPv6", ext, ext6},
	} {
		if got := dptest.UDPEcho(t, a.ns, e.srv, e.addr, n); got != n {
			t.Errorf("UDP %s: %d of %d echoes came back", e.desc, got, n)
		}
		if err := dptest.TCPBulkVia(t, a.ns, e.srv, netip.AddrPortFrom(e.addr, 5201), netip.AddrPortFrom(e.addr, 5201), 1<<20); err != nil {
			t.Errorf("TCP %s: %v", e.desc, err)
		}
	}

	// link-local: A resolves the node's link-local address of lxcA itself
	hostLL := linkLocal(t, node, "lxcA")
	if got := linkLocalEcho(t, a.ns, node, hostLL, "eth0", "lxcA", n); got != n {
		t.Errorf("UDP between link-local addresses: %d of %d echoes came back", got, n)
	}
	if st := neighState(t, a.ns, "eth0", hostLL); st&(netlink.NUD_REACHABLE|netlink.NUD_STALE|netlink.NUD_DELAY|netlink.NUD_PROBE) == 0 {
		t.Errorf("pod A's neighbour entry of %s is in state %#x: Neighbor Discovery did not complete", hostLL, st)
	}

	// ICMP errors: C's kernel answers a closed port with port unreachable
	for _, dst := range []netip.Addr{c.ip4, c.ip6} {
		if err := closedPortError(t, a.ns, dst); err != nil {
			t.Errorf("UDP to a closed port of %s: %v", dst, err)
		}
	}

	m1, err := d.MetricsByDirection()
	if err != nil {
		t.Fatal(err)
	}
	delta := func(r string) uint64 { return m1["pod_egress"][r] - m0["pod_egress"][r] }
	for _, r := range []string{"drop_spoof_src", "drop_spoof_arp", "drop_spoof_nd", "drop_l2", "drop_malformed"} {
		if got := delta(r); got != 0 {
			t.Errorf("pod_egress %s +%d during legitimate traffic, want 0", r, got)
		}
	}
	if got := delta("redirect_peer_local"); got < 4*n {
		t.Errorf("pod_egress redirect_peer_local +%d, want >= %d: the pod-to-pod traffic did not take the BPF path", got, 4*n)
	}
	if got := delta("redirect_fib") + delta("redirect_neigh"); got < 2*n {
		t.Errorf("pod_egress fib redirects +%d, want >= %d: the off-node traffic did not take the BPF path", got, 2*n)
	}
	if got := delta("pass_host_bound"); got < 2 {
		t.Errorf("pod_egress pass_host_bound +%d, want >= 2 (the link-local solicitation and datagrams)", got)
	}
	t.Logf("pod_egress counters moved: %v", func() map[string]uint64 {
		out := map[string]uint64{}
		for r := range m1["pod_egress"] {
			if v := delta(r); v != 0 {
				out[r] = v
			}
		}
		return out
	}())
}

// linkLocal is dev's IPv6 link-local address in netns ns.
func linkLocal(t *testing.T, ns, dev string) netip.Addr {
	t.Helper()
	nc := dptest.NSConf(t, ns)
	deadline := time.Now().Add(5 * time.Second)
	for {
		addrs, err := nc.H.AddrList(nc.Link(dev), netlink.FAMILY_V6)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range addrs {
			ip, _ := netip.AddrFromSlice(a.IP)
			if ip.IsLinkLocalUnicast() && a.Flags&unix.IFA_F_TENTATIVE == 0 {
				return ip
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s %s: no usable link-local address: %v", ns, dev, addrs)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// linkLocalEcho echoes n datagrams from netns client (out of cdev) to a
// server in netns srv on the link-local address ll of sdev; it returns how
// many came back.
func linkLocalEcho(t *testing.T, client, srv string, ll netip.Addr, cdev, sdev string, n int) int {
	t.Helper()
	var pc net.PacketConn
	dptest.InNetns(t, srv, func() {
		var err error
		if pc, err = net.ListenPacket("udp6", netip.AddrPortFrom(ll.WithZone(sdev), 7777).String()); err != nil {
			t.Fatalf("listen on %s%%%s in %s: %v", ll, sdev, srv, err)
		}
	})
	defer pc.Close()
	go func() {
		buf := make([]byte, 1500)
		for {
			k, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo(buf[:k], from)
		}
	}()
	var conn net.Conn
	dptest.InNetns(t, client, func() {
		var err error
		if conn, err = net.Dial("udp6", netip.AddrPortFrom(ll.WithZone(cdev), 7777).String()); err != nil {
			t.Fatalf("dial %s%%%s from %s: %v", ll, cdev, client, err)
		}
	})
	defer conn.Close()
	got := 0
	buf := make([]byte, 1500)
	for i := range n {
		msg := fmt.Sprintf("axon-ll-%d", i)
		if _, err := conn.Write([]byte(msg)); err != nil {
			t.Logf("link-local echo write: %v", err)
			continue
		}
		_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
		if k, err := conn.Read(buf); err == nil && string(buf[:k]) == msg {
			got++
		}
	}
	return got
}

// neighState is the NUD state of ip's neighbour entry on dev in netns ns
// (0: none).
func neighState(t *testing.T, ns, dev string, ip netip.Addr) int {
	t.Helper()
	nc := dptest.NSConf(t, ns)
	neighs, err := nc.H.NeighList(nc.Index(dev), netlink.FAMILY_V6)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range neighs {
		if a, _ := netip.AddrFromSlice(n.IP); a == ip {
			return n.State
		}
	}
	return 0
}

// closedPortError sends a datagram from netns ns to a port of dst nobody
// listens on and returns nil when the ICMP port unreachable of dst's kernel
// came back (the connected socket's read fails with ECONNREFUSED).
func closedPortError(t *testing.T, ns string, dst netip.Addr) error {
	t.Helper()
	var conn *net.UDPConn
	dptest.InNetns(t, ns, func() {
		var err error
		if conn, err = net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst, 9))); err != nil {
			t.Fatalf("dial %s: %v", dst, err)
		}
	})
	defer conn.Close()
	var last error
	for range 3 { // the kernel rate-limits the errors it sends
		if _, err := conn.Write([]byte("anyone?")); err != nil && !errors.Is(err, unix.ECONNREFUSED) {
			return fmt.Errorf("write: %w", err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(time.Second))
		_, err := conn.Read(make([]byte, 64))
		if errors.Is(err, unix.ECONNREFUSED) {
			return nil
		}
		last = err
	}
	return fmt.Errorf("no port unreachable came back (last read: %v)", last)
}
