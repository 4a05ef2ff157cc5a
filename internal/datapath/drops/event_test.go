package drops

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"time"
)

func rawEvent(prog, reason, dir uint8, sample []byte) []byte {
	b := make([]byte, eventSize)
	binary.LittleEndian.PutUint64(b[offTS:], uint64(time.Second))
	binary.LittleEndian.PutUint32(b[offIfindex:], 7)
	binary.LittleEndian.PutUint32(b[offLen:], uint32(len(sample)))
	b[offProg], b[offReason], b[offDir] = prog, reason, dir
	b[offCapLen] = uint8(copy(b[offSample:], sample))
	return b
}

func eth(et uint16, payload []byte) []byte {
	b := make([]byte, 14, 14+len(payload))
	binary.BigEndian.PutUint16(b[12:], et)
	return append(b, payload...)
}

func ipv4(proto uint8, src, dst string, l4 []byte) []byte {
	b := make([]byte, 20)
	b[0] = 0x45
	b[9] = proto
	s, d := netip.MustParseAddr(src).As4(), netip.MustParseAddr(dst).As4()
	copy(b[12:], s[:])
	copy(b[16:], d[:])
	return append(b, l4...)
}

func ports(s, d uint16) []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint16(b[0:], s)
	binary.BigEndian.PutUint16(b[2:], d)
	return b
}

func TestDecode(t *testing.T) {
	v6 := make([]byte, 40)
	v6[0], v6[6] = 0x60, ipprotoUDP
	a, c := netip.MustParseAddr("fd00::1").As16(), netip.MustParseAddr("fd00::2").As16()
	copy(v6[8:], a[:])
	copy(v6[24:], c[:])
	v6 = append(v6, ports(53, 5353)...)

	sock := make([]byte, eventSize)
	sock[offProg], sock[offReason], sock[offDir] = 6, 5, 1
	sock[offFamily], sock[offProto] = afInet, ipprotoTCP
	binary.BigEndian.PutUint16(sock[offDport:], 80)
	m := netip.MustParseAddr("::ffff:10.96.0.10").As16()
	copy(sock[offDaddr:], m[:])

	for _, tc := range []struct {
		name string
		raw  []byte
		want Event
	}{
		{"tcp4 no backend at lb_tc", rawEvent(2, 5, 0, eth(ethPIPv4, ipv4(ipprotoTCP, "198.18.0.250", "198.18.0.11", ports(40000, 30080)))),
			Event{Prog: "lb_tc", Reason: "drop_no_backend", Direction: "ingress", Proto: "tcp",
				Src: netip.MustParseAddr("198.18.0.250"), Dst: netip.MustParseAddr("198.18.0.11"), SrcPort: 40000, DstPort: 30080}},
		{"udp6 spoofed", rawEvent(0, 0, 0, eth(ethPIPv6, v6)),
			Event{Prog: "pod_egress", Reason: "drop_spoof_src", Direction: "ingress", Proto: "udp",
				Src: netip.MustParseAddr("fd00::1"), Dst: netip.MustParseAddr("fd00::2"), SrcPort: 53, DstPort: 5353}},
		{"icmp has no ports", rawEvent(0, 0, 0, eth(ethPIPv4, ipv4(ipprotoICMP, "10.0.0.1", "10.0.0.2", ports(0x0800, 1)))),
			Event{Prog: "pod_egress", Reason: "drop_spoof_src", Direction: "ingress", Proto: "icmp",
				Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2")}},
		{"other ethertype", rawEvent(0, 3, 0, eth(0x88cc, []byte{1, 2})),
			Event{Prog: "pod_egress", Reason: "drop_l2", Direction: "ingress", Proto: "0x88cc"}},
		{"truncated IPv4 header", rawEvent(3, 8, 0, eth(ethPIPv4, []byte{0x45, 0})),
			Event{Prog: "lb_xdp", Reason: "drop_no_route", Direction: "ingress", Proto: "ipv4"}},
		{"socket LB refusal", sock,
			Event{Prog: "sock_lb", Reason: "drop_no_backend", Direction: "egress", Proto: "tcp",
				Dst: netip.MustParseAddr("10.96.0.10"), DstPort: 80}},
		{"unknown reason value", rawEvent(9, 99, 0, nil),
			Event{Prog: "unknown_9", Reason: "unknown_99", Direction: "ingress"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Decode(tc.raw, time.Time{})
			if err != nil {
				t.Fatal(err)
			}
			got.Time, got.Ifindex, got.Len = time.Time{}, 0, 0
			if got != tc.want {
				t.Errorf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
	if _, err := Decode(make([]byte, 10), time.Time{}); err == nil {
		t.Error("a short record decoded without error")
	}
}
