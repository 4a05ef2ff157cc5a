package podpath

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
)

// Directions and reasons mirror enum axon_dir / enum axon_reason in
// bpf/lib/common.h (same order).
var (
	directionNames = []string{"pod_egress", "uplink_ingress"}
	reasonNames    = []string{
		"redirect_peer_local", // to a pod on this node via bpf_redirect_peer
		"redirect_fib",        // fib hit with neighbour (bpf_redirect), or a cached route (bpf_redirect_neigh)
		"redirect_neigh",      // fib hit without neighbour: bpf_redirect_neigh
		"pass_host_bound",     // local address / no route (NOT_FWDED), link-local, multicast
		"pass_arp_non_ip",     // ARP and other non-IP ethertypes
		"pass_no_route",       // fib: unreachable, frag needed, forwarding off, ...
		"pass_malformed",      // truncated or invalid headers
		"pass_ttl",            // TTL / hop limit expired
		"pass_not_local",      // uplink: destination is not a local pod
		"redirect_failed",     // redirect helper refused the packet
		// source address validation at pod egress (bpf/lib/srcguard.h): dropped
		"drop_spoof_src", // IPv4/IPv6 source the pod does not own
		"drop_spoof_arp", // ARP sender address the pod does not own, or not Ethernet/IPv4 ARP
		"drop_spoof_nd",  // Neighbor Advertisement for an address not the pod's; Router Advertisement, Redirect
		"drop_l2",        // ethertype other than IPv4/IPv6/ARP, or a VLAN tag
		"drop_malformed", // headers the program cannot check (truncated, not linear)
		// the pod's ARP request for its gateway, answered back to it (bpf/lib/arp.h)
		"redirect_arp_reply",
	}
)

// ReasonNames lists the metric reasons in enum order.
func ReasonNames() []string { return append([]string(nil), reasonNames...) }

// Metrics returns packet counters summed over CPUs and directions, keyed by
// reason name (see ReasonNames). Every reason is present, zero or not.
func (d *Datapath) Metrics() (map[string]uint64, error) {
	byDir, err := d.MetricsByDirection()
	if err != nil {
		return nil, err
	}
	out := make(map[string]uint64, len(reasonNames))
	for _, r := range reasonNames {
		out[r] = 0
	}
	for _, m := range byDir {
		for r, v := range m {
			out[r] += v
		}
	}
	return out, nil
}

// MetricsByDirection returns counters keyed by direction ("pod_egress",
// "uplink_ingress") and then by reason name.
func (d *Datapath) MetricsByDirection() (map[string]map[string]uint64, error) {
	return readMetrics(d.metrics)
}

type lookuper interface {
	Lookup(key, valueOut any) error
}

func readMetrics(m lookuper) (map[string]map[string]uint64, error) {
	perCPU, err := readMetricsPerCPU(m)
	if err != nil {
		return nil, err
	}
	out := make(map[string]map[string]uint64, len(perCPU))
	for dn, reasons := range perCPU {
		row := make(map[string]uint64, len(reasons))
		for rn, cpus := range reasons {
			var sum uint64
			for _, v := range cpus {
				sum += v
			}
			row[rn] = sum
		}
		out[dn] = row
	}
	return out, nil
}

// readMetricsPerCPU reads every counter of axon_metrics keyed by direction
// and reason name, one value per possible CPU (index = CPU number).
func readMetricsPerCPU(m lookuper) (map[string]map[string][]uint64, error) {
	out := make(map[string]map[string][]uint64, len(directionNames))
	for di, dn := range directionNames {
		row := make(map[string][]uint64, len(reasonNames))
		for ri, rn := range reasonNames {
			idx := uint32(di*len(reasonNames) + ri)
			var perCPU []uint64
			if err := m.Lookup(idx, &perCPU); err != nil {
				return nil, fmt.Errorf("read axon_metrics[%d] (%s/%s): %w", idx, dn, rn, err)
			}
			row[rn] = perCPU
		}
		out[dn] = row
	}
	return out, nil
}

// metricsMigration unpins an axon_metrics of another size than spec (an
// older object with fewer reasons; the source address validation added
// five): counters are not worth an agent that cannot start. They restart
// from zero, which Prometheus counters handle as a reset; programs still
// attached keep counting into the old map until the agent replaces them.
func metricsMigration(pinDir string, spec *ebpf.MapSpec, log *slog.Logger) error {
	path := filepath.Join(pinDir, "axon_metrics")
	old, err := ebpf.LoadPinnedMap(path, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open pinned axon_metrics: %w", err)
	}
	size := old.MaxEntries()
	old.Close()
	if size == spec.MaxEntries {
		return nil
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("migrate axon_metrics: unpin the old counters: %w", err)
	}
	log.Info("pod datapath: packet counters restart from zero (their layout changed)", "map", "axon_metrics", "old_entries", size, "entries", spec.MaxEntries)
	return nil
}
