package nodeport

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/axonhq/axon/internal/lb"
)

// TestNodePortNextHopCache: SNAT packets take their next hop (egress
// device, MACs) from where it was kept: a new flow's first packet from the
// per-CPU cache (bpf/lib/fib_cache.h, keyed by the route, not the flow),
// the packets of a known flow from its own CT entry (np_nh in
// bpf/lib/ct.h); a changed neighbour or route sends the next packet to the
// right MAC either way. That the kept next hop is
// read at all is shown by poisoning it: its MAC is what the packet gets. A
// neighbour change must move the neighbour generation (MapNeighGen); a
// route change must not need it (rt_genid).
func TestNodePortNextHopCache(t *testing.T) {
	f := newNPFix(t, nil)
	if !f.n.FibCacheOn() {
		t.Skip("the kernel cannot run the next-hop cache (no bpf_cast_to_kern_ctx)")
	}
	c := dptest.NSConf(t, f.ns)
	f.upsert(t, npNodePort(30080, lb.TCP, false, npBE("10.244.2.5:8080", "node2")), FrontendOptions{})
	poison := dptest.MustMAC(t, "02:00:00:00:00:99")
	macB := dptest.MustMAC(t, "02:00:00:00:00:22")
	macC := dptest.MustMAC(t, "02:00:00:00:00:33")
	gw := &netlink.Neigh{LinkIndex: f.upIf, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT, IP: net.ParseIP("198.18.0.12")}
	alt := &netlink.Neigh{LinkIndex: f.upIf, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT, IP: net.ParseIP("198.18.0.13")}
	route := func(t *testing.T, via string) {
		t.Helper()
		_, dst, _ := net.ParseCIDR("10.244.2.0/24")
		if err := c.H.RouteReplace(&netlink.Route{Dst: dst, Gw: net.ParseIP(via), LinkIndex: f.upIf}); err != nil {
			t.Fatalf("route 10.244.2.0/24 via %s: %v", via, err)
		}
	}
	neigh := func(t *testing.T, n *netlink.Neigh, mac net.HardwareAddr) {
		t.Helper()
		n.HardwareAddr = mac
		if err := c.H.NeighSet(n); err != nil {
			t.Fatalf("neighbour %s lladdr %s: %v", n.IP, mac, err)
		}
	}
	flow := npTCP("198.18.0.250:40000", "198.18.0.11:30080")
	kinds := []struct {
		name string
		flow bool // one established flow; else every packet a new flow's SYN
		// poison gives the kept next hop, where it is valid under the
		// current neighbour generation, the MAC mac; the entries changed
		poison func(t *testing.T, cache *ebpf.Map, mac net.HardwareAddr) int
	}{
		{"per-CPU cache", false, func(t *testing.T, cache *ebpf.Map, mac net.HardwareAddr) int { return npPoison(t, f, cache, mac) }},
		{"CT entry", true, func(t *testing.T, _ *ebpf.Map, mac net.HardwareAddr) int { return npPoisonCT(t, f, flow, mac) }},
	}
	for _, hook := range npHooks {
		for _, k := range kinds {
			t.Run(hook+"/"+k.name, func(t *testing.T) {
				f.resetFlows(t)
				neigh(t, gw, f.gwMAC)
				route(t, "198.18.0.12")
				if err := c.H.NeighDel(alt); err != nil && !errors.Is(err, unix.ENOENT) {
					t.Fatal(err)
				}
				cache := f.n.tc.AxonFibCache
				if hook == "xdp" {
					if _, err := f.n.XDPProgram(); err != nil { // the XDP object loads on first use
						t.Fatal(err)
					}
					cache = f.n.xdp.AxonFibCache
				}
				port := 41000
				var sentGen uint32 // the neighbour generation before the last packet
				send := func(flags uint8) (npVerdict, net.HardwareAddr) {
					t.Helper()
					sentGen = npNeighGen(t, f)
					fl := flow
					if !k.flow {
						port++
						fl, flags = npTCP(fmt.Sprintf("198.18.0.250:%d", port), "198.18.0.11:30080"), npSYN
					}
					v, out := f.run(t, hook, f.wirePkt(fl, flags))
					return v, net.HardwareAddr(out[0:6])
				}
				first := uint8(npSYN)
				if k.flow {
					// the backend's answer and the client's ACK move the flow
					// to the established table, whose entries keep their next hop
					if v, _ := send(npSYN); v != npFwd {
						t.Fatalf("SYN: %s, want fwd", v)
					}
					e, _ := f.ctFor(t, flow)
					f.npEstablish(t, hook, flow, e)
					if e, ok := f.ctFor(t, flow); !ok || e.Unreplied {
						t.Fatalf("flow not established after the answer and the ACK: %+v (found %v)", e, ok)
					}
					first = npACK
				}
				// A packet looks the next hop up (or takes it from the
				// per-CPU cache) and keeps it; the next packet gets the
				// poisoned MAC. The neighbour watch bumps the generation on
				// its own goroutine, and this subtest has just changed a
				// neighbour (the gateway back from macB, the previous
				// subtest's): a bump that lands between the fill and the
				// check makes the entry stale, and the check shows nothing.
				// Then the pair runs again (the ACK refills under the new
				// generation); a miss with the generation unchanged fails.
				for try, flags := 1, first; ; try, flags = try+1, npACK {
					g := npNeighGen(t, f)
					if v, mac := send(flags); v != npFwd || !bytes.Equal(mac, f.gwMAC) {
						t.Fatalf("fill (try %d): %s to %s, want fwd to %s", try, v, mac, f.gwMAC)
					}
					n := k.poison(t, cache, poison)
					var mac net.HardwareAddr
					if n > 0 {
						if _, mac = send(npACK); bytes.Equal(mac, poison) {
							break
						}
					}
					if g2 := npNeighGen(t, f); g2 == g || try == 5 {
						if n == 0 {
							t.Fatalf("no valid kept next hop after the fill; neighbour generation %d -> %d, try %d", g, g2, try)
						}
						t.Fatalf("poisoned next hop: packet to %s, want %s (the kept MAC: it is not read); neighbour generation %d -> %d, try %d",
							mac, poison, g, g2, try)
					} else {
						t.Logf("the neighbour generation moved %d -> %d between the fill and the check (a late bump of an earlier change): again", g, g2)
					}
				}

				// the listing (axon bpf ct) shows what the entry keeps; none
				// only when the generation moved after the last packet (a
				// late bump, as above: the entry is stale, rightly not shown)
				kept := func(mac net.HardwareAddr) {
					t.Helper()
					if !k.flow {
						return
					}
					want := fmt.Sprintf("%s on ifindex %d", mac, f.upIf)
					e, _ := f.ctFor(t, flow)
					if e.NextHop == "" && npNeighGen(t, f) != sentGen {
						t.Logf("CT listing: no next hop, the neighbour generation moved after the last packet (%d -> %d)", sentGen, npNeighGen(t, f))
						return
					}
					if e.NextHop != want {
						t.Fatalf("CT listing: next hop %q, want %q (neighbour generation %d at the last packet)", e.NextHop, want, sentGen)
					}
				}
				kept(poison)

				// a neighbour change: the generation moves, the next packet goes to the new MAC
				g0 := npNeighGen(t, f)
				neigh(t, gw, macB)
				npWaitGen(t, f, g0)
				if _, mac := send(npACK); !bytes.Equal(mac, macB) {
					t.Fatalf("after the neighbour changed its MAC: packet to %s, want %s", mac, macB)
				}
				kept(macB)

				// a route change alone (rt_genid): the other gateway's neighbour
				// exists first, then only the route moves
				g1 := npNeighGen(t, f)
				neigh(t, alt, macC)
				npWaitGen(t, f, g1)
				if _, mac := send(npACK); !bytes.Equal(mac, macB) { // refills under the current generation
					t.Fatalf("before the route change: packet to %s, want %s", mac, macB)
				}
				if k.poison(t, cache, poison) == 0 {
					t.Fatal("no valid kept next hop after the refill")
				}
				g1 = npNeighGen(t, f)
				route(t, "198.18.0.13")
				if _, mac := send(npACK); !bytes.Equal(mac, macC) {
					t.Fatalf("after the route moved to 198.18.0.13: packet to %s, want %s", mac, macC)
				}
				if g := npNeighGen(t, f); g != g1 {
					t.Fatalf("neighbour generation moved during the route change (%d -> %d): the route check would not be shown by rt_genid alone", g1, g)
				}

				// the next hop fails: no MAC to use; XDP passes it up for tc to
				// resolve, tc hands it to bpf_redirect_neigh
				g2 := npNeighGen(t, f)
				if err := c.H.NeighDel(alt); err != nil {
					t.Fatal(err)
				}
				npWaitGen(t, f, g2)
				want := map[string]npVerdict{"tc": npFwd, "xdp": npNext}[hook] // XDP_PASS reads as next
				before := f.counters(t)
				if v, _ := send(npACK); v != want {
					t.Fatalf("next hop without a neighbour: %s, want %s", v, want)
				}
				if hook == "xdp" {
					if moved := npMoved(before, f.counters(t), hook); moved["xdp_punt"] != 1 {
						t.Fatalf("next hop without a neighbour at XDP: counters moved %v, want xdp_punt 1", moved)
					}
				}
			})
		}
	}
}

// npPoisonCT gives flow's established CT entry, if its kept next hop is
// valid under the current neighbour generation, the destination MAC mac:
// 1, else 0 (nothing changed).
func npPoisonCT(t *testing.T, f *npFix, flow Tuple, mac net.HardwareAddr) int {
	t.Helper()
	k := npTuple(flow)
	var v lbTCNpCt
	if err := f.n.tc.AxonNpCt.Lookup(&k, &v); err != nil {
		t.Fatalf("read the CT entry of %s: %v", flow, err)
	}
	if v.Nh.NeighGen == 0 || v.Nh.NeighGen != npNeighGen(t, f) {
		return 0
	}
	copy(v.Nh.Dmac[:], mac)
	if err := f.n.tc.AxonNpCt.Update(&k, &v, ebpf.UpdateExist); err != nil {
		t.Fatalf("write the CT entry of %s: %v", flow, err)
	}
	return 1
}

// npPoison gives every slot of a next-hop cache that holds a valid entry
// of the current neighbour generation on some CPU that entry on every CPU
// (a test run may run on any of them), with mac as the destination MAC; the
// number of slots changed. Another CPU's slot can still hold an older
// generation's entry, valid but stale (entries are replaced, not cleared):
// copied everywhere, it would make every packet a miss.
func npPoison(t *testing.T, f *npFix, m *ebpf.Map, mac net.HardwareAddr) int {
	t.Helper()
	gen := npNeighGen(t, f)
	n := 0
	for slot := uint32(0); slot < m.MaxEntries(); slot++ {
		var per []lbTCFibCacheEntry
		if err := m.Lookup(slot, &per); err != nil {
			t.Fatalf("read next-hop cache slot %d: %v", slot, err)
		}
		i := slices.IndexFunc(per, func(e lbTCFibCacheEntry) bool { return e.Valid == 1 && e.NeighGen == gen })
		if i < 0 {
			continue
		}
		e := per[i]
		copy(e.Dmac[:], mac)
		for j := range per {
			per[j] = e
		}
		if err := m.Update(slot, per, ebpf.UpdateExist); err != nil {
			t.Fatalf("write next-hop cache slot %d: %v", slot, err)
		}
		n++
	}
	return n
}

func npNeighGen(t *testing.T, f *npFix) uint32 {
	t.Helper()
	var g uint32
	if err := f.n.tc.AxonNpNeighGen.Lookup(uint32(0), &g); err != nil {
		t.Fatal(err)
	}
	return g
}

// npWaitGen waits until the neighbour watch has moved the generation past
// old (it runs on its own goroutine).
func npWaitGen(t *testing.T, f *npFix, old uint32) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for npNeighGen(t, f) == old {
		if time.Now().After(deadline) {
			t.Fatalf("neighbour generation still %d 5 s after a neighbour change: the watch missed it", old)
		}
		time.Sleep(time.Millisecond)
	}
}
