package fuzz

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/axonhq/axon/internal/inetcsum"
)

// The checker: what a program may do to a packet it lets through. A
// program rewrites with incremental checksum updates (bpf_l3_csum_replace,
// bpf_l4_csum_replace), which keep a valid checksum valid and a wrong one
// wrong, so the rule is per field: what was valid in the input is valid in
// the output, and a header the program wrote itself (an IPIP outer header,
// an ICMP error it generated) is valid outright.

// ipInfo is what the checker found in one IP packet.
type ipInfo struct {
	v6     bool
	proto  uint8 // the L4 protocol after IPv6 extension headers
	hdrOK  bool  // IPv4 header checksum (IPv6: always)
	tot    int   // the declared length, header included
	hlen   int   // the fixed header's length (20 / 40)
	lenOK  bool  // the declared length fits the bytes present
	slack  int   // bytes present after the declared end (lenOK only)
	frag   bool  // a fragment: the L4 checksum covers other packets too
	l4OK   *bool // L4 checksum and length; nil: not checkable
	l4What string
	inner  *ipInfo // IPIP / IPv6-in-IPv6 inner packet, or the packet an ICMP error quotes
	quoted bool    // inner is an ICMP error's quote (truncated: header checksum only)
}

func boolp(b bool) *bool { return &b }

// fixedLenOff: what the declared length (tot) adds to the length field: 0
// for IPv4 (total length), the fixed header for IPv6 (payload length).
func (p *ipInfo) fixedLenOff() int {
	if p.v6 {
		return 40
	}
	return 0
}

// parseIP reads the IP packet at the start of b (up to the frame's end);
// nil when b does not start with an IPv4 or IPv6 header. gso: the packet
// is a GSO skb, whose length may be its frame's (BIG TCP: IPv4 total
// length 0, or an IPv6 jumbo payload option and payload length 0).
func parseIP(b []byte, depth int, gso bool) *ipInfo {
	if len(b) < 1 || depth > 2 {
		return nil
	}
	var p ipInfo
	var l4, rest []byte // rest: from the transport header to the frame's end
	var src, dst []byte
	switch b[0] >> 4 {
	case 4:
		ihl := int(b[0]&0x0f) * 4
		if len(b) < 20 || ihl < 20 {
			return nil
		}
		tot := int(binary.BigEndian.Uint16(b[2:]))
		if tot == 0 && gso && depth == 0 && b[9] == ProtoTCP {
			tot = len(b) // iph_totlen()
		}
		p.tot, p.hlen = tot, 20
		if ihl > len(b) { // options cut short: no checksum to check, nothing behind
			p.proto = b[9]
			return &p
		}
		p.hdrOK = inetcsum.Checksum(b[:ihl], 0) == 0
		p.lenOK = tot >= ihl && tot <= len(b)
		p.proto = b[9]
		p.frag = binary.BigEndian.Uint16(b[6:])&0x3fff != 0
		src, dst = b[12:16], b[16:20]
		rest = b[ihl:]
		l4 = rest
		if p.lenOK {
			p.slack = len(b) - tot
			l4 = b[ihl:tot]
		}
	case 6:
		if len(b) < 40 {
			return nil
		}
		p.v6, p.hdrOK = true, true
		tot := 40 + int(binary.BigEndian.Uint16(b[4:]))
		if tot == 40 && gso && depth == 0 && b[6] == ProtoHop && len(b) >= 48 && b[42] == 0xc2 && b[43] == 4 {
			tot = 40 + int(binary.BigEndian.Uint32(b[44:])) // the jumbo payload option
		}
		p.tot, p.hlen = tot, 40
		p.lenOK = tot <= len(b)
		end := len(b)
		if p.lenOK {
			p.slack, end = len(b)-tot, tot
		}
		src, dst = b[8:24], b[24:40]
		next, off := b[6], 40
		routed := false
		for i := 0; i < 8; i++ {
			if next != ProtoHop && next != ProtoDstOpt && next != ProtoRoute && next != ProtoFrag {
				break
			}
			if off+8 > end {
				return &p // extension headers cut short: nothing more to check
			}
			hl := (int(b[off+1]) + 1) * 8
			if next == ProtoFrag {
				hl = 8
				p.frag = binary.BigEndian.Uint16(b[off+2:])&0xfff9 != 0
			}
			if next == ProtoRoute && b[off+3] != 0 {
				routed = true // the pseudo-header holds the final destination
			}
			if off+hl > end {
				return &p
			}
			next, off = b[off], off+hl
		}
		p.proto = next
		l4, rest = b[off:end], b[off:]
		if routed {
			p.frag = true // not checkable: same as a fragment
		}
	default:
		return nil
	}
	if (p.proto == ProtoIPIP || p.proto == ProtoIPv6) && !p.frag {
		// what an IP-in-IP header carries, to the frame's end: taking the
		// outer header away leaves it there whatever the outer length said
		p.inner = parseIP(rest, depth+1, false)
		return &p
	}
	if !p.lenOK || p.frag {
		return &p
	}
	var init uint32
	pseudo := func(proto uint8) uint32 {
		s := uint32(proto) + uint32(len(l4)&0xffff) + uint32(len(l4)>>16)
		for i := 0; i+1 < len(src); i += 2 {
			s += uint32(binary.BigEndian.Uint16(src[i:])) + uint32(binary.BigEndian.Uint16(dst[i:]))
		}
		return s
	}
	switch p.proto {
	case ProtoTCP:
		p.l4What = "TCP"
		p.l4OK = boolp(len(l4) >= 20 && inetcsum.Checksum(l4, pseudo(ProtoTCP)) == 0)
	case ProtoUDP:
		p.l4What = "UDP"
		ok := len(l4) >= 8 && int(binary.BigEndian.Uint16(l4[4:])) == len(l4)
		if ok && !(binary.BigEndian.Uint16(l4[6:]) == 0 && !p.v6) { // IPv4: 0 = no checksum
			ok = inetcsum.Checksum(l4, pseudo(ProtoUDP)) == 0
		}
		p.l4OK = boolp(ok)
	case ProtoICMP, ProtoICMPv6:
		if (p.proto == ProtoICMP) == p.v6 {
			break
		}
		p.l4What = "ICMP"
		if p.v6 {
			p.l4What, init = "ICMPv6", pseudo(ProtoICMPv6)
		}
		p.l4OK = boolp(len(l4) >= 8 && inetcsum.Checksum(l4, init) == 0)
		if len(l4) >= 8 && isICMPError(p.v6, l4[0]) {
			p.inner, p.quoted = parseIP(l4[8:], depth+1, false), true
		}
	}
	return &p
}

func isICMPError(v6 bool, typ uint8) bool {
	if v6 {
		return typ >= 1 && typ <= 4
	}
	return typ == 3 || typ == 11 || typ == 12
}

// l3Start is the offset of the IP header in frame (after one VLAN tag),
// and whether the frame is IP at all.
func l3Start(frame []byte) (int, bool) {
	if len(frame) < 14 {
		return 0, false
	}
	off, et := 12, binary.BigEndian.Uint16(frame[12:])
	if et == EtherVLAN && len(frame) >= 18 {
		off, et = 16, binary.BigEndian.Uint16(frame[16:])
	}
	return off + 2, et == EtherIPv4 || et == EtherIPv6
}

// CheckRewrite says what is wrong with out, the frame a program let through
// after it was given in (gso: as a GSO skb); nil when nothing is. An
// unchanged frame is always fine.
func CheckRewrite(in, out []byte, gso bool) error {
	if bytes.Equal(in, out) {
		return nil
	}
	if len(out) < 14 {
		return fmt.Errorf("output of %d bytes is shorter than an Ethernet header", len(out))
	}
	ioff, iip := l3Start(in)
	ooff, oip := l3Start(out)
	if !oip {
		if iip {
			return fmt.Errorf("an IP frame came out as EtherType %#04x", binary.BigEndian.Uint16(out[12:]))
		}
		if isARPAnswer(in, out) {
			return nil
		}
		return fmt.Errorf("a non-IP frame (EtherType %#04x) was rewritten", binary.BigEndian.Uint16(in[12:]))
	}
	o := parseIP(out[ooff:], 0, gso)
	if o == nil {
		return fmt.Errorf("the output's IP header does not parse (version/IHL)")
	}
	var i *ipInfo
	if iip {
		i = parseIP(in[ioff:], 0, gso)
	}
	switch {
	case o.inner != nil && !o.quoted && (i == nil || i.proto != o.proto || i.inner == nil):
		// encapsulated: the outer header is the program's own. Its length
		// is the inner packet's declared length plus its own header: it
		// fits the frame when the inner length did, and it does not lie
		// further than the inner one does.
		if !o.hdrOK {
			return errors.New("outer IPv4 header checksum is wrong in a header the program built")
		}
		// (dsr_outer_len, bpf/lib/dsr.h: a sum over 16 bits is written as
		// 0, the form of BIG TCP)
		sum := 0
		if o.inner != nil {
			field := o.inner.tot + o.hlen - o.fixedLenOff() // the length field's value
			if field > 0xffff {
				field = 0
			}
			sum = field + o.fixedLenOff()
		}
		if o.inner != nil && !o.lenOK && o.tot != sum {
			return fmt.Errorf("outer IP length %d is neither within the frame nor the inner length %d plus the outer header", o.tot, o.inner.tot)
		}
		if i != nil && i.lenOK && !o.lenOK {
			return fmt.Errorf("outer IP length %d exceeds the frame (%d bytes) around an inner packet that fitted", o.tot, len(out)-ooff)
		}
		return compare(o.inner, i, "inner ", 0)
	case i != nil && i.inner != nil && !i.quoted && (o.proto != i.proto || o.inner == nil):
		return compare(o, i.inner, "decapsulated ", 0)
	}
	return compare(o, i, "", 0)
}

// isARPAnswer: out is the one rewrite of a non-IP frame a program may make,
// pod_egress's answer to an Ethernet/IPv4 ARP request (bpf/lib/arp.h): the
// reply to the asker from the target address at the MAC it names, the
// frame's length and everything behind the 42 bytes unchanged.
func isARPAnswer(in, out []byte) bool {
	const n = 14 + 28
	if len(in) < n || len(out) != len(in) || !bytes.Equal(in[n:], out[n:]) {
		return false
	}
	ia, oa := in[14:n], out[14:n]
	return binary.BigEndian.Uint16(in[12:]) == EtherARP && binary.BigEndian.Uint16(out[12:]) == EtherARP &&
		bytes.Equal(ia[:6], oa[:6]) && // htype, ptype, hlen, plen
		binary.BigEndian.Uint16(ia[6:]) == 1 && binary.BigEndian.Uint16(oa[6:]) == 2 &&
		bytes.Equal(out[0:6], ia[8:14]) && bytes.Equal(out[6:12], oa[8:14]) && // to the asker, from the answer's MAC
		bytes.Equal(oa[14:18], ia[24:28]) && // the asked address answers
		bytes.Equal(oa[18:24], ia[8:14]) && bytes.Equal(oa[24:28], ia[14:18]) // to the asker's MAC and address
}

// fresh: every field of a header the program built must be valid.
func fresh(o *ipInfo, what string) error {
	switch {
	case !o.hdrOK:
		return fmt.Errorf("%sIPv4 header checksum is wrong in a header the program built", what)
	case !o.lenOK:
		return fmt.Errorf("%sIP length exceeds the frame in a header the program built", what)
	case o.l4OK != nil && !*o.l4OK:
		return fmt.Errorf("%s%s checksum or length is wrong in a packet the program built", what, o.l4What)
	}
	return nil
}

// compare: what was valid in i is valid in o. i nil: o is the program's own.
// extraSlack: bytes o may have after its end beyond those i had.
func compare(o, i *ipInfo, what string, extraSlack int) error {
	if o == nil {
		return fmt.Errorf("%spacket does not parse as IP", what)
	}
	if i == nil || i.v6 != o.v6 || (i.proto != o.proto && !o.quoted) {
		return fresh(o, what) // a new packet (an ICMP error the program answers with)
	}
	if i.hdrOK && !o.hdrOK {
		return fmt.Errorf("%sIPv4 header checksum was valid and is not any more", what)
	}
	if i.lenOK && !o.lenOK {
		return fmt.Errorf("%sIP length fitted the frame and does not any more", what)
	}
	if i.lenOK && o.lenOK && o.slack > i.slack+extraSlack {
		return fmt.Errorf("%s%d bytes follow the IP packet's declared end (the input had %d)", what, o.slack, i.slack)
	}
	if i.l4OK != nil && *i.l4OK && (o.l4OK == nil || !*o.l4OK) {
		return fmt.Errorf("%s%s checksum or length was valid and is not any more", what, o.l4What)
	}
	if i.quoted && o.quoted && i.inner != nil && i.inner.hdrOK && (o.inner == nil || !o.inner.hdrOK) {
		return fmt.Errorf("%sthe IPv4 header an ICMP error quotes lost its valid checksum", what)
	}
	if !i.quoted && i.inner != nil && o.inner != nil {
		return compare(o.inner, i.inner, what+"inner ", 0)
	}
	return nil
}
