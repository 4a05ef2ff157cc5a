package nodeport

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/cilium/ebpf"

	"github.com/axonhq/axon/internal/datapath/lbmap"
	"github.com/axonhq/axon/internal/lb"
)

var _ lb.Writer = (*LB)(nil)

// np_svc_val.flags and np_backend values (bpf/lib/nodeport.h).
const (
	npFlagAffinity  = 0x01
	npFlagMaglev    = 0x02
	npFlagSrcRanges = 0x04
	npFlagDSR       = 0x08
	npFlagLocalOnly = 0x10
	npBackendLocal  = 0x01
)

// npFrontend is what the maps hold for one frontend, plus the display
// fields of the last upsert.
type npFrontend struct {
	id       uint32
	master   lbTCNpSvcVal
	backends []lbmap.Entry // slot i+1 holds backends[i]
	ranges   []netip.Prefix
	meta     *lb.Frontend
}

// UpsertFrontend programs f with the options of SetFrontendOptions (lb.Writer).
func (n *LB) UpsertFrontend(f lb.Frontend) error {
	n.mu.Lock()
	fn := n.optFn
	n.mu.Unlock()
	var o FrontendOptions
	if fn != nil {
		o = fn(f)
	}
	return n.UpsertFrontendWith(f, o)
}

// UpsertFrontendWith programs f (new, or a new backend set and options of an
// existing frontend). Backends are written first, then the slots, source
// ranges and Maglev table (swapped whole), then the master entry; stale
// entries are removed last, so packets never see a partial frontend. On
// bad input the previous state stays.
func (n *LB) UpsertFrontendWith(f lb.Frontend, o FrontendOptions) error {
	// the Maglev table indexes the caller's backend order: resolve it first
	var mag []lbmap.BackendAddr
	if o.Maglev != nil {
		if uint32(len(o.Maglev)) != n.opts.MaglevTableSize {
			return fmt.Errorf("upsert frontend %s: Maglev table has %d slots, the LB was loaded with %d (Options.MaglevTableSize)",
				lbmap.KeyString(f.Key), len(o.Maglev), n.opts.MaglevTableSize)
		}
		mag = make([]lbmap.BackendAddr, len(o.Maglev))
		for i, idx := range o.Maglev {
			if int(idx) >= len(f.Backends) {
				return fmt.Errorf("upsert frontend %s: Maglev slot %d points at backend %d of %d", lbmap.KeyString(f.Key), i, idx, len(f.Backends))
			}
			b := f.Backends[idx]
			mag[i] = lbmap.BackendAddr{Addr: b.Addr.Unmap(), Port: b.Port}
		}
	}
	f, err := lbmap.NormFrontend(f)
	if err != nil {
		return fmt.Errorf("upsert frontend: %w", err)
	}
	mode := o.Mode
	if mode == "" {
		mode = n.opts.Mode
	}
	if mode != ModeSNAT && mode != ModeDSR {
		return fmt.Errorf("upsert frontend %s: mode %q is not %s or %s", lbmap.KeyString(f.Key), mode, ModeSNAT, ModeDSR)
	}
	var ranges []netip.Prefix
	for _, p := range o.SourceRanges {
		if !p.IsValid() {
			return fmt.Errorf("upsert frontend %s: invalid source range %v", lbmap.KeyString(f.Key), p)
		}
		p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()).Masked()
		if p.Addr().Is4() != f.Key.Addr.Is4() {
			return fmt.Errorf("upsert frontend %s: source range %s is of the other address family", lbmap.KeyString(f.Key), p)
		}
		ranges = append(ranges, p)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.upsertLocked(f, mode, ranges, mag); err != nil {
		return fmt.Errorf("upsert frontend %s: %w", lbmap.KeyString(f.Key), err)
	}
	n.warnPodFrontend(f.Key)
	return nil
}

func npSvcKey(k lb.FrontendKey, slot uint16) lbTCNpSvcKey {
	return lbTCNpSvcKey{Addr: lbmap.Addr16(k.Addr), Port: lbmap.Port(k.Port), Proto: uint8(k.Proto), Scope: uint8(k.Scope), Slot: slot}
}

func npFeKey(k lbTCNpSvcKey) lb.FrontendKey {
	return lb.FrontendKey{Addr: lbmap.FromAddr16(k.Addr), Port: lbmap.PortHost(k.Port), Proto: lb.Proto(k.Proto), Scope: lb.Scope(k.Scope)}
}

// npDSRKey is the axon_np_dsr key of a backend address of frontend id.
func npDSRKey(id uint32, a netip.Addr) lbTCNpDsrKey {
	return lbTCNpDsrKey{FrontendId: id, Addr: lbmap.Addr16(a)}
}

func npRangeKey(id uint32, p netip.Prefix) lbTCNpSrcrangeKey {
	addr, bits := prefix16(p)
	return lbTCNpSrcrangeKey{Prefixlen: uint32(32 + bits), FrontendId: id, Addr: addr}
}

func (n *LB) backendVal(b lb.Backend, feID uint32) lbTCNpBackend {
	v := lbTCNpBackend{Addr: lbmap.Addr16(b.Addr), Port: lbmap.Port(b.Port), State: uint8(b.State), FrontendId: feID}
	if n.opts.NodeName != "" && b.NodeName == n.opts.NodeName {
		v.Flags |= npBackendLocal
	}
	return v
}

func (n *LB) upsertLocked(f lb.Frontend, mode string, ranges []netip.Prefix, mag []lbmap.BackendAddr) error {
	m := n.tc.lbTCMaps
	old := n.fe[f.Key]
	oldIDs := map[lbmap.BackendAddr]lbmap.Entry{}
	oldSlots := 0
	var feID uint32
	var created []uint32
	if old != nil {
		feID = old.id
		oldSlots = len(old.backends)
		for _, be := range old.backends {
			oldIDs[lbmap.BackendAddr{Addr: be.Backend.Addr, Port: be.Backend.Port}] = be
		}
	} else {
		id, err := n.feIDs.Alloc()
		if err != nil {
			return fmt.Errorf("frontend id: %w", err)
		}
		feID = id
	}
	var dsrWritten []lbTCNpDsrKey
	fail := func(err error) error {
		for _, k := range dsrWritten {
			_ = m.AxonNpDsr.Delete(&k)
		}
		for _, id := range created {
			_ = m.AxonNpBe.Delete(&id)
			n.beIDs.Free(id)
		}
		if old == nil {
			for slot := 1; slot <= len(f.Backends); slot++ {
				k := npSvcKey(f.Key, uint16(slot))
				_ = m.AxonNpSvc.Delete(&k)
			}
			n.feIDs.Free(feID)
		}
		return err
	}

	// 1. backends (and the DSR entries of local ones)
	master := lbTCNpSvcVal{Id: feID}
	local := map[netip.Addr]bool{}
	entries := make([]lbmap.Entry, len(f.Backends))
	ids := map[lbmap.BackendAddr]uint32{}
	for i, b := range f.Backends {
		switch b.State {
		case lb.Active:
			master.Active++
		case lb.Terminating:
			master.Terminating++
		default:
			master.Quarantined++
		}
		ba := lbmap.BackendAddr{Addr: b.Addr, Port: b.Port}
		id := oldIDs[ba].ID
		if id == 0 {
			var err error
			if id, err = n.beIDs.Alloc(); err != nil {
				return fail(fmt.Errorf("backend id: %w", err))
			}
			created = append(created, id)
		}
		v := n.backendVal(b, feID)
		if err := m.AxonNpBe.Put(&id, &v); err != nil {
			return fail(fmt.Errorf("write backend %s: %w", netip.AddrPortFrom(b.Addr, b.Port), lbmap.MapFullHint(err, MapBackend)))
		}
		entries[i] = lbmap.Entry{ID: id, Backend: b}
		ids[ba] = id
		// a pod on this node: accept other nodes' DSR requests for it
		if v.Flags&npBackendLocal != 0 {
			dk := npDSRKey(feID, b.Addr)
			if err := m.AxonNpDsr.Put(&dk, &id); err != nil {
				return fail(fmt.Errorf("write DSR entry of %s: %w", netip.AddrPortFrom(b.Addr, b.Port), lbmap.MapFullHint(err, MapDSR)))
			}
			if oldIDs[ba].ID == 0 {
				dsrWritten = append(dsrWritten, dk)
			}
			local[b.Addr] = true
		}
	}
	// 2. slots: beyond the old count first (invisible), then the ones in use
	for pass := 0; pass < 2; pass++ {
		for i, e := range entries {
			slot := i + 1
			if (pass == 0) != (slot > oldSlots) {
				continue
			}
			k := npSvcKey(f.Key, uint16(slot))
			v := lbTCNpSvcVal{Id: e.ID}
			if err := m.AxonNpSvc.Put(&k, &v); err != nil {
				return fail(fmt.Errorf("write slot %d: %w", slot, lbmap.MapFullHint(err, MapService)))
			}
		}
	}
	// 3. source ranges (new ones before the master turns the check on)
	if len(ranges) > 0 {
		master.Flags |= npFlagSrcRanges
		for _, p := range ranges {
			k := npRangeKey(feID, p)
			if err := m.AxonNpSrcrange.Put(&k, uint8(1)); err != nil {
				return fail(fmt.Errorf("write source range %s: %w", p, lbmap.MapFullHint(err, MapSrcRange)))
			}
		}
	}
	// 4. Maglev table: a new inner map swapped in whole
	if mag != nil {
		inner, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: n.opts.MaglevTableSize})
		if err != nil {
			return fail(fmt.Errorf("create Maglev table: %w", err))
		}
		keys := make([]uint32, len(mag))
		vals := make([]uint32, len(mag))
		for i, ba := range mag {
			keys[i], vals[i] = uint32(i), ids[ba]
		}
		_, err = inner.BatchUpdate(keys, vals, nil)
		if err != nil {
			for i := range keys {
				if err = inner.Put(&keys[i], &vals[i]); err != nil {
					break
				}
			}
		}
		if err == nil {
			err = m.AxonLbMaglev.Put(&feID, inner)
		}
		inner.Close()
		if err != nil {
			return fail(fmt.Errorf("write Maglev table: %w", lbmap.MapFullHint(err, MapLBMaglev)))
		}
		master.Flags |= npFlagMaglev
	}
	if secs := lbmap.AffinitySeconds(f.Affinity); secs > 0 {
		master.Flags |= npFlagAffinity
		master.AffinityTimeout = secs
	}
	if mode == ModeDSR {
		master.Flags |= npFlagDSR
	}
	if f.LocalOnly {
		master.Flags |= npFlagLocalOnly
	}
	// 5. master
	mk := npSvcKey(f.Key, 0)
	if err := m.AxonNpSvc.Put(&mk, &master); err != nil {
		return fail(fmt.Errorf("write frontend: %w", lbmap.MapFullHint(err, MapService)))
	}
	// 6. stale state
	var errs []error
	for slot := len(entries) + 1; slot <= oldSlots; slot++ {
		k := npSvcKey(f.Key, uint16(slot))
		if err := m.AxonNpSvc.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("delete slot %d: %w", slot, err))
		}
	}
	for ba, be := range oldIDs {
		if !local[ba.Addr] {
			dk := npDSRKey(feID, ba.Addr)
			if err := m.AxonNpDsr.Delete(&dk); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				errs = append(errs, fmt.Errorf("delete DSR entry of %s: %w", ba.Addr, err))
			}
		}
		if _, ok := ids[ba]; ok {
			continue
		}
		if err := m.AxonNpBe.Delete(&be.ID); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("delete backend %d: %w", be.ID, err))
		}
		n.beIDs.Free(be.ID)
	}
	if old != nil {
		keep := map[netip.Prefix]bool{}
		for _, p := range ranges {
			keep[p] = true
		}
		for _, p := range old.ranges {
			if !keep[p] {
				k := npRangeKey(feID, p)
				if err := m.AxonNpSrcrange.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
					errs = append(errs, fmt.Errorf("delete source range %s: %w", p, err))
				}
			}
		}
	}
	if mag == nil {
		if err := m.AxonLbMaglev.Delete(&feID); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("delete Maglev table: %w", err))
		}
	}
	meta := f
	n.fe[f.Key] = &npFrontend{id: feID, master: master, backends: entries, ranges: ranges, meta: &meta}
	return errors.Join(errs...)
}

// DeleteFrontend removes a frontend: master first (no new flows), then its
// slots, backends, source ranges and Maglev table. Established flows keep
// their CT entries until they time out or GC drops them (backend gone).
func (n *LB) DeleteFrontend(k lb.FrontendKey) error {
	k, err := lbmap.NormKey(k)
	if err != nil {
		return fmt.Errorf("delete frontend: %w", err)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	st := n.fe[k]
	if st == nil {
		return nil
	}
	m := n.tc.lbTCMaps
	var errs []error
	del := func(mp *ebpf.Map, key any, what string) {
		if err := mp.Delete(key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("delete %s: %w", what, err))
		}
	}
	mk := npSvcKey(k, 0)
	del(m.AxonNpSvc, &mk, "frontend")
	for i, be := range st.backends {
		sk := npSvcKey(k, uint16(i+1))
		del(m.AxonNpSvc, &sk, "slot")
		del(m.AxonNpBe, &be.ID, "backend")
		dk := npDSRKey(st.id, be.Backend.Addr)
		del(m.AxonNpDsr, &dk, "DSR entry")
		n.beIDs.Free(be.ID)
	}
	for _, p := range st.ranges {
		rk := npRangeKey(st.id, p)
		del(m.AxonNpSrcrange, &rk, "source range")
	}
	del(m.AxonLbMaglev, &st.id, "Maglev table")
	delete(n.fe, k)
	n.feIDs.Free(st.id)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("delete frontend %s: %w", lbmap.KeyString(k), err)
	}
	return nil
}

// Frontends reads every programmed frontend back from the maps (lb.Writer),
// sorted by key. Display fields (Kind, Service, ...) come from the last
// upsert by this process.
func (n *LB) Frontends() ([]lb.Frontend, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	fes, err := n.readMaps()
	if err != nil {
		return nil, err
	}
	out := make([]lb.Frontend, 0, len(fes))
	for k, st := range fes {
		f := lb.Frontend{Key: k, LocalOnly: st.master.Flags&npFlagLocalOnly != 0}
		if st.master.Flags&npFlagAffinity != 0 {
			f.Affinity = time.Duration(st.master.AffinityTimeout) * time.Second
		}
		var meta *lb.Frontend
		if cur := n.fe[k]; cur != nil && cur.meta != nil {
			meta = cur.meta
			f.Kind, f.Service, f.PortName = meta.Kind, meta.Service, meta.PortName
		}
		for _, be := range st.backends {
			f.Backends = append(f.Backends, lbmap.WithBackendMeta(be.Backend, meta))
		}
		slices.SortFunc(f.Backends, lb.CompareBackends)
		out = append(out, f)
	}
	slices.SortFunc(out, func(a, b lb.Frontend) int { return lbmap.CompareKeys(a.Key, b.Key) })
	return out, nil
}

// readMaps reads frontends (master + slots + backends) from the maps.
func (n *LB) readMaps() (map[lb.FrontendKey]*npFrontend, error) {
	m := n.tc.lbTCMaps
	type raw struct {
		master lbTCNpSvcVal
		has    bool
		slots  map[uint16]uint32
	}
	raws := map[lb.FrontendKey]*raw{}
	var k lbTCNpSvcKey
	var v lbTCNpSvcVal
	it := m.AxonNpSvc.Iterate()
	for it.Next(&k, &v) {
		fk := npFeKey(k)
		r := raws[fk]
		if r == nil {
			r = &raw{slots: map[uint16]uint32{}}
			raws[fk] = r
		}
		if k.Slot == 0 {
			r.master, r.has = v, true
		} else {
			r.slots[k.Slot] = v.Id
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", MapService, err)
	}
	out := map[lb.FrontendKey]*npFrontend{}
	for fk, r := range raws {
		if !r.has || r.master.Id == 0 {
			continue
		}
		st := &npFrontend{id: r.master.Id, master: r.master}
		total := int(r.master.Active) + int(r.master.Terminating) + int(r.master.Quarantined)
		for slot := 1; slot <= total; slot++ {
			id, ok := r.slots[uint16(slot)]
			if !ok {
				return nil, fmt.Errorf("frontend %s: slot %d missing from %s", lbmap.KeyString(fk), slot, MapService)
			}
			var bv lbTCNpBackend
			if err := m.AxonNpBe.Lookup(&id, &bv); err != nil {
				return nil, fmt.Errorf("frontend %s: backend %d of slot %d: %w", lbmap.KeyString(fk), id, slot, err)
			}
			st.backends = append(st.backends, lbmap.Entry{ID: id, Backend: lb.Backend{Addr: lbmap.FromAddr16(bv.Addr), Port: lbmap.PortHost(bv.Port), State: lb.BackendState(bv.State)}})
		}
		out[fk] = st
	}
	return out, nil
}

// MaglevTable returns the backend of every slot of frontend k's Maglev
// table as programmed (nil, nil when the frontend picks at random).
func (n *LB) MaglevTable(k lb.FrontendKey) ([]netip.AddrPort, error) {
	k, err := lbmap.NormKey(k)
	if err != nil {
		return nil, fmt.Errorf("maglev table: %w", err)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	st := n.fe[k]
	if st == nil {
		return nil, fmt.Errorf("maglev table: frontend %s is not programmed", lbmap.KeyString(k))
	}
	var inner *ebpf.Map
	if err := n.tc.AxonLbMaglev.Lookup(&st.id, &inner); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("maglev table of %s: %w", lbmap.KeyString(k), err)
	}
	defer inner.Close()
	byID := map[uint32]netip.AddrPort{}
	for _, be := range st.backends {
		byID[be.ID] = netip.AddrPortFrom(be.Backend.Addr, be.Backend.Port)
	}
	out := make([]netip.AddrPort, n.opts.MaglevTableSize)
	var key, id uint32
	it := inner.Iterate()
	for it.Next(&key, &id) {
		if int(key) < len(out) {
			out[key] = byID[id]
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("maglev table of %s: %w", lbmap.KeyString(k), err)
	}
	return out, nil
}
