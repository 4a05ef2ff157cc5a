package podpath

import (
	"fmt"
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
