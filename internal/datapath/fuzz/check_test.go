package fuzz

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/axonhq/axon/internal/inetcsum"
)

// The checker must catch what it is there for: each broken output below is
// one a buggy program could produce, and each must be named.

var (
	tMAC1 = net.HardwareAddr{2, 0, 0, 0, 0, 1}
	tMAC2 = net.HardwareAddr{2, 0, 0, 0, 0, 2}
)

func tAP(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

func tFrame(ip []byte) []byte {
	et := uint16(EtherIPv4)
	if ip[0]>>4 == 6 {
		et = EtherIPv6
	}
	return Eth(tMAC1, tMAC2, et, ip)
}

// rebuilt is frame with the IPv4 header checksum computed afresh.
func rebuilt(frame []byte) []byte {
	b := append([]byte(nil), frame...)
	b[24], b[25] = 0, 0
	binary.BigEndian.PutUint16(b[24:], inetcsum.Checksum(b[14:34], 0))
	return b
}

func TestCheckRewrite(t *testing.T) {
	c, fe, be := tAP("198.18.0.250:40000"), tAP("198.18.0.11:30080"), tAP("10.244.1.5:8080")
	c6, fe6, be6 := tAP("[fd00::250]:40000"), tAP("[fd00::11]:30080"), tAP("[fd00:10::5]:8080")
	syn := tFrame(tcpPkt(c, fe, SYN, MSS(1460), nil))
	dnat := tFrame(tcpPkt(c, be, SYN, MSS(1460), nil)) // what a correct DNAT makes
	udp := tFrame(IP(c.Addr(), fe.Addr(), ProtoUDP, 64, nil, nil, UDP(c, fe, payload(8))))
	udp[14+20+6], udp[14+20+7] = 0, 0 // no checksum (IPv4)
	withIP := func(b []byte, fn func(b []byte)) []byte { b = append([]byte(nil), b...); fn(b); return b }
	encap := func(inner []byte, fix bool) []byte {
		ip := IP(netip.MustParseAddr("198.18.0.11"), netip.MustParseAddr("10.244.2.7"), ProtoIPIP, 64, nil, nil, inner[14:])
		if !fix {
			ip[10] ^= 0xff
		}
		return tFrame(ip)
	}
	quoted := tcpPkt(fe, c, ACK, nil, nil)
	icmpIn := tFrame(icmpErr(netip.MustParseAddr("198.18.0.1"), fe.Addr(), quoted, 1400))
	icmpBad := withIP(icmpIn, func(b []byte) { b[14+20+8+12] ^= 1 }) // the quoted source, no checksum fixed
	// pod_egress's answer to a request for the gateway (bpf/lib/arp.h)
	arpReq := ARP(tMAC1, c.Addr(), fe.Addr())
	arpAnswer := withIP(arpReq, func(b []byte) {
		gwMAC := []byte{2, 0, 0, 0, 0, 0x99}
		req := append([]byte(nil), b[14:42]...)
		copy(b[0:6], req[8:14])
		copy(b[6:12], gwMAC)
		b[14+7] = 2
		copy(b[14+8:], gwMAC)
		copy(b[14+14:], req[24:28])
		copy(b[14+18:], req[8:14])
		copy(b[14+24:], req[14:18])
	})
	for _, tc := range []struct {
		name    string
		in, out []byte
		want    string // "" = accepted
		gso     bool
	}{
		{"unchanged", syn, syn, "", false},
		{"DNAT with both checksums fixed", syn, dnat, "", false},
		{"DNAT without the IPv4 header checksum", syn, withIP(dnat, func(b []byte) { copy(b[24:26], syn[24:26]) }), "IPv4 header checksum was valid", false},
		{"DNAT without the TCP checksum", syn, withIP(dnat, func(b []byte) { copy(b[14+20+16:], syn[14+20+16:14+20+18]) }), "TCP checksum", false},
		{"an invalid TCP checksum stays invalid", withIP(syn, func(b []byte) { b[14+20+16] ^= 1 }), withIP(dnat, func(b []byte) { b[14+20+16] ^= 1 }), "", false},
		{"UDP without checksum keeps none", udp, udp, "", false},
		{"UDP without checksum gets a wrong one", udp, withIP(udp, func(b []byte) { b[14+20+6] = 0x12 }), "UDP checksum", false},
		{"bytes appended behind the packet", syn, rebuilt(append(append([]byte(nil), dnat...), 0, 0, 0, 0)), "follow the IP packet's declared end", false},
		{"IP length grown past the frame", syn, rebuilt(withIP(dnat, func(b []byte) { b[17] += 8 })), "IP length fitted the frame", false},
		{"ARP rewritten", ARP(tMAC1, c.Addr(), fe.Addr()), withIP(ARP(tMAC1, c.Addr(), fe.Addr()), func(b []byte) { b[20] = 9 }), "non-IP frame", false},
		{"ARP request answered", arpReq, arpAnswer, "", false},
		{"ARP answer from another address", arpReq, withIP(arpAnswer, func(b []byte) { b[14+17] ^= 1 }), "non-IP frame", false},
		{"ARP answer to another MAC", arpReq, withIP(arpAnswer, func(b []byte) { b[0] ^= 2 }), "non-IP frame", false},
		{"ARP answer whose MACs disagree", arpReq, withIP(arpAnswer, func(b []byte) { b[6] ^= 2 }), "non-IP frame", false},
		{"ARP reply turned around", withIP(arpReq, func(b []byte) { b[14+7] = 2 }), arpAnswer, "non-IP frame", false},
		{"IP turned into another EtherType", syn, withIP(syn, func(b []byte) { b[12] = 0x88 }), "came out as EtherType", false},
		{"IPIP with a valid outer header", syn, encap(syn, true), "", false},
		{"IPIP with a wrong outer checksum", syn, encap(syn, false), "outer IPv4 header checksum", false},
		{"decapsulated", encap(syn, true), syn, "", false},
		{"decapsulated with the inner checksum broken", encap(syn, true), withIP(syn, func(b []byte) { b[24] ^= 1 }), "decapsulated IPv4 header checksum", false},
		{"ICMP error quote changed without checksums", icmpIn, icmpBad, "ICMP checksum", false},
		{"IPv6 DNAT with the TCP checksum fixed", tFrame(tcpPkt(c6, fe6, SYN, nil, nil)), tFrame(tcpPkt(c6, be6, SYN, nil, nil)), "", false},
		{"IPv6 DNAT without the TCP checksum", tFrame(tcpPkt(c6, fe6, SYN, nil, nil)),
			withIP(tFrame(tcpPkt(c6, be6, SYN, nil, nil)), func(b []byte) { copy(b[14+40+16:], tFrame(tcpPkt(c6, fe6, SYN, nil, nil))[14+40+16:14+40+18]) }), "TCP checksum", false},
		{"output cut below an Ethernet header", syn, syn[:10], "shorter than an Ethernet header", false},
		{"IPv4 BIG TCP DNAT, checksums fixed", bigTCP4(syn), bigTCP4(dnat), "", true},
		{"IPv4 BIG TCP DNAT without the TCP checksum", bigTCP4(syn), withIP(bigTCP4(dnat), func(b []byte) { b[14+20+16] ^= 1 }), "TCP checksum", true},
		{"IPv6 BIG TCP (jumbo) DNAT without the TCP checksum", bigTCP6(tFrame(tcpPkt(c6, fe6, ACK, nil, payload(100)))),
			withIP(bigTCP6(tFrame(tcpPkt(c6, be6, ACK, nil, payload(100)))), func(b []byte) { b[14+48+16] ^= 1 }), "TCP checksum", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckRewrite(tc.in, tc.out, tc.gso)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("rejected: %v", err)
			case tc.want != "" && err == nil:
				t.Fatalf("accepted; want an error saying %q", tc.want)
			case tc.want != "" && !strings.Contains(err.Error(), tc.want):
				t.Fatalf("error %q does not say %q", err, tc.want)
			}
		})
	}
}

// The builders make valid packets: the checker finds every field valid.
func TestBuildersValid(t *testing.T) {
	c, s := tAP("198.18.0.250:40000"), tAP("198.18.0.11:53")
	c6, s6 := tAP("[fd00::250]:40000"), tAP("[fd00::11]:53")
	for name, ip := range map[string][]byte{
		"tcp4":  tcpPkt(c, s, SYN, MSS(1460), payload(3)),
		"udp6":  udpPkt(c6, s6, payload(9)),
		"icmp4": echo(c.Addr(), s.Addr(), 64),
		"icmp6": echo(c6.Addr(), s6.Addr(), 64),
		"ext6":  IP(c6.Addr(), s6.Addr(), ProtoUDP, 64, nil, []Ext{{ProtoHop, []byte{1, 4, 0, 0, 0, 0}}, {ProtoDstOpt, nil}}, UDP(c6, s6, payload(5))),
		"opts4": IP(c.Addr(), s.Addr(), ProtoTCP, 64, []byte{148, 4, 0, 0}, nil, TCP(c, s, SYN, nil, nil)),
	} {
		p := parseIP(ip, 0, false)
		if p == nil || !p.hdrOK || !p.lenOK || p.slack != 0 || p.l4OK == nil || !*p.l4OK {
			t.Errorf("%s: %+v", name, p)
		}
	}
	for _, f := range Fragments(udpPkt(c, s, payload(64)), 24, 7) {
		if p := parseIP(f, 0, false); p == nil || !p.frag || !p.hdrOK || !p.lenOK {
			t.Errorf("fragment %x: %+v", f, p)
		}
	}
}

// The same seed and stream make the same packets; another stream others.
func TestMutatorDeterministic(t *testing.T) {
	seeds := [][]byte{tFrame(tcpPkt(tAP("1.2.3.4:1"), tAP("5.6.7.8:2"), SYN, nil, nil))}
	a, b, c := NewMutator(seeds, 7, 1), NewMutator(seeds, 7, 1), NewMutator(seeds, 7, 2)
	same := 0
	for i := 0; i < 1000; i++ {
		pa, ka := a.Next()
		pb, kb := b.Next()
		pc, _ := c.Next()
		if !bytes.Equal(pa, pb) || ka != kb {
			t.Fatalf("packet %d differs between two runs of one seed", i)
		}
		if len(pa) < minFrame {
			t.Fatalf("packet %d is %d bytes", i, len(pa))
		}
		if bytes.Equal(pa, pc) {
			same++
		}
	}
	if same > 200 {
		t.Errorf("%d of 1000 packets equal across streams", same)
	}
}
