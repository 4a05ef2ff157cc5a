package nodeport

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/axonhq/axon/internal/inetcsum"
	"github.com/axonhq/axon/internal/lb"
)

// BPF_PROG_TEST_RUN fixtures of what does not fit DSR's outer header
// (bpf/lib/icmp_too_big.h) and of what a client sends once it knows:
// fragments, and the ICMP errors of the way back, at the backend node
// (np_dsr_accept).

// npTooBig is the answer the LB must send for frame (a datagram from the
// client, as it arrived): from the frontend to the client, MACs swapped,
// "fragmentation needed" / "packet too big" with mtu, quoting the IP header
// and 8 bytes (IPv4) or 64 bytes (IPv6: past a fragment header to the
// ports); IPv4 with the internetwork-control TOS Linux uses.
func npTooBig(frame []byte, frontend, client netip.Addr, mtu uint16) []byte {
	var b []byte
	if frontend.Is4() {
		b = icmpErr(frontend, client, frame, mtu)
	} else {
		msg := make([]byte, 8, 8+104)
		msg[0] = 2
		binary.BigEndian.PutUint32(msg[4:], uint32(mtu))
		b = npFrame(frontend, client, 58, append(msg, frame[14:14+104]...), true)
	}
	copy(b[0:6], frame[6:12])
	copy(b[6:12], frame[0:6])
	if frontend.Is4() {
		b[14+1] = 0xc0
		b[14+10], b[14+11] = 0, 0
		binary.BigEndian.PutUint16(b[14+10:], inetcsum.Checksum(b[14:34], 0))
	}
	return b
}

func TestNodePortDSRTooBig(t *testing.T) {
	f := newNPFix(t, func(o *Options) { o.UplinkMTU = 1500 })
	f.upsert(t, npVIP("192.0.2.10:53", lb.UDP, npBE("10.244.2.7:53", "node2")), FrontendOptions{Mode: ModeDSR})
	f.upsert(t, npVIP("[2001:db8::10]:53", lb.UDP, npBE("[fd00:10:244:2::7]:53", "node2")), FrontendOptions{Mode: ModeDSR})
	f.upsert(t, npVIP("192.0.2.20:53", lb.UDP, npBE("10.244.2.8:53", "node2")), FrontendOptions{}) // SNAT: no outer header
	flow4 := npUDP("198.18.0.250:40000", "192.0.2.10:53")
	flow6 := npUDP("[fd00:198:18::250]:40000", "[2001:db8::10]:53")
	be4, be6 := netip.MustParseAddr("10.244.2.7"), netip.MustParseAddr("fd00:10:244:2::7")
	// datagram whose IP packet is n bytes long
	datagram := func(fl Tuple, n int) []byte {
		hdr := 20 + 8
		if fl.Src.Addr().Is6() {
			hdr = 40 + 8
		}
		payload := make([]byte, n-hdr)
		for i := range payload {
			payload[i] = byte(i)
		}
		b := npPacketPayload(fl, 0, payload)
		copy(b[0:6], f.upMAC)
		copy(b[6:12], f.cliMAC)
		return b
	}
	cases := []struct {
		desc   string
		flow   Tuple
		len    int // IP packet length (negative: a first fragment of that length)
		reason string
		want   func(in []byte) []byte
	}{
		{"v4: 1480 bytes fit 1500 with the outer header: encapsulated", flow4, 1480, "dsr_encap",
			func(in []byte) []byte { return npDSRFrame(in, npNode, be4, f.gwMAC, f.upMAC) }},
		{"v4: 1481 bytes do not: fragmentation needed, MTU 1480", flow4, 1481, "dsr_too_big",
			func(in []byte) []byte { return npTooBig(in, netip.MustParseAddr("192.0.2.10"), npClient, 1480) }},
		{"v4: 3000 bytes (a jumbo frame's start): the same answer", flow4, 3000, "dsr_too_big",
			func(in []byte) []byte { return npTooBig(in, netip.MustParseAddr("192.0.2.10"), npClient, 1480) }},
		{"v6: 1460 bytes fit 1500 with the outer header: encapsulated", flow6, 1460, "dsr_encap",
			func(in []byte) []byte { return npDSRFrame(in, npNode6, be6, f.gwMAC, f.upMAC) }},
		{"v6: 1461 bytes do not: packet too big, MTU 1460", flow6, 1461, "dsr_too_big",
			func(in []byte) []byte { return npTooBig(in, netip.MustParseAddr("2001:db8::10"), npCli6, 1460) }},
		{"v6 first fragment of 1496 bytes: packet too big, the quote reaches its UDP header", flow6, -1496, "dsr_too_big",
			func(in []byte) []byte { return npTooBig(in, netip.MustParseAddr("2001:db8::10"), npCli6, 1460) }},
		{"v4 SNAT frontend: 1500 bytes go on (no outer header)", npUDP("198.18.0.250:40000", "192.0.2.20:53"), 1500, "snat_fwd", nil},
	}
	for _, c := range cases {
		for _, hook := range npHooks {
			t.Run(hook+"/"+c.desc, func(t *testing.T) {
				f.resetFlows(t)
				var in []byte
				if c.len > 0 {
					in = datagram(c.flow, c.len)
				} else { // the first fragment (-len bytes) of a larger datagram
					in = npFrags(datagram(c.flow, 3000), 7, -c.len-40-8)[0]
				}
				before := f.counters(t)
				v, out := f.run(t, hook, in)
				got := npMoved(before, f.counters(t), hook)
				if v != npFwd || got[c.reason] != 1 {
					t.Fatalf("verdict %s, counters %v; want fwd and %s 1", v, got, c.reason)
				}
				if c.reason != "dsr_too_big" && got["dsr_too_big"] != 0 {
					t.Errorf("dsr_too_big moved: %v", got)
				}
				if c.want == nil {
					return
				}
				if want := c.want(in); !bytes.Equal(out, want) {
					t.Errorf("output\n got %x\nwant %x", out, want)
				}
			})
		}
	}

	t.Run("an IPv4 packet with options gets no answer", func(t *testing.T) {
		in := datagram(flow4, 1600)
		// insert a 4-byte option (NOP x3, EOL) after the fixed header
		opt := append(append(bytes.Clone(in[:34]), 1, 1, 1, 0), in[34:]...)
		opt[14] = 0x46
		binary.BigEndian.PutUint16(opt[14+2:], uint16(len(opt)-14))
		opt[14+10], opt[14+11] = 0, 0
		binary.BigEndian.PutUint16(opt[14+10:], inetcsum.Checksum(opt[14:38], 0))
		for _, hook := range npHooks {
			f.resetFlows(t)
			before := f.counters(t)
			v, _ := f.run(t, hook, opt)
			if got := npMoved(before, f.counters(t), hook); v != npDrop || got["dsr_too_big"] != 1 {
				t.Errorf("%s: verdict %s, counters %v; want drop, dsr_too_big 1", hook, v, got)
			}
		}
	})

	t.Run("no uplink MTU known: no answer, encapsulated beyond it as before", func(t *testing.T) {
		g := newNPFix(t, nil)
		g.upsert(t, npVIP("192.0.2.10:53", lb.UDP, npBE("10.244.2.7:53", "node2")), FrontendOptions{Mode: ModeDSR})
		in := datagram(flow4, 1490)
		copy(in[0:6], g.upMAC)
		v, out := g.run(t, "tc", in)
		if v != npFwd || !bytes.Equal(out, npDSRFrame(in, npNode, be4, g.gwMAC, g.upMAC)) {
			t.Errorf("verdict %s\n got %x", v, out)
		}
	})
}

// TestNodePortDSRBigTCP: a BIG TCP request (a GSO packet over 64 KiB:
// IPv4 tot_len 0, IPv6 payload_len 0; a client's own, or a GRO aggregate
// on an uplink with a large gro_max_size) gets an outer header whose length
// is the packet's, not 0 + the outer header's: a kernel ipip device at the
// backend, or any router on the way, would trim the packet to that length.
// PROG_TEST_RUN feeds one page at most and cannot set a GSO type (without
// one bpf_skb_adjust_room refuses a GSO skb), so the packets are small and
// not GSO: this checks where the outer length comes from. Lengths over
// 64 KiB (outer length 0) go through real traffic in
// TestNodePortTrafficBigTCP.
func TestNodePortDSRBigTCP(t *testing.T) {
	f := newNPFix(t, func(o *Options) { o.UplinkMTU = 1500 })
	f.upsert(t, npVIP("192.0.2.10:80", lb.TCP, npBE("10.244.2.7:80", "node2")), FrontendOptions{Mode: ModeDSR})
	f.upsert(t, npVIP("[2001:db8::10]:80", lb.TCP, npBE("[fd00:10:244:2::7]:80", "node2")), FrontendOptions{Mode: ModeDSR})
	be4, be6 := netip.MustParseAddr("10.244.2.7"), netip.MustParseAddr("fd00:10:244:2::7")
	big := func(fl Tuple) []byte {
		b := f.wirePkt(fl, npACK)
		if fl.Src.Addr().Is4() {
			return dptest.BigTCP4(b, unix.IPPROTO_TCP)
		}
		b[14+4], b[14+5] = 0, 0
		return b
	}
	fl4, fl6 := npTCP("198.18.0.250:40000", "192.0.2.10:80"), npTCP("[fd00:198:18::250]:40000", "[2001:db8::10]:80")
	for _, c := range []struct {
		desc string
		flow Tuple
		in   []byte
		want func(in []byte) []byte
	}{
		{"IPv4, tot_len 0", fl4, big(fl4),
			func(in []byte) []byte { return npDSRFrame(in, npNode, be4, f.gwMAC, f.upMAC) }},
		{"IPv6, payload_len 0", fl6, big(fl6),
			func(in []byte) []byte { return npDSRFrame(in, npNode6, be6, f.gwMAC, f.upMAC) }},
	} {
		t.Run(c.desc, func(t *testing.T) {
			f.openFlow(t, "tc", c.flow) // the big segment is an ACK: a SYN opens the flow first
			before := f.counters(t)
			v, out := f.run(t, "tc", c.in)
			if got := npMoved(before, f.counters(t), "tc"); v != npFwd || got["dsr_encap"] != 1 {
				t.Fatalf("verdict %s, counters %v; want fwd and dsr_encap 1", v, got)
			}
			if want := c.want(c.in); !bytes.Equal(out, want) {
				t.Errorf("output\n got %x\nwant %x", out, want)
			}
		})
	}
}

// TestNodePortDSRBackendFragmentsAndErrors: the backend node accepts the
// fragments of a datagram the entry node encapsulated piece by piece, and
// the ICMP error the entry node forwards about a reply of the flow.
func TestNodePortDSRBackendFragmentsAndErrors(t *testing.T) {
	f := newNPFix(t, func(o *Options) { o.UplinkMTU = 1500 })
	node2, node2v6 := netip.MustParseAddr("198.18.0.12"), netip.MustParseAddr("fd00:198:18::12")
	f.upsert(t, npVIP("192.0.2.10:53", lb.UDP, npBE("10.244.1.7:5353", "node1")), FrontendOptions{Mode: ModeDSR})
	f.upsert(t, npVIP("[2001:db8::10]:53", lb.UDP, npBE("[fd00:10:244:1::7]:5353", "node1")), FrontendOptions{Mode: ModeDSR})
	f.upsert(t, npVIP("192.0.2.30:80", lb.TCP, npBE("10.244.1.7:8080", "node1")), FrontendOptions{Mode: ModeDSR})
	f.upsert(t, npVIP("[2001:db8::30]:80", lb.TCP, npBE("[fd00:10:244:1::7]:8080", "node1")), FrontendOptions{Mode: ModeDSR})
	const id = 0x77

	for _, v6 := range []bool{false, true} {
		fam := map[bool]string{false: "v4", true: "v6"}[v6]
		flow, pod, from := npUDP("198.18.0.250:40000", "192.0.2.10:53"), netip.MustParseAddr("10.244.1.7"), node2
		if v6 {
			flow, pod, from = npUDP("[fd00:198:18::250]:40000", "[2001:db8::10]:53"), netip.MustParseAddr("fd00:10:244:1::7"), node2v6
		}
		be := netip.AddrPortFrom(pod, 5353)
		t.Run(fam+" fragments: decapsulated and DNATed one by one", func(t *testing.T) {
			f.resetFlows(t)
			frags := npFrags(npPacketPayload(flow, 0, npFragPayload), id, npFragChunk)
			want := npFrags(npPacketPayload(Tuple{Proto: lb.UDP, Src: flow.Src, Dst: be}, 0, npFragPayload), id, npFragChunk)
			for i, fr := range frags {
				in := npDSRFrame(fr, from, pod, f.upMAC, f.gwMAC)
				before := f.counters(t)
				v, out := f.run(t, "tc", in)
				got := npMoved(before, f.counters(t), "tc")
				exp := bytes.Clone(want[i])
				copy(exp[0:12], in[0:12])
				if v != npNext || !bytes.Equal(out, exp) {
					t.Fatalf("fragment %d: verdict %s (counters %v)\n got %x\nwant %x", i, v, got, out, exp)
				}
				if got["dsr_decap"] != 1 || got["dnat_local"] != 1 {
					t.Errorf("fragment %d: counters %v, want dsr_decap and dnat_local 1", i, got)
				}
			}
		})
		t.Run(fam+" a later fragment without its first is not ours", func(t *testing.T) {
			f.resetFlows(t)
			fr := npFrags(npPacketPayload(flow, 0, npFragPayload), id+1, npFragChunk)[1]
			in := npDSRFrame(fr, from, pod, f.upMAC, f.gwMAC)
			if v, out := f.run(t, "tc", in); v != npNext || !bytes.Equal(out, in) {
				t.Errorf("verdict %s, want next and untouched\n got %x", v, out)
			}
		})

		tcp, router := npTCP("198.18.0.250:40000", "192.0.2.30:80"), netip.MustParseAddr("198.18.0.1")
		if v6 {
			tcp, router = npTCP("[fd00:198:18::250]:40000", "[2001:db8::30]:80"), netip.MustParseAddr("fd00:198:18::1")
		}
		tbe := netip.AddrPortFrom(pod, 8080)
		t.Run(fam+" ICMP error about a reply: decapsulated and sent to the pod as about what it sent", func(t *testing.T) {
			f.resetFlows(t)
			syn := npDSRFrame(f.wirePkt(tcp, npSYN), from, pod, f.upMAC, f.gwMAC)
			if v, _ := f.run(t, "tc", syn); v != npNext {
				t.Fatalf("SYN: verdict %s", v)
			}
			// a router between the pod and the client answers the reply
			// (frontend -> client) with an error to the frontend; node2's
			// LB encapsulates it to the pod unchanged
			reply := npPacket(Tuple{Proto: lb.TCP, Src: tcp.Dst, Dst: tcp.Src}, npACK)
			mtu := uint16(1400)
			if v6 {
				mtu = 1280
			}
			errPkt := icmpErr(router, tcp.Dst.Addr(), reply, mtu)
			in := npDSRFrame(errPkt, from, pod, f.upMAC, f.gwMAC)
			before := f.counters(t)
			v, out := f.run(t, "tc", in)
			got := npMoved(before, f.counters(t), "tc")
			podSent := npPacket(Tuple{Proto: lb.TCP, Src: tbe, Dst: tcp.Src}, npACK)
			want := icmpErr(router, pod, podSent, mtu)
			copy(want[0:12], in[0:12])
			if v != npNext || !bytes.Equal(out, want) {
				t.Fatalf("verdict %s (counters %v)\n got %x\nwant %x", v, got, out, want)
			}
			if got["dsr_decap"] != 1 || got["icmp_error"] != 1 {
				t.Errorf("counters %v, want dsr_decap and icmp_error 1", got)
			}
		})
		t.Run(fam+" ICMP error about another flow is not ours", func(t *testing.T) {
			f.resetFlows(t)
			reply := npPacket(Tuple{Proto: lb.TCP, Src: tcp.Dst, Dst: tcp.Src}, npACK)
			in := npDSRFrame(icmpErr(router, tcp.Dst.Addr(), reply, 1280), from, pod, f.upMAC, f.gwMAC)
			if v, out := f.run(t, "tc", in); v != npNext || !bytes.Equal(out, in) {
				t.Errorf("verdict %s, want next and untouched\n got %x", v, out)
			}
		})
	}
}

// TestNPMetricsMigration: a pinned counters map of an older size (fewer
// np_reason rows) is unpinned so that the LB loads; one of the right size
// is kept with its counts.
func TestNPMetricsMigration(t *testing.T) {
	dptest.RequireRoot(t)
	spec, err := loadLbTC()
	if err != nil {
		t.Fatal(err)
	}
	ms := spec.Maps[MapMetrics]
	for _, tc := range []struct {
		desc    string
		entries uint32
		kept    bool
	}{
		{"older layout: unpinned", ms.MaxEntries - uint32(len(npHookNames)), false},
		{"same layout: kept", ms.MaxEntries, true},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			pin := newPinDir(t)
			if err := datapath.EnsurePinDir(pin); err != nil {
				t.Fatal(err)
			}
			old := ms.Copy()
			old.MaxEntries = tc.entries
			old.Pinning = ebpf.PinNone
			m, err := ebpf.NewMap(old)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(pin, MapMetrics)
			if err := m.Pin(path); err != nil {
				t.Fatal(err)
			}
			m.Close()
			if err := npMetricsMigration(pin, ms, dptest.Logger(t)); err != nil {
				t.Fatal(err)
			}
			_, err = os.Stat(path)
			if kept := err == nil; kept != tc.kept {
				t.Errorf("pin kept = %v, want %v (stat: %v)", kept, tc.kept, err)
			}
			if tc.kept {
				_ = os.Remove(path)
			}
		})
	}
}
