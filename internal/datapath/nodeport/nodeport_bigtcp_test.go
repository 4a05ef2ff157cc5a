package nodeport

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/axonhq/axon/internal/lb"
)

// npHBH inserts, after the IPv6 header of frame, the hop-by-hop header IPv6
// BIG TCP puts in every GSO packet over 64 KiB: hdrLen 8-byte units beyond
// the first (0: just a jumbo payload option holding the length), payload_len
// 0. The TCP checksum does not change: its pseudo-header counts the TCP
// length and next header 6 either way.
func npHBH(frame []byte, hdrLen int) []byte {
	ip, payload := frame[14:14+40], frame[14+40:]
	hbh := make([]byte, (hdrLen+1)*8)
	hbh[0], hbh[1] = ip[6], byte(hdrLen)
	hbh[2], hbh[3] = 0xc2, 4 // jumbo payload option
	binary.BigEndian.PutUint32(hbh[4:], uint32(len(hbh)+len(payload)))
	for i := 8; i+1 < len(hbh); i += 2 { // PadN over the rest
		hbh[i], hbh[i+1] = 1, 0
	}
	out := append([]byte(nil), frame[:14+40]...)
	out[14+4], out[14+5], out[14+6] = 0, 0, 0
	out = append(out, hbh...)
	return append(out, payload...)
}

// TestNodePortIPv6HopByHop: an IPv6 BIG TCP packet carries a hop-by-hop
// jumbo header before TCP (6.18 still inserts it). The LB reads past it: the
// established flow's packet is DNATed to a local pod or SNATed to a remote
// one, the pod's reply gets its frontend back at egress, the header kept
// in place. Before, the LB read next header 0 as "not a service" and let
// such packets through untranslated. A hop-by-hop header longer than the LB
// parses is left untouched and counted.
func TestNodePortIPv6HopByHop(t *testing.T) {
	f := newNPFix(t, nil)
	f.upsert(t, npNodePort(30090, lb.TCP, true, npBE("[fd00:10:244:1::5]:8080", "node1")), FrontendOptions{})
	f.upsert(t, npNodePort(30091, lb.TCP, true, npBE("[fd00:10:244:2::5]:8080", "node2")), FrontendOptions{})
	local := npTCP("[fd00:198:18::250]:40000", "[fd00:198:18::11]:30090")
	remote := npTCP("[fd00:198:18::250]:40001", "[fd00:198:18::11]:30091")
	pod := npAP("[fd00:10:244:1::5]:8080")

	f.resetFlows(t)
	for _, fl := range []Tuple{local, remote} { // the handshake creates the flows
		if v, _ := f.run(t, "tc", f.wirePkt(fl, npSYN)); v == npDrop {
			t.Fatalf("SYN of %s dropped", fl)
		}
	}
	t.Run("request to a local backend: DNAT", func(t *testing.T) {
		before := f.counters(t)
		v, out := f.run(t, "tc", npHBH(f.wirePkt(local, npACK), 0))
		want := npHBH(npTranslated(f.wirePkt(local, npACK), Tuple{Proto: lb.TCP, Src: local.Src, Dst: pod}, npACK, nil, nil), 0)
		if got := npMoved(before, f.counters(t), "tc"); v != npNext || got["dnat_local"] != 1 {
			t.Fatalf("verdict %s, counters %v; want next and dnat_local 1", v, got)
		}
		if !bytes.Equal(out, want) {
			t.Errorf("output\n got %x\nwant %x", out, want)
		}
	})
	t.Run("the pod's reply: its frontend back at egress", func(t *testing.T) {
		reply := Tuple{Proto: lb.TCP, Src: pod, Dst: local.Src}
		in := npHBH(npPacket(reply, npACK), 0)
		before := f.counters(t)
		v, out := f.run(t, "egress", in)
		want := npHBH(npPacket(Tuple{Proto: lb.TCP, Src: local.Dst, Dst: local.Src}, npACK), 0)
		copy(want[0:12], in[0:12])
		if got := npMoved(before, f.counters(t), "egress"); v != npNext || got["egress_rev"] != 1 {
			t.Fatalf("verdict %s, counters %v; want next and egress_rev 1", v, got)
		}
		if !bytes.Equal(out, want) {
			t.Errorf("output\n got %x\nwant %x", out, want)
		}
	})
	t.Run("request to a remote backend: SNAT", func(t *testing.T) {
		e, ok := f.ctFor(t, remote)
		if !ok {
			t.Fatal("no CT entry for the remote flow")
		}
		before := f.counters(t)
		v, out := f.run(t, "tc", npHBH(f.wirePkt(remote, npACK), 0))
		nt := Tuple{Proto: lb.TCP, Src: netip.AddrPortFrom(npNode6, e.NATPort), Dst: npAP("[fd00:10:244:2::5]:8080")}
		want := npHBH(npTranslated(f.wirePkt(remote, npACK), nt, npACK, f.gwMAC, f.upMAC), 0)
		if got := npMoved(before, f.counters(t), "tc"); v != npFwd || got["snat_fwd"] != 1 {
			t.Fatalf("verdict %s, counters %v; want fwd and snat_fwd 1", v, got)
		}
		if !bytes.Equal(out, want) {
			t.Errorf("output\n got %x\nwant %x", out, want)
		}
	})
	t.Run("a hop-by-hop header over 64 bytes: untouched", func(t *testing.T) {
		in := npHBH(f.wirePkt(local, npACK), 8) // 72 bytes
		before := f.counters(t)
		v, out := f.run(t, "tc", in)
		if got := npMoved(before, f.counters(t), "tc"); v != npNext || got["malformed"] != 1 || !bytes.Equal(out, in) {
			t.Fatalf("verdict %s, counters %v, changed %v; want next, malformed 1, unchanged", v, got, !bytes.Equal(out, in))
		}
	})
}
