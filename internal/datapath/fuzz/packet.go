package fuzz

import (
	"encoding/binary"
	"net"
	"net/netip"

	"github.com/axonhq/axon/internal/inetcsum"
)

// Frame builders for the seed corpus: real packets with correct lengths and
// checksums, which the mutators then damage.

// EtherTypes and IP protocol numbers the builders and the checker use.
const (
	EtherIPv4 = 0x0800
	EtherARP  = 0x0806
	EtherVLAN = 0x8100
	EtherIPv6 = 0x86dd

	ProtoICMP   = 1
	ProtoIPIP   = 4
	ProtoTCP    = 6
	ProtoUDP    = 17
	ProtoIPv6   = 41
	ProtoFrag   = 44
	ProtoICMPv6 = 58
	ProtoHop    = 0
	ProtoDstOpt = 60
	ProtoRoute  = 43
)

// TCP flags.
const (
	FIN = 0x01
	SYN = 0x02
	RST = 0x04
	PSH = 0x08
	ACK = 0x10
)

// Eth is an Ethernet frame of payload.
func Eth(dst, src net.HardwareAddr, etype uint16, payload []byte) []byte {
	b := make([]byte, 14, 14+len(payload))
	copy(b[0:6], dst)
	copy(b[6:12], src)
	binary.BigEndian.PutUint16(b[12:], etype)
	return append(b, payload...)
}

// VLAN is an 802.1Q-tagged Ethernet frame of payload.
func VLAN(dst, src net.HardwareAddr, vid uint16, etype uint16, payload []byte) []byte {
	tag := make([]byte, 4)
	binary.BigEndian.PutUint16(tag[0:], vid&0x0fff)
	binary.BigEndian.PutUint16(tag[2:], etype)
	return Eth(dst, src, EtherVLAN, append(tag, payload...))
}

// pseudoSum is the partial sum of the TCP/UDP/ICMPv6 pseudo-header.
func pseudoSum(src, dst netip.Addr, proto uint8, l4len int) uint32 {
	var s uint32
	add := func(b []byte) {
		for i := 0; i+1 < len(b); i += 2 {
			s += uint32(binary.BigEndian.Uint16(b[i:]))
		}
	}
	if src.Is4() {
		a, b := src.As4(), dst.As4()
		add(a[:])
		add(b[:])
	} else {
		a, b := src.As16(), dst.As16()
		add(a[:])
		add(b[:])
		s += uint32(l4len >> 16)
	}
	s += uint32(proto) + uint32(l4len&0xffff)
	return s
}

// TCP is a TCP segment src -> dst with flags, options (padded to 4 bytes)
// and payload, checksum filled in.
func TCP(src, dst netip.AddrPort, flags uint8, opts, payload []byte) []byte {
	for len(opts)%4 != 0 {
		opts = append(opts, 0) // EOL
	}
	b := make([]byte, 20+len(opts)+len(payload))
	binary.BigEndian.PutUint16(b[0:], src.Port())
	binary.BigEndian.PutUint16(b[2:], dst.Port())
	binary.BigEndian.PutUint32(b[4:], 0x11223344)
	if flags&ACK != 0 {
		binary.BigEndian.PutUint32(b[8:], 0x55667788)
	}
	b[12] = byte((20+len(opts))/4) << 4
	b[13] = flags
	binary.BigEndian.PutUint16(b[14:], 64240)
	copy(b[20:], opts)
	copy(b[20+len(opts):], payload)
	binary.BigEndian.PutUint16(b[16:], inetcsum.Checksum(b, pseudoSum(src.Addr(), dst.Addr(), ProtoTCP, len(b))))
	return b
}

// MSS is the TCP MSS option.
func MSS(v uint16) []byte { return []byte{2, 4, byte(v >> 8), byte(v)} }

// UDP is a UDP datagram src -> dst with payload, checksum filled in.
func UDP(src, dst netip.AddrPort, payload []byte) []byte {
	b := make([]byte, 8+len(payload))
	binary.BigEndian.PutUint16(b[0:], src.Port())
	binary.BigEndian.PutUint16(b[2:], dst.Port())
	binary.BigEndian.PutUint16(b[4:], uint16(len(b)))
	copy(b[8:], payload)
	c := inetcsum.Checksum(b, pseudoSum(src.Addr(), dst.Addr(), ProtoUDP, len(b)))
	if c == 0 {
		c = 0xffff
	}
	binary.BigEndian.PutUint16(b[6:], c)
	return b
}

// ICMP is an ICMPv4 message (or, with src and dst IPv6, an ICMPv6 one)
// with its checksum filled in; rest is the 4 bytes after the checksum.
func ICMP(src, dst netip.Addr, typ, code uint8, rest uint32, body []byte) []byte {
	b := make([]byte, 8+len(body))
	b[0], b[1] = typ, code
	binary.BigEndian.PutUint32(b[4:], rest)
	copy(b[8:], body)
	var init uint32
	if src.Is6() {
		init = pseudoSum(src, dst, ProtoICMPv6, len(b))
	}
	binary.BigEndian.PutUint16(b[2:], inetcsum.Checksum(b, init))
	return b
}

// Ext is one IPv6 extension header: its protocol number (ProtoHop,
// ProtoDstOpt, ProtoRoute) and body after the next-header and length bytes
// (padded to 8-byte units).
type Ext struct {
	Proto uint8
	Body  []byte
}

// IP is an IPv4 packet (src and dst IPv4) or an IPv6 packet of proto
// carrying l4, with TTL / hop limit ttl, IPv4 options or IPv6 extension
// headers. The IPv4 header checksum is filled in.
func IP(src, dst netip.Addr, proto, ttl uint8, opts []byte, exts []Ext, l4 []byte) []byte {
	if src.Is4() {
		for len(opts)%4 != 0 {
			opts = append(opts, 0)
		}
		h := make([]byte, 20+len(opts))
		h[0] = 0x40 | byte(len(h)/4)
		binary.BigEndian.PutUint16(h[2:], uint16(len(h)+len(l4)))
		binary.BigEndian.PutUint16(h[4:], 0x4d2)
		h[8], h[9] = ttl, proto
		s, d := src.As4(), dst.As4()
		copy(h[12:], s[:])
		copy(h[16:], d[:])
		copy(h[20:], opts)
		binary.BigEndian.PutUint16(h[10:], inetcsum.Checksum(h, 0))
		return append(h, l4...)
	}
	var ext []byte
	next := proto
	for i := len(exts) - 1; i >= 0; i-- {
		body := exts[i].Body
		for (len(body)+2)%8 != 0 {
			body = append(body, 0)
		}
		e := append([]byte{next, byte((len(body)+2)/8 - 1)}, body...)
		ext = append(e, ext...)
		next = exts[i].Proto
	}
	h := make([]byte, 40)
	h[0] = 0x60
	binary.BigEndian.PutUint16(h[4:], uint16(len(ext)+len(l4)))
	h[6], h[7] = next, ttl
	s, d := src.As16(), dst.As16()
	copy(h[8:], s[:])
	copy(h[24:], d[:])
	return append(append(h, ext...), l4...)
}

// Fragments splits the IP packet pkt (IPv4, or IPv6 without extension
// headers) into fragments of at most chunk bytes of payload (a multiple of
// 8), with IP id (IPv6: fragment identification) id.
func Fragments(pkt []byte, chunk int, id uint32) [][]byte {
	var out [][]byte
	if pkt[0]>>4 == 4 {
		hl := int(pkt[0]&0x0f) * 4
		payload := pkt[hl:]
		for off := 0; off < len(payload); off += chunk {
			end := min(off+chunk, len(payload))
			h := append([]byte(nil), pkt[:hl]...)
			binary.BigEndian.PutUint16(h[2:], uint16(hl+end-off))
			binary.BigEndian.PutUint16(h[4:], uint16(id))
			fo := uint16(off / 8)
			if end < len(payload) {
				fo |= 0x2000 // MF
			}
			binary.BigEndian.PutUint16(h[6:], fo)
			h[10], h[11] = 0, 0
			binary.BigEndian.PutUint16(h[10:], inetcsum.Checksum(h, 0))
			out = append(out, append(h, payload[off:end]...))
		}
		return out
	}
	next := pkt[6]
	payload := pkt[40:]
	for off := 0; off < len(payload); off += chunk {
		end := min(off+chunk, len(payload))
		h := append([]byte(nil), pkt[:40]...)
		h[6] = ProtoFrag
		binary.BigEndian.PutUint16(h[4:], uint16(8+end-off))
		fh := make([]byte, 8)
		fh[0] = next
		fo := uint16(off/8) << 3
		if end < len(payload) {
			fo |= 1 // M
		}
		binary.BigEndian.PutUint16(fh[2:], fo)
		binary.BigEndian.PutUint32(fh[4:], id)
		out = append(out, append(append(h, fh...), payload[off:end]...))
	}
	return out
}

// ARP is an ARP request from mac/ip for target.
func ARP(mac net.HardwareAddr, ip, target netip.Addr) []byte {
	a := make([]byte, 28)
	binary.BigEndian.PutUint16(a[0:], 1)
	binary.BigEndian.PutUint16(a[2:], EtherIPv4)
	a[4], a[5] = 6, 4
	binary.BigEndian.PutUint16(a[6:], 1)
	copy(a[8:], mac)
	s, d := ip.As4(), target.As4()
	copy(a[14:], s[:])
	copy(a[24:], d[:])
	return Eth(net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, mac, EtherARP, a)
}
