package nodeport

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/axonhq/axon/internal/datapath/lbmap"
	"github.com/axonhq/axon/internal/lb"
)

// TestNodePortRepairAtLoad: what an agent killed between two map writes
// leaves in the pinned maps is removed by the next Load, and the whole
// frontends stay as they were. Planted: a frontend half written (backends,
// slots, DSR entry, source range and Maglev table, no master), a slot and
// a backend beyond a frontend's count (a cut update), a backend of nobody,
// and a frontend whose master counts a slot that is missing.
func TestNodePortRepairAtLoad(t *testing.T) {
	f := newNPFix(t, func(o *Options) { o.MaglevTableSize = 251 })
	keep := npNodePort(30080, lb.TCP, false, npBE("10.244.1.5:8080", "node1"), npBE("10.244.2.5:8080", "node2"))
	mag := make([]uint32, 251)
	for i := range mag {
		mag[i] = uint32(i % 2)
	}
	f.upsert(t, keep, FrontendOptions{Maglev: mag, SourceRanges: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}})
	vip := npVIP("203.0.113.10:80", lb.TCP, npBE("10.244.2.6:8080", "node2"))
	f.upsert(t, vip, FrontendOptions{})
	m := f.n.tc.lbTCMaps
	put := func(mp *ebpf.Map, k, v any) {
		t.Helper()
		if err := mp.Put(k, v); err != nil {
			t.Fatal(err)
		}
	}
	// a frontend half written: everything but its master (frontend id 77)
	half := npNodePort(30999, lb.TCP, false).Key
	for i, id := range []uint32{700, 701} {
		put(m.AxonNpBe, &id, &lbTCNpBackend{Addr: lbmap.Addr16(netip.MustParseAddr("10.244.1.9")), Port: lbmap.Port(8080), FrontendId: 77, Flags: npBackendLocal})
		k := npSvcKey(half, uint16(i+1))
		put(m.AxonNpSvc, &k, &lbTCNpSvcVal{Id: id})
	}
	dk := npDSRKey(77, netip.MustParseAddr("10.244.1.9"))
	put(m.AxonNpDsr, &dk, uint32(700))
	rk := npRangeKey(77, netip.MustParsePrefix("192.0.2.0/24"))
	put(m.AxonNpSrcrange, &rk, uint8(1))
	inner, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 251})
	if err != nil {
		t.Fatal(err)
	}
	put(m.AxonLbMaglev, uint32(77), inner)
	inner.Close()
	// a cut update of keep: slot 3 and its backend beyond the count of 2
	beyond := uint32(710)
	put(m.AxonNpBe, &beyond, &lbTCNpBackend{Addr: lbmap.Addr16(netip.MustParseAddr("10.244.2.7")), Port: lbmap.Port(8080), FrontendId: f.n.fe[keep.Key].id})
	sk := npSvcKey(keep.Key, 3)
	put(m.AxonNpSvc, &sk, &lbTCNpSvcVal{Id: beyond})
	// a backend of nobody
	nobody := uint32(720)
	put(m.AxonNpBe, &nobody, &lbTCNpBackend{Addr: lbmap.Addr16(netip.MustParseAddr("10.244.2.8")), Port: lbmap.Port(8080), FrontendId: 78})
	// a master whose slot 2 is missing (frontend id 79)
	broken := npNodePort(30998, lb.TCP, false).Key
	bid := uint32(730)
	put(m.AxonNpBe, &bid, &lbTCNpBackend{Addr: lbmap.Addr16(netip.MustParseAddr("10.244.2.9")), Port: lbmap.Port(8080), FrontendId: 79})
	k1, k0 := npSvcKey(broken, 1), npSvcKey(broken, 0)
	put(m.AxonNpSvc, &k1, &lbTCNpSvcVal{Id: bid})
	put(m.AxonNpSvc, &k0, &lbTCNpSvcVal{Id: 79, Active: 2})

	n2, err := Load(f.n.Options())
	if err != nil {
		t.Fatalf("load over the planted maps: %v", err)
	}
	defer n2.Close()
	got, err := n2.Frontends()
	if err != nil {
		t.Fatal(err)
	}
	var keys []lb.FrontendKey
	for _, fe := range got {
		keys = append(keys, fe.Key)
	}
	if want := []lb.FrontendKey{keep.Key, vip.Key}; !slices.Equal(keys, want) || len(got[0].Backends) != 2 {
		t.Fatalf("frontends after the repair: %v (%+v), want %v with 2 backends", keys, got, want)
	}
	keepID := n2.fe[keep.Key].id
	count := func(mp *ebpf.Map, k, v any, ok func() bool) (n, bad int) {
		it := mp.Iterate()
		for it.Next(k, v) {
			n++
			if !ok() {
				bad++
			}
		}
		if err := it.Err(); err != nil {
			t.Fatal(err)
		}
		return n, bad
	}
	var svcK lbTCNpSvcKey
	var svcV lbTCNpSvcVal
	if n, _ := count(m.AxonNpSvc, &svcK, &svcV, func() bool { return true }); n != 3+2 {
		t.Errorf("%s holds %d entries, want 5 (2 masters, 3 slots)", MapService, n)
	}
	var id uint32
	var be lbTCNpBackend
	if n, bad := count(m.AxonNpBe, &id, &be, func() bool { return id < 700 }); n != 3 || bad != 0 {
		t.Errorf("%s holds %d backends (%d planted ones left), want the 3 of the whole frontends", MapBackend, n, bad)
	}
	var dsrK lbTCNpDsrKey
	var dsrV uint32
	if n, bad := count(m.AxonNpDsr, &dsrK, &dsrV, func() bool { return dsrK.FrontendId == keepID }); n != 1 || bad != 0 {
		t.Errorf("%s holds %d entries (%d of other frontends), want keep's one local backend", MapDSR, n, bad)
	}
	var rangeK lbTCNpSrcrangeKey
	var rangeV uint8
	if n, bad := count(m.AxonNpSrcrange, &rangeK, &rangeV, func() bool { return rangeK.FrontendId == keepID }); n != 1 || bad != 0 {
		t.Errorf("%s holds %d entries (%d of other frontends), want keep's one", MapSrcRange, n, bad)
	}
	var magK, magV uint32
	if n, bad := count(m.AxonLbMaglev, &magK, &magV, func() bool { return magK == keepID }); n != 1 || bad != 0 {
		t.Errorf("%s holds %d tables (%d of other frontends), want keep's", MapLBMaglev, n, bad)
	}
	// the repaired LB writes the broken frontend anew
	fix := npNodePort(30998, lb.TCP, false, npBE("10.244.2.9:8080", "node2"), npBE("10.244.2.10:8080", "node2"))
	if err := n2.UpsertFrontendWith(fix, FrontendOptions{}); err != nil {
		t.Fatal(err)
	}
	if got, _ := n2.Frontends(); len(got) != 3 {
		t.Errorf("after writing the broken frontend anew: %d frontends, want 3", len(got))
	}
}
