package nodeport

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/axonhq/axon/internal/datapath/lbmap"
	"github.com/axonhq/axon/internal/lb"
)

// Conntrack of handshake-less and unanswered flows: what may open a flow,
// the unreplied state, established flows under a flood of new ones.

// TestNodePortNoSYNNoFlow: a TCP packet without an entry opens a flow only
// when it is a SYN without ACK. Anything else (a stray ACK, a SYN-ACK, a
// RST, data of a flow this LB never saw) is handed to the stack untouched,
// without a CT or NAT entry (ct_no_syn counts it), so a flood of such
// packets cannot fill the table or reserve SNAT ports.
func TestNodePortNoSYNNoFlow(t *testing.T) {
	f := newNPFix(t, nil)
	f.upsert(t, npNodePort(30080, lb.TCP, false, npBE("10.244.2.5:8080", "node2")), FrontendOptions{})
	f.upsert(t, npNodePort(30081, lb.TCP, false, npBE("10.244.1.5:8080", "node1")), FrontendOptions{})
	cases := []struct {
		desc  string
		flags uint8
	}{
		{"ACK", npACK},
		{"SYN-ACK", npSYN | npACK},
		{"RST", npRST},
		{"FIN-ACK", npFIN | npACK},
		{"data (PSH-ACK)", 0x08 | npACK},
		{"no flags", 0},
	}
	for _, hook := range npHooks {
		for _, dst := range []string{"198.18.0.11:30080", "198.18.0.11:30081"} {
			for _, c := range cases {
				t.Run(hook+"/"+dst+"/"+c.desc, func(t *testing.T) {
					f.resetFlows(t)
					flow := npTCP("198.18.0.250:40000", dst)
					pkt := f.wirePkt(flow, c.flags)
					before := f.counters(t)
					v, out := f.run(t, hook, pkt)
					if v != npNext || string(out) != string(pkt) {
						t.Errorf("verdict %s, changed %v: want next, untouched", v, string(out) != string(pkt))
					}
					if got := npMoved(before, f.counters(t), hook); got["ct_no_syn"] != 1 || got["ct_new"] != 0 {
						t.Errorf("counters %v: want ct_no_syn 1 and no ct_new", got)
					}
					if es := mustCT(t, f.n); len(es) != 0 {
						t.Errorf("CT entries %+v: a packet without SYN must not open a flow", es)
					}
					if nat, err := f.n.NAT(); err != nil || len(nat) != 0 {
						t.Errorf("NAT entries %+v (%v): no SNAT port for a packet without SYN", nat, err)
					}
				})
			}
		}
		t.Run(hook+"/SYN opens, the ACK continues it", func(t *testing.T) {
			f.resetFlows(t)
			flow := npTCP("198.18.0.250:40001", "198.18.0.11:30080")
			before := f.counters(t)
			if v, _ := f.run(t, hook, f.wirePkt(flow, npSYN)); v != npFwd {
				t.Fatalf("SYN: verdict %s", v)
			}
			if v, _ := f.run(t, hook, f.wirePkt(flow, npACK)); v != npFwd {
				t.Fatalf("ACK: verdict %s", v)
			}
			if got := npMoved(before, f.counters(t), hook); got["ct_new"] != 1 || got["ct_hit"] != 1 || got["ct_no_syn"] != 0 {
				t.Errorf("counters %v: want ct_new 1, ct_hit 1", got)
			}
		})
		t.Run(hook+"/UDP: every datagram may open a flow", func(t *testing.T) {
			f.resetFlows(t)
			f.upsert(t, npNodePort(30053, lb.UDP, false, npBE("10.244.2.6:53", "node2")), FrontendOptions{})
			before := f.counters(t)
			if v, _ := f.run(t, hook, f.wirePkt(npUDP("198.18.0.250:5000", "198.18.0.11:30053"), 0)); v != npFwd {
				t.Fatalf("verdict %s", v)
			}
			if got := npMoved(before, f.counters(t), hook); got["ct_new"] != 1 {
				t.Errorf("counters %v: want ct_new 1", got)
			}
		})
	}
}

// npEstablish completes the handshake of flow (opened through hook, entry
// e): the backend's reply (npReply), then for TCP the client's ACK.
func (f *npFix) npEstablish(t *testing.T, hook string, flow Tuple, e CTEntry) {
	t.Helper()
	f.npReply(t, hook, flow, e)
	if flow.Proto == lb.TCP && e.Mode != "dsr" {
		if v, _ := f.run(t, hook, f.wirePkt(flow, npACK)); v == npDrop {
			t.Fatalf("the client's ACK: dropped")
		}
	}
}

// npReply sends the first reply of flow (opened through hook, entry e)
// where the LB sees it: an SNAT backend's at the ingress hook (reverse
// NAT), a local backend's at the uplink egress. DSR replies never pass
// this node: the client's second packet (its ACK) stands for the reply.
func (f *npFix) npReply(t *testing.T, hook string, flow Tuple, e CTEntry) {
	t.Helper()
	var v npVerdict
	switch e.Mode {
	case "snat":
		node := npNode
		if flow.Dst.Addr().Is6() {
			node = npNode6
		}
		pkt := npPacket(Tuple{Proto: flow.Proto, Src: e.Backend, Dst: netip.AddrPortFrom(node, e.NATPort)}, npSYN|npACK)
		copy(pkt[0:6], f.upMAC)
		copy(pkt[6:12], f.gwMAC)
		if v, _ = f.run(t, hook, pkt); v != npFwd {
			t.Fatalf("SNAT reply: verdict %s", v)
		}
	case "local":
		pkt := npPacket(Tuple{Proto: flow.Proto, Src: e.Backend, Dst: flow.Src}, npSYN|npACK)
		if v, _ = f.run(t, "egress", pkt); v != npNext {
			t.Fatalf("local reply at egress: verdict %s", v)
		}
	case "dsr":
		if v, _ = f.run(t, hook, f.wirePkt(flow, npACK)); v != npFwd {
			t.Fatalf("DSR: the client's ACK: verdict %s", v)
		}
	default:
		t.Fatalf("mode %q", e.Mode)
	}
}

// TestNodePortUnreplied: a flow whose backend never answered (an
// unanswered or spoofed SYN, a UDP datagram without reply) is removed by GC
// after the short unreplied timeout (TCPUnreplied 60 s, UDPUnreplied 30 s
// by default) instead of the established one (6 h, 60 s), and its SNAT port
// is free at once: the backend never answered, so it holds no TIME_WAIT
// for the port. The first reply (for DSR: the client's second packet)
// makes the flow established. GC runs with a clock moved forward.
func TestNodePortUnreplied(t *testing.T) {
	f := newNPFix(t, nil)
	f.upsert(t, npNodePort(30080, lb.TCP, false, npBE("10.244.2.5:8080", "node2")), FrontendOptions{})
	f.upsert(t, npNodePort(30081, lb.TCP, false, npBE("10.244.1.5:8080", "node1")), FrontendOptions{})
	f.upsert(t, npVIP("192.0.2.10:80", lb.TCP, npBE("10.244.2.7:80", "node2")), FrontendOptions{Mode: ModeDSR})
	f.upsert(t, npNodePort(30053, lb.UDP, false, npBE("10.244.2.6:53", "node2")), FrontendOptions{})
	f.upsert(t, npNodePort(30054, lb.UDP, false, npBE("10.244.1.6:53", "node1")), FrontendOptions{})
	cases := []struct {
		desc    string
		flow    Tuple
		mode    string
		timeout time.Duration // the unreplied timeout that applies
	}{
		{"TCP, SNAT backend", npTCP("198.18.0.250:40000", "198.18.0.11:30080"), "snat", 60 * time.Second},
		{"TCP, local backend", npTCP("198.18.0.250:40000", "198.18.0.11:30081"), "local", 60 * time.Second},
		{"TCP, DSR backend", npTCP("198.18.0.250:40000", "192.0.2.10:80"), "dsr", 60 * time.Second},
		{"UDP, SNAT backend", npUDP("198.18.0.250:5000", "198.18.0.11:30053"), "snat", 30 * time.Second},
		{"UDP, local backend", npUDP("198.18.0.250:5000", "198.18.0.11:30054"), "local", 30 * time.Second},
	}
	later := func(d time.Duration) uint64 { return monoCoarse() + uint64(d) }
	for _, hook := range npHooks {
		for _, c := range cases {
			t.Run(hook+"/"+c.desc+"/unanswered: gone after the unreplied timeout, SNAT port free", func(t *testing.T) {
				e := f.openFlow(t, hook, c.flow)
				if e.Mode != c.mode {
					t.Fatalf("mode %s, want %s", e.Mode, c.mode)
				}
				st, err := f.n.gcAt(DefaultCTTimeouts, later(c.timeout-5*time.Second))
				if err != nil || st.CTDeleted != 0 {
					t.Fatalf("GC before the unreplied timeout: %+v, %v: want the flow kept", st, err)
				}
				st, err = f.n.gcAt(DefaultCTTimeouts, later(c.timeout+2*time.Second))
				if err != nil || st.CTDeleted != 1 {
					t.Errorf("GC %s after an unanswered flow's last packet: %+v, %v: want it deleted", c.timeout+2*time.Second, st, err)
				}
				if nat, err := f.n.NAT(); err != nil || len(nat) != 0 {
					t.Errorf("reverse entries %+v (%v) after GC: an unanswered flow's SNAT port / reverse entry must go with it", nat, err)
				}
			})
			if c.flow.Proto == lb.TCP && c.mode != "dsr" {
				t.Run(hook+"/"+c.desc+"/answered, never ACKed (a spoofed SYN): not established", func(t *testing.T) {
					e := f.openFlow(t, hook, c.flow)
					before := f.counters(t)
					f.npReply(t, hook, c.flow, e)
					e2, _ := f.ctFor(t, c.flow)
					if !e2.Unreplied || !e2.Replied {
						t.Errorf("entry %+v after the SYN-ACK: want unreplied, replied (the client's ACK establishes)", e2)
					}
					if got := npMoved(before, f.counters(t), hook); got["ct_established"] != 0 {
						t.Errorf("counters %v: a SYN-ACK alone must not establish the flow", got)
					}
					st, err := f.n.gcAt(DefaultCTTimeouts, later(c.timeout+2*time.Second))
					if err != nil || st.CTDeleted != 1 || st.NATDeleted != 1 {
						t.Errorf("GC %s later: %+v, %v: want the flow and its reverse entry gone", c.timeout+2*time.Second, st, err)
					}
				})
			}
			t.Run(hook+"/"+c.desc+"/answered: established, kept", func(t *testing.T) {
				e := f.openFlow(t, hook, c.flow)
				if c.flow.Proto == lb.UDP && c.mode == "dsr" {
					t.Skip("no UDP DSR case")
				}
				f.npEstablish(t, hook, c.flow, e)
				if e2, _ := f.ctFor(t, c.flow); e2.Unreplied {
					t.Errorf("entry %+v still unreplied after the handshake", e2)
				}
				st, err := f.n.gcAt(DefaultCTTimeouts, later(c.timeout+2*time.Second))
				if err != nil || st.CTDeleted != 0 || st.NATDeleted != 0 {
					t.Errorf("GC %s later: %+v, %v: an answered flow is established and keeps its entries", c.timeout+2*time.Second, st, err)
				}
				if _, ok := f.ctFor(t, c.flow); !ok {
					t.Error("answered flow's CT entry gone")
				}
			})
		}
	}
}

// TestNodePortFloodKeepsEstablished: new flows past the conntrack table's
// size (a SYN flood from spoofed sources) do not evict established flows:
// every established flow keeps its backend and SNAT port afterwards.
func TestNodePortFloodKeepsEstablished(t *testing.T) {
	const ctMax = 256
	f := newNPFix(t, func(o *Options) { o.CTMax = ctMax })
	f.upsert(t, npNodePort(30080, lb.TCP, false, npBE("10.244.2.5:8080", "node2"), npBE("10.244.2.6:8080", "node2")), FrontendOptions{})
	f.upsert(t, npNodePort(30081, lb.TCP, false, npBE("10.244.1.5:8080", "node1")), FrontendOptions{})
	const established, flood = 64, 4 * ctMax
	for _, hook := range npHooks {
		t.Run(hook, func(t *testing.T) {
			f.resetFlows(t)
			var flows []Tuple
			want := map[Tuple]CTEntry{}
			for i := 0; i < established; i++ {
				dst := npAP("198.18.0.11:30080")
				if i%2 == 1 {
					dst = npAP("198.18.0.11:30081")
				}
				flow := Tuple{Proto: lb.TCP, Src: netip.AddrPortFrom(npClient, uint16(40000+i)), Dst: dst}
				if v, _ := f.run(t, hook, f.wirePkt(flow, npSYN)); v == npDrop {
					t.Fatalf("SYN of flow %d dropped", i)
				}
				e, ok := f.ctFor(t, flow)
				if !ok {
					t.Fatalf("flow %d: no CT entry", i)
				}
				f.npEstablish(t, hook, flow, e)
				flows = append(flows, flow)
				want[flow] = e
			}
			before := f.counters(t)
			for i := 0; i < flood; i++ {
				src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{203, 0, byte(i >> 8), byte(i)}), uint16(10000+i))
				f.run(t, hook, f.wirePkt(Tuple{Proto: lb.TCP, Src: src, Dst: npAP("198.18.0.11:30080")}, npSYN))
			}
			flooded := npMoved(before, f.counters(t), hook)
			if flooded["ct_new"] < flood/2 {
				t.Fatalf("counters %v: the flood did not create flows", flooded)
			}
			before = f.counters(t)
			lost := 0
			for _, flow := range flows {
				e, ok := f.ctFor(t, flow)
				if !ok || e.Backend != want[flow].Backend || e.NATPort != want[flow].NATPort {
					lost++
					continue
				}
				if v, _ := f.run(t, hook, f.wirePkt(flow, npACK)); v == npDrop {
					t.Errorf("flow %s: ACK dropped after the flood", flow)
				}
			}
			got := npMoved(before, f.counters(t), hook)
			if lost != 0 || got["ct_hit"] != uint64(established) {
				t.Errorf("after %d new flows into a %d-entry table: %d of %d established flows lost their entry; counters %v (want ct_hit %d)",
					flood, ctMax, lost, established, got, established)
			}
		})
	}
}

// TestNodePortFloodSNATPorts: a SYN flood to an SNAT backend does not hold
// its SNAT ports: the reservation of an unanswered flow evicted from the
// unreplied table is taken over by the next new flow (snat_port_reused),
// so ports in use stay bounded by that table's size and a legitimate
// client still gets a port while the flood goes on.
func TestNodePortFloodSNATPorts(t *testing.T) {
	const ports, unrepliedMax, flood = 512, 64, 3000
	f := newNPFix(t, func(o *Options) {
		o.SNATPortMin, o.SNATPortMax = 20000, 20000+ports-1
		o.CTUnrepliedMax = unrepliedMax
	})
	f.upsert(t, npNodePort(30080, lb.TCP, false, npBE("10.244.2.5:8080", "node2")), FrontendOptions{})
	for _, hook := range npHooks {
		t.Run(hook, func(t *testing.T) {
			f.resetFlows(t)
			before := f.counters(t)
			for i := 0; i < flood; i++ {
				src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{203, 0, byte(i >> 8), byte(i)}), uint16(40000+i%1000))
				f.run(t, hook, f.wirePkt(Tuple{Proto: lb.TCP, Src: src, Dst: npAP("198.18.0.11:30080")}, npSYN))
			}
			got := npMoved(before, f.counters(t), hook)
			st, err := f.n.CTStats()
			if err != nil {
				t.Fatal(err)
			}
			if got["snat_no_port"] != 0 || got["snat_port_reused"] == 0 || st.NATEntries > ports {
				t.Errorf("%d SYNs through %d SNAT ports and a %d-entry unreplied table: counters %v, %d reservations: want no snat_no_port, ports of evicted flows reused",
					flood, ports, unrepliedMax, got, st.NATEntries)
			}
			// a legitimate client during the flood: a port, and its reply
			// comes back
			legit := npTCP("198.18.0.250:45000", "198.18.0.11:30080")
			if v, _ := f.run(t, hook, f.wirePkt(legit, npSYN)); v != npFwd {
				t.Fatalf("legitimate SYN during the flood: verdict %s", v)
			}
			e, ok := f.ctFor(t, legit)
			if !ok {
				t.Fatal("legitimate flow: no CT entry")
			}
			f.npEstablish(t, hook, legit, e)
			if e2, _ := f.ctFor(t, legit); e2.Unreplied {
				t.Errorf("legitimate flow still unreplied after its reply: %+v", e2)
			}
			t.Logf("%s: %v; %d reservations, %d unreplied flows", hook, got, st.NATEntries, st.Unreplied)
		})
	}
}

// TestNodePortMaglevResume: an established flow of a Maglev frontend whose
// CT entry is gone (evicted, or lost with the maps) continues on the same
// backend: its next packet, not a SYN, picks the Maglev slot again
// (ct_maglev_resume) instead of going to the stack. A random frontend's
// flow cannot be resumed (ct_no_syn: TestNodePortNoSYNNoFlow).
func TestNodePortMaglevResume(t *testing.T) {
	const m = 251
	f := newNPFix(t, func(o *Options) { o.MaglevTableSize = m })
	table := make([]uint32, m)
	for i := range table {
		table[i] = uint32(i % 3)
	}
	f.upsert(t, npVIP("192.0.2.90:80", lb.TCP, npBE("10.244.2.1:80", "node2"), npBE("10.244.2.2:80", "node2"), npBE("10.244.2.3:80", "node2")),
		FrontendOptions{Maglev: table, Mode: ModeDSR})
	f.upsert(t, npVIP("192.0.2.91:80", lb.TCP, npBE("10.244.1.1:80", "node1"), npBE("10.244.1.2:80", "node1"), npBE("10.244.1.3:80", "node1")),
		FrontendOptions{Maglev: table})
	for _, hook := range npHooks {
		for _, vip := range []string{"192.0.2.90:80", "192.0.2.91:80"} {
			t.Run(hook+"/"+vip, func(t *testing.T) {
				for i := 0; i < 8; i++ {
					flow := Tuple{Proto: lb.TCP, Src: netip.AddrPortFrom(netip.AddrFrom4([4]byte{203, 0, 113, byte(i)}), uint16(30000+i*7)), Dst: npAP(vip)}
					e := f.openFlow(t, hook, flow)
					f.npEstablish(t, hook, flow, e)
					f.resetFlows(t) // the entry is lost
					before := f.counters(t)
					if v, _ := f.run(t, hook, f.wirePkt(flow, npACK)); v == npDrop {
						t.Fatalf("flow %s: ACK after its entry was lost: dropped", flow)
					}
					got := npMoved(before, f.counters(t), hook)
					e2, ok := f.ctFor(t, flow)
					if !ok || e2.Backend != e.Backend || got["ct_maglev_resume"] != 1 {
						t.Fatalf("flow %s on %s: after its entry was lost its ACK went to %v (entry %v), counters %v: want the same backend by Maglev, ct_maglev_resume 1",
							flow, e.Backend, e2.Backend, ok, got)
					}
				}
			})
		}
	}
}

// TestNodePortTablesFull: what a full table does, by table.
//   - conntrack (established flows, an LRU): the least recently used flow
//     is evicted; every packet is still translated.
//   - reverse NAT (a plain hash: SNAT port reservations and local
//     backends' reverse entries): a new flow that needs an entry is
//     dropped (SNAT: snat_no_port; local backend: nat_full, else its
//     replies would leave with the pod's address), its client retransmits;
//     established flows go on.
func TestNodePortTablesFull(t *testing.T) {
	t.Run("conntrack", func(t *testing.T) {
		const ctMax = 128
		f := newNPFix(t, func(o *Options) { o.CTMax = ctMax })
		f.upsert(t, npNodePort(30081, lb.TCP, false, npBE("10.244.1.5:8080", "node1")), FrontendOptions{})
		before := f.counters(t)
		const flows = 3 * ctMax
		var last Tuple
		for i := 0; i < flows; i++ {
			last = Tuple{Proto: lb.TCP, Src: netip.AddrPortFrom(netip.AddrFrom4([4]byte{203, 0, byte(i >> 8), byte(i)}), 40000), Dst: npAP("198.18.0.11:30081")}
			if v, _ := f.run(t, "tc", f.wirePkt(last, npSYN)); v != npNext {
				t.Fatalf("flow %d: SYN verdict %s", i, v)
			}
			e, ok := f.ctFor(t, last)
			if !ok {
				t.Fatalf("flow %d: no entry", i)
			}
			f.npEstablish(t, "tc", last, e)
		}
		got := npMoved(before, f.counters(t), "tc")
		st, err := f.n.CTStats()
		if err != nil {
			t.Fatal(err)
		}
		if got["ct_established"] != flows || got["dnat_local"] != 2*flows || st.Entries > ctMax+ctMax/4 {
			t.Errorf("%d flows established into a %d-entry table: counters %v, %d entries: want every packet translated, the table at its size", flows, ctMax, got, st.Entries)
		}
		if e, ok := f.ctFor(t, last); !ok || e.Unreplied {
			t.Errorf("the most recent flow's entry %+v (%v): an LRU keeps it", e, ok)
		}
		t.Logf("%d flows into %d entries: %d kept, %d evicted", flows, ctMax, st.Entries, flows-st.Entries)
	})
	t.Run("reverse NAT", func(t *testing.T) {
		const natMax = 64
		f := newNPFix(t, func(o *Options) { o.NATMax = natMax })
		f.upsert(t, npNodePort(30080, lb.TCP, false, npBE("10.244.2.5:8080", "node2")), FrontendOptions{})
		f.upsert(t, npNodePort(30081, lb.TCP, false, npBE("10.244.1.5:8080", "node1")), FrontendOptions{})
		var flows []Tuple
		for i := 0; ; i++ {
			flow := Tuple{Proto: lb.TCP, Src: netip.AddrPortFrom(npClient, uint16(40000+i)), Dst: npAP("198.18.0.11:30080")}
			if v, _ := f.run(t, "tc", f.wirePkt(flow, npSYN)); v == npDrop {
				break
			}
			e, _ := f.ctFor(t, flow)
			f.npEstablish(t, "tc", flow, e)
			flows = append(flows, flow)
			if i > 2*natMax {
				t.Fatalf("%d SNAT flows into a %d-entry NAT table", i, natMax)
			}
		}
		if st, _ := f.n.CTStats(); st.NATEntries < natMax-natMax/8 {
			t.Fatalf("first drop with %d of %d reverse entries", st.NATEntries, natMax)
		}
		for _, c := range []struct{ dst, reason string }{{"198.18.0.11:30080", "snat_no_port"}, {"198.18.0.11:30081", "nat_full"}} {
			flow := npTCP("203.0.113.99:50000", c.dst)
			before := f.counters(t)
			v, _ := f.run(t, "tc", f.wirePkt(flow, npSYN))
			if got := npMoved(before, f.counters(t), "tc"); v != npDrop || got[c.reason] != 1 {
				t.Errorf("new flow to %s with the NAT table full: verdict %s, counters %v: want drop, %s 1", c.dst, v, got, c.reason)
			}
			if e, ok := f.ctFor(t, flow); ok {
				t.Errorf("new flow to %s with the NAT table full left an entry %+v", c.dst, e)
			}
		}
		before := f.counters(t)
		for _, flow := range flows {
			if v, _ := f.run(t, "tc", f.wirePkt(flow, npACK)); v != npFwd {
				t.Fatalf("established flow %s with the NAT table full: verdict %s", flow, v)
			}
		}
		if got := npMoved(before, f.counters(t), "tc"); got["ct_hit"] != uint64(len(flows)) {
			t.Errorf("established flows with the NAT table full: counters %v, want %d ct_hit", got, len(flows))
		}
	})
}

// TestNodePortClock: the programs read the coarse clock once per tick and
// CPU and use that reading until jiffies moves (np_now in bpf/lib/ct.h).
// The time a new flow's entry gets is still the agent's
// CLOCK_MONOTONIC_COARSE: no later than a reading taken after the packet,
// no earlier than one tick before a reading taken before it, on every
// hook, and again after the clock moved on by a few ticks (a reading kept
// past its tick would fall behind by them).
func TestNodePortClock(t *testing.T) {
	f := newNPFix(t, nil)
	f.upsert(t, npNodePort(30080, lb.TCP, false, npBE("10.244.2.5:8080", "node2")), FrontendOptions{})
	var res unix.Timespec
	if err := unix.ClockGetres(unix.CLOCK_MONOTONIC_COARSE, &res); err != nil {
		t.Fatal(err)
	}
	tick := uint64(res.Nano()) // the coarse clock moves once per tick
	for _, hook := range npHooks {
		t.Run(hook, func(t *testing.T) {
			f.resetFlows(t)
			var prev uint64
			for i := range 6 {
				flow := npTCP(fmt.Sprintf("198.18.0.250:%d", 40000+i), "198.18.0.11:30080")
				before := monoCoarse()
				if v, _ := f.run(t, hook, f.wirePkt(flow, npSYN)); v != npFwd {
					t.Fatalf("SYN %d: %s, want fwd", i, v)
				}
				after := monoCoarse()
				var v lbTCNpCt
				if err := f.n.tc.AxonNpCtNew.Lookup(npTuple(flow), &v); err != nil {
					t.Fatalf("CT entry of SYN %d: %v", i, err)
				}
				if v.Created+tick < before || v.Created > after {
					t.Fatalf("SYN %d: entry created at %d, the agent's clock read %d before and %d after the packet (tick %d ns)",
						i, v.Created, before, after, tick)
				}
				if v.Created < prev {
					t.Fatalf("SYN %d: entry created at %d, before the previous flow's %d", i, v.Created, prev)
				}
				prev = v.Created
				time.Sleep(3 * time.Duration(tick))
			}
		})
	}
}

// TestNPCTMigration: CT maps pinned by an older axon, whose np_ct ended
// before the next hop kept in the entry (48 bytes), are carried over when
// the LB loads: the flows are still listed as they were, an established
// one is still translated with its SNAT port (no new flow, no RST), and it
// then keeps its next hop in the migrated entry.
func TestNPCTMigration(t *testing.T) {
	dptest.RequireRoot(t)
	spec, err := loadLbTC()
	if err != nil {
		t.Fatal(err)
	}
	const oldValueSize = 48 // np_ct up to `created`
	est := npTCP("198.18.0.250:40000", "198.18.0.11:30080")
	unrep := npTCP("198.18.0.250:40001", "198.18.0.11:30080")
	be := npAP("10.244.2.5:8080")
	now := monoCoarse()
	entry := func(natPort uint16) []byte {
		v := lbTCNpCt{BeAddr: lbmap.Addr16(be.Addr()), BePort: lbmap.Port(be.Port()), NatPort: lbmap.Port(natPort),
			BackendId: 7, FrontendId: 3, Flags: npCTSNAT, LastSeen: now, Created: now}
		b, err := binary.Append(nil, binary.NativeEndian, v)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) <= oldValueSize {
			t.Fatalf("np_ct is %d bytes: no longer a layout grown past %d", len(b), oldValueSize)
		}
		return b[:oldValueSize]
	}
	pin := newPinDir(t)
	if err := datapath.EnsurePinDir(pin); err != nil {
		t.Fatal(err)
	}
	for _, m := range []struct {
		name string
		flow Tuple
		port uint16
	}{{MapCT, est, 41000}, {MapCTNew, unrep, 41001}} {
		old := spec.Maps[m.name].Copy()
		old.ValueSize = oldValueSize
		old.Pinning = ebpf.PinNone
		om, err := ebpf.NewMap(old)
		if err != nil {
			t.Fatal(err)
		}
		k := npTuple(m.flow)
		if err := om.Update(&k, entry(m.port), ebpf.UpdateNoExist); err != nil {
			t.Fatal(err)
		}
		if err := om.Pin(filepath.Join(pin, m.name)); err != nil {
			t.Fatal(err)
		}
		om.Close()
	}

	f := newNPFix(t, func(o *Options) { o.PinDir = pin })
	for _, c := range []struct {
		flow      Tuple
		port      uint16
		unreplied bool
	}{{est, 41000, false}, {unrep, 41001, true}} {
		e, ok := f.ctFor(t, c.flow)
		if !ok || e.Backend != be || e.NATPort != c.port || e.Mode != "snat" || e.Unreplied != c.unreplied || e.BackendID != 7 {
			t.Fatalf("after the migration, %s: %+v (found %v), want backend %s, SNAT port %d, unreplied %v, backend id 7",
				c.flow, e, ok, be, c.port, c.unreplied)
		}
	}
	f.upsert(t, npNodePort(30080, lb.TCP, false, npBE(be.String(), "node2")), FrontendOptions{})
	before := f.counters(t)
	pkt := f.wirePkt(est, npACK)
	v, out := f.run(t, "tc", pkt)
	nt := Tuple{Proto: lb.TCP, Src: netip.AddrPortFrom(npNode, 41000), Dst: be}
	if want := npTranslated(pkt, nt, npACK, f.gwMAC, f.upMAC); v != npFwd || !bytes.Equal(out[:len(want)], want) {
		t.Fatalf("the migrated flow's ACK: %s\n got %x\nwant %x", v, out, want)
	}
	if moved := npMoved(before, f.counters(t), "tc"); moved["ct_hit"] != 1 || moved["ct_new"] != 0 {
		t.Fatalf("the migrated flow's ACK: counters moved %v, want ct_hit 1 and no ct_new", moved)
	}
	if !f.n.FibCacheOn() {
		return
	}
	var got lbTCNpCt
	k := npTuple(est)
	if err := f.n.tc.AxonNpCt.Lookup(&k, &got); err != nil {
		t.Fatal(err)
	}
	if got.Nh.NeighGen == 0 || !bytes.Equal(got.Nh.Dmac[:], f.gwMAC) || got.Nh.Oif != uint32(f.upIf) {
		t.Fatalf("the migrated entry's next hop after a packet: %+v, want the gateway %s via ifindex %d", got.Nh, f.gwMAC, f.upIf)
	}
}

// TestNPNATMigration: an axon_np_nat pinned by an older axon as an LRU
// hash is carried into the plain hash the programs use now, its reverse
// entry still listed as it was.
func TestNPNATMigration(t *testing.T) {
	dptest.RequireRoot(t)
	spec, err := loadLbTC()
	if err != nil {
		t.Fatal(err)
	}
	pin := newPinDir(t)
	if err := datapath.EnsurePinDir(pin); err != nil {
		t.Fatal(err)
	}
	old := spec.Maps[MapNAT].Copy()
	old.Type = ebpf.LRUHash
	old.Pinning = ebpf.PinNone
	om, err := ebpf.NewMap(old)
	if err != nil {
		t.Fatal(err)
	}
	reply := npTCP("10.244.2.5:8080", "198.18.0.11:41000")
	front, client := npAP("198.18.0.11:30080"), npAP("198.18.0.250:40000")
	k := npTuple(reply)
	v := lbTCNpNat{Saddr: lbmap.Addr16(front.Addr()), Daddr: lbmap.Addr16(client.Addr()), Sport: lbmap.Port(front.Port()),
		Dport: lbmap.Port(client.Port()), FrontendId: 3, Flags: npNATSNAT, LastSeen: monoCoarse()}
	if err := om.Update(&k, &v, ebpf.UpdateNoExist); err != nil {
		t.Fatal(err)
	}
	if err := om.Pin(filepath.Join(pin, MapNAT)); err != nil {
		t.Fatal(err)
	}
	om.Close()

	f := newNPFix(t, func(o *Options) { o.PinDir = pin })
	if typ := f.n.tc.AxonNpNat.Type(); typ != ebpf.Hash {
		t.Fatalf("after the migration %s is a %s, want a hash", MapNAT, typ)
	}
	es, err := f.n.NAT()
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 1 || es[0].Reply != reply || es[0].NewSrc != front || es[0].NewDst != client || es[0].Kind != "snat" {
		t.Fatalf("after the migration: %+v, want one snat entry %s -> %s, %s", es, reply, front, client)
	}
}
