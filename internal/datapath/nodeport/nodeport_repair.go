package nodeport

// The repair-at-start pass of the north-south LB. The agent can die (SIGKILL,
// OOM, a node crash) between any two map writes of UpsertFrontendWith or
// DeleteFrontend; the maps stay pinned, and the next Load adopts them. A
// frontend is then half written (backends, slots, a DSR entry and a Maglev
// table of a frontend whose master entry was never written), half updated
// (slots beyond the master's count, backends no slot references any more)
// or half deleted (slots and backends after their master went). Nothing
// reads those entries back, so no resync would ever remove them, and a
// frontend id reused later would inherit another frontend's source ranges.
// rebuild keeps exactly the frontends whose master entry is consistent and
// removes everything else, as the socket LB's rebuild does for its maps.

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"

	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/datapath/lbmap"
	"github.com/axonhq/axon/internal/lb"
)

// repairStats counts what rebuild removed or rewrote.
type repairStats struct {
	slots, backends, dsr, ranges, maglev, frontends, dsrAdded int
}

func (r repairStats) any() bool { return r != repairStats{} }

// rebuild adopts what the pinned maps hold after a restart and removes what
// a crash between two writes left behind (see the file comment). A frontend
// that is inconsistent in itself (a slot missing below its count, a backend
// that names another frontend, a Maglev table with another frontend's
// backends) is removed whole: the Service watch's resync writes it again.
func (n *LB) rebuild() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	m := n.tc.lbTCMaps
	svcKeys, svcVals, err := datapath.DumpMap[lbTCNpSvcKey, lbTCNpSvcVal](m.AxonNpSvc, 0)
	if err != nil {
		return fmt.Errorf("read %s: %w", MapService, err)
	}
	beKeys, beVals, err := datapath.DumpMap[uint32, lbTCNpBackend](m.AxonNpBe, 0)
	if err != nil {
		return fmt.Errorf("read %s: %w", MapBackend, err)
	}
	backends := make(map[uint32]lbTCNpBackend, len(beKeys))
	for i, id := range beKeys {
		backends[id] = beVals[i]
	}
	masters := map[lb.FrontendKey]lbTCNpSvcVal{}
	slots := map[lb.FrontendKey]map[uint16]uint32{}
	for i, k := range svcKeys {
		fk := npFeKey(k)
		if k.Slot == 0 {
			masters[fk] = svcVals[i]
			continue
		}
		if slots[fk] == nil {
			slots[fk] = map[uint16]uint32{}
		}
		slots[fk][k.Slot] = svcVals[i].Id
	}

	var st repairStats
	var errs []error
	del := func(mp *ebpf.Map, key any, what string, count *int) {
		if err := mp.Delete(key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("remove %s: %w", what, err))
			return
		}
		*count++
	}

	// frontends whose master, slots and backends agree
	fes := map[lb.FrontendKey]*npFrontend{}
	byID := map[uint32]*npFrontend{}
	keyByID := map[uint32]lb.FrontendKey{}
	for fk, mv := range masters {
		bad := ""
		if mv.Id == 0 {
			bad = "frontend id 0"
		} else if byID[mv.Id] != nil {
			bad = fmt.Sprintf("frontend id %d is also %s", mv.Id, lbmap.KeyString(keyByID[mv.Id]))
		}
		fe := &npFrontend{id: mv.Id, master: mv}
		total := int(mv.Active) + int(mv.Terminating) + int(mv.Quarantined)
		for slot := 1; slot <= total && bad == ""; slot++ {
			id, ok := slots[fk][uint16(slot)]
			bv, have := backends[id]
			switch {
			case !ok:
				bad = fmt.Sprintf("slot %d of %d missing", slot, total)
			case !have:
				bad = fmt.Sprintf("slot %d points at backend %d, which is not in %s", slot, id, MapBackend)
			case bv.FrontendId != mv.Id:
				bad = fmt.Sprintf("backend %d of slot %d belongs to frontend id %d", id, slot, bv.FrontendId)
			default:
				fe.backends = append(fe.backends, lbmap.Entry{ID: id, Backend: lb.Backend{Addr: lbmap.FromAddr16(bv.Addr),
					Port: lbmap.PortHost(bv.Port), State: lb.BackendState(bv.State)}})
			}
		}
		if bad == "" && !n.maglevOwnLocked(mv.Id, fe) {
			bad = "its Maglev table points at backends of another frontend"
		}
		if bad != "" {
			n.log.Warn("nodeport LB: removing an inconsistent frontend left by a previous run; the Service watch writes it again",
				"frontend", lbmap.KeyString(fk), "reason", bad)
			mk := npSvcKey(fk, 0)
			del(m.AxonNpSvc, &mk, "master of "+lbmap.KeyString(fk), &st.frontends)
			continue // its slots, backends and id-keyed entries go below
		}
		fes[fk], byID[mv.Id], keyByID[mv.Id] = fe, fe, fk
	}

	// slots of no frontend or beyond its count, backends no slot references
	used := map[uint32]bool{}
	for fk, ss := range slots {
		fe := fes[fk]
		for slot := range ss {
			if fe != nil && int(slot) <= len(fe.backends) {
				used[ss[slot]] = true
				continue
			}
			k := npSvcKey(fk, slot)
			del(m.AxonNpSvc, &k, fmt.Sprintf("slot %d of %s", slot, lbmap.KeyString(fk)), &st.slots)
		}
	}
	for id := range backends {
		if !used[id] {
			del(m.AxonNpBe, &id, fmt.Sprintf("backend %d", id), &st.backends)
		}
	}

	// DSR entries: exactly the local backends of the frontends kept
	wantDSR := map[lbTCNpDsrKey]uint32{}
	for _, fe := range fes {
		for _, e := range fe.backends {
			if backends[e.ID].Flags&npBackendLocal != 0 {
				wantDSR[npDSRKey(fe.id, e.Backend.Addr)] = e.ID
			}
		}
	}
	dsrKeys, dsrVals, err := datapath.DumpMap[lbTCNpDsrKey, uint32](m.AxonNpDsr, len(wantDSR))
	if err != nil {
		return fmt.Errorf("read %s: %w", MapDSR, err)
	}
	for i, k := range dsrKeys {
		if id, ok := wantDSR[k]; ok && id == dsrVals[i] {
			delete(wantDSR, k)
			continue
		}
		if _, ok := wantDSR[k]; !ok {
			del(m.AxonNpDsr, &k, fmt.Sprintf("DSR entry of frontend id %d", k.FrontendId), &st.dsr)
		}
	}
	for k, id := range wantDSR { // missing or pointing elsewhere
		if err := m.AxonNpDsr.Put(&k, &id); err != nil {
			errs = append(errs, fmt.Errorf("write DSR entry of frontend id %d: %w", k.FrontendId, err))
			continue
		}
		st.dsrAdded++
	}

	// source ranges: kept per frontend, the others removed
	var rk lbTCNpSrcrangeKey
	var rv uint8
	var staleRanges []lbTCNpSrcrangeKey
	it := m.AxonNpSrcrange.Iterate()
	for it.Next(&rk, &rv) {
		fe := byID[rk.FrontendId]
		if fe == nil {
			staleRanges = append(staleRanges, rk)
			continue
		}
		a := netip.AddrFrom16(rk.Addr)
		bits := int(rk.Prefixlen) - 32
		if a.Is4In6() {
			a, bits = a.Unmap(), bits-96
		}
		if p, err := a.Prefix(bits); err == nil {
			fe.ranges = append(fe.ranges, p)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read %s: %w", MapSrcRange, err)
	}
	for i := range staleRanges {
		del(m.AxonNpSrcrange, &staleRanges[i], fmt.Sprintf("source range of frontend id %d", staleRanges[i].FrontendId), &st.ranges)
	}

	// Maglev tables: only of frontends kept, and only over their own backends
	var mid, inner uint32
	var staleTables []uint32
	mit := m.AxonLbMaglev.Iterate()
	for mit.Next(&mid, &inner) {
		if byID[mid] == nil {
			staleTables = append(staleTables, mid)
		}
	}
	if err := mit.Err(); err != nil {
		return fmt.Errorf("read %s: %w", MapLBMaglev, err)
	}
	for _, id := range staleTables {
		del(m.AxonLbMaglev, &id, fmt.Sprintf("Maglev table of frontend id %d", id), &st.maglev)
	}

	n.fe = fes
	for _, fe := range fes {
		n.feIDs.Mark(fe.id)
		for _, be := range fe.backends {
			n.beIDs.Mark(be.ID)
		}
	}
	if st.any() {
		n.log.Info("nodeport LB: removed what a previous run left half written", "slots", st.slots, "backends", st.backends,
			"dsrEntries", st.dsr, "dsrEntriesAdded", st.dsrAdded, "sourceRanges", st.ranges, "maglevTables", st.maglev, "frontends", st.frontends)
	}
	if err := errors.Join(errs...); err != nil {
		// the frontends kept are consistent: serve them, leave the rest
		n.log.Warn("nodeport LB: some entries left by a previous run could not be removed; they stay unused", "error", err)
	}
	return nil
}

// maglevOwnLocked reports whether frontend id's Maglev table, if it has
// one, points only at fe's backends.
func (n *LB) maglevOwnLocked(id uint32, fe *npFrontend) bool {
	var inner *ebpf.Map
	if err := n.tc.AxonLbMaglev.Lookup(&id, &inner); err != nil {
		return errors.Is(err, ebpf.ErrKeyNotExist)
	}
	defer inner.Close()
	own := make(map[uint32]bool, len(fe.backends))
	for _, e := range fe.backends {
		own[e.ID] = true
	}
	var slot, be uint32
	it := inner.Iterate()
	for it.Next(&slot, &be) {
		if !own[be] {
			return false
		}
	}
	return it.Err() == nil
}
