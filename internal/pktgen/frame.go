// Package pktgen sends UDP frames as fast as the kernel produces them and
// counts where they land: the tools of a forwarding-rate benchmark,
// the "pktgen hairpin" test of Cilium's LB talk, without the pktgen module.
//
//   - Generator: an XDP program run by BPF_PROG_RUN in live-frame mode
//     (BPF_F_TEST_XDP_LIVE_FRAMES, Linux ≥ 5.18, as xdp-trafficgen does). Each
//     run writes a template's headers into a page-pool frame and redirects it
//     out of a veth, so the veth's peer receives raw frames into its receive
//     ring, the way a NIC's DMA hands them over: no socket, skb or qdisc on
//     the sending side.
//   - Sink: a native XDP program that counts and drops IPv4 UDP packets to one
//     port and passes everything else.
//   - Forwarder: the trivial XDP forwarder (check the Ethernet and IPv4
//     headers, write both MACs, XDP_TX), the floor a load balancer's forward
//     is measured against.
//   - NAPI helpers: threaded NAPI on a device, its kernel threads, their CPU
//     time, affinity and scheduling class.
package pktgen

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/axonhq/axon/internal/inetcsum"
)

// Frame sizes. A UDP4 frame is FrameLen bytes (the 64-byte Ethernet minimum
// without its FCS): Ethernet, IPv4 without options, UDP, and a payload.
const (
	FrameLen  = 60
	HeaderLen = 14 + 20 + 8 // what the generator restores in every frame
)

// UDP4 describes one IPv4 UDP frame.
type UDP4 struct {
	SrcMAC, DstMAC net.HardwareAddr
	Src, Dst       netip.AddrPort
}

// Frame returns the FrameLen-byte frame with valid IPv4 and UDP checksums
// (TTL 64, DF clear, payload "axon pktgen" padded with zeros).
func (u UDP4) Frame() ([]byte, error) {
	if len(u.SrcMAC) != 6 || len(u.DstMAC) != 6 {
		return nil, fmt.Errorf("pktgen: MAC addresses must be 6 bytes (src %q, dst %q)", u.SrcMAC, u.DstMAC)
	}
	if !u.Src.Addr().Is4() || !u.Dst.Addr().Is4() {
		return nil, errors.New("pktgen: UDP4 needs IPv4 addresses (" + u.Src.String() + " → " + u.Dst.String() + ")")
	}
	b := make([]byte, FrameLen)
	copy(b[0:6], u.DstMAC)
	copy(b[6:12], u.SrcMAC)
	binary.BigEndian.PutUint16(b[12:], 0x0800)
	ip := b[14:34]
	ip[0] = 0x45 // version 4, 5 words
	binary.BigEndian.PutUint16(ip[2:], FrameLen-14)
	ip[8] = 64 // TTL
	ip[9] = 17 // UDP
	src, dst := u.Src.Addr().As4(), u.Dst.Addr().As4()
	copy(ip[12:16], src[:])
	copy(ip[16:20], dst[:])
	binary.BigEndian.PutUint16(ip[10:], inetcsum.Checksum(ip, 0))
	udp := b[34:]
	binary.BigEndian.PutUint16(udp[0:], u.Src.Port())
	binary.BigEndian.PutUint16(udp[2:], u.Dst.Port())
	binary.BigEndian.PutUint16(udp[4:], uint16(len(udp)))
	copy(udp[8:], "axon pktgen")
	c := inetcsum.Checksum(udp, pseudoHeader(src, dst, len(udp)))
	if c == 0 {
		c = 0xffff // 0 means "no checksum" in UDP over IPv4
	}
	binary.BigEndian.PutUint16(udp[6:], c)
	return b, nil
}

// TCP4SYN describes one IPv4 TCP SYN frame (a connection attempt).
type TCP4SYN struct {
	SrcMAC, DstMAC net.HardwareAddr
	Src, Dst       netip.AddrPort
}

// Frame returns the FrameLen-byte frame: a TCP SYN without options
// (sequence number 1, window 64240) with valid IPv4 and TCP checksums, then
// zero padding to FrameLen. Its first HeaderLen bytes hold the addresses and
// ports, the flags and checksum follow: frames of different flows differ
// there only in the checksum (see RandomSourcePort).
func (s TCP4SYN) Frame() ([]byte, error) {
	if len(s.SrcMAC) != 6 || len(s.DstMAC) != 6 {
		return nil, fmt.Errorf("pktgen: MAC addresses must be 6 bytes (src %q, dst %q)", s.SrcMAC, s.DstMAC)
	}
	if !s.Src.Addr().Is4() || !s.Dst.Addr().Is4() {
		return nil, errors.New("pktgen: TCP4SYN needs IPv4 addresses (" + s.Src.String() + " → " + s.Dst.String() + ")")
	}
	const tcpLen = 20
	b := make([]byte, FrameLen)
	copy(b[0:6], s.DstMAC)
	copy(b[6:12], s.SrcMAC)
	binary.BigEndian.PutUint16(b[12:], 0x0800)
	ip := b[14:34]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], 20+tcpLen)
	ip[8] = 64
	ip[9] = 6 // TCP
	src, dst := s.Src.Addr().As4(), s.Dst.Addr().As4()
	copy(ip[12:16], src[:])
	copy(ip[16:20], dst[:])
	binary.BigEndian.PutUint16(ip[10:], inetcsum.Checksum(ip, 0))
	tcp := b[34 : 34+tcpLen]
	binary.BigEndian.PutUint16(tcp[0:], s.Src.Port())
	binary.BigEndian.PutUint16(tcp[2:], s.Dst.Port())
	binary.BigEndian.PutUint32(tcp[4:], 1) // sequence number
	tcp[12] = 5 << 4                       // data offset: 5 words
	tcp[13] = 0x02                         // SYN
	binary.BigEndian.PutUint16(tcp[14:], 64240)
	var ps uint32
	for i := 0; i < 4; i += 2 {
		ps += uint32(binary.BigEndian.Uint16(src[i:])) + uint32(binary.BigEndian.Uint16(dst[i:]))
	}
	ps += 6 + tcpLen
	binary.BigEndian.PutUint16(tcp[16:], inetcsum.Checksum(tcp, ps))
	return b, nil
}

// pseudoHeader is the partial sum of the IPv4 pseudo-header of a UDP datagram.
func pseudoHeader(src, dst [4]byte, udpLen int) uint32 {
	var s uint32
	for i := 0; i < 4; i += 2 {
		s += uint32(binary.BigEndian.Uint16(src[i:])) + uint32(binary.BigEndian.Uint16(dst[i:]))
	}
	return s + 17 + uint32(udpLen)
}
