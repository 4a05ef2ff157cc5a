package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/lb"
)

// Values of struct lb_svc_val.flags and the backend states (bpf/lib/lb.h).
const (
	lbFlagAffinity = 0x1
	lbMaxSlots     = math.MaxUint16 // slot numbers are u16; slot 0 is the master
)

// beAddr identifies a backend inside one frontend.
type beAddr struct {
	addr netip.Addr
	port uint16
}

type beEntry struct {
	id uint32
	b  lb.Backend
}

// feState is what the maps hold for one frontend: the ids, and the
// frontend last written with its backends in slot order (display fields,
// node and zone are not in the maps). meta.Backends is the slice the caller
// passed in (normFrontend copies only what it has to reorder), so the socket
// LB keeps no second copy of every backend list.
type feState struct {
	id     uint32
	master sockLBLbSvcVal
	ids    []uint32     // slot i+1 holds backend ids[i] ...
	meta   *lb.Frontend // ... which is meta.Backends[i]
}

// entry is slot i+1's backend.
func (st *feState) entry(i int) beEntry { return beEntry{id: st.ids[i], b: st.meta.Backends[i]} }

// newFEState records f (normalized, backends in slot order) written with
// entries (entries[i].b == f.Backends[i]).
func newFEState(id uint32, master sockLBLbSvcVal, f lb.Frontend, entries []beEntry) *feState {
	ids := make([]uint32, len(entries))
	for i, e := range entries {
		ids[i] = e.id
	}
	f.Backends = f.Backends[:len(f.Backends):len(f.Backends)] // an append by anyone else copies
	return &feState{id: id, master: master, ids: ids, meta: &f}
}

// idAlloc hands out the lowest free non-zero u32 at or after a moving hint.
type idAlloc struct {
	used map[uint32]bool
	next uint32
}

func (a *idAlloc) alloc() (uint32, error) {
	if a.used == nil {
		a.used = map[uint32]bool{}
	}
	if len(a.used) >= math.MaxUint32-1 {
		return 0, errors.New("id space exhausted")
	}
	for {
		a.next++
		if a.next == 0 {
			a.next = 1
		}
		if !a.used[a.next] {
			a.used[a.next] = true
			return a.next, nil
		}
	}
}

func (a *idAlloc) mark(id uint32) {
	if a.used == nil {
		a.used = map[uint32]bool{}
	}
	a.used[id] = true
	if id > a.next {
		a.next = id // ids freed before a restart are not handed out again soon
	}
}

func (a *idAlloc) free(id uint32) { delete(a.used, id) }

// Conversions between the Go model and the map layouts.

func lbPort(p uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], p)
	return binary.NativeEndian.Uint16(b[:])
}

func lbPortHost(p uint16) uint16 { return lbPort(p) }

func addr16(a netip.Addr) [16]byte { return a.As16() } // IPv4 comes out v4 mapped

func fromAddr16(b [16]byte) netip.Addr { return netip.AddrFrom16(b).Unmap() }

func svcKey(k lb.FrontendKey, slot uint16) sockLBLbSvcKey {
	return sockLBLbSvcKey{Addr: addr16(k.Addr), Port: lbPort(k.Port), Proto: uint8(k.Proto), Scope: uint8(k.Scope), Slot: slot}
}

func feKeyOf(k sockLBLbSvcKey) lb.FrontendKey {
	return lb.FrontendKey{Addr: fromAddr16(k.Addr), Port: lbPortHost(k.Port), Proto: lb.Proto(k.Proto), Scope: lb.Scope(k.Scope)}
}

func affinitySeconds(d time.Duration) uint32 {
	if d <= 0 {
		return 0
	}
	s := (d + time.Second - 1) / time.Second // round up: 500ms -> 1s
	if s > math.MaxUint32 {
		return math.MaxUint32
	}
	return uint32(s)
}

// normFrontend validates f and returns it with unmapped addresses and
// backends in slot order (Active, Terminating, Quarantined; each sorted by
// address and port).
func normFrontend(f lb.Frontend) (lb.Frontend, error) {
	k, err := normKey(f.Key)
	if err != nil {
		return f, err
	}
	f.Key = k
	if f.Affinity < 0 {
		return f, fmt.Errorf("frontend %s: negative session affinity timeout %s", keyString(k), f.Affinity)
	}
	if len(f.Backends) > lbMaxSlots {
		return f, fmt.Errorf("frontend %s: %d backends, at most %d fit the service map slots", keyString(k), len(f.Backends), lbMaxSlots)
	}
	if inSlotOrder(k, f.Backends) {
		return f, nil // the common case: nothing to copy
	}
	seen := map[beAddr]bool{}
	bs := make([]lb.Backend, 0, len(f.Backends))
	for _, b := range f.Backends {
		if !b.Addr.IsValid() {
			return f, fmt.Errorf("frontend %s: backend with an empty address", keyString(k))
		}
		b.Addr = b.Addr.Unmap()
		if b.Addr.Is4() != k.Addr.Is4() {
			return f, fmt.Errorf("frontend %s: backend %s is of the other address family: give v4 frontends v4 backends and v6 frontends v6 ones", keyString(k), b.Addr)
		}
		if b.Port == 0 {
			return f, fmt.Errorf("frontend %s: backend %s has port 0: resolve the targetPort first", keyString(k), b.Addr)
		}
		if b.State > lb.Quarantined {
			return f, fmt.Errorf("frontend %s: backend %s has unknown state %d", keyString(k), b.Addr, b.State)
		}
		ba := beAddr{b.Addr, b.Port}
		if seen[ba] {
			return f, fmt.Errorf("frontend %s: backend %s listed twice", keyString(k), netip.AddrPortFrom(b.Addr, b.Port))
		}
		seen[ba] = true
		bs = append(bs, b)
	}
	slices.SortStableFunc(bs, func(a, b lb.Backend) int {
		if a.State != b.State {
			return int(a.State) - int(b.State)
		}
		return lb.CompareBackends(a, b)
	})
	f.Backends = bs
	return f, nil
}

// inSlotOrder reports whether bs is valid for k and already as normFrontend
// would return it: all Active, unmapped, of k's family, with a port, sorted by
// address and port without duplicates. Anything else takes the slow path,
// which reports what is wrong.
func inSlotOrder(k lb.FrontendKey, bs []lb.Backend) bool {
	for i, b := range bs {
		if b.State != lb.Active || !b.Addr.IsValid() || b.Addr.Is4In6() || b.Addr.Is4() != k.Addr.Is4() || b.Port == 0 {
			return false
		}
		if i > 0 && lb.CompareBackends(bs[i-1], b) >= 0 {
			return false
		}
	}
	return true
}

func normKey(k lb.FrontendKey) (lb.FrontendKey, error) {
	if !k.Addr.IsValid() {
		return k, fmt.Errorf("frontend key %+v: empty address (NodePort and HostPort frontends use 0.0.0.0 or ::)", k)
	}
	k.Addr = k.Addr.Unmap()
	if k.Port == 0 {
		return k, fmt.Errorf("frontend %s: port 0", keyString(k))
	}
	switch k.Proto {
	case lb.TCP, lb.UDP, lb.SCTP:
	default:
		return k, fmt.Errorf("frontend %s: protocol %d is not TCP, UDP or SCTP", keyString(k), k.Proto)
	}
	switch k.Scope {
	case lb.ScopeCluster:
		if k.Addr.IsUnspecified() {
			return k, fmt.Errorf("frontend %s: a cluster-scope frontend needs a service address, not %s", keyString(k), k.Addr)
		}
	case lb.ScopeNodePort, lb.ScopeHostPort:
		if !k.Addr.IsUnspecified() {
			return k, fmt.Errorf("frontend %s: NodePort and HostPort frontends match every local address: use %s as their address",
				keyString(k), map[bool]string{true: "0.0.0.0", false: "::"}[k.Addr.Is4()])
		}
	default:
		return k, fmt.Errorf("frontend %s: unknown scope %d", keyString(k), k.Scope)
	}
	return k, nil
}

func keyString(k lb.FrontendKey) string {
	proto := map[lb.Proto]string{lb.TCP: "tcp", lb.UDP: "udp", lb.SCTP: "sctp"}[k.Proto]
	if proto == "" {
		proto = fmt.Sprintf("proto%d", k.Proto)
	}
	scope := map[lb.Scope]string{lb.ScopeCluster: "cluster", lb.ScopeNodePort: "nodeport", lb.ScopeHostPort: "hostport"}[k.Scope]
	if scope == "" {
		scope = fmt.Sprintf("scope%d", k.Scope)
	}
	return fmt.Sprintf("%s/%s (%s)", netip.AddrPortFrom(k.Addr, k.Port), proto, scope)
}

// mapFullHint explains E2BIG/ENOSPC from a map update.
func mapFullHint(err error, m string) error {
	if errors.Is(err, unix.E2BIG) || errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.ENOMEM) {
		return fmt.Errorf("map %s is full: %w (delete unused services or raise its max_entries in bpf/lib/lb.h)", m, err)
	}
	return err
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
func (s *SockLB) readMaps(svcHint, beHint int) (lbMaps, error) {
	svcKeys, svcVals, err := dumpMap[sockLBLbSvcKey, sockLBLbSvcVal](s.objs.AxonLbSvc, svcHint)
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
	beKeys, beVals, err := dumpMap[uint32, sockLBLbBackend](s.objs.AxonLbBe, beHint)
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
	return lb.Backend{Addr: fromAddr16(v.Addr), Port: lbPortHost(v.Port), State: lb.BackendState(v.State)}
}

// rebuild reads the maps into s.fe and the id allocators, and removes what a
// crash between two writes may have left: slots beyond a master's count or
// without a master, and backends no frontend references.
func (s *SockLB) rebuild() error {
	c, err := s.readMaps(0, 0)
	if err != nil {
		return err
	}
	var (
		stale  []sockLBLbSvcKey
		states = map[lb.FrontendKey][]beEntry{} // slot order
	)
	for fk, m := range c.masters {
		states[fk] = make([]beEntry, slotCount(m))
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
		st[idx] = beEntry{id: se.id, b: fromBackendVal(b)}
		used[se.id] = true
	}
	for fk, st := range states {
		for i, be := range st {
			if be.id == 0 { // a slot missing below the count: rewrite the frontend without it
				s.log.Warn("socket LB: frontend has a missing slot, dropping it", "frontend", keyString(fk), "slot", i+1)
				st = slices.DeleteFunc(st, func(e beEntry) bool { return e.id == 0 })
				break
			}
		}
		f := lb.Frontend{Key: fk, Backends: make([]lb.Backend, len(st))}
		for i, be := range st {
			f.Backends[i] = be.b
		}
		m := c.masters[fk]
		if m.Flags&lbFlagAffinity != 0 {
			f.Affinity = time.Duration(m.AffinityTimeout) * time.Second
		}
		s.fe[fk] = newFEState(m.Id, m, f, st)
		s.feIDs.mark(m.Id)
		for _, be := range st {
			s.beIDs.mark(be.id)
		}
	}
	for i := range stale {
		if err := s.objs.AxonLbSvc.Delete(&stale[i]); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("remove stale slot of %s: %w", keyString(feKeyOf(stale[i])), err)
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
				return fmt.Errorf("repair %s: %w", keyString(fk), err)
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
