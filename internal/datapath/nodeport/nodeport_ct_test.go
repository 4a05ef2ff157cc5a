package nodeport

import (
	"testing"

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
