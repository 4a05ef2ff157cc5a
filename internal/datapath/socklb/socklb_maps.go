package socklb

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/cilium/ebpf"

	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/datapath/lbmap"
	"github.com/axonhq/axon/internal/lb"
)

// feState is what the maps hold for one frontend: the ids, and the
// frontend last written with its backends in slot order (display fields,
// node and zone are not in the maps). meta.Backends is the slice the caller
// passed in (lbmap.NormFrontend copies only what it has to reorder), so the socket
// LB keeps no second copy of every backend list.
type feState struct {
	id     uint32
	master sockLBLbSvcVal
	ids    []uint32     // slot i+1 holds backend ids[i] ...
	meta   *lb.Frontend // ... which is meta.Backends[i]
}

// entry is slot i+1's backend.
func (st *feState) entry(i int) lbmap.Entry {
	return lbmap.Entry{ID: st.ids[i], Backend: st.meta.Backends[i]}
}

// newFEState records f (normalized, backends in slot order) written with
// entries (entries[i].b == f.Backends[i]).
func newFEState(id uint32, master sockLBLbSvcVal, f lb.Frontend, entries []lbmap.Entry) *feState {
	ids := make([]uint32, len(entries))
	for i, e := range entries {
		ids[i] = e.ID
	}
	f.Backends = f.Backends[:len(f.Backends):len(f.Backends)] // an append by anyone else copies
	return &feState{id: id, master: master, ids: ids, meta: &f}
}

// Conversions between the Go model and the map layouts.

func svcKey(k lb.FrontendKey, slot uint16) sockLBLbSvcKey {
	return sockLBLbSvcKey{Addr: lbmap.Addr16(k.Addr), Port: lbmap.Port(k.Port), Proto: uint8(k.Proto), Scope: uint8(k.Scope), Slot: slot}
}

func feKeyOf(k sockLBLbSvcKey) lb.FrontendKey {
	return lb.FrontendKey{Addr: lbmap.FromAddr16(k.Addr), Port: lbmap.PortHost(k.Port), Proto: lb.Proto(k.Proto), Scope: lb.Scope(k.Scope)}
}

// slotEnt is one slot entry of axon_lb_svc as read back.
type slotEnt struct {
	key sockLBLbSvcKey
	id  uint32
}

// lbMaps is the content of axon_lb_svc and axon_lb_be: master entries by
// frontend, slot entries, backends by id.
type lbMaps struct {
	masters  map[lb.FrontendKey]sockLBLbSvcVal
	slots    []slotEnt
	backends map[uint32]sockLBLbBackend
}

// readMaps reads both maps in batches (hints size the result).
func (s *LB) readMaps(svcHint, beHint int) (lbMaps, error) {
	svcKeys, svcVals, err := datapath.DumpMap[sockLBLbSvcKey, sockLBLbSvcVal](s.objs.AxonLbSvc, svcHint)
	if err != nil {
		return lbMaps{}, fmt.Errorf("read %s: %w", MapLBService, err)
	}
	c := lbMaps{masters: map[lb.FrontendKey]sockLBLbSvcVal{}, slots: make([]slotEnt, 0, len(svcKeys))}
	for i, k := range svcKeys {
		if k.Slot == 0 {
			c.masters[feKeyOf(k)] = svcVals[i]
		} else {
			c.slots = append(c.slots, slotEnt{k, svcVals[i].Id})
		}
	}
	beKeys, beVals, err := datapath.DumpMap[uint32, sockLBLbBackend](s.objs.AxonLbBe, beHint)
	if err != nil {
		return lbMaps{}, fmt.Errorf("read %s: %w", MapLBBackend, err)
	}
	c.backends = make(map[uint32]sockLBLbBackend, len(beKeys))
	for i, id := range beKeys {
		c.backends[id] = beVals[i]
	}
	return c, nil
}

// slotCount is the number of slots a master entry says are in use.
func slotCount(m sockLBLbSvcVal) int {
	return int(m.Active) + int(m.Terminating) + int(m.Quarantined)
}

// fromBackendVal is the lb.Backend of an axon_lb_be value (the inverse of
// backendVal without node and zone, which the map does not hold).
func fromBackendVal(v sockLBLbBackend) lb.Backend {
	return lb.Backend{Addr: lbmap.FromAddr16(v.Addr), Port: lbmap.PortHost(v.Port), State: lb.BackendState(v.State)}
}

// rebuild reads the maps into s.fe and the id allocators, and removes what a
// crash between two writes may have left: slots beyond a master's count or
// without a master, and backends no frontend references.
func (s *LB) rebuild() error {
	c, err := s.readMaps(0, 0)
	if err != nil {
		return err
	}
	var (
		stale  []sockLBLbSvcKey
		states = map[lb.FrontendKey][]lbmap.Entry{} // slot order
	)
	for fk, m := range c.masters {
		states[fk] = make([]lbmap.Entry, slotCount(m))
	}
	used := map[uint32]bool{}
	for _, se := range c.slots {
		fk := feKeyOf(se.key)
		st := states[fk]
		idx := int(se.key.Slot) - 1
		b, ok := c.backends[se.id]
		if st == nil || idx >= len(st) || !ok {
			stale = append(stale, se.key)
			continue
		}
		st[idx] = lbmap.Entry{ID: se.id, Backend: fromBackendVal(b)}
		used[se.id] = true
	}
	for fk, st := range states {
		for i, be := range st {
			if be.ID == 0 { // a slot missing below the count: rewrite the frontend without it
				s.log.Warn("socket LB: frontend has a missing slot, dropping it", "frontend", lbmap.KeyString(fk), "slot", i+1)
				st = slices.DeleteFunc(st, func(e lbmap.Entry) bool { return e.ID == 0 })
				break
			}
		}
		f := lb.Frontend{Key: fk, Backends: make([]lb.Backend, len(st))}
		for i, be := range st {
			f.Backends[i] = be.Backend
		}
		m := c.masters[fk]
		if m.Flags&lbmap.FlagAffinity != 0 {
			f.Affinity = time.Duration(m.AffinityTimeout) * time.Second
		}
		s.fe[fk] = newFEState(m.Id, m, f, st)
		s.feIDs.Mark(m.Id)
		for _, be := range st {
			s.beIDs.Mark(be.ID)
		}
	}
	for i := range stale {
		if err := s.objs.AxonLbSvc.Delete(&stale[i]); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("remove stale slot of %s: %w", lbmap.KeyString(feKeyOf(stale[i])), err)
		}
	}
	for id := range c.backends {
		if !used[id] {
			if err := s.objs.AxonLbBe.Delete(&id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return fmt.Errorf("remove unreferenced backend %d: %w", id, err)
			}
		}
	}
	// a frontend that lost a slot is rewritten whole
	for fk, st := range s.fe {
		if slotCount(st.master) != len(st.ids) {
			f := *st.meta
			f.Backends = slices.Clone(f.Backends)
			if err := s.upsertLocked(f); err != nil {
				return fmt.Errorf("repair %s: %w", lbmap.KeyString(fk), err)
			}
		}
	}
	if len(stale) > 0 {
		s.log.Info("socket LB: removed stale service slots", "count", len(stale))
	}
	s.svcEntries = 0
	for _, st := range s.fe {
		s.svcEntries += 1 + len(st.ids)
	}
	return nil
}
