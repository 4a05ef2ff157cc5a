// Package drops reads axon's drop counters and drop events: the maps of
// bpf/lib/drop.h that every tc/XDP program and the socket LB share through
// the node's pin directory (axon_drops, axon_drop_listen,
// axon_drop_ring_stats, axon_drop_events), in one vocabulary of reasons
// (enum axon_drop_reason, bpf/lib/common.h).
package drops

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
)

// Names of the C enums, index = value; TestEnumsMatchBTF (in the packages
// whose objects include bpf/lib/drop.h) holds them to the objects' BTF.
var (
	// reasonNames: enum axon_drop_reason, "drop_" + the member's name
	// without AXON_DROP_REASON_, lower case.
	reasonNames = []string{
		"drop_spoof_src",    // pod_egress: IPv4/IPv6 source the pod does not own
		"drop_spoof_arp",    // pod_egress: ARP sender address the pod does not own
		"drop_spoof_nd",     // pod_egress: Neighbor Advertisement for an address not the pod's; RA, Redirect
		"drop_l2",           // pod_egress: ethertype other than IPv4/IPv6/ARP, or a VLAN tag
		"drop_malformed",    // pod_egress: headers the source guard cannot check
		"drop_no_backend",   // LB, socket LB or pod LB: Service frontend without a usable backend
		"drop_src_range",    // LB: client outside loadBalancerSourceRanges
		"drop_not_local",    // LB: externalTrafficPolicy Local, no local backend
		"drop_no_route",     // LB: no route to the backend or the client
		"drop_snat_no_port", // LB: no free SNAT port
		"drop_no_snat_addr", // LB: no node address for SNAT
		"drop_nat_full",     // LB: reverse NAT table full
		"drop_rewrite_fail", // LB: packet write or encapsulation failed
		"drop_dsr_too_big",  // LB: too big once DSR-encapsulated (ICMP answer sent)
		"drop_bw_horizon",   // uplink_egress: egress bandwidth limit, beyond the EDT horizon
		"drop_bw_ingress",   // a local pod's ingress bandwidth limit
	}
	// directionNames: enum axon_drop_dir.
	directionNames = []string{"ingress", "egress"}
	// progNames: enum axon_prog.
	progNames = []string{"pod_egress", "uplink_ingress", "lb_tc", "lb_xdp", "lb_egress", "uplink_egress", "sock_lb", "pod_lb"}
	// ringStatNames: enum axon_drop_ring_stat.
	ringStatNames = []string{"emitted", "lost"}
)

// ReasonNames lists the drop reasons in enum order.
func ReasonNames() []string { return append([]string(nil), reasonNames...) }

// DirectionNames lists the directions in enum order.
func DirectionNames() []string { return append([]string(nil), directionNames...) }

// ProgNames lists the programs in enum order.
func ProgNames() []string { return append([]string(nil), progNames...) }

// ValidReason reports whether name is a drop reason.
func ValidReason(name string) bool {
	for _, r := range reasonNames {
		if r == name {
			return true
		}
	}
	return false
}

func nameOf(names []string, i int) string {
	if i >= 0 && i < len(names) {
		return names[i]
	}
	return fmt.Sprintf("unknown_%d", i)
}

// Pinned map names (bpf/lib/drop.h).
const (
	MapCounts    = "axon_drops"
	MapListen    = "axon_drop_listen"
	MapRingStats = "axon_drop_ring_stats"
	MapEvents    = "axon_drop_events"
)

// Maps are the drop maps of one node, opened from its pin directory.
type Maps struct {
	Counts, Listen, RingStats, Events *ebpf.Map
}

// ErrNotLoaded: no program of the node pinned the drop maps yet.
var ErrNotLoaded = errors.New("drop maps not pinned (no axon program loaded on this node yet)")

// Open opens the drop maps pinned under pinDir. It returns ErrNotLoaded
// (wrapped) when the counters are not pinned.
func Open(pinDir string) (*Maps, error) {
	var m Maps
	for _, x := range []struct {
		name string
		dst  **ebpf.Map
	}{{MapCounts, &m.Counts}, {MapListen, &m.Listen}, {MapRingStats, &m.RingStats}, {MapEvents, &m.Events}} {
		mp, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, x.name), nil)
		if err != nil {
			m.Close()
			if errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("%s under %s: %w", x.name, pinDir, ErrNotLoaded)
			}
			return nil, fmt.Errorf("open pinned %s under %s: %w", x.name, pinDir, err)
		}
		*x.dst = mp
	}
	return &m, nil
}

// Close closes the maps that are open.
func (m *Maps) Close() {
	for _, mp := range []*ebpf.Map{m.Counts, m.Listen, m.RingStats, m.Events} {
		if mp != nil {
			mp.Close()
		}
	}
}

// Count is one drop counter summed over CPUs.
type Count struct {
	Reason    string `json:"reason"`
	Direction string `json:"direction"`
	Packets   uint64 `json:"packets"`
	Bytes     uint64 `json:"bytes"`
}

// countVal mirrors struct axon_drop_count.
type countVal struct {
	Packets uint64
	Bytes   uint64
}

// ReadCounts reads every drop counter (direction x reason), zero ones
// included, summed over CPUs.
func (m *Maps) ReadCounts() ([]Count, error) {
	out := make([]Count, 0, len(directionNames)*len(reasonNames))
	for d := range directionNames {
		for r := range reasonNames {
			idx := uint32(d*len(reasonNames) + r)
			var per []countVal
			if err := m.Counts.Lookup(idx, &per); err != nil {
				return nil, fmt.Errorf("read %s[%d]: %w", MapCounts, idx, err)
			}
			c := Count{Reason: reasonNames[r], Direction: directionNames[d]}
			for _, v := range per {
				c.Packets += v.Packets
				c.Bytes += v.Bytes
			}
			out = append(out, c)
		}
	}
	return out, nil
}

// RingStats are the ring buffer's counters summed over CPUs.
type RingStats struct {
	Emitted uint64 `json:"emitted"` // events the programs submitted
	Lost    uint64 `json:"lost"`    // events lost in the kernel: the ring buffer was full
}

// ReadRingStats reads axon_drop_ring_stats.
func (m *Maps) ReadRingStats() (RingStats, error) {
	var s RingStats
	for i, dst := range []*uint64{&s.Emitted, &s.Lost} {
		var per []uint64
		if err := m.RingStats.Lookup(uint32(i), &per); err != nil {
			return s, fmt.Errorf("read %s[%s]: %w", MapRingStats, ringStatNames[i], err)
		}
		for _, v := range per {
			*dst += v
		}
	}
	return s, nil
}

// SetListeners writes the number of event readers the programs see (0:
// no event is written).
func (m *Maps) SetListeners(n uint32) error {
	if err := m.Listen.Update(uint32(0), n, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("set %s: %w", MapListen, err)
	}
	return nil
}

// Listeners reads the listener count the programs see.
func (m *Maps) Listeners() (uint32, error) {
	var n uint32
	if err := m.Listen.Lookup(uint32(0), &n); err != nil {
		return 0, fmt.Errorf("read %s: %w", MapListen, err)
	}
	return n, nil
}
