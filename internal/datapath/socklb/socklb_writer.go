package socklb

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/cilium/ebpf"

	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/datapath/lbmap"
	"github.com/axonhq/axon/internal/lb"
)

var _ lb.Writer = (*LB)(nil)

// UpsertFrontend programs f (a new frontend or a new backend set for an
// existing one). The order of writes keeps every intermediate state a whole
// service for the hooks: backends first, then the slots beyond the current
// count (invisible), then the slots in use, then the master entry with the
// new counts, and only then stale slots and backends are removed. On an
// error (bad input, map full) the previous frontend stays programmed as it
// was.
func (s *LB) UpsertFrontend(f lb.Frontend) error {
	f, err := lbmap.NormFrontend(f)
	if err != nil {
		return fmt.Errorf("upsert frontend: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.upsertLocked(f); err != nil {
		return fmt.Errorf("upsert frontend %s: %w", lbmap.KeyString(f.Key), err)
	}
	return nil
}

func (s *LB) upsertLocked(f lb.Frontend) error {
	old := s.fe[f.Key]
	oldSlots := 0
	oldIDs := map[lbmap.BackendAddr]lbmap.Entry{}
	if old != nil {
		oldSlots = slotCount(old.master)
		for i := range old.ids {
			be := old.entry(i)
			oldIDs[lbmap.BackendAddr{Addr: be.Backend.Addr, Port: be.Backend.Port}] = be
		}
	}

	var (
		feID    uint32
		newFE   bool
		created []uint32      // backend ids allocated by this call
		changed []lbmap.Entry // existing backends overwritten: old values for rollback
		written []uint16      // new slots beyond oldSlots
		err     error
	)
	if old != nil {
		feID = old.id
	} else {
		if feID, err = s.feIDs.Alloc(); err != nil {
			return fmt.Errorf("frontend id: %w", err)
		}
		newFE = true
	}
	rollback := func() {
		for _, slot := range written {
			k := svcKey(f.Key, slot)
			_ = s.objs.AxonLbSvc.Delete(&k)
		}
		for _, be := range changed {
			v := backendVal(be.Backend, f.Key.Proto, feID)
			_ = s.objs.AxonLbBe.Put(&be.ID, &v)
		}
		for _, id := range created {
			_ = s.objs.AxonLbBe.Delete(&id)
			s.beIDs.Free(id)
		}
		if newFE {
			s.feIDs.Free(feID)
		}
	}

	if old != nil && sameProgrammed(old, f) {
		// display fields only (kind, names; node and zone of the
		// backends, index for index): the maps already hold f
		meta := f
		meta.Backends = meta.Backends[:len(meta.Backends):len(meta.Backends)]
		old.meta = &meta
		return nil
	}

	// 1. backends
	entries := make([]lbmap.Entry, len(f.Backends))
	master := sockLBLbSvcVal{Id: feID}
	for i, b := range f.Backends {
		switch b.State {
		case lb.Active:
			master.Active++
		case lb.Terminating:
			master.Terminating++
		default:
			master.Quarantined++
		}
		prev, ok := oldIDs[lbmap.BackendAddr{Addr: b.Addr, Port: b.Port}]
		id := prev.ID
		if !ok {
			if id, err = s.beIDs.Alloc(); err != nil {
				rollback()
				return fmt.Errorf("backend id: %w", err)
			}
			created = append(created, id)
		} else if prev.Backend.State == b.State {
			entries[i] = lbmap.Entry{ID: id, Backend: b}
			continue
		} else {
			changed = append(changed, prev)
		}
		v := backendVal(b, f.Key.Proto, feID)
		if err := s.objs.AxonLbBe.Put(&id, &v); err != nil {
			rollback()
			return fmt.Errorf("write backend %s: %w", netip.AddrPortFrom(b.Addr, b.Port), lbmap.MapFullHint(err, MapLBBackend))
		}
		entries[i] = lbmap.Entry{ID: id, Backend: b}
	}
	if secs := lbmap.AffinitySeconds(f.Affinity); secs > 0 {
		master.Flags |= lbmap.FlagAffinity
		master.AffinityTimeout = secs
	}

	// 2. slots beyond the current count: not yet visible to the hooks
	for i := oldSlots; i < len(entries); i++ {
		slot := uint16(i + 1)
		k := svcKey(f.Key, slot)
		v := sockLBLbSvcVal{Id: entries[i].ID}
		if err := s.objs.AxonLbSvc.Put(&k, &v); err != nil {
			rollback()
			return fmt.Errorf("write slot %d: %w", slot, lbmap.MapFullHint(err, MapLBService))
		}
		written = append(written, slot)
	}
	// 3. slots in use: each flips from an old backend to a new one
	for i := 0; i < len(entries) && i < oldSlots; i++ {
		k := svcKey(f.Key, uint16(i+1))
		v := sockLBLbSvcVal{Id: entries[i].ID}
		if err := s.objs.AxonLbSvc.Put(&k, &v); err != nil {
			s.restoreLocked(f.Key, old)
			rollback()
			return fmt.Errorf("write slot %d: %w", i+1, lbmap.MapFullHint(err, MapLBService))
		}
	}
	// 4. the master: the new backend set becomes visible at once
	mk := svcKey(f.Key, 0)
	if err := s.objs.AxonLbSvc.Put(&mk, &master); err != nil {
		if old != nil {
			s.restoreLocked(f.Key, old)
		}
		rollback()
		return fmt.Errorf("write master entry: %w", lbmap.MapFullHint(err, MapLBService))
	}

	// 5. cleanup: stale slots, then backends nothing references any more
	var errs []error
	for i := len(entries); i < oldSlots; i++ {
		k := svcKey(f.Key, uint16(i+1))
		if err := s.objs.AxonLbSvc.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("remove stale slot %d: %w", i+1, err))
		}
	}
	keep := map[uint32]bool{}
	for _, e := range entries {
		keep[e.ID] = true
	}
	var gone []GoneBackend
	if old != nil {
		for i := range old.ids {
			be := old.entry(i)
			if keep[be.ID] {
				continue
			}
			gone = append(gone, GoneBackend{FrontendID: feID, Addr: be.Backend.Addr, Port: be.Backend.Port, TCP: true})
			if err := s.objs.AxonLbBe.Delete(&be.ID); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				errs = append(errs, fmt.Errorf("remove backend %d: %w", be.ID, err))
				continue
			}
			s.beIDs.Free(be.ID)
		}
	}
	if old == nil {
		s.svcEntries += 1 + len(entries)
	} else {
		s.svcEntries += len(entries) - oldSlots
	}
	s.fe[f.Key] = newFEState(feID, master, f, entries)
	// sockets still connected to a removed backend are aborted (both
	// protocols: the backend is gone from this Service, its address may
	// soon belong to another pod)
	s.destroyLocked(gone)
	if len(errs) > 0 {
		return fmt.Errorf("frontend programmed, cleanup incomplete: %w", errors.Join(errs...))
	}
	return nil
}

// sameProgrammed reports whether the maps already hold exactly f (same
// backends in the same slots, same master), so an upsert has nothing to
// write (a restarted agent re-upserts every frontend once).
func sameProgrammed(old *feState, f lb.Frontend) bool {
	if len(old.ids) != len(f.Backends) {
		return false
	}
	master := sockLBLbSvcVal{Id: old.id}
	for i, b := range f.Backends {
		e := old.meta.Backends[i]
		if e.Addr != b.Addr || e.Port != b.Port || e.State != b.State {
			return false
		}
		switch b.State {
		case lb.Active:
			master.Active++
		case lb.Terminating:
			master.Terminating++
		default:
			master.Quarantined++
		}
	}
	if secs := lbmap.AffinitySeconds(f.Affinity); secs > 0 {
		master.Flags |= lbmap.FlagAffinity
		master.AffinityTimeout = secs
	}
	return master == old.master
}

// restoreLocked rewrites the slots in use of old (best effort, after a
// failed write in place).
func (s *LB) restoreLocked(k lb.FrontendKey, old *feState) {
	if old == nil {
		return
	}
	for i, id := range old.ids {
		sk := svcKey(k, uint16(i+1))
		v := sockLBLbSvcVal{Id: id}
		_ = s.objs.AxonLbSvc.Put(&sk, &v)
	}
}

func backendVal(b lb.Backend, proto lb.Proto, feID uint32) sockLBLbBackend {
	return sockLBLbBackend{Addr: lbmap.Addr16(b.Addr), Port: lbmap.Port(b.Port), Proto: uint8(proto), State: uint8(b.State), FrontendId: feID}
}

// DeleteFrontend removes a frontend: its master entry first (the service
// disappears at once), then its slots and backends. A frontend that is not
// programmed is no error.
func (s *LB) DeleteFrontend(k lb.FrontendKey) error {
	k, err := lbmap.NormKey(k)
	if err != nil {
		return fmt.Errorf("delete frontend: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.fe[k]
	if st == nil {
		return nil
	}
	mk := svcKey(k, 0)
	if err := s.objs.AxonLbSvc.Delete(&mk); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete frontend %s: master entry: %w", lbmap.KeyString(k), err)
	}
	delete(s.fe, k)
	s.feIDs.Free(st.id)
	var errs []error
	total := slotCount(st.master)
	s.svcEntries -= 1 + len(st.ids)
	// a deleted Service's connected UDP sockets are aborted, as kube-proxy
	// flushes its UDP conntrack entries; TCP connections keep working
	gone := make([]GoneBackend, 0, len(st.ids))
	for _, b := range st.meta.Backends {
		gone = append(gone, GoneBackend{FrontendID: st.id, Addr: b.Addr, Port: b.Port})
	}
	defer s.destroyLocked(gone)
	for i := 0; i < total || i < len(st.ids); i++ {
		sk := svcKey(k, uint16(i+1))
		if err := s.objs.AxonLbSvc.Delete(&sk); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("slot %d: %w", i+1, err))
		}
	}
	for _, id := range st.ids {
		if err := s.objs.AxonLbBe.Delete(&id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("backend %d: %w", id, err))
			continue
		}
		s.beIDs.Free(id)
	}
	if len(errs) > 0 {
		return fmt.Errorf("delete frontend %s (no longer served; the next load removes the rest): %w", lbmap.KeyString(k), errors.Join(errs...))
	}
	return nil
}

// Frontends reads every programmed frontend back from the maps, sorted by
// key, backends sorted by address and port. Kind, Service, PortName,
// LocalOnly and the backends' NodeName/Zone are not in the maps: they come
// from the last upsert by this process (empty after a restart until the
// agent upserts the frontend again).
func (s *LB) Frontends() ([]lb.Frontend, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, err := s.readMaps(s.svcEntries, s.beIDs.Len())
	if err != nil {
		return nil, err
	}
	// masters first: their counts size the slot lists
	type raw struct {
		master sockLBLbSvcVal
		ids    []uint32 // slot i+1
	}
	fes := make(map[lb.FrontendKey]*raw, len(c.masters))
	for fk, m := range c.masters {
		if m.Id != 0 { // slots written ahead of their master: not a frontend yet
			fes[fk] = &raw{master: m, ids: make([]uint32, slotCount(m))}
		}
	}
	for _, se := range c.slots {
		if r := fes[feKeyOf(se.key)]; r != nil && int(se.key.Slot) <= len(r.ids) {
			r.ids[se.key.Slot-1] = se.id
		}
	}
	out := make([]lb.Frontend, 0, len(fes))
	for fk, r := range fes {
		f := lb.Frontend{Key: fk, Backends: make([]lb.Backend, 0, len(r.ids))}
		if r.master.Flags&lbmap.FlagAffinity != 0 {
			f.Affinity = time.Duration(r.master.AffinityTimeout) * time.Second
		}
		st := s.fe[fk]
		if st != nil {
			meta := st.meta
			f.Kind, f.Service, f.PortName, f.LocalOnly = meta.Kind, meta.Service, meta.PortName, meta.LocalOnly
		}
		for i, id := range r.ids {
			if id == 0 {
				return nil, fmt.Errorf("frontend %s: slot %d missing from %s", lbmap.KeyString(fk), i+1, MapLBService)
			}
			bv, ok := c.backends[id]
			if !ok {
				return nil, fmt.Errorf("frontend %s: backend %d of slot %d: %w", lbmap.KeyString(fk), id, i+1, ebpf.ErrKeyNotExist)
			}
			b := fromBackendVal(bv)
			if st != nil && i < len(st.ids) {
				// node and zone (not in the maps) from the entry last written to this slot
				if w := st.meta.Backends[i]; w.Addr == b.Addr && w.Port == b.Port {
					b.NodeName, b.Zone = w.NodeName, w.Zone
				}
			}
			f.Backends = append(f.Backends, b)
		}
		slices.SortFunc(f.Backends, lb.CompareBackends)
		out = append(out, f)
	}
	slices.SortFunc(out, func(a, b lb.Frontend) int { return lbmap.CompareKeys(a.Key, b.Key) })
	return out, nil
}

// lbmap.WithBackendMeta fills in what the maps do not hold (node, zone) from the
// frontend last written, for a backend read back from the maps (the
// north-south LB; the socket LB takes them from its slot entries).
// Fits reports whether the frontends of one Service can all be written
// now: an error wrapping lb.ErrFull says which map is short and by how
// much. Nothing is written either way. The estimate is conservative: it
// counts each frontend's peak (new entries are written before old ones are
// removed).
func (s *LB) Fits(fs []lb.Frontend) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	needSvc, needBe := 0, 0
	for _, f := range fs {
		f, err := lbmap.NormFrontend(f)
		if err != nil {
			continue // UpsertFrontend reports bad input itself
		}
		old := s.fe[f.Key]
		if old == nil {
			needSvc += 1 + len(f.Backends)
			needBe += len(f.Backends)
			continue
		}
		needSvc += max(0, len(f.Backends)-len(old.ids))
		have := map[lbmap.BackendAddr]lb.BackendState{}
		for _, b := range old.meta.Backends {
			have[lbmap.BackendAddr{Addr: b.Addr, Port: b.Port}] = b.State
		}
		for _, b := range f.Backends {
			if _, ok := have[lbmap.BackendAddr{Addr: b.Addr, Port: b.Port}]; !ok {
				needBe++
			}
		}
	}
	svcMax, beMax := int(s.objs.AxonLbSvc.MaxEntries()), int(s.objs.AxonLbBe.MaxEntries())
	var short []string
	if free := svcMax - s.svcEntries; needSvc > free {
		short = append(short, fmt.Sprintf("%s needs %d more entries, %d of %d free", MapLBService, needSvc, max(free, 0), svcMax))
	}
	if free := beMax - s.beIDs.Len(); needBe > free {
		short = append(short, fmt.Sprintf("%s needs %d more entries, %d of %d free", MapLBBackend, needBe, max(free, 0), beMax))
	}
	if len(short) > 0 {
		return fmt.Errorf("%w: %s (raise --lb-service-map-size/--lb-backend-map-size or remove Services)", lb.ErrFull, strings.Join(short, "; "))
	}
	return nil
}

// SetLocalAddrs replaces the node's local addresses that NodePort and
// HostPort frontends match on (loopback always matches). Invalid input
// changes nothing.
func (s *LB) SetLocalAddrs(addrs []netip.Addr) error {
	want := map[[16]byte]bool{}
	for _, a := range addrs {
		if !a.IsValid() || a.IsUnspecified() {
			return fmt.Errorf("set local addresses: %q is not a usable address", a)
		}
		want[lbmap.Addr16(a.Unmap())] = true
	}
	if max := int(s.objs.AxonLbLocal.MaxEntries()); len(want) > max {
		return fmt.Errorf("set local addresses: %d addresses, the map %s holds at most %d", len(want), MapLBLocal, max)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := datapath.ReplaceKeys(s.objs.AxonLbLocal, MapLBLocal, want); err != nil {
		return fmt.Errorf("set local addresses: %w", err)
	}
	return nil
}
