package nodeport

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/axonhq/axon/internal/inetcsum"
	"github.com/axonhq/axon/internal/lb"
)

// BPF_PROG_TEST_RUN fixtures of IP fragments through the north-south LB
// (bpf/lib/frag.h): the first, a middle and the last fragment of a UDP
// datagram, IPv4 and IPv6, through tc and XDP, for SNAT (both directions),
// a local backend (DNAT, and its reply at egress) and DSR. Every output
// frame is compared byte for byte with the fragments of the translated
// datagram built from scratch, and the output is reassembled and its
// checksums verified independently.

// npFragPayload is the UDP payload of the fixtures' datagrams: 100 bytes,
// fragmented into 48 + 48 + 12 bytes of IP payload (UDP header in the first).
var npFragPayload = func() []byte {
	b := make([]byte, 100)
	for i := range b {
		b[i] = byte(i*7 + 3)
	}
	return b
}()

const npFragChunk = 48

// npFrags splits the IP payload of frame (ethernet + IPv4 without options
// or IPv6 without extension headers + L4) into fragments of chunk bytes
// (a multiple of 8) with IP identification id: IPv4 MF/offset, or an IPv6
// fragment header.
func npFrags(frame []byte, id uint32, chunk int) [][]byte {
	eth := frame[:14]
	var out [][]byte
	if binary.BigEndian.Uint16(frame[12:]) == 0x0800 {
		ip, pl := frame[14:34], frame[34:]
		for off := 0; off < len(pl); off += chunk {
			end := min(off+chunk, len(pl))
			h := bytes.Clone(ip)
			binary.BigEndian.PutUint16(h[2:], uint16(20+end-off))
			binary.BigEndian.PutUint16(h[4:], uint16(id))
			fo := uint16(off / 8)
			if end < len(pl) {
				fo |= 0x2000
			}
			binary.BigEndian.PutUint16(h[6:], fo)
			h[10], h[11] = 0, 0
			binary.BigEndian.PutUint16(h[10:], inetcsum.Checksum(h, 0))
			out = append(out, append(append(bytes.Clone(eth), h...), pl[off:end]...))
		}
		return out
	}
	ip, pl := frame[14:54], frame[54:]
	for off := 0; off < len(pl); off += chunk {
		end := min(off+chunk, len(pl))
		h := bytes.Clone(ip)
		h[6] = 44
		binary.BigEndian.PutUint16(h[4:], uint16(8+end-off))
		fh := make([]byte, 8)
		fh[0] = ip[6]
		fo := uint16(off)
		if end < len(pl) {
			fo |= 1
		}
		binary.BigEndian.PutUint16(fh[2:], fo)
		binary.BigEndian.PutUint32(fh[4:], id)
		out = append(out, append(append(append(bytes.Clone(eth), h...), fh...), pl[off:end]...))
	}
	return out
}

// npReassemble puts fragments (in any order) back together and checks
// every IPv4 header checksum and the L4 checksum of the whole datagram
// (pseudo header included). It returns the datagram's tuple.
func npReassemble(frags [][]byte) (Tuple, error) {
	var src, dst netip.Addr
	var proto uint8
	pieces := map[int][]byte{}
	total := -1
	for i, fr := range frags {
		if len(fr) < 14+20 {
			return Tuple{}, fmt.Errorf("fragment %d: %d bytes", i, len(fr))
		}
		var off int
		var more bool
		var pl []byte
		switch binary.BigEndian.Uint16(fr[12:]) {
		case 0x0800:
			h := fr[14:34]
			if inetcsum.Checksum(h, 0) != 0 {
				return Tuple{}, fmt.Errorf("fragment %d: IPv4 header checksum wrong: %x", i, h)
			}
			src, dst, proto = netip.AddrFrom4([4]byte(h[12:16])), netip.AddrFrom4([4]byte(h[16:20])), h[9]
			fo := binary.BigEndian.Uint16(h[6:])
			off, more = int(fo&0x1fff)*8, fo&0x2000 != 0
			pl = fr[34 : 14+int(binary.BigEndian.Uint16(h[2:]))]
		case 0x86dd:
			h := fr[14:54]
			if h[6] != 44 {
				return Tuple{}, fmt.Errorf("fragment %d: no fragment header (next header %d)", i, h[6])
			}
			fh := fr[54:62]
			src, dst, proto = netip.AddrFrom16([16]byte(h[8:24])), netip.AddrFrom16([16]byte(h[24:40])), fh[0]
			fo := binary.BigEndian.Uint16(fh[2:])
			off, more = int(fo&0xfff8), fo&1 != 0
			pl = fr[62 : 54+int(binary.BigEndian.Uint16(h[4:]))]
		default:
			return Tuple{}, fmt.Errorf("fragment %d: not IP", i)
		}
		pieces[off] = pl
		if !more {
			total = off + len(pl)
		}
	}
	if total < 0 {
		return Tuple{}, fmt.Errorf("no last fragment")
	}
	l4 := make([]byte, 0, total)
	for len(l4) < total {
		p, ok := pieces[len(l4)]
		if !ok {
			return Tuple{}, fmt.Errorf("hole at offset %d", len(l4))
		}
		l4 = append(l4, p...)
	}
	var pseudo []byte
	if src.Is4() {
		s, d := src.As4(), dst.As4()
		pseudo = append(append(append([]byte{}, s[:]...), d[:]...), 0, proto, byte(total>>8), byte(total))
	} else {
		s, d := src.As16(), dst.As16()
		pseudo = append(append(append([]byte{}, s[:]...), d[:]...), 0, 0, byte(total>>8), byte(total), 0, 0, 0, proto)
	}
	if c := inetcsum.Checksum(append(pseudo, l4...), 0); c != 0 {
		return Tuple{}, fmt.Errorf("L4 checksum of the reassembled datagram wrong (residue %#x)", c)
	}
	return Tuple{Proto: lb.Proto(proto),
		Src: netip.AddrPortFrom(src, binary.BigEndian.Uint16(l4[0:])),
		Dst: netip.AddrPortFrom(dst, binary.BigEndian.Uint16(l4[2:]))}, nil
}

// npWithMACs returns frames with dst/src MACs set.
func npWithMACs(frames [][]byte, dst, src net.HardwareAddr) [][]byte {
	out := make([][]byte, len(frames))
	for i, fr := range frames {
		out[i] = bytes.Clone(fr)
		copy(out[i][0:6], dst)
		copy(out[i][6:12], src)
	}
	return out
}

// npFragFix is the LB with UDP frontends of every kind, v4 and v6.
type npFragFix struct {
	*npFix
	snat4, snat6, local4, local6, dsr4, dsr6 Tuple
}

// newNPFragFix loads it with a fragment timeout of 30 s (timeout 0; the
// fragments of one datagram must not expire between two test runs of a
// slow VM) or timeout.
func newNPFragFix(t *testing.T, timeout time.Duration) *npFragFix {
	if timeout == 0 {
		timeout = 30 * time.Second
	}
	f := &npFragFix{npFix: newNPFix(t, func(o *Options) { o.FragTimeout = timeout })}
	f.upsert(t, npNodePort(30053, lb.UDP, false, npBE("10.244.2.6:5353", "node2")), FrontendOptions{})
	f.upsert(t, npNodePort(30053, lb.UDP, true, npBE("[fd00:10:244:2::6]:5353", "node2")), FrontendOptions{})
	f.upsert(t, npNodePort(30054, lb.UDP, false, npBE("10.244.1.6:5353", "node1")), FrontendOptions{})
	f.upsert(t, npNodePort(30054, lb.UDP, true, npBE("[fd00:10:244:1::6]:5353", "node1")), FrontendOptions{})
	f.upsert(t, npVIP("192.0.2.10:53", lb.UDP, npBE("10.244.2.7:53", "node2")), FrontendOptions{Mode: ModeDSR})
	f.upsert(t, npVIP("[2001:db8::10]:53", lb.UDP, npBE("[fd00:10:244:2::7]:53", "node2")), FrontendOptions{Mode: ModeDSR})
	f.snat4 = npUDP("198.18.0.250:40000", "198.18.0.11:30053")
	f.snat6 = npUDP("[fd00:198:18::250]:40000", "[fd00:198:18::11]:30053")
	f.local4 = npUDP("198.18.0.250:40001", "198.18.0.11:30054")
	f.local6 = npUDP("[fd00:198:18::250]:40001", "[fd00:198:18::11]:30054")
	f.dsr4 = npUDP("198.18.0.250:40002", "192.0.2.10:53")
	f.dsr6 = npUDP("[fd00:198:18::250]:40002", "[2001:db8::10]:53")
	return f
}

// wireFrags: the fragments of a datagram of flow t from the client.
func (f *npFragFix) wireFrags(t Tuple, id uint32) [][]byte {
	return npWithMACs(npFrags(npPacketPayload(t, 0, npFragPayload), id, npFragChunk), f.upMAC, f.cliMAC)
}

// backendFrags: the fragments of a datagram of flow t arriving from node2.
func (f *npFragFix) backendFrags(t Tuple, id uint32) [][]byte {
	return npWithMACs(npFrags(npPacketPayload(t, 0, npFragPayload), id, npFragChunk), f.upMAC, f.gwMAC)
}

// natPort is the SNAT port of flow (from its CT entry).
func (f *npFragFix) natPort(t *testing.T, flow Tuple) uint16 {
	t.Helper()
	e, ok := f.ctFor(t, flow)
	if !ok {
		t.Fatalf("no CT entry for %s", flow)
	}
	return e.NATPort
}

func (f *npFragFix) node(v6 bool) netip.Addr {
	if v6 {
		return npNode6
	}
	return npNode
}

type npFragCase struct {
	desc  string
	setup *Tuple // an unfragmented datagram of this flow first (creates CT/NAT)
	// frags returns the input fragments and, once they ran, the expected output
	frags  func(t *testing.T) [][]byte
	expect func(t *testing.T, in [][]byte) [][]byte
	hook   string // "" = the loop's hook (tc, xdp); "egress"
	want   npVerdict
	reason string // counter every fragment moves (besides frag_tracked for the first)
	// wantTuple is the datagram as reassembled from the output (nil: DSR,
	// checked by bytes only)
	wantTuple func(t *testing.T) Tuple
}

func TestNodePortFragments(t *testing.T) {
	f := newNPFragFix(t, 0)
	const id = 0x4242
	var cases []npFragCase
	for _, v6 := range []bool{false, true} {
		fam := map[bool]string{false: "v4", true: "v6"}[v6]
		snat, local, dsr := f.snat4, f.local4, f.dsr4
		snatBE, localBE, dsrBE := npAP("10.244.2.6:5353"), npAP("10.244.1.6:5353"), netip.MustParseAddr("10.244.2.7")
		if v6 {
			snat, local, dsr = f.snat6, f.local6, f.dsr6
			snatBE, localBE, dsrBE = npAP("[fd00:10:244:2::6]:5353"), npAP("[fd00:10:244:1::6]:5353"), netip.MustParseAddr("fd00:10:244:2::7")
		}
		snatOut := func(t *testing.T) Tuple {
			return Tuple{Proto: lb.UDP, Src: netip.AddrPortFrom(f.node(v6), f.natPort(t, snat)), Dst: snatBE}
		}
		localOut := func(*testing.T) Tuple { return Tuple{Proto: lb.UDP, Src: local.Src, Dst: localBE} }
		back := func(fl Tuple) func(*testing.T) Tuple {
			return func(*testing.T) Tuple { return Tuple{Proto: lb.UDP, Src: fl.Dst, Dst: fl.Src} }
		}
		cases = append(cases,
			npFragCase{desc: fam + " NodePort SNAT, remote backend: every fragment SNATed + DNATed, TTL-1, FIB MACs",
				frags: func(*testing.T) [][]byte { return f.wireFrags(snat, id) },
				expect: func(t *testing.T, in [][]byte) [][]byte {
					exp := npWithMACs(npFrags(npPacketPayload(snatOut(t), 0, npFragPayload), id, npFragChunk), f.upMAC, f.cliMAC)
					for i := range exp {
						exp[i] = dptest.Forwarded(exp[i], f.gwMAC, f.upMAC)
					}
					return exp
				},
				want: npFwd, reason: "snat_fwd", wantTuple: snatOut},
			npFragCase{desc: fam + " NodePort, local backend: every fragment DNATed, client address kept",
				frags: func(*testing.T) [][]byte { return f.wireFrags(local, id) },
				expect: func(t *testing.T, in [][]byte) [][]byte {
					return npWithMACs(npFrags(npPacketPayload(localOut(t), 0, npFragPayload), id, npFragChunk), f.upMAC, f.cliMAC)
				},
				want: npNext, reason: "dnat_local", wantTuple: localOut},
			npFragCase{desc: fam + " LoadBalancer IP, DSR: every fragment encapsulated to the backend unchanged",
				frags: func(*testing.T) [][]byte { return f.wireFrags(dsr, id) },
				expect: func(t *testing.T, in [][]byte) [][]byte {
					exp := make([][]byte, len(in))
					for i := range in {
						exp[i] = npDSRFrame(in[i], f.node(v6), dsrBE, f.gwMAC, f.upMAC)
					}
					return exp
				},
				want: npFwd, reason: "dsr_encap"},
			npFragCase{desc: fam + " SNAT reply from the backend, fragmented: back to frontend -> client",
				setup: &snat,
				frags: func(t *testing.T) [][]byte {
					return f.backendFrags(Tuple{Proto: lb.UDP, Src: snatBE, Dst: netip.AddrPortFrom(f.node(v6), f.natPort(t, snat))}, id+1)
				},
				expect: func(t *testing.T, in [][]byte) [][]byte {
					exp := npWithMACs(npFrags(npPacketPayload(back(snat)(t), 0, npFragPayload), id+1, npFragChunk), f.upMAC, f.gwMAC)
					for i := range exp {
						exp[i] = dptest.Forwarded(exp[i], f.cliMAC, f.upMAC)
					}
					return exp
				},
				want: npFwd, reason: "rev_nat", wantTuple: back(snat)},
			npFragCase{desc: fam + " local backend's reply, fragmented, at uplink egress: frontend restored as source",
				setup: &local, hook: "egress",
				frags: func(t *testing.T) [][]byte {
					return npWithMACs(npFrags(npPacketPayload(Tuple{Proto: lb.UDP, Src: localBE, Dst: local.Src}, 0, npFragPayload), id+2, npFragChunk), f.gwMAC, f.upMAC)
				},
				expect: func(t *testing.T, in [][]byte) [][]byte {
					return npWithMACs(npFrags(npPacketPayload(back(local)(t), 0, npFragPayload), id+2, npFragChunk), f.gwMAC, f.upMAC)
				},
				want: npNext, reason: "egress_rev", wantTuple: back(local)},
		)
	}
	for _, c := range cases {
		for _, hook := range npHooks {
			t.Run(hook+"/"+c.desc, func(t *testing.T) {
				f.resetFlows(t)
				if c.setup != nil {
					if v, _ := f.run(t, hook, f.wirePkt(*c.setup, 0)); v == npDrop {
						t.Fatalf("setup datagram of %s dropped", *c.setup)
					}
				}
				rh := hook
				if c.hook != "" {
					rh = c.hook
				}
				in := c.frags(t)
				if len(in) != 3 {
					t.Fatalf("%d fragments, want first + middle + last", len(in))
				}
				var out [][]byte
				for i, fr := range in {
					before := f.counters(t)
					v, o := f.run(t, rh, fr)
					got := npMoved(before, f.counters(t), rh)
					if v != c.want {
						t.Fatalf("fragment %d: verdict %s, want %s (counters moved: %v)", i, v, c.want, got)
					}
					if got[c.reason] != 1 || got["frag_not_found"] != 0 || got["fragment"] != 0 {
						t.Errorf("fragment %d: counters %v, want %s 1", i, got, c.reason)
					}
					if i == 0 && got["frag_tracked"] != 1 {
						t.Errorf("first fragment: counters %v, want frag_tracked 1", got)
					}
					if i > 0 && got["frag_tracked"] != 0 {
						t.Errorf("fragment %d: counters %v, want no frag_tracked", i, got)
					}
					out = append(out, o)
				}
				exp := c.expect(t, in)
				for i := range out {
					if !bytes.Equal(out[i], exp[i]) {
						t.Errorf("fragment %d:\n got %x\nwant %x", i, out[i], exp[i])
					}
				}
				if c.wantTuple == nil {
					return
				}
				tu, err := npReassemble(out)
				if err != nil {
					t.Fatalf("reassembling the output: %v", err)
				}
				if w := c.wantTuple(t); tu != w {
					t.Errorf("reassembled datagram is %s, want %s", tu, w)
				}
			})
		}
	}
}

// TestNodePortFragmentsOutOfOrder: a later fragment ahead of its first is
// counted and passed on untouched; the datagram's fragments after the
// first are translated.
func TestNodePortFragmentsOutOfOrder(t *testing.T) {
	f := newNPFragFix(t, 0)
	for _, flow := range []Tuple{f.snat4, f.snat6} {
		for _, hook := range npHooks {
			t.Run(fmt.Sprintf("%s/%s", hook, flow), func(t *testing.T) {
				f.resetFlows(t)
				fr := f.wireFrags(flow, 7)
				// last, first, middle
				before := f.counters(t)
				v, out := f.run(t, hook, fr[2])
				got := npMoved(before, f.counters(t), hook)
				if v != npNext || !bytes.Equal(out, fr[2]) {
					t.Errorf("last fragment ahead of the first: verdict %s, changed %v", v, !bytes.Equal(out, fr[2]))
				}
				if got["frag_not_found"] != 1 || len(got) != 1 {
					t.Errorf("counters %v, want frag_not_found 1 only", got)
				}
				for _, i := range []int{0, 1} {
					before = f.counters(t)
					if v, _ := f.run(t, hook, fr[i]); v != npFwd {
						t.Errorf("fragment %d after: verdict %s, want fwd", i, v)
					}
					if got := npMoved(before, f.counters(t), hook); got["snat_fwd"] != 1 || got["frag_not_found"] != 0 {
						t.Errorf("fragment %d: counters %v", i, got)
					}
				}
			})
		}
	}
}

// TestNodePortFragmentsGarbage: truncated first fragments, IP id reuse,
// fragments of no service and of other protocols, a stale first fragment.
func TestNodePortFragmentsGarbage(t *testing.T) {
	f := newNPFragFix(t, 0)
	for _, hook := range npHooks {
		t.Run(hook+"/first fragment with a truncated UDP header: untouched, nothing recorded", func(t *testing.T) {
			f.resetFlows(t)
			for _, flow := range []Tuple{f.snat4, f.snat6} {
				fr := f.wireFrags(flow, 9)
				l4 := 34
				if flow.Src.Addr().Is6() {
					l4 = 62
				}
				short := fr[0][:l4+2]
				before := f.counters(t)
				v, out := f.run(t, hook, short)
				if got := npMoved(before, f.counters(t), hook); v != npNext || !bytes.Equal(out, short) || got["malformed"] != 1 || len(got) != 1 {
					t.Errorf("%s: verdict %s, counters %v, changed %v; want next, malformed 1, unchanged", flow, v, got, !bytes.Equal(out, short))
				}
				if v, out := f.run(t, hook, fr[1]); v != npNext || !bytes.Equal(out, fr[1]) {
					t.Errorf("%s: the next fragment: verdict %s, changed %v; want it untouched", flow, v, !bytes.Equal(out, fr[1]))
				}
			}
			if n, err := f.n.FragEntries(); err != nil || n != 0 {
				t.Errorf("axon_np_frag has %d entries (%v), want 0", n, err)
			}
		})
		t.Run(hook+"/IPv6 fragment header cut short: untouched, malformed", func(t *testing.T) {
			f.resetFlows(t)
			fr := f.wireFrags(f.snat6, 9)[0][:14+40+4]
			before := f.counters(t)
			v, out := f.run(t, hook, fr)
			if got := npMoved(before, f.counters(t), hook); v != npNext || !bytes.Equal(out, fr) || got["malformed"] != 1 {
				t.Errorf("verdict %s, counters %v", v, got)
			}
		})
		t.Run(hook+"/the same IP id from two clients: each datagram keeps its own flow", func(t *testing.T) {
			f.resetFlows(t)
			a, b := f.snat4, f.snat4
			b.Src = npAP("198.18.0.251:40000")
			fa, fb := f.wireFrags(a, 5), f.wireFrags(b, 5)
			var outA, outB [][]byte
			for i := range fa { // interleaved: a0 b0 a1 b1 a2 b2
				_, oa := f.run(t, hook, fa[i])
				_, ob := f.run(t, hook, fb[i])
				outA, outB = append(outA, oa), append(outB, ob)
			}
			for _, x := range []struct {
				flow Tuple
				out  [][]byte
			}{{a, outA}, {b, outB}} {
				tu, err := npReassemble(x.out)
				if err != nil {
					t.Fatalf("%s: %v", x.flow, err)
				}
				want := Tuple{Proto: lb.UDP, Src: netip.AddrPortFrom(npNode, f.natPort(t, x.flow)), Dst: npAP("10.244.2.6:5353")}
				if tu != want {
					t.Errorf("%s reassembles as %s, want %s", x.flow, tu, want)
				}
			}
		})
		t.Run(hook+"/the same IP id from one client, two ports: the newest first fragment wins", func(t *testing.T) {
			f.resetFlows(t)
			a, b := f.snat4, f.snat4
			b.Src = npAP("198.18.0.250:40100")
			fa, fb := f.wireFrags(a, 6), f.wireFrags(b, 6)
			f.run(t, hook, fa[0])
			f.run(t, hook, fb[0])
			_, o := f.run(t, hook, fa[1]) // a's middle fragment now follows b's flow
			natB := f.natPort(t, b)
			exp := npWithMACs(npFrags(npPacketPayload(Tuple{Proto: lb.UDP, Src: netip.AddrPortFrom(npNode, natB), Dst: npAP("10.244.2.6:5353")}, 0, npFragPayload), 6, npFragChunk), f.upMAC, f.cliMAC)
			// only the IP header is compared: the payload is a's
			if w := dptest.Forwarded(exp[1], f.gwMAC, f.upMAC); !bytes.Equal(o[:34], w[:34]) {
				t.Errorf("a's middle fragment:\n got %x\nwant %x (b's translation)", o[:34], w[:34])
			}
		})
		t.Run(hook+"/fragments to no service: untouched", func(t *testing.T) {
			f.resetFlows(t)
			for _, flow := range []Tuple{npUDP("198.18.0.250:40000", "198.18.0.11:9999"), npUDP("198.18.0.250:40000", "10.244.1.9:53"),
				npUDP("[fd00:198:18::250]:40000", "[fd00:198:18::11]:9999")} {
				for i, fr := range f.wireFrags(flow, 11) {
					before := f.counters(t)
					v, out := f.run(t, hook, fr)
					got := npMoved(before, f.counters(t), hook)
					if v != npNext || !bytes.Equal(out, fr) || got["not_service"] != 1 || got["frag_not_found"] != 0 {
						t.Errorf("%s fragment %d: verdict %s, counters %v, changed %v", flow, i, v, got, !bytes.Equal(out, fr))
					}
				}
			}
		})
		t.Run(hook+"/ICMP fragments: untouched, counted fragment", func(t *testing.T) {
			f.resetFlows(t)
			echo := make([]byte, 8+100)
			echo[0] = 8 // echo request
			for i, fr := range npWithMACs(npFrags(npFrame(npClient, npNode, 1, echo, true), 12, npFragChunk), f.upMAC, f.cliMAC) {
				before := f.counters(t)
				v, out := f.run(t, hook, fr)
				if got := npMoved(before, f.counters(t), hook); v != npNext || !bytes.Equal(out, fr) || got["fragment"] != 1 || len(got) != 1 {
					t.Errorf("fragment %d: verdict %s, counters %v", i, v, got)
				}
			}
		})
	}
	t.Run("a first fragment older than cfg_frag_timeout_ns (here 300 ms) serves no later fragment", func(t *testing.T) {
		f := newNPFragFix(t, 300*time.Millisecond)
		fr := f.wireFrags(f.snat4, 13)
		if v, _ := f.run(t, "tc", fr[0]); v != npFwd {
			t.Fatalf("first fragment: verdict %s", v)
		}
		time.Sleep(500 * time.Millisecond)
		before := f.counters(t)
		v, out := f.run(t, "tc", fr[1])
		if got := npMoved(before, f.counters(t), "tc"); v != npNext || !bytes.Equal(out, fr[1]) || got["frag_not_found"] != 1 {
			t.Errorf("later fragment 0.5 s after its first: verdict %s, counters %v", v, got)
		}
	})
}
