// Package lbmap holds what the socket LB (internal/datapath/socklb) and the
// north-south LB (internal/datapath/nodeport) share to write lb.Frontends
// into their service and backend maps: validation and slot order of a
// frontend, id allocation, and the conversions to the maps' layouts
// (bpf/lib/lb.h).
package lbmap

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/lb"
)

// Values of struct lb_svc_val.flags and the backend states (bpf/lib/lb.h).
const (
	FlagAffinity = 0x1            // session affinity on
	MaxSlots     = math.MaxUint16 // slot numbers are u16; slot 0 is the master
)

// BackendAddr identifies a backend inside one frontend.
type BackendAddr struct {
	Addr netip.Addr
	Port uint16
}

// Entry is a backend with the id it has in the backend map.
type Entry struct {
	ID      uint32
	Backend lb.Backend
}

// IDAlloc hands out the lowest free non-zero u32 at or after a moving hint.
type IDAlloc struct {
	used map[uint32]bool
	next uint32
}

// Alloc returns a free id and marks it used.
func (a *IDAlloc) Alloc() (uint32, error) {
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

// Mark records id as used (read back from the maps).
func (a *IDAlloc) Mark(id uint32) {
	if a.used == nil {
		a.used = map[uint32]bool{}
	}
	a.used[id] = true
	if id > a.next {
		a.next = id // ids freed before a restart are not handed out again soon
	}
}

// Len is the number of ids in use.
func (a *IDAlloc) Len() int { return len(a.used) }

// Free returns id.
func (a *IDAlloc) Free(id uint32) { delete(a.used, id) }

// Conversions between the Go model and the map layouts.

// Port is p in the maps' byte order (network order as stored).
func Port(p uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], p)
	return binary.NativeEndian.Uint16(b[:])
}

// PortHost is Port's inverse.
func PortHost(p uint16) uint16 { return Port(p) }

// Addr16 is a map address; IPv4 comes out v4 mapped.
func Addr16(a netip.Addr) [16]byte { return a.As16() } // IPv4 comes out v4 mapped

// FromAddr16 is Addr16's inverse.
func FromAddr16(b [16]byte) netip.Addr { return netip.AddrFrom16(b).Unmap() }

// AffinitySeconds is a session affinity timeout in whole seconds, rounded up.
func AffinitySeconds(d time.Duration) uint32 {
	if d <= 0 {
		return 0
	}
	s := (d + time.Second - 1) / time.Second // round up: 500ms -> 1s
	if s > math.MaxUint32 {
		return math.MaxUint32
	}
	return uint32(s)
}

// NormFrontend validates f and returns it with unmapped addresses and
// backends in slot order (Active, Terminating, Quarantined; each sorted by
// address and port).
func NormFrontend(f lb.Frontend) (lb.Frontend, error) {
	k, err := NormKey(f.Key)
	if err != nil {
		return f, err
	}
	f.Key = k
	if f.Affinity < 0 {
		return f, fmt.Errorf("frontend %s: negative session affinity timeout %s", KeyString(k), f.Affinity)
	}
	if len(f.Backends) > MaxSlots {
		return f, fmt.Errorf("frontend %s: %d backends, at most %d fit the service map slots", KeyString(k), len(f.Backends), MaxSlots)
	}
	if inSlotOrder(k, f.Backends) {
		return f, nil // the common case: nothing to copy
	}
	seen := map[BackendAddr]bool{}
	bs := make([]lb.Backend, 0, len(f.Backends))
	for _, b := range f.Backends {
		if !b.Addr.IsValid() {
			return f, fmt.Errorf("frontend %s: backend with an empty address", KeyString(k))
		}
		b.Addr = b.Addr.Unmap()
		if b.Addr.Is4() != k.Addr.Is4() {
			return f, fmt.Errorf("frontend %s: backend %s is of the other address family: give v4 frontends v4 backends and v6 frontends v6 ones", KeyString(k), b.Addr)
		}
		if b.Port == 0 {
			return f, fmt.Errorf("frontend %s: backend %s has port 0: resolve the targetPort first", KeyString(k), b.Addr)
		}
		if b.State > lb.Quarantined {
			return f, fmt.Errorf("frontend %s: backend %s has unknown state %d", KeyString(k), b.Addr, b.State)
		}
		ba := BackendAddr{Addr: b.Addr, Port: b.Port}
		if seen[ba] {
			return f, fmt.Errorf("frontend %s: backend %s listed twice", KeyString(k), netip.AddrPortFrom(b.Addr, b.Port))
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

// inSlotOrder reports whether bs is valid for k and already as NormFrontend
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

// NormKey validates k and returns it with an unmapped address.
func NormKey(k lb.FrontendKey) (lb.FrontendKey, error) {
	if !k.Addr.IsValid() {
		return k, fmt.Errorf("frontend key %+v: empty address (NodePort and HostPort frontends use 0.0.0.0 or ::)", k)
	}
	k.Addr = k.Addr.Unmap()
	if k.Port == 0 {
		return k, fmt.Errorf("frontend %s: port 0", KeyString(k))
	}
	switch k.Proto {
	case lb.TCP, lb.UDP, lb.SCTP:
	default:
		return k, fmt.Errorf("frontend %s: protocol %d is not TCP, UDP or SCTP", KeyString(k), k.Proto)
	}
	switch k.Scope {
	case lb.ScopeCluster:
		if k.Addr.IsUnspecified() {
			return k, fmt.Errorf("frontend %s: a cluster-scope frontend needs a service address, not %s", KeyString(k), k.Addr)
		}
	case lb.ScopeNodePort, lb.ScopeHostPort:
		if !k.Addr.IsUnspecified() {
			return k, fmt.Errorf("frontend %s: NodePort and HostPort frontends match every local address: use %s as their address",
				KeyString(k), map[bool]string{true: "0.0.0.0", false: "::"}[k.Addr.Is4()])
		}
	default:
		return k, fmt.Errorf("frontend %s: unknown scope %d", KeyString(k), k.Scope)
	}
	return k, nil
}

// KeyString names k in errors and logs: "10.96.0.10:53/udp (cluster)".
func KeyString(k lb.FrontendKey) string {
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

// MapFullHint explains E2BIG/ENOSPC from a map update.
func MapFullHint(err error, m string) error {
	if errors.Is(err, unix.E2BIG) || errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.ENOMEM) {
		return fmt.Errorf("map %s is full: %w (delete unused services or raise its max_entries in bpf/lib/lb.h)", m, err)
	}
	return err
}

// WithBackendMeta is b with the node and zone meta gives its address.
func WithBackendMeta(b lb.Backend, meta *lb.Frontend) lb.Backend {
	if meta != nil {
		for _, mb := range meta.Backends {
			if mb.Addr == b.Addr && mb.Port == b.Port {
				b.NodeName, b.Zone = mb.NodeName, mb.Zone
			}
		}
	}
	return b
}

// CompareKeys orders frontend keys by address, port, protocol and scope.
func CompareKeys(a, b lb.FrontendKey) int {
	if c := a.Addr.Compare(b.Addr); c != 0 {
		return c
	}
	if a.Port != b.Port {
		return int(a.Port) - int(b.Port)
	}
	if a.Proto != b.Proto {
		return int(a.Proto) - int(b.Proto)
	}
	return int(a.Scope) - int(b.Scope)
}
