package drops

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"time"
)

// Layout of struct axon_drop_event (bpf/lib/drop.h); TestEventLayout holds
// these offsets to the objects' BTF.
const (
	sampleLen    = 128 // AXON_DROP_SAMPLE
	eventSize    = 40 + sampleLen
	offTS        = 0
	offIfindex   = 8
	offLen       = 12
	offProg      = 16
	offReason    = 17
	offDir       = 18
	offCapLen    = 19
	offFamily    = 20
	offProto     = 21
	offDport     = 22
	offDaddr     = 24
	offSample    = 40
	afInet       = 2
	afInet6      = 10
	ethPIPv4     = 0x0800
	ethPIPv6     = 0x86dd
	ethPARP      = 0x0806
	ethPVLAN     = 0x8100
	ethPQinQ     = 0x88a8
	ipprotoICMP  = 1
	ipprotoTCP   = 6
	ipprotoUDP   = 17
	ipprotoSCTP  = 132
	ipprotoICMP6 = 58
)

// Event is one drop, decoded.
type Event struct {
	Time      time.Time  `json:"time"`
	Prog      string     `json:"prog"`
	Reason    string     `json:"reason"`
	Direction string     `json:"direction"`
	Ifindex   uint32     `json:"ifindex,omitempty"`
	Len       uint32     `json:"len"`
	Proto     string     `json:"proto,omitempty"` // tcp, udp, sctp, icmp, icmpv6, arp, ip-<n>, or an ethertype 0x....
	Src       netip.Addr `json:"src,omitzero"`
	Dst       netip.Addr `json:"dst,omitzero"`
	SrcPort   uint16     `json:"sport,omitempty"`
	DstPort   uint16     `json:"dport,omitempty"`
}

// Decode decodes one ring buffer record. bootWall converts the event's
// CLOCK_MONOTONIC stamp to wall time: the wall time at monotonic 0.
func Decode(raw []byte, bootWall time.Time) (Event, error) {
	if len(raw) < eventSize {
		return Event{}, fmt.Errorf("drop event of %d bytes, want %d (agent and programs of different versions?)", len(raw), eventSize)
	}
	le := binary.LittleEndian
	e := Event{
		Time:      bootWall.Add(time.Duration(le.Uint64(raw[offTS:]))),
		Ifindex:   le.Uint32(raw[offIfindex:]),
		Len:       le.Uint32(raw[offLen:]),
		Prog:      nameOf(progNames, int(raw[offProg])),
		Reason:    nameOf(reasonNames, int(raw[offReason])),
		Direction: nameOf(directionNames, int(raw[offDir])),
	}
	capLen := int(raw[offCapLen])
	if capLen > sampleLen {
		capLen = sampleLen
	}
	if capLen == 0 {
		// the socket LB: the Service's address, port and protocol
		if f := raw[offFamily]; f == afInet || f == afInet6 {
			e.Dst = netip.AddrFrom16([16]byte(raw[offDaddr : offDaddr+16])).Unmap()
			e.DstPort = binary.BigEndian.Uint16(raw[offDport:])
			e.Proto = protoName(raw[offProto])
		}
		return e, nil
	}
	decodeSample(&e, raw[offSample:offSample+capLen])
	return e, nil
}

func protoName(p uint8) string {
	switch p {
	case ipprotoTCP:
		return "tcp"
	case ipprotoUDP:
		return "udp"
	case ipprotoSCTP:
		return "sctp"
	case ipprotoICMP:
		return "icmp"
	case ipprotoICMP6:
		return "icmpv6"
	}
	return fmt.Sprintf("ip-%d", p)
}

// decodeSample fills protocol, addresses and ports from the packet's first
// bytes (Ethernet on). A sample cut short leaves the rest unset.
func decodeSample(e *Event, b []byte) {
	be := binary.BigEndian
	if len(b) < 14 {
		return
	}
	et := be.Uint16(b[12:])
	off := 14
	for (et == ethPVLAN || et == ethPQinQ) && len(b) >= off+4 {
		et = be.Uint16(b[off+2:])
		off += 4
	}
	b = b[off:]
	var proto uint8
	var l4 []byte
	switch et {
	case ethPIPv4:
		if len(b) < 20 || b[0]>>4 != 4 {
			e.Proto = "ipv4"
			return
		}
		ihl := int(b[0]&0xf) * 4
		proto = b[9]
		e.Src = netip.AddrFrom4([4]byte(b[12:16]))
		e.Dst = netip.AddrFrom4([4]byte(b[16:20]))
		if be.Uint16(b[6:])&0x1fff == 0 && ihl >= 20 && len(b) >= ihl {
			l4 = b[ihl:]
		}
	case ethPIPv6:
		if len(b) < 40 || b[0]>>4 != 6 {
			e.Proto = "ipv6"
			return
		}
		proto = b[6]
		e.Src = netip.AddrFrom16([16]byte(b[8:24]))
		e.Dst = netip.AddrFrom16([16]byte(b[24:40]))
		l4 = b[40:]
	case ethPARP:
		e.Proto = "arp"
		// Ethernet/IPv4 ARP: sender and target protocol addresses
		if len(b) >= 28 && be.Uint16(b[0:]) == 1 && be.Uint16(b[2:]) == ethPIPv4 && b[4] == 6 && b[5] == 4 {
			e.Src = netip.AddrFrom4([4]byte(b[14:18]))
			e.Dst = netip.AddrFrom4([4]byte(b[24:28]))
		}
		return
	default:
		e.Proto = fmt.Sprintf("0x%04x", et)
		return
	}
	e.Proto = protoName(proto)
	if (proto == ipprotoTCP || proto == ipprotoUDP || proto == ipprotoSCTP) && len(l4) >= 4 {
		e.SrcPort = be.Uint16(l4[0:])
		e.DstPort = be.Uint16(l4[2:])
	}
}
