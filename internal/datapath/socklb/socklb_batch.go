package socklb

// Batched writes for the socket LB's full sync: 10 000 new frontends × 10
// backends are 210 000 map updates one by one; with BPF_MAP_UPDATE_BATCH
// they are three system calls per chunk. The order of a single upsert is
// kept across the whole batch (all backends, then all slots, then all
// master entries), so the hooks never see a master whose slots are missing.

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"

	"github.com/axonhq/axon/internal/datapath/lbmap"
	"github.com/axonhq/axon/internal/lb"
)

var _ lb.BatchWriter = (*LB)(nil)

// batchMin is the number of new frontends below which single writes are
// used (a batch saves nothing for a handful).
const batchMin = 4

// batchChunk bounds the entries of one BPF_MAP_UPDATE_BATCH call.
const batchChunk = 16384

// UpsertFrontends implements lb.BatchWriter: like UpsertFrontend for each of
// fs (errs[i] belongs to fs[i]; nil when all succeeded). Frontends not yet
// programmed are written in batches; the others, and all of them when the
// kernel has no batch operations or a batch fails (a full map), one by one,
// so every error is attributed to its frontend.
func (s *LB) UpsertFrontends(fs []lb.Frontend) []error {
	errs := make([]error, len(fs))
	failed := false
	norm := make([]lb.Frontend, len(fs))
	s.mu.Lock()
	defer s.mu.Unlock()
	var fresh []int
	seen := make(map[lb.FrontendKey]bool, len(fs))
	var single []int
	for i, f := range fs {
		nf, err := lbmap.NormFrontend(f)
		if err != nil {
			errs[i], failed = fmt.Errorf("upsert frontend: %w", err), true
			continue
		}
		norm[i] = nf
		if s.fe[nf.Key] == nil && !seen[nf.Key] {
			fresh = append(fresh, i)
		} else {
			single = append(single, i)
		}
		seen[nf.Key] = true
	}
	if len(fresh) >= batchMin {
		if err := s.batchNewLocked(norm, fresh); err != nil {
			if !errors.Is(err, ebpf.ErrNotSupported) {
				s.log.Debug("socket LB: batch write failed; writing one by one", "frontends", len(fresh), "error", err)
			}
			single = append(fresh, single...)
		}
	} else {
		single = append(fresh, single...)
	}
	for _, i := range single {
		if err := s.upsertLocked(norm[i]); err != nil {
			errs[i], failed = fmt.Errorf("upsert frontend %s: %w", lbmap.KeyString(norm[i].Key), err), true
		}
	}
	if !failed {
		return nil
	}
	return errs
}

// batchNewLocked writes the frontends fs[idx...] (none programmed yet)
// with batch updates. On an error nothing of them stays written and the
// ids are freed.
func (s *LB) batchNewLocked(fs []lb.Frontend, idx []int) error {
	type plan struct {
		feID    uint32
		master  sockLBLbSvcVal
		entries []lbmap.Entry
	}
	plans := make([]plan, len(idx))
	nbe := 0
	for _, i := range idx {
		nbe += len(fs[i].Backends)
	}
	var (
		beKeys   = make([]uint32, 0, nbe)
		beVals   = make([]sockLBLbBackend, 0, nbe)
		slotKeys = make([]sockLBLbSvcKey, 0, nbe)
		slotVals = make([]sockLBLbSvcVal, 0, nbe)
		mKeys    = make([]sockLBLbSvcKey, 0, len(idx))
		mVals    = make([]sockLBLbSvcVal, 0, len(idx))
	)
	freeIDs := func() {
		for _, p := range plans {
			if p.feID != 0 {
				s.feIDs.Free(p.feID)
			}
			for _, e := range p.entries {
				s.beIDs.Free(e.ID)
			}
		}
	}
	for n, i := range idx {
		f := fs[i]
		id, err := s.feIDs.Alloc()
		if err != nil {
			freeIDs()
			return fmt.Errorf("frontend id: %w", err)
		}
		p := plan{feID: id, master: sockLBLbSvcVal{Id: id}, entries: make([]lbmap.Entry, 0, len(f.Backends))}
		for _, b := range f.Backends {
			switch b.State {
			case lb.Active:
				p.master.Active++
			case lb.Terminating:
				p.master.Terminating++
			default:
				p.master.Quarantined++
			}
			bid, err := s.beIDs.Alloc()
			if err != nil {
				plans[n] = p
				freeIDs()
				return fmt.Errorf("backend id: %w", err)
			}
			p.entries = append(p.entries, lbmap.Entry{ID: bid, Backend: b})
			beKeys = append(beKeys, bid)
			beVals = append(beVals, backendVal(b, f.Key.Proto, id))
			slotKeys = append(slotKeys, svcKey(f.Key, uint16(len(p.entries))))
			slotVals = append(slotVals, sockLBLbSvcVal{Id: bid})
		}
		if secs := lbmap.AffinitySeconds(f.Affinity); secs > 0 {
			p.master.Flags |= lbmap.FlagAffinity
			p.master.AffinityTimeout = secs
		}
		plans[n] = p
		mKeys = append(mKeys, svcKey(f.Key, 0))
		mVals = append(mVals, p.master)
	}
	// capacity: a batch that would overflow a map fails part-way; check first
	if free := int(s.objs.AxonLbSvc.MaxEntries()) - s.svcEntries; len(slotKeys)+len(mKeys) > free {
		freeIDs()
		return fmt.Errorf("%w: %s needs %d entries, %d free", lb.ErrFull, MapLBService, len(slotKeys)+len(mKeys), max(free, 0))
	}
	rollbackSvc := func(keys []sockLBLbSvcKey) {
		for i := range keys {
			_ = s.objs.AxonLbSvc.Delete(&keys[i])
		}
	}
	rollbackBe := func() {
		for i := range beKeys {
			_ = s.objs.AxonLbBe.Delete(&beKeys[i])
		}
	}
	if err := batchPut(s.objs.AxonLbBe, beKeys, beVals); err != nil {
		rollbackBe()
		freeIDs()
		return fmt.Errorf("write backends: %w", lbmap.MapFullHint(err, MapLBBackend))
	}
	if err := batchPut(s.objs.AxonLbSvc, slotKeys, slotVals); err != nil {
		rollbackSvc(slotKeys)
		rollbackBe()
		freeIDs()
		return fmt.Errorf("write slots: %w", lbmap.MapFullHint(err, MapLBService))
	}
	if err := batchPut(s.objs.AxonLbSvc, mKeys, mVals); err != nil {
		rollbackSvc(mKeys)
		rollbackSvc(slotKeys)
		rollbackBe()
		freeIDs()
		return fmt.Errorf("write master entries: %w", lbmap.MapFullHint(err, MapLBService))
	}
	for n, i := range idx {
		f, p := fs[i], plans[n]
		s.fe[f.Key] = newFEState(p.feID, p.master, f, p.entries)
		s.svcEntries += 1 + len(p.entries)
	}
	return nil
}

// batchPut writes keys[i] → vals[i] in chunks of batchChunk.
func batchPut[K, V any](m *ebpf.Map, keys []K, vals []V) error {
	for lo := 0; lo < len(keys); lo += batchChunk {
		hi := min(lo+batchChunk, len(keys))
		if _, err := m.BatchUpdate(keys[lo:hi], vals[lo:hi], &ebpf.BatchOptions{}); err != nil {
			return err
		}
	}
	return nil
}
