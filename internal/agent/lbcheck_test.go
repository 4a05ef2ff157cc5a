package agent

// The load-balancer map checker of the crash tests: every pinned map of the
// socket LB and of the north-south LB is read by path, as the kernel holds
// it (no agent or datapath code in between), and compared with what the
// kube-apiserver says the node should hold. It reports what differs and
// everything orphaned: slots without a master or beyond its count, backends
// no slot references, DSR entries, source ranges and Maglev tables of no
// frontend, frontend ids used twice.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/axonhq/axon/internal/lb"
)

// Layouts of the map keys and values read here (bpf/lib/lb.h,
// bpf/lib/nodeport.h). The sizes are checked against the pinned maps, so a
// layout change fails loudly instead of being misread.
const (
	svcKeySize      = 24 // {addr[16], __be16 port, u8 proto, u8 scope, u16 slot, u16 pad}
	svcValSize      = 16 // {u32 id, u16 active, terminating, quarantined, flags (u8 + pad / u16), u32 affinity}
	backendValSize  = 24 // {addr[16], __be16 port, u8, u8, u32 frontend_id}
	dsrKeySize      = 20 // {u32 frontend_id, addr[16]}
	srcrangeKeySize = 24 // {u32 prefixlen, u32 frontend_id, addr[16]}
	npFlagMaglevBit = 0x02
	npFlagRangesBit = 0x04
	npBackendLocalF = 0x01
)

// pinnedMaster is a slot-0 entry.
type pinnedMaster struct {
	id                 uint32
	active, term, quar uint16
	flags              uint16
	affinity           uint32
}

func (m pinnedMaster) count() int { return int(m.active) + int(m.term) + int(m.quar) }

// pinnedBackend is an axon_lb_be / axon_np_be value.
type pinnedBackend struct {
	ap    netip.AddrPort
	state uint8
	flags uint8 // north-south only: NP_BE_F_LOCAL
	feID  uint32
}

// pinnedLBSide is one LB's service and backend maps.
type pinnedLBSide struct {
	name     string // "socket LB" / "north-south LB"
	masters  map[lb.FrontendKey]pinnedMaster
	slots    map[lb.FrontendKey]map[uint16]uint32
	backends map[uint32]pinnedBackend
}

// pinnedNS adds the north-south LB's per-frontend-id maps.
type pinnedNS struct {
	pinnedLBSide
	dsr       map[[dsrKeySize]byte]uint32 // {frontend id, addr} -> backend id
	srcranges map[uint32]int              // frontend id -> source ranges
	maglev    map[uint32][]uint32         // frontend id -> the backend ids of its table
}

func openPinned(pinDir, name string) (*ebpf.Map, error) {
	m, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, name), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("open pinned map %s: %w", name, err)
	}
	return m, nil
}

// eachEntry calls f for every entry of the pinned map name, after checking
// its key and value sizes.
func eachEntry(pinDir, name string, keySize, valSize uint32, f func(k, v []byte)) error {
	m, err := openPinned(pinDir, name)
	if err != nil {
		return err
	}
	defer m.Close()
	if m.KeySize() != keySize || (valSize != 0 && m.ValueSize() != valSize) {
		return fmt.Errorf("%s: key/value size %d/%d, the checker reads %d/%d: update lbcheck_test.go to the new layout",
			name, m.KeySize(), m.ValueSize(), keySize, valSize)
	}
	k, v := make([]byte, m.KeySize()), make([]byte, m.ValueSize())
	it := m.Iterate()
	for it.Next(&k, &v) {
		f(slices.Clone(k), slices.Clone(v))
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("iterate %s: %w", name, err)
	}
	return nil
}

func addr16(b []byte) netip.Addr { return netip.AddrFrom16([16]byte(b[:16])).Unmap() }

func readLBSide(pinDir, name, svcMap, beMap string, npFlags bool) (pinnedLBSide, error) {
	s := pinnedLBSide{name: name, masters: map[lb.FrontendKey]pinnedMaster{},
		slots: map[lb.FrontendKey]map[uint16]uint32{}, backends: map[uint32]pinnedBackend{}}
	err := eachEntry(pinDir, svcMap, svcKeySize, svcValSize, func(k, v []byte) {
		fk := lb.FrontendKey{Addr: addr16(k), Port: binary.BigEndian.Uint16(k[16:18]), Proto: lb.Proto(k[18]), Scope: lb.Scope(k[19])}
		slot := binary.NativeEndian.Uint16(k[20:22])
		id := binary.NativeEndian.Uint32(v[0:4])
		if slot != 0 {
			if s.slots[fk] == nil {
				s.slots[fk] = map[uint16]uint32{}
			}
			s.slots[fk][slot] = id
			return
		}
		m := pinnedMaster{id: id, active: binary.NativeEndian.Uint16(v[4:6]), term: binary.NativeEndian.Uint16(v[6:8]),
			quar: binary.NativeEndian.Uint16(v[8:10]), affinity: binary.NativeEndian.Uint32(v[12:16])}
		if npFlags {
			m.flags = binary.NativeEndian.Uint16(v[10:12])
		} else {
			m.flags = uint16(v[10])
		}
		s.masters[fk] = m
	})
	if err != nil {
		return s, err
	}
	err = eachEntry(pinDir, beMap, 4, backendValSize, func(k, v []byte) {
		b := pinnedBackend{ap: netip.AddrPortFrom(addr16(v), binary.BigEndian.Uint16(v[16:18])), feID: binary.NativeEndian.Uint32(v[20:24])}
		if npFlags { // {.., u8 state, u8 flags, ..}
			b.state, b.flags = v[18], v[19]
		} else { // {.., u8 proto, u8 state, ..}
			b.state = v[19]
		}
		s.backends[binary.NativeEndian.Uint32(k)] = b
	})
	return s, err
}

func readPinnedNS(pinDir string) (pinnedNS, error) {
	side, err := readLBSide(pinDir, "north-south LB", "axon_np_svc", "axon_np_be", true)
	ns := pinnedNS{pinnedLBSide: side, dsr: map[[dsrKeySize]byte]uint32{}, srcranges: map[uint32]int{}, maglev: map[uint32][]uint32{}}
	if err != nil {
		return ns, err
	}
	if err := eachEntry(pinDir, "axon_np_dsr", dsrKeySize, 4, func(k, v []byte) {
		ns.dsr[[dsrKeySize]byte(k)] = binary.NativeEndian.Uint32(v)
	}); err != nil {
		return ns, err
	}
	if err := eachEntry(pinDir, "axon_np_srcrange", srcrangeKeySize, 1, func(k, _ []byte) {
		ns.srcranges[binary.NativeEndian.Uint32(k[4:8])]++
	}); err != nil {
		return ns, err
	}
	var ids, inner []uint32
	if err := eachEntry(pinDir, "axon_lb_maglev", 4, 4, func(k, v []byte) {
		ids, inner = append(ids, binary.NativeEndian.Uint32(k)), append(inner, binary.NativeEndian.Uint32(v))
	}); err != nil {
		return ns, err
	}
	for i, id := range ids {
		m, err := ebpf.NewMapFromID(ebpf.MapID(inner[i]))
		if err != nil {
			return ns, fmt.Errorf("axon_lb_maglev: inner map of frontend id %d: %w", id, err)
		}
		var slot, be uint32
		var tab []uint32
		it := m.Iterate()
		for it.Next(&slot, &be) {
			tab = append(tab, be)
		}
		err = it.Err()
		m.Close()
		if err != nil {
			return ns, fmt.Errorf("axon_lb_maglev: table of frontend id %d: %w", id, err)
		}
		ns.maglev[id] = tab
	}
	return ns, nil
}

// desiredFrontends is what the apiserver says this node's LBs hold: every
// Service with its EndpointSlices through lb.Translate, as the agent's
// Service watch computes it.
func desiredFrontends(ctx context.Context, cs kubernetes.Interface, node string) ([]lb.Frontend, error) {
	svcs, err := cs.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list Services: %w", err)
	}
	sl, err := cs.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list EndpointSlices: %w", err)
	}
	bySvc := map[string][]*discoveryv1.EndpointSlice{}
	for i := range sl.Items {
		es := &sl.Items[i]
		if name := es.Labels[lb.ServiceNameLabel]; name != "" {
			k := lb.ServiceKey(es.Namespace, name)
			bySvc[k] = append(bySvc[k], es)
		}
	}
	var out []lb.Frontend
	for i := range svcs.Items {
		svc := &svcs.Items[i]
		fs, _ := lb.Translate(svc, bySvc[lb.ServiceKey(svc.Namespace, svc.Name)], lb.NodeInfo{Name: node})
		out = append(out, fs...)
	}
	return out, nil
}

// checkSide compares one LB's service and backend maps with want and
// returns every difference and orphan (at most a few of each kind).
func checkSide(s pinnedLBSide, want []lb.Frontend, node string, np bool) []string {
	var probs []string
	add := func(format string, args ...any) { probs = append(probs, s.name+": "+fmt.Sprintf(format, args...)) }
	wantBy := map[lb.FrontendKey]lb.Frontend{}
	for _, f := range want {
		wantBy[f.Key] = f
	}
	referenced := map[uint32]lb.FrontendKey{}
	ids := map[uint32]lb.FrontendKey{}
	for fk, m := range s.masters {
		f, ok := wantBy[fk]
		if !ok {
			add("frontend %s is programmed but no Service wants it", fk2s(fk))
		}
		if other, dup := ids[m.id]; dup {
			add("frontend id %d used by %s and %s", m.id, fk2s(fk), fk2s(other))
		}
		ids[m.id] = fk
		var got []string
		for slot := 1; slot <= m.count(); slot++ {
			id, ok := s.slots[fk][uint16(slot)]
			if !ok {
				add("frontend %s: slot %d of %d missing", fk2s(fk), slot, m.count())
				continue
			}
			b, ok := s.backends[id]
			if !ok {
				add("frontend %s: slot %d points at backend id %d, which is not in the backend map", fk2s(fk), slot, id)
				continue
			}
			if prev, twice := referenced[id]; twice {
				add("backend id %d referenced by %s and %s", id, fk2s(fk), fk2s(prev))
			}
			referenced[id] = fk
			if np && b.feID != m.id {
				add("frontend %s (id %d): backend %d says frontend id %d", fk2s(fk), m.id, id, b.feID)
			}
			local := ""
			if np && b.flags&npBackendLocalF != 0 {
				local = " local"
			}
			got = append(got, fmt.Sprintf("%s/%d%s", b.ap, b.state, local))
		}
		for slot := range s.slots[fk] {
			if int(slot) > m.count() {
				add("frontend %s: stale slot %d beyond its count %d", fk2s(fk), slot, m.count())
			}
		}
		if !ok {
			continue
		}
		var exp []string
		for _, b := range f.Backends {
			local := ""
			if np && b.NodeName == node {
				local = " local"
			}
			exp = append(exp, fmt.Sprintf("%s/%d%s", netip.AddrPortFrom(b.Addr.Unmap(), b.Port), b.State, local))
		}
		slices.Sort(got)
		slices.Sort(exp)
		if !slices.Equal(got, exp) {
			add("frontend %s: backends %v, want %v", fk2s(fk), got, exp)
		}
		if want := uint32(f.Affinity.Seconds()); m.affinity != want {
			add("frontend %s: affinity %d s, want %d s", fk2s(fk), m.affinity, want)
		}
	}
	for fk := range wantBy {
		if _, ok := s.masters[fk]; !ok {
			add("frontend %s (%s) wanted by %s is not programmed", fk2s(fk), wantBy[fk].Kind, wantBy[fk].Service)
		}
	}
	for fk, slots := range s.slots {
		if _, ok := s.masters[fk]; !ok {
			add("orphaned slots of %s (no master entry): %d", fk2s(fk), len(slots))
		}
	}
	for id, b := range s.backends {
		if _, ok := referenced[id]; !ok {
			add("orphaned backend id %d (%s, frontend id %d): no slot references it", id, b.ap, b.feID)
		}
	}
	return probs
}

// checkNSExtra checks the north-south LB's maps keyed by frontend id.
func checkNSExtra(ns pinnedNS) []string {
	var probs []string
	add := func(format string, args ...any) { probs = append(probs, ns.name+": "+fmt.Sprintf(format, args...)) }
	byID := map[uint32]lb.FrontendKey{}
	for fk, m := range ns.masters {
		byID[m.id] = fk
	}
	wantDSR := map[[dsrKeySize]byte]uint32{}
	for fk, m := range ns.masters {
		for slot := 1; slot <= m.count(); slot++ {
			id := ns.slots[fk][uint16(slot)]
			if b, ok := ns.backends[id]; ok && b.flags&npBackendLocalF != 0 {
				var k [dsrKeySize]byte
				binary.NativeEndian.PutUint32(k[0:4], m.id)
				a := b.ap.Addr().As16()
				copy(k[4:], a[:])
				wantDSR[k] = id
			}
		}
		if _, has := ns.maglev[m.id]; has != (m.flags&npFlagMaglevBit != 0) {
			add("frontend %s: Maglev flag %v, table present %v", fk2s(fk), m.flags&npFlagMaglevBit != 0, has)
		}
		if has := ns.srcranges[m.id] > 0; has != (m.flags&npFlagRangesBit != 0) {
			add("frontend %s: source-range flag %v, ranges present %v", fk2s(fk), m.flags&npFlagRangesBit != 0, has)
		}
	}
	for k, id := range ns.dsr {
		feID := binary.NativeEndian.Uint32(k[0:4])
		if w, ok := wantDSR[k]; !ok || w != id {
			add("orphaned DSR entry {frontend id %d, %s} -> backend %d (frontend %s)", feID, addr16(k[4:]), id, fk2sOK(byID, feID))
		}
	}
	for k := range wantDSR {
		if _, ok := ns.dsr[k]; !ok {
			add("DSR entry {frontend id %d, %s} missing", binary.NativeEndian.Uint32(k[0:4]), addr16(k[4:]))
		}
	}
	for id, n := range ns.srcranges {
		if _, ok := byID[id]; !ok {
			add("orphaned source ranges of frontend id %d: %d", id, n)
		}
	}
	for id, tab := range ns.maglev {
		fk, ok := byID[id]
		if !ok {
			add("orphaned Maglev table of frontend id %d", id)
			continue
		}
		own := map[uint32]bool{}
		for slot := 1; slot <= ns.masters[fk].count(); slot++ {
			own[ns.slots[fk][uint16(slot)]] = true
		}
		for _, be := range tab {
			if !own[be] {
				add("frontend %s: Maglev table points at backend id %d, not one of its own", fk2s(fk), be)
				break
			}
		}
	}
	return probs
}

func fk2s(k lb.FrontendKey) string {
	return fmt.Sprintf("%s/%s:%d scope %d", map[lb.Proto]string{lb.TCP: "tcp", lb.UDP: "udp", lb.SCTP: "sctp"}[k.Proto], k.Addr, k.Port, k.Scope)
}

func fk2sOK(byID map[uint32]lb.FrontendKey, id uint32) string {
	if fk, ok := byID[id]; ok {
		return fk2s(fk)
	}
	return "none"
}

// checkPinnedLB compares every pinned LB map under pinDir with the
// apiserver's Services; nil when the maps hold exactly the desired state
// and nothing else. withNS: the north-south LB is loaded and checked too.
func checkPinnedLB(ctx context.Context, cs kubernetes.Interface, pinDir, node string, withNS bool) error {
	want, err := desiredFrontends(ctx, cs, node)
	if err != nil {
		return err
	}
	sock, err := readLBSide(pinDir, "socket LB", "axon_lb_svc", "axon_lb_be", false)
	if err != nil {
		return err
	}
	probs := checkSide(sock, want, node, false)
	if withNS {
		ns, err := readPinnedNS(pinDir)
		if err != nil {
			return err
		}
		probs = append(probs, checkSide(ns.pinnedLBSide, slices.DeleteFunc(slices.Clone(want), func(f lb.Frontend) bool { return !northSouth(f) }), node, true)...)
		probs = append(probs, checkNSExtra(ns)...)
	}
	if len(probs) == 0 {
		return nil
	}
	slices.Sort(probs)
	const show = 25
	more := ""
	if len(probs) > show {
		more = fmt.Sprintf("\n... and %d more", len(probs)-show)
		probs = probs[:show]
	}
	return errors.New(strings.Join(probs, "\n") + more)
}
