package podpath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
)

// FibRoute is one IPv4 route cached by axon_pod_egress in one CPU's slot of
// axon_fib_cache (bpf/lib/fib_cache.h).
type FibRoute struct {
	CPU        int
	InIfIndex  int        // key: the pod's host-side device
	Src, Dst   netip.Addr // key
	TOS, Proto uint8      // key
	OutIfIndex int        // the egress device the FIB chose
	NextHop    netip.Addr // gateway, or Dst when on-link
	MTU        int        // egress device MTU at lookup time (0: lookup said NO_NEIGH)
	Genid      uint32     // the netns' rt_genid the route was looked up under
}

// FibCacheEnabled says whether axon_pod_egress was loaded with the route
// cache (the "fib_cache" decision).
func (d *Datapath) FibCacheEnabled() bool { return d.fibCache }

// FibCache returns the valid routes in the cache of the loaded veth pod
// program, every CPU's slots. Nil without BPF host routing or the cache.
func (d *Datapath) FibCache() ([]FibRoute, error) {
	if d.podProg == nil || !d.fibCache {
		return nil, nil
	}
	m, err := progMap(d.podProg, "axon_fib_cache")
	if err != nil {
		return nil, err
	}
	defer m.Close()
	var out []FibRoute
	var per []podEgressFibCacheEntry
	for slot := uint32(0); slot < m.MaxEntries(); slot++ {
		if err := m.Lookup(slot, &per); err != nil {
			return nil, fmt.Errorf("read axon_fib_cache[%d]: %w", slot, err)
		}
		for cpu, e := range per {
			if e.Valid == 0 {
				continue
			}
			out = append(out, FibRoute{CPU: cpu, InIfIndex: int(e.Ifindex),
				Src: be32Addr(e.Saddr), Dst: be32Addr(e.Daddr), TOS: e.Tos, Proto: e.Proto,
				OutIfIndex: int(e.Oif), NextHop: be32Addr(e.Nh), MTU: int(e.Mtu), Genid: e.Genid})
		}
	}
	return out, nil
}

// be32Addr turns an IPv4 address read from a BPF map (network order in
// memory, decoded as a little-endian uint32) back into an address.
func be32Addr(v uint32) netip.Addr {
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], v)
	return netip.AddrFrom4(b)
}

// progMap opens the map called name that prog uses (kernel map names are
// cut at 15 bytes). The caller closes it.
func progMap(prog *ebpf.Program, name string) (*ebpf.Map, error) {
	info, err := prog.Info()
	if err != nil {
		return nil, fmt.Errorf("program info: %w", err)
	}
	ids, ok := info.MapIDs()
	if !ok {
		return nil, errors.New("program info: the kernel does not report map IDs")
	}
	for _, id := range ids {
		m, err := ebpf.NewMapFromID(id)
		if err != nil {
			return nil, fmt.Errorf("open map %d of the program: %w", id, err)
		}
		mi, err := m.Info()
		if err == nil && mi.Name == name {
			return m, nil
		}
		m.Close()
	}
	return nil, fmt.Errorf("program has no map %s", name)
}
