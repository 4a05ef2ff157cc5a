package nodeport

import (
	"bytes"
	"encoding/binary"
	"math/bits"
	"net/netip"
	"testing"
	"time"

	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/axonhq/axon/internal/lb"
)

// Multi-packet fixtures: conntrack hit/miss, reverse NAT, egress reverse
// translation, ICMP errors, a full table, affinity, Maglev, Explain.

func TestNodePortConntrack(t *testing.T) {
	f := newNPFix(t, nil)
	var bes []lb.Backend
	for i := 1; i <= 10; i++ {
		bes = append(bes, npBE(netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, 2, byte(i)}), 8080).String(), "node2"))
	}
	f.upsert(t, npNodePort(30080, lb.TCP, false, bes...), FrontendOptions{})
	flow := npTCP("198.18.0.250:40000", "198.18.0.11:30080")
	for _, hook := range npHooks {
		t.Run(hook, func(t *testing.T) {
			f.resetFlows(t)
			before := f.counters(t)
			var first []byte
			for i := 0; i < 20; i++ {
				flags := uint8(npACK)
				if i == 0 {
					flags = npSYN
				}
				v, out := f.run(t, hook, f.wirePkt(flow, flags))
				if v != npFwd {
					t.Fatalf("packet %d: verdict %s", i, v)
				}
				if i == 0 {
					first = out
				} else if !bytes.Equal(out[14+12:14+20], first[14+12:14+20]) || !bytes.Equal(out[34:38], first[34:38]) {
					t.Fatalf("packet %d went to %x, the first to %x: a CT hit must keep backend and SNAT port", i, out[26:38], first[26:38])
				}
			}
			got := npMoved(before, f.counters(t), hook)
			if got["ct_new"] != 1 || got["ct_hit"] != 19 || got["snat_fwd"] != 20 {
				t.Errorf("counters %v, want ct_new 1, ct_hit 19, snat_fwd 20", got)
			}
			es, _ := f.n.CT()
			if len(es) != 1 || es[0].Flow != flow || es[0].Mode != "snat" {
				t.Errorf("CT %+v, want one snat entry for %s", es, flow)
			}
			// FIN marks the entry closing; a later SYN (port reuse) picks again
			if v, _ := f.run(t, hook, f.wirePkt(flow, npFIN|npACK)); v != npFwd {
				t.Fatalf("FIN: verdict %s", v)
			}
			if e, _ := f.ctFor(t, flow); !e.Closing {
				t.Errorf("CT entry not closing after FIN: %+v", e)
			}
			b2 := f.counters(t)
			if v, _ := f.run(t, hook, f.wirePkt(flow, npSYN)); v != npFwd {
				t.Fatalf("new SYN: verdict %s", v)
			}
			if got := npMoved(b2, f.counters(t), hook); got["ct_new"] != 1 {
				t.Errorf("SYN on a closing entry: counters %v, want a new flow", got)
			}
		})
	}
}

func TestNodePortReverse(t *testing.T) {
	f := newNPFix(t, nil)
	f.upsert(t, npNodePort(30080, lb.TCP, false, npBE("10.244.2.5:8080", "node2")), FrontendOptions{})
	f.upsert(t, npNodePort(30080, lb.TCP, true, npBE("[fd00:10:244:2::5]:8080", "node2")), FrontendOptions{})
	f.upsert(t, npNodePort(30081, lb.TCP, false, npBE("10.244.1.5:8080", "node1")), FrontendOptions{})
	cases := []struct {
		desc       string
		flow       Tuple
		backend    string
		node       netip.Addr
		replyHook  string // where the reply is seen
		replyLocal bool   // local backend: reply leaves via egress with only the source changed
	}{
		{"v4 SNAT: backend reply to node:natport -> frontend to client, sent to the client's MAC",
			npTCP("198.18.0.250:40000", "198.18.0.11:30080"), "10.244.2.5:8080", npNode, "", false},
		{"v6 SNAT: reply translated back",
			npTCP("[fd00:198:18::250]:40000", "[fd00:198:18::11]:30080"), "[fd00:10:244:2::5]:8080", npNode6, "", false},
		{"local backend: reply at uplink egress gets the frontend as source",
			npTCP("198.18.0.250:40000", "198.18.0.11:30081"), "10.244.1.5:8080", npNode, "egress", true},
	}
	for _, c := range cases {
		for _, hook := range npHooks {
			t.Run(hook+"/"+c.desc, func(t *testing.T) {
				e := f.openFlow(t, hook, c.flow)
				var reply Tuple
				var want []byte
				rh := hook
				if c.replyLocal {
					reply = Tuple{Proto: lb.TCP, Src: npAP(c.backend), Dst: c.flow.Src}
					rh = "egress"
					want = npPacket(Tuple{Proto: lb.TCP, Src: c.flow.Dst, Dst: c.flow.Src}, npSYN|npACK)
				} else {
					reply = Tuple{Proto: lb.TCP, Src: npAP(c.backend), Dst: netip.AddrPortFrom(c.node, e.NATPort)}
					want = npPacket(Tuple{Proto: lb.TCP, Src: c.flow.Dst, Dst: c.flow.Src}, npSYN|npACK)
				}
				pkt := npPacket(reply, npSYN|npACK)
				copy(pkt[0:6], f.upMAC)
				copy(pkt[6:12], f.gwMAC)
				before := f.counters(t)
				v, out := f.run(t, rh, pkt)
				if c.replyLocal {
					copy(want[0:12], pkt[0:12])
					if v != npNext || !bytes.Equal(out, want) {
						t.Fatalf("egress: verdict %s\n got %x\nwant %x", v, out, want)
					}
					if got := npMoved(before, f.counters(t), "egress"); got["egress_rev"] != 1 {
						t.Errorf("egress counters %v", got)
					}
					return
				}
				copy(want[0:12], pkt[0:12])
				want = dptest.Forwarded(want, f.cliMAC, f.upMAC)
				if v != npFwd || !bytes.Equal(out, want) {
					t.Fatalf("reply: verdict %s\n got %x\nwant %x", v, out, want)
				}
				if got := npMoved(before, f.counters(t), rh); got["rev_nat"] != 1 {
					t.Errorf("counters %v, want rev_nat 1", got)
				}
			})
		}
	}
}

// icmpErr builds an ICMP(v6) error from src to dst quoting the first 8
// bytes of L4 of inner (a frame). typ/code: 3/4 frag needed (v4), 2/0
// packet too big (v6); mtu in the second word.
func icmpErr(src, dst netip.Addr, inner []byte, mtu uint16) []byte {
	ip := inner[14:]
	var quote []byte
	var msg []byte
	if src.Is4() {
		ihl := int(ip[0]&0x0f) * 4
		quote = append([]byte{}, ip[:ihl+8]...)
		msg = make([]byte, 8)
		msg[0], msg[1] = 3, 4
		binary.BigEndian.PutUint16(msg[6:], mtu)
		return npFrame(src, dst, 1, append(msg, quote...), true)
	}
	quote = append([]byte{}, ip[:40+8]...)
	msg = make([]byte, 8)
	msg[0] = 2
	binary.BigEndian.PutUint32(msg[4:], uint32(mtu))
	return npFrame(src, dst, 58, append(msg, quote...), true)
}

func TestNodePortICMPErrors(t *testing.T) {
	f := newNPFix(t, nil)
	f.upsert(t, npNodePort(30080, lb.TCP, false, npBE("10.244.2.5:8080", "node2")), FrontendOptions{})
	f.upsert(t, npNodePort(30080, lb.TCP, true, npBE("[fd00:10:244:2::5]:8080", "node2")), FrontendOptions{})
	f.upsert(t, npNodePort(30081, lb.TCP, false, npBE("10.244.1.5:8080", "node1")), FrontendOptions{})
	f.upsert(t, npVIP("192.0.2.10:80", lb.TCP, npBE("10.244.2.7:80", "node2")), FrontendOptions{Mode: ModeDSR})
	router := netip.MustParseAddr("198.18.0.1")
	router6 := netip.MustParseAddr("fd00:198:18::1")
	type icase struct {
		desc string
		flow Tuple
		// build returns the error packet and what must come out (nil: not compared)
		build func(e CTEntry) (in, want []byte)
		want  npVerdict
	}
	frame := func(tup Tuple) []byte { return npPacket(tup, npACK) }
	// aboutSNATReply builds the case of an ICMP error (from router, 1280
	// bytes) about the node's reply front -> client of a SNAT flow: it must
	// reach backend as an error about the packet the backend sent.
	aboutSNATReply := func(router, node netip.Addr, front, client, backend string) func(e CTEntry) ([]byte, []byte) {
		return func(e CTEntry) ([]byte, []byte) {
			be := npAP(backend)
			reply := frame(npTCP(front, client))
			in := icmpErr(router, node, reply, 1280)
			backendSent := frame(Tuple{Proto: lb.TCP, Src: be, Dst: netip.AddrPortFrom(node, e.NATPort)})
			want := icmpErr(node, be.Addr(), backendSent, 1280)
			return in, dptest.Forwarded(want, f.gwMAC, f.upMAC)
		}
	}
	cases := []icase{
		{"v4 frag needed about a packet sent to the backend (SNAT): inner back to client -> frontend, outer frontend -> client",
			npTCP("198.18.0.250:40000", "198.18.0.11:30080"), func(e CTEntry) ([]byte, []byte) {
				sent := frame(Tuple{Proto: lb.TCP, Src: netip.AddrPortFrom(npNode, e.NATPort), Dst: npAP("10.244.2.5:8080")})
				in := icmpErr(router, npNode, sent, 1400)
				orig := frame(npTCP("198.18.0.250:40000", "198.18.0.11:30080"))
				want := icmpErr(npNode, npClient, orig, 1400)
				return in, dptest.Forwarded(want, f.cliMAC, f.upMAC)
			}, npFwd},
		{"v4 frag needed about a reply sent to the client (SNAT): to the backend as if about what it sent",
			npTCP("198.18.0.250:40000", "198.18.0.11:30080"), aboutSNATReply(router, npNode, "198.18.0.11:30080", "198.18.0.250:40000", "10.244.2.5:8080"), npFwd},
		{"v6 packet too big about a reply (SNAT): to the backend",
			npTCP("[fd00:198:18::250]:40000", "[fd00:198:18::11]:30080"), aboutSNATReply(router6, npNode6, "[fd00:198:18::11]:30080", "[fd00:198:18::250]:40000", "[fd00:10:244:2::5]:8080"), npFwd},
		{"v4 frag needed about a local backend's reply: to the pod, continue to uplink_ingress",
			npTCP("198.18.0.250:40000", "198.18.0.11:30081"), func(e CTEntry) ([]byte, []byte) {
				reply := frame(npTCP("198.18.0.11:30081", "198.18.0.250:40000"))
				in := icmpErr(router, npNode, reply, 1280)
				podSent := frame(npTCP("10.244.1.5:8080", "198.18.0.250:40000"))
				want := icmpErr(router, netip.MustParseAddr("10.244.1.5"), podSent, 1280)
				return in, want
			}, npNext},
		{"v4 frag needed about a DSR reply: IPIP to the backend, unchanged inside",
			npTCP("198.18.0.250:40000", "192.0.2.10:80"), func(e CTEntry) ([]byte, []byte) {
				reply := frame(npTCP("192.0.2.10:80", "198.18.0.250:40000"))
				in := icmpErr(router, netip.MustParseAddr("192.0.2.10"), reply, 1280)
				return in, npDSRFrame(in, npNode, netip.MustParseAddr("10.244.2.7"), f.gwMAC, f.upMAC)
			}, npFwd},
		{"ICMP error about an unknown flow: untouched",
			npTCP("198.18.0.250:40000", "198.18.0.11:30080"), func(e CTEntry) ([]byte, []byte) {
				other := frame(npTCP("198.18.0.11:22", "198.18.0.250:40000"))
				in := icmpErr(router, npNode, other, 1280)
				return in, in
			}, npNext},
	}
	for _, c := range cases {
		for _, hook := range npHooks {
			t.Run(hook+"/"+c.desc, func(t *testing.T) {
				e := f.openFlow(t, hook, c.flow)
				in, want := c.build(e)
				v, out := f.run(t, hook, in)
				if v != c.want {
					t.Fatalf("verdict %s, want %s", v, c.want)
				}
				if want != nil && !bytes.Equal(out, want) {
					t.Fatalf("output:\n got %x\nwant %x", out, want)
				}
			})
		}
	}
}

func TestNodePortTableFull(t *testing.T) {
	const ctMax = 256
	f := newNPFix(t, func(o *Options) { o.CTMax = ctMax })
	f.upsert(t, npNodePort(30080, lb.TCP, false, npBE("10.244.2.5:8080", "node2")), FrontendOptions{})
	const flows = 1500
	for _, hook := range npHooks {
		t.Run(hook, func(t *testing.T) {
			f.resetFlows(t)
			before := f.counters(t)
			for i := 0; i < flows; i++ {
				src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{203, 0, byte(i >> 8), byte(i)}), uint16(10000+i))
				flow := Tuple{Proto: lb.TCP, Src: src, Dst: npAP("198.18.0.11:30080")}
				if v, _ := f.run(t, hook, f.wirePkt(flow, npSYN)); v != npFwd && v != npNext {
					t.Fatalf("flow %d: verdict %s: a full table must not drop (counters %v)", i, v, npMoved(before, f.counters(t), hook))
				}
			}
			st, err := f.n.CTStats()
			if err != nil {
				t.Fatal(err)
			}
			got := npMoved(before, f.counters(t), hook)
			if got["ct_new"]+got["ct_insert_fail"] != flows {
				t.Errorf("counters %v: every flow must be set up", got)
			}
			// new flows (SYNs, never answered) go to the unreplied table,
			// ctMax/4 entries
			if st.Unreplied > ctMax/4+ctMax/16 || st.UnrepliedMax != ctMax/4 || st.Max != ctMax || st.Entries != 0 {
				t.Errorf("CT stats %+v: the unreplied LRU table must stay near its size %d, the established one empty", st, ctMax/4)
			}
			t.Logf("%s: %d flows into a %d-entry unreplied table: %d entries, %d created, %d evicted", hook, flows, ctMax/4, st.Unreplied, got["ct_new"], got["ct_new"]-uint64(st.Unreplied))
		})
	}
}

func TestNodePortAffinity(t *testing.T) {
	f := newNPFix(t, nil)
	var bes []lb.Backend
	for i := 1; i <= 8; i++ {
		bes = append(bes, npBE(netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, 2, byte(i)}), 80).String(), "node2"))
	}
	fe := npVIP("192.0.2.80:80", lb.TCP, bes...)
	fe.Affinity = 30 * 1e9
	f.upsert(t, fe, FrontendOptions{})
	for _, hook := range npHooks {
		t.Run(hook, func(t *testing.T) {
			f.resetFlows(t)
			seen := map[netip.AddrPort]int{}
			for i := 0; i < 16; i++ {
				flow := Tuple{Proto: lb.TCP, Src: netip.AddrPortFrom(npClient, uint16(41000+i)), Dst: npAP("192.0.2.80:80")}
				if v, _ := f.run(t, hook, f.wirePkt(flow, npSYN)); v != npFwd {
					t.Fatalf("verdict %s", v)
				}
				e, _ := f.ctFor(t, flow)
				seen[e.Backend]++
			}
			if len(seen) != 1 {
				t.Errorf("16 connections of one client went to %d backends %v: sessionAffinity ClientIP keeps one", len(seen), seen)
			}
		})
	}
}

// npHashTuple is bpf/lib/maglev.h's np_hash_tuple.
func npHashTuple(t Tuple, seed uint32) uint32 {
	k := npTuple(t)
	var b [40]byte
	copy(b[0:], k.Saddr[:])
	copy(b[16:], k.Daddr[:])
	binary.NativeEndian.PutUint16(b[32:], k.Sport)
	binary.NativeEndian.PutUint16(b[34:], k.Dport)
	b[36] = k.Proto
	h := seed
	for i := 0; i < 10; i++ {
		w := binary.NativeEndian.Uint32(b[i*4:])
		w *= 0xcc9e2d51
		w = bits.RotateLeft32(w, 15) * 0x1b873593
		h ^= w
		h = bits.RotateLeft32(h, 13)*5 + 0xe6546b64
	}
	h ^= 40
	h ^= h >> 16
	h *= 0x85ebca6b
	h ^= h >> 13
	h *= 0xc2b2ae35
	h ^= h >> 16
	return h
}

func TestNodePortMaglev(t *testing.T) {
	const m = 251
	f := newNPFix(t, func(o *Options) { o.MaglevTableSize = m })
	bes := []lb.Backend{npBE("10.244.2.3:80", "node2"), npBE("10.244.2.1:80", "node2"), npBE("10.244.2.2:80", "node2")}
	table := make([]uint32, m) // slot i -> backend i%3 (caller's order)
	for i := range table {
		table[i] = uint32(i % 3)
	}
	fe := npVIP("192.0.2.90:80", lb.TCP, bes...)
	f.upsert(t, fe, FrontendOptions{Maglev: table})
	got, err := f.n.MaglevTable(fe.Key)
	if err != nil {
		t.Fatal(err)
	}
	for i := range table {
		if want := netip.AddrPortFrom(bes[table[i]].Addr, bes[table[i]].Port); got[i] != want {
			t.Fatalf("MaglevTable slot %d = %s, want %s", i, got[i], want)
		}
	}
	for _, hook := range npHooks {
		t.Run(hook, func(t *testing.T) {
			f.resetFlows(t)
			for i := 0; i < 40; i++ {
				flow := Tuple{Proto: lb.TCP, Src: netip.AddrPortFrom(netip.AddrFrom4([4]byte{203, 0, 113, byte(i)}), uint16(30000+i*7)), Dst: npAP("192.0.2.90:80")}
				ex, err := f.n.Explain(flow)
				if err != nil {
					t.Fatal(err)
				}
				if v, _ := f.run(t, hook, f.wirePkt(flow, npSYN)); v != npFwd {
					t.Fatalf("verdict %s", v)
				}
				e, _ := f.ctFor(t, flow)
				want := got[npHashTuple(flow, DefaultHashSeed)%m]
				if e.Backend != want || ex.Backend != want {
					t.Fatalf("flow %s: backend %s, Explain said %s, Maglev slot says %s", flow, e.Backend, ex.Backend, want)
				}
			}
		})
	}
	// back to random: the table goes
	if err := f.n.UpsertFrontendWith(fe, FrontendOptions{}); err != nil {
		t.Fatal(err)
	}
	if got, err := f.n.MaglevTable(fe.Key); err != nil || got != nil {
		t.Errorf("after switching to random: table %d slots, err %v", len(got), err)
	}
	if err := f.n.UpsertFrontendWith(fe, FrontendOptions{Maglev: table[:10]}); err == nil {
		t.Error("a table of the wrong size was accepted")
	}
}

func TestNodePortExplain(t *testing.T) {
	f := newNPFix(t, nil)
	f.upsert(t, npNodePort(30080, lb.TCP, false, npBE("10.244.2.5:8080", "node2")), FrontendOptions{})
	f.upsert(t, npNodePort(30081, lb.TCP, false, npBE("10.244.1.5:8080", "node1")), FrontendOptions{})
	f.upsert(t, npVIP("192.0.2.30:80", lb.TCP, npBE("10.244.2.8:80", "node2")),
		FrontendOptions{SourceRanges: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}})
	cases := []struct {
		desc, proto, src, dst  string
		verdict, mode, backend string
	}{
		{"NodePort, remote backend", "tcp", "203.0.113.7:40000", "198.18.0.11:30080", "snat_fwd", "snat", "10.244.2.5:8080"},
		{"NodePort, local backend", "tcp", "203.0.113.7:40000", "198.18.0.11:30081", "dnat_local", "local", "10.244.1.5:8080"},
		{"source range refuses", "tcp", "203.0.113.7:40000", "192.0.2.30:80", "drop_src_range", "", ""},
		{"no service", "udp", "203.0.113.7:40000", "198.18.0.11:53", "not_service", "", ""},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			tup, err := ParseTuple(c.proto, c.src, c.dst)
			if err != nil {
				t.Fatal(err)
			}
			before, _ := f.n.CTStats()
			ex, err := f.n.Explain(tup)
			if err != nil {
				t.Fatal(err)
			}
			after, _ := f.n.CTStats()
			if ex.Verdict != c.verdict || ex.Mode != c.mode || (c.backend != "" && ex.Backend.String() != c.backend) {
				t.Errorf("explain %s = %+v, want %s %s %s", tup, ex, c.verdict, c.mode, c.backend)
			}
			if after.Entries != before.Entries || after.Created != before.Created {
				t.Errorf("Explain wrote CT state: %+v -> %+v", before, after)
			}
		})
	}
	// an existing flow is reported as such
	flow := npTCP("203.0.113.9:40000", "198.18.0.11:30080")
	if v, _ := f.run(t, "tc", f.wirePkt(flow, npSYN)); v != npFwd {
		t.Fatal("SYN not dptest.Forwarded")
	}
	ex, err := f.n.Explain(flow)
	if err != nil || !ex.Existing || ex.Backend != npAP("10.244.2.5:8080") {
		t.Errorf("explain of an established flow: %+v, %v", ex, err)
	}
	if _, err := ParseTuple("icmp", "1.2.3.4:1", "1.2.3.4:2"); err == nil {
		t.Error("ParseTuple accepted icmp")
	}
}

// TestNodePortDecap: the backend-side program strips exactly the header the
// LB's DSR encapsulation added, and leaves everything else alone.
func TestNodePortDecap(t *testing.T) {
	f := newNPFix(t, nil)
	for _, c := range []struct {
		desc     string
		inner    []byte
		src, dst netip.Addr
		encap    bool
	}{
		{"IPv4 in IPv4: outer header removed", f.wirePkt(npTCP("198.18.0.250:40000", "192.0.2.10:80"), npSYN), npNode, netip.MustParseAddr("10.244.2.7"), true},
		{"IPv6 in IPv6: outer header removed", f.wirePkt(npTCP("[fd00:198:18::250]:40000", "[2001:db8::10]:80"), npSYN), npNode6, netip.MustParseAddr("fd00:10:244:2::7"), true},
		{"plain TCP: untouched", f.wirePkt(npTCP("198.18.0.250:40000", "192.0.2.10:80"), npSYN), netip.Addr{}, netip.Addr{}, false},
	} {
		t.Run(c.desc, func(t *testing.T) {
			in := c.inner
			if c.encap {
				in = npDSRFrame(c.inner, c.src, c.dst, f.upMAC, f.gwMAC)
			}
			before := f.counters(t)
			v, out := f.run(t, "decap", in)
			want := append([]byte(nil), c.inner...)
			copy(want[0:12], in[0:12])
			if v != npNext || !bytes.Equal(out, want) {
				t.Fatalf("verdict %s\n got %x\nwant %x", v, out, want)
			}
			got := npMoved(before, f.counters(t), "egress")
			if (got["dsr_decap"] == 1) != c.encap {
				t.Errorf("dsr_decap moved by %d", got["dsr_decap"])
			}
		})
	}
}

// TestNodePortDecapMalformed: axon_lb_decap removes only what the DSR
// encapsulation adds, around headers the shared parser (bpf/lib/eth_ip.h)
// accepts: an outer header that is not valid IPv4 / IPv6 of its ethertype,
// or an inner one that is not, leaves the packet as it is.
func TestNodePortDecapMalformed(t *testing.T) {
	f := newNPFix(t, nil)
	v4 := func() []byte {
		return npDSRFrame(f.wirePkt(npTCP("198.18.0.250:40000", "192.0.2.10:80"), npSYN), npNode, netip.MustParseAddr("10.244.2.7"), f.upMAC, f.gwMAC)
	}
	v6 := func() []byte {
		return npDSRFrame(f.wirePkt(npTCP("[fd00:198:18::250]:40000", "[2001:db8::10]:80"), npSYN), npNode6, netip.MustParseAddr("fd00:10:244:2::7"), f.upMAC, f.gwMAC)
	}
	for _, c := range []struct {
		desc string
		in   []byte
	}{
		{"IPv4 outer header of version 6", func() []byte { b := v4(); b[14] = 0x65; return b }()},
		{"IPv4 outer header with options", func() []byte { b := v4(); b[14] = 0x46; return b }()},
		{"IPv4 outer header of a fragment", func() []byte { b := v4(); b[14+6] = 0x20; return b }()},
		{"IPv4 inner header with IHL 4", func() []byte { b := v4(); b[14+20] = 0x44; return b }()},
		{"IPv4 inner header of version 6", func() []byte { b := v4(); b[14+20] = 0x65; return b }()},
		{"IPv6 outer header of version 4", func() []byte { b := v6(); b[14] = 0x40 | b[14]&0x0f; return b }()},
		{"IPv6 inner header of version 4", func() []byte { b := v6(); b[14+40] = 0x40 | b[14+40]&0x0f; return b }()},
	} {
		t.Run(c.desc, func(t *testing.T) {
			before := f.counters(t)
			v, out := f.run(t, "decap", c.in)
			if v != npNext || !bytes.Equal(out, c.in) {
				t.Fatalf("verdict %s, changed %v; want next, untouched", v, !bytes.Equal(out, c.in))
			}
			if got := npMoved(before, f.counters(t), "egress"); len(got) != 0 {
				t.Errorf("counters moved: %v", got)
			}
		})
	}
}

// TestNodePortGC: GC keeps live flows, drops idle ones and those whose
// backend left the frontend (with their reverse entries).
func TestNodePortGC(t *testing.T) {
	f := newNPFix(t, nil)
	fe := npNodePort(30080, lb.TCP, false, npBE("10.244.2.5:8080", "node2"), npBE("10.244.2.6:8080", "node2"))
	f.upsert(t, fe, FrontendOptions{})
	f.upsert(t, npNodePort(30053, lb.UDP, false, npBE("10.244.2.6:53", "node2")), FrontendOptions{})
	for i := 0; i < 20; i++ {
		// answered flows: established (unanswered ones: TestNodePortUnreplied)
		flow := Tuple{Proto: lb.TCP, Src: netip.AddrPortFrom(npClient, uint16(40000+i)), Dst: npAP("198.18.0.11:30080")}
		f.run(t, "tc", f.wirePkt(flow, npSYN))
		e, ok := f.ctFor(t, flow)
		if !ok {
			t.Fatalf("flow %s: no CT entry", flow)
		}
		f.npEstablish(t, "tc", flow, e)
	}
	f.run(t, "tc", f.wirePkt(npUDP("198.18.0.250:5000", "198.18.0.11:30053"), 0))
	st, err := f.n.GC(DefaultCTTimeouts)
	if err != nil || st.CTDeleted != 0 || st.CTEntries != 21 || st.NATEntries != 21 {
		t.Fatalf("GC of fresh flows: %+v, %v", st, err)
	}
	nat, _ := f.n.NAT()
	if len(nat) != 21 || nat[0].Kind != "snat" {
		t.Errorf("NAT list: %d entries, first %+v", len(nat), nat[0])
	}
	// one backend leaves: its flows keep it while they move (a flow whose
	// SYN raced the removal must not be cut), and go once idle for the
	// closing timeout
	fe.Backends = fe.Backends[:1]
	f.upsert(t, fe, FrontendOptions{})
	st, err = f.n.GC(DefaultCTTimeouts)
	if err != nil || st.CTDeleted != 0 {
		t.Fatalf("GC right after a backend left: %+v, %v: its fresh flows must stay", st, err)
	}
	onGone := 0
	for _, e := range mustCT(t, f.n) {
		if e.Backend == npAP("10.244.2.6:8080") && e.Flow.Proto == lb.TCP {
			onGone++
		}
	}
	if onGone == 0 || onGone == 20 {
		t.Fatalf("%d of 20 flows on the removed backend: random pick over 2 backends should put some on each", onGone)
	}
	time.Sleep(20 * time.Millisecond)
	st, err = f.n.GC(CTTimeouts{TCP: time.Hour, UDP: time.Hour, TCPClosing: time.Millisecond})
	if err != nil || st.CTDeleted != onGone {
		t.Fatalf("GC after the closing timeout: %+v, %v: want the %d flows of the removed backend gone", st, err, onGone)
	}
	for _, e := range mustCT(t, f.n) {
		if e.Backend == npAP("10.244.2.6:8080") && e.Flow.Proto == lb.TCP {
			t.Errorf("idle flow to the removed backend kept: %+v", e)
		}
	}
	// idle timeouts
	st, err = f.n.GC(CTTimeouts{TCP: time.Hour, UDP: time.Millisecond, TCPClosing: time.Millisecond})
	if err != nil || st.CTDeleted != 1 {
		t.Fatalf("GC with a 1 ms UDP timeout: %+v, %v: want the UDP flow gone", st, err)
	}
	// the SNAT ports of the ended TCP flows stay reserved for SNATTimeWait
	if nat, err := f.n.NAT(); err != nil || len(nat) != 20 {
		t.Errorf("after GC: %d reverse NAT entries (%v), want the 20 TCP reservations held (SNATTimeWait)", len(nat), err)
	}
	st, err = f.n.GC(CTTimeouts{TCP: time.Hour, UDP: time.Millisecond, TCPClosing: time.Millisecond, SNATTimeWait: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	cs, err := f.n.CTStats()
	if err != nil || cs.Entries != len(mustCT(t, f.n)) || cs.Created != 21 {
		t.Errorf("CT stats %+v, %v", cs, err)
	}
	// the reverse (SNAT) entries of the flows that are gone went with them,
	// so their SNAT ports are free again: one per remaining flow
	if nat, err := f.n.NAT(); err != nil || len(nat) != cs.Entries {
		t.Errorf("after GC: %d reverse NAT entries for %d flows (%v): SNAT ports of ended flows must be freed", len(nat), cs.Entries, err)
	}
}

// TestNodePortGCUDPBackendReplaced: a UDP flow whose backend left the
// frontend (its server pod replaced) loses its CT entry at the next GC even
// while its client keeps sending, as kube-proxy clears a removed UDP
// endpoint's conntrack entries; its next datagram opens a flow to the
// backend that is there. (A TCP flow keeps a gone backend while it moves:
// TestNodePortGC.)
func TestNodePortGCUDPBackendReplaced(t *testing.T) {
	f := newNPFix(t, nil)
	fe := npNodePort(30053, lb.UDP, false, npBE("10.244.2.6:53", "node2"))
	f.upsert(t, fe, FrontendOptions{})
	flow := npUDP("198.18.0.250:5000", "198.18.0.11:30053")
	f.run(t, "tc", f.wirePkt(flow, 0))
	e, ok := f.ctFor(t, flow)
	if !ok || e.Backend != npAP("10.244.2.6:53") {
		t.Fatalf("flow %s: entry %+v, %v; want one to 10.244.2.6:53", flow, e, ok)
	}
	f.npEstablish(t, "tc", flow, e)
	if st, err := f.n.GC(DefaultCTTimeouts); err != nil || st.CTDeleted != 0 {
		t.Fatalf("GC with the backend there: %+v, %v; want the fresh UDP flow kept", st, err)
	}
	fe.Backends = []lb.Backend{npBE("10.244.2.7:53", "node2")} // the server pod replaced
	f.upsert(t, fe, FrontendOptions{})
	f.run(t, "tc", f.wirePkt(flow, 0)) // the client keeps sending: a hit, still to the old backend
	if e, ok := f.ctFor(t, flow); !ok || e.Backend != npAP("10.244.2.6:53") {
		t.Fatalf("before GC: entry %+v, %v; want the old backend's (nothing else removes it)", e, ok)
	}
	if st, err := f.n.GC(DefaultCTTimeouts); err != nil || st.CTDeleted != 1 {
		t.Fatalf("GC after the backend was replaced: %+v, %v; want the moving UDP flow's entry deleted", st, err)
	}
	if e, ok := f.ctFor(t, flow); ok {
		t.Fatalf("after GC: entry %+v left", e)
	}
	f.run(t, "tc", f.wirePkt(flow, 0))
	if e, ok := f.ctFor(t, flow); !ok || e.Backend != npAP("10.244.2.7:53") {
		t.Errorf("the next datagram: entry %+v, %v; want the new backend 10.244.2.7:53", e, ok)
	}
}

func mustCT(t *testing.T, n *LB) []CTEntry {
	t.Helper()
	es, err := n.CT()
	if err != nil {
		t.Fatal(err)
	}
	return es
}

// openFlow starts from an empty connection table, sends the SYN of flow
// through hook and returns the CT entry it created; a dropped SYN or a
// missing entry fails the test.
func (f *npFix) openFlow(t *testing.T, hook string, flow Tuple) CTEntry {
	t.Helper()
	f.resetFlows(t)
	if v, _ := f.run(t, hook, f.wirePkt(flow, npSYN)); v == npDrop {
		t.Fatal("SYN dropped")
	}
	e, ok := f.ctFor(t, flow)
	if !ok {
		t.Fatal("no CT entry")
	}
	return e
}
