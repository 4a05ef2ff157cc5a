package services

// Reading the agent's pinned socket-LB service map directly (not through the
// agent), so the control-plane benchmark measures "apiserver write → entry
// visible in the BPF map" end to end. Layouts: bpf/lib/lb.h (struct
// lb_svc_key, struct lb_svc_val); checked against the map's key and value
// sizes so a layout change fails loudly instead of reading garbage.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"

	"github.com/cilium/ebpf"
)

const (
	lbSvcMapName   = "axon_lb_svc"
	lbSvcKeySize   = 24 // struct lb_svc_key
	lbSvcValueSize = 16 // struct lb_svc_val
	ipprotoTCP     = 6
	lbScopeCluster = 0
)

// LBMapNames are the socket LB maps pinned in a node's pin dir.
var LBMapNames = []string{"axon_lb_svc", "axon_lb_be", "axon_lb_rev", "axon_lb_sock", "axon_lb_aff", "axon_lb_local", "axon_lb_skip"}

// LBSvcMap is a read-only handle on a node's pinned axon_lb_svc.
type LBSvcMap struct {
	m *ebpf.Map
}

// OpenLBSvcMap opens <pinDir>/axon_lb_svc.
func OpenLBSvcMap(pinDir string) (*LBSvcMap, error) {
	p := filepath.Join(pinDir, lbSvcMapName)
	m, err := ebpf.LoadPinnedMap(p, &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("open pinned %s (is the agent running with --socket-lb?): %w", p, err)
	}
	if m.KeySize() != lbSvcKeySize || m.ValueSize() != lbSvcValueSize {
		m.Close()
		return nil, fmt.Errorf("%s has key/value sizes %d/%d, the benchmark reads %d/%d: update internal/bench/services/lbmap.go to bpf/lib/lb.h",
			p, m.KeySize(), m.ValueSize(), lbSvcKeySize, lbSvcValueSize)
	}
	return &LBSvcMap{m: m}, nil
}

// Close releases the map.
func (s *LBSvcMap) Close() error { return s.m.Close() }

// svcKeyBytes encodes struct lb_svc_key for a ClusterIP TCP frontend.
func svcKeyBytes(addr netip.Addr, port uint16, slot uint16) []byte {
	k := make([]byte, lbSvcKeySize)
	a := addr.Unmap().As16() // IPv4 comes out as ::ffff:a.b.c.d
	copy(k, a[:])
	binary.BigEndian.PutUint16(k[16:], port)
	k[18] = ipprotoTCP
	k[19] = lbScopeCluster
	binary.NativeEndian.PutUint16(k[20:], slot)
	return k
}

// Active returns the number of active backends of the TCP ClusterIP
// frontend addr:port (its master entry), and false when it is not in the map.
func (s *LBSvcMap) Active(addr netip.Addr, port uint16) (int, bool, error) {
	v := make([]byte, lbSvcValueSize)
	if err := s.m.Lookup(svcKeyBytes(addr, port, 0), v); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return 0, false, nil
		}
		return 0, false, fmt.Errorf("lookup %s:%d in %s: %w", addr, port, lbSvcMapName, err)
	}
	return int(binary.NativeEndian.Uint16(v[4:])), true, nil
}

// Masters counts the frontends (slot-0 entries) in the map.
func (s *LBSvcMap) Masters() (int, error) {
	k := make([]byte, lbSvcKeySize)
	v := make([]byte, lbSvcValueSize)
	it := s.m.Iterate()
	n := 0
	for it.Next(&k, &v) {
		if binary.NativeEndian.Uint16(k[20:]) == 0 {
			n++
		}
	}
	if err := it.Err(); err != nil {
		return n, fmt.Errorf("iterate %s: %w", lbSvcMapName, err)
	}
	return n, nil
}
