package fuzz

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/axonhq/axon/internal/datapath/nodeport"
	"github.com/axonhq/axon/internal/inetcsum"
	"github.com/axonhq/axon/internal/lb"
)

// The seed corpus: real packets of every path, built with correct lengths
// and checksums; replies of the flows the seed flows created are built from
// the NAT table itself.

func ap(a netip.Addr, port uint16) netip.AddrPort { return netip.AddrPortFrom(a, port) }

func etherOf(a netip.Addr) uint16 {
	if a.Is4() {
		return EtherIPv4
	}
	return EtherIPv6
}

func tcpPkt(src, dst netip.AddrPort, flags uint8, opts []byte, payload []byte) []byte {
	return IP(src.Addr(), dst.Addr(), ProtoTCP, 64, nil, nil, TCP(src, dst, flags, opts, payload))
}

func udpPkt(src, dst netip.AddrPort, payload []byte) []byte {
	return IP(src.Addr(), dst.Addr(), ProtoUDP, 64, nil, nil, UDP(src, dst, payload))
}

func icmpProto(a netip.Addr) uint8 {
	if a.Is4() {
		return ProtoICMP
	}
	return ProtoICMPv6
}

// echo is an ICMP / ICMPv6 echo request.
func echo(src, dst netip.Addr, ttl uint8) []byte {
	typ := uint8(8)
	if src.Is6() {
		typ = 128
	}
	return IP(src, dst, icmpProto(src), ttl, nil, nil, ICMP(src, dst, typ, 0, 0x00010001, []byte("axon-fuzz-echo-payload")))
}

// icmpErr is an ICMP error from src to dst quoting the IP packet quoted
// (the first 64 bytes): "fragmentation needed" with MTU mtu, or IPv6
// "packet too big".
func icmpErr(src, dst netip.Addr, quoted []byte, mtu uint32) []byte {
	q := quoted[:min(len(quoted), 64)]
	if src.Is4() {
		return IP(src, dst, ProtoICMP, 64, nil, nil, ICMP(src, dst, 3, 4, mtu, q))
	}
	return IP(src, dst, ProtoICMPv6, 64, nil, nil, ICMP(src, dst, 2, 0, mtu, q))
}

func payload(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte('a' + i%26)
	}
	return b
}

// bigTCP4 is an IPv4 frame as IPv4 BIG TCP hands a GSO packet over 64 KiB
// to a device: total length 0 (the length is the skb's), header checksum
// valid.
func bigTCP4(frame []byte) []byte {
	b := append([]byte(nil), frame...)
	b[16], b[17], b[24], b[25] = 0, 0, 0, 0
	binary.BigEndian.PutUint16(b[24:], inetcsum.Checksum(b[14:34], 0))
	return b
}

// bigTCP6 is an IPv6 frame as IPv6 BIG TCP sends it: a hop-by-hop header
// with a jumbo payload option holding the length, payload length 0.
func bigTCP6(frame []byte) []byte {
	ip, rest := frame[14:14+40], frame[14+40:]
	hbh := []byte{ip[6], 0, 0xc2, 4, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(hbh[4:], uint32(len(hbh)+len(rest)))
	out := append([]byte(nil), frame[:14+40]...)
	out[14+4], out[14+5], out[14+6] = 0, 0, ProtoHop
	return append(append(out, hbh...), rest...)
}

func bigTCP4or6(frame []byte) []byte {
	if frame[14]>>4 == 4 {
		return bigTCP4(frame)
	}
	return bigTCP6(frame)
}

// wire is an IP packet as it arrives on the uplink from the client's router.
func (n *node) wire(ip []byte) []byte {
	et := uint16(EtherIPv4)
	if ip[0]>>4 == 6 {
		et = EtherIPv6
	}
	return Eth(n.upMAC, n.cliMAC, et, ip)
}

// out is an IP packet as it leaves through the uplink.
func (n *node) out(ip []byte) []byte {
	et := uint16(EtherIPv4)
	if ip[0]>>4 == 6 {
		et = EtherIPv6
	}
	return Eth(n.gwMAC, n.upMAC, et, ip)
}

// fromPod is an IP packet pod A sends.
func (n *node) fromPod(ip []byte) []byte {
	et := uint16(EtherIPv4)
	if ip[0]>>4 == 6 {
		et = EtherIPv6
	}
	return Eth(n.hostAMAC, n.podAMAC, et, ip)
}

// flowSeeds are the packets that open the node's north-south flows: run
// through axon_lb_ingress before each pass and after each GC, so mutated
// packets find CT and NAT entries to hit.
func (n *node) flowSeeds() [][]byte {
	var out [][]byte
	for p := uint16(40000); p < 40008; p++ { // Maglev spreads these over the local and the remote backend
		out = append(out,
			n.wire(tcpPkt(ap(client4, p), ap(node4, npTCP), SYN, MSS(1460), nil)),
			n.wire(tcpPkt(ap(client6, p), ap(node6, npTCP), SYN, MSS(1440), nil)),
			n.wire(tcpPkt(ap(client4, p), ap(vip4, vipPort), SYN, MSS(1460), nil)),
			n.wire(tcpPkt(ap(client6, p), ap(vip6, vipPort), SYN, MSS(1440), nil)),
			n.wire(tcpPkt(ap(client4, p), ap(extIP4, extPort), SYN, MSS(1460), nil)),
		)
	}
	out = append(out,
		n.wire(udpPkt(ap(client4, 40100), ap(node4, npUDP), payload(32))),
		n.wire(udpPkt(ap(client6, 40100), ap(node6, npUDP), payload(32))),
		// a DSR request another node's LB sent for the local backend (pod B)
		n.wire(IP(node2v4, podB4, ProtoIPIP, 64, nil, nil, tcpPkt(ap(client4, 40200), ap(vip4, vipPort), SYN, MSS(1460), nil))),
		n.wire(IP(node2v6, podB6, ProtoIPv6, 64, nil, nil, tcpPkt(ap(client6, 40200), ap(vip6, vipPort), SYN, MSS(1440), nil))),
	)
	return out
}

// ingressSeeds: everything that arrives on the uplink (axon_lb_ingress,
// axon_lb_xdp, axon_uplink_ingress).
func (n *node) ingressSeeds(t testing.TB) [][]byte {
	t.Helper()
	s := n.flowSeeds()
	c4, c6 := ap(client4, 40000), ap(client6, 40000)
	s = append(s,
		// established, closing and reset flows
		n.wire(tcpPkt(c4, ap(node4, npTCP), ACK|PSH, nil, payload(100))),
		n.wire(tcpPkt(c6, ap(node6, npTCP), ACK|PSH, nil, payload(100))),
		n.wire(tcpPkt(ap(client4, 40001), ap(node4, npTCP), FIN|ACK, nil, nil)),
		n.wire(tcpPkt(ap(client4, 40002), ap(node4, npTCP), RST, nil, nil)),
		n.wire(tcpPkt(c4, ap(vip4, vipPort), ACK, nil, payload(40))),
		// BIG TCP (GRO aggregates of the established flows, run as GSO skbs)
		bigTCP4(n.wire(tcpPkt(c4, ap(node4, npTCP), ACK|PSH, nil, payload(2800)))),
		bigTCP6(n.wire(tcpPkt(c6, ap(node6, npTCP), ACK|PSH, nil, payload(2800)))),
		bigTCP4(n.wire(tcpPkt(c4, ap(vip4, vipPort), ACK, nil, payload(2800)))),
		// externalTrafficPolicy Local without a local backend, no backends,
		// a client outside the source ranges, the node's own port
		n.wire(tcpPkt(c4, ap(node4, npLocal), SYN, nil, nil)),
		n.wire(tcpPkt(c4, ap(node4, npEmpty), SYN, nil, nil)),
		n.wire(tcpPkt(c4, ap(node4, npAway), SYN, nil, nil)),
		n.wire(tcpPkt(ap(client4, 40001), ap(node4, npAway), SYN, nil, nil)),
		n.wire(tcpPkt(ap(netip.MustParseAddr("198.18.0.200"), 40000), ap(extIP4, extPort), SYN, nil, nil)),
		n.wire(tcpPkt(c4, ap(node4, 22), SYN, nil, nil)),
		// IPv4 options (router alert, NOP, record route), IPv6 extension headers
		n.wire(IP(client4, node4, ProtoTCP, 64, []byte{148, 4, 0, 0, 1, 7, 7, 4, 0, 0, 0, 0}, nil, TCP(c4, ap(node4, npTCP), SYN, nil, nil))),
		n.wire(IP(client6, node6, ProtoTCP, 64, nil, []Ext{{ProtoHop, []byte{1, 4, 0, 0, 0, 0}}, {ProtoDstOpt, []byte{1, 4, 0, 0, 0, 0}}}, TCP(c6, ap(node6, npTCP), SYN, nil, nil))),
		n.wire(IP(client6, node6, ProtoUDP, 64, nil, []Ext{{ProtoRoute, []byte{0, 0, 0, 0, 0, 0}}}, UDP(c6, ap(node6, npUDP), payload(16)))),
		// pod traffic from another node, to local pods (LB delivery, uplink_ingress)
		n.wire(tcpPkt(ap(remote4, 5000), ap(podA4, 8080), SYN, MSS(1460), nil)),
		n.wire(udpPkt(ap(remote6, 5000), ap(podA6, 53), payload(20))),
		n.wire(echo(remote4, podA4, 64)),
		n.wire(echo(remote6, podB6, 64)),
		n.wire(echo(remote4, podB4, 1)),
		n.wire(tcpPkt(ap(remote4, 5000), ap(podB4, 80), ACK, nil, payload(1400))),
		// not IP, or tagged
		ARP(n.cliMAC, client4, node4),
		VLAN(n.upMAC, n.cliMAC, 100, EtherIPv4, tcpPkt(c4, ap(node4, npTCP), SYN, nil, nil)),
	)
	// fragments of UDP datagrams to the NodePort and to a pod
	for _, ip := range [][]byte{
		udpPkt(ap(client4, 40300), ap(node4, npUDP), payload(64)),
		udpPkt(ap(client6, 40300), ap(node6, npUDP), payload(64)),
		udpPkt(ap(remote4, 5000), ap(podA4, 53), payload(64)),
	} {
		for _, f := range Fragments(ip, 24, 0x77) {
			s = append(s, n.wire(f))
		}
	}
	// ICMP errors about the flows' replies (frontend -> client), as the
	// client's router sends them
	s = append(s,
		n.wire(icmpErr(router4, node4, tcpPkt(ap(node4, npTCP), c4, ACK, nil, payload(8)), 1400)),
		n.wire(icmpErr(router6, node6, tcpPkt(ap(node6, npTCP), c6, ACK, nil, payload(8)), 1280)),
		n.wire(icmpErr(router4, client4, tcpPkt(ap(vip4, vipPort), c4, ACK, nil, payload(8)), 1400)),
	)
	// replies of the SNAT flows, and errors about what the node sent the backends
	nats, err := n.lb.NAT()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range nats {
		if e.Kind != "snat" {
			continue
		}
		r := e.Reply
		be, dst := r.Src, r.Dst
		if r.Proto == lb.TCP {
			s = append(s, n.wire(tcpPkt(be, dst, SYN|ACK, MSS(1460), nil)), n.wire(tcpPkt(be, dst, FIN|ACK, nil, nil)))
		} else {
			s = append(s, n.wire(udpPkt(be, dst, payload(24))))
		}
		s = append(s, n.wire(icmpErr(be.Addr(), dst.Addr(), sent(r), 1400)))
	}
	return s
}

// sent is the packet of the flow whose reply is r, as the node sent it
// (r reversed), for quoting in ICMP errors.
func sent(r nodeport.Tuple) []byte {
	if r.Proto == lb.TCP {
		return tcpPkt(r.Dst, r.Src, ACK, nil, payload(8))
	}
	return udpPkt(r.Dst, r.Src, payload(8))
}

// egressSeeds: replies of local backends leaving through the uplink
// (axon_lb_egress), from the NAT table, and other pod and node traffic.
func (n *node) egressSeeds(t testing.TB) [][]byte {
	t.Helper()
	s := [][]byte{
		n.out(tcpPkt(ap(podA4, 8080), ap(remote4, 5000), SYN|ACK, MSS(1460), nil)),
		n.out(udpPkt(ap(podA6, 53), ap(remote6, 5000), payload(20))),
		n.out(echo(node4, client4, 64)),
		ARP(n.upMAC, node4, client4),
	}
	nats, err := n.lb.NAT()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range nats {
		if e.Kind == "snat" {
			continue
		}
		r := e.Reply
		if r.Proto == lb.TCP {
			s = append(s,
				n.out(tcpPkt(r.Src, r.Dst, SYN|ACK, MSS(1460), nil)),
				n.out(tcpPkt(r.Src, r.Dst, ACK|PSH, nil, payload(200))),
				bigTCP4or6(n.out(tcpPkt(r.Src, r.Dst, ACK|PSH, nil, payload(2800)))),
				n.out(tcpPkt(r.Src, r.Dst, FIN|ACK, nil, nil)))
		} else {
			s = append(s, n.out(udpPkt(r.Src, r.Dst, payload(24))))
		}
		// the pod answers an error about the client's packet to it
		s = append(s, n.out(icmpErr(r.Src.Addr(), r.Dst.Addr(), sent(r), 1400)))
	}
	return s
}

// edtSeeds: what leaves through the uplink for the Bandwidth Manager: the
// limited pods' packets (large and small), others', the node's.
func (n *node) edtSeeds() [][]byte {
	return [][]byte{
		n.out(tcpPkt(ap(podA4, 40000), ap(remote4, 80), ACK|PSH, nil, payload(1400))),
		n.out(tcpPkt(ap(podA4, 40000), ap(remote4, 80), ACK, nil, nil)),
		bigTCP4(n.out(tcpPkt(ap(podA4, 40000), ap(remote4, 80), ACK|PSH, nil, payload(2800)))),
		n.out(tcpPkt(ap(podA6, 40000), ap(remote6, 80), ACK|PSH, nil, payload(1400))),
		n.out(udpPkt(ap(podB4, 5000), ap(remote4, 53), payload(512))),
		n.out(udpPkt(ap(podB6, 5000), ap(remote6, 53), payload(100))),
		n.out(tcpPkt(ap(node4, 22), ap(client4, 50000), ACK|PSH, nil, payload(600))),
		n.out(echo(podA4, remote4, 64)),
		ARP(n.upMAC, node4, client4),
	}
}

// podSeeds: what pod A sends (axon_pod_egress on its host-side veth).
func (n *node) podSeeds() [][]byte {
	a4, a6 := ap(podA4, 40000), ap(podA6, 40000)
	s := [][]byte{
		n.fromPod(tcpPkt(a4, ap(podB4, 80), SYN, MSS(1460), nil)),
		n.fromPod(tcpPkt(a4, ap(podA4, 80), ACK|PSH, nil, payload(1400))), // to itself: its own ingress limit
		n.fromPod(tcpPkt(a6, ap(podB6, 80), ACK|PSH, nil, payload(300))),
		n.fromPod(udpPkt(a4, ap(podB4, 53), payload(40))),
		n.fromPod(echo(podA6, podB6, 64)),
		n.fromPod(tcpPkt(a4, ap(remote4, 8080), SYN, MSS(1460), nil)),
		n.fromPod(tcpPkt(a6, ap(remote6, 8080), ACK|PSH, nil, payload(1400))),
		bigTCP4(n.fromPod(tcpPkt(a4, ap(remote4, 8080), ACK|PSH, nil, payload(2800)))),
		bigTCP6(n.fromPod(tcpPkt(a6, ap(podB6, 80), ACK|PSH, nil, payload(2800)))),
		n.fromPod(udpPkt(a4, ap(noNeigh4, 53), payload(20))),
		n.fromPod(udpPkt(a4, ap(unreach4, 53), payload(20))),
		n.fromPod(udpPkt(a4, ap(netip.MustParseAddr("8.8.8.8"), 53), payload(20))),
		n.fromPod(tcpPkt(a4, ap(node4, 10250), SYN, nil, nil)),
		n.fromPod(udpPkt(a4, ap(netip.MustParseAddr("169.254.1.1"), 53), payload(20))),
		n.fromPod(udpPkt(a4, ap(netip.MustParseAddr("224.0.0.251"), 5353), payload(20))),
		n.fromPod(udpPkt(a6, ap(netip.MustParseAddr("fe80::1"), 53), payload(20))),
		n.fromPod(echo(podA4, remote4, 1)),
		n.fromPod(echo(podA4, podB4, 1)),
		n.fromPod(IP(podA6, netip.MustParseAddr("ff02::1:ff00:5"), ProtoICMPv6, 255, nil, nil,
			ICMP(podA6, netip.MustParseAddr("ff02::1:ff00:5"), 135, 0, 0, make([]byte, 16)))),
		n.fromPod(IP(podA6, podB6, ProtoUDP, 64, nil, []Ext{{ProtoDstOpt, []byte{1, 4, 0, 0, 0, 0}}}, UDP(a6, ap(podB6, 53), payload(16)))),
		ARP(n.podAMAC, podA4, netip.MustParseAddr("169.254.1.1")),
		VLAN(n.hostAMAC, n.podAMAC, 7, EtherIPv4, udpPkt(a4, ap(podB4, 53), payload(16))),
	}
	for _, f := range Fragments(udpPkt(a4, ap(remote4, 53), payload(64)), 24, 0x99) {
		s = append(s, n.fromPod(f))
	}
	return s
}

// decapSeeds: DSR requests as the backend's node receives them (IPIP,
// IPv6 in IPv6), and what else arrives there.
func (n *node) decapSeeds() [][]byte {
	s := [][]byte{
		n.wire(IP(node2v4, podB4, ProtoIPIP, 64, nil, nil, tcpPkt(ap(client4, 40500), ap(vip4, vipPort), SYN, MSS(1460), nil))),
		n.wire(IP(node2v6, podB6, ProtoIPv6, 64, nil, nil, tcpPkt(ap(client6, 40500), ap(vip6, vipPort), SYN, MSS(1440), nil))),
		n.wire(IP(node2v4, podB4, ProtoIPIP, 64, nil, nil, udpPkt(ap(client4, 40500), ap(vip4, 53), payload(30)))),
		n.wire(IP(node2v4, podB4, ProtoIPIP, 64, nil, nil, icmpErr(router4, vip4, tcpPkt(ap(vip4, vipPort), ap(client4, 40500), ACK, nil, nil), 1400))),
		n.wire(tcpPkt(ap(client4, 40500), ap(node4, npTCP), SYN, nil, nil)),
	}
	// an IPIP packet whose inner packet is a fragment
	for _, f := range Fragments(udpPkt(ap(client4, 40501), ap(vip4, 53), payload(64)), 24, 0x55) {
		s = append(s, n.wire(IP(node2v4, podB4, ProtoIPIP, 64, nil, nil, f)))
	}
	return s
}

// ttlOf is the TTL / hop limit of the IP packet in frame (-1: none).
func ttlOf(frame []byte) int {
	off, ok := l3Start(frame)
	if !ok || off+9 > len(frame) {
		return -1
	}
	switch frame[off] >> 4 {
	case 4:
		return int(frame[off+8])
	case 6:
		return int(frame[off+7])
	}
	return -1
}
