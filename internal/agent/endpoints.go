package agent

import (
	"bytes"
	"cmp"
	"net"
	"net/netip"
	"slices"

	"github.com/axonhq/axon/internal/api"
)

// MapEntry is one row of the BPF endpoint map: pod IP → host device + MACs.
type MapEntry struct {
	IP      netip.Addr
	IfIndex int
	PodMAC  net.HardwareAddr
	HostMAC net.HardwareAddr
}

func (e MapEntry) same(o MapEntry) bool {
	return e.IP == o.IP && e.IfIndex == o.IfIndex && bytes.Equal(e.PodMAC, o.PodMAC) && bytes.Equal(e.HostMAC, o.HostMAC)
}

// dataplane is what the agent needs from internal/datapath (see datapath.go
// for the adapter). Kept as an interface so that the reconcile logic is
// unit-testable without BPF.
type dataplane interface {
	AttachPod(ifname string) error
	DetachPod(ifname string) error
	UpsertEndpoint(e MapEntry) error
	DeleteEndpoint(ip netip.Addr) error
	Endpoints() ([]MapEntry, error)
	GCPodLinks(keep map[string]bool) error
	Decisions() []api.Decision
	HostRouting() string // datapath.RoutingBPF or datapath.ModeLegacy
	Features() []api.Feature
	Metrics() (map[string]uint64, error)
	Close() error
}

// DiffEndpoints returns the entries to write (missing or different) and the
// IPs to delete (present but not desired). Entries already right are left
// alone: no flush-and-refill.
func DiffEndpoints(desired, current []MapEntry) (upsert []MapEntry, del []netip.Addr) {
	cur := make(map[netip.Addr]MapEntry, len(current))
	for _, c := range current {
		cur[c.IP] = c
	}
	want := make(map[netip.Addr]bool, len(desired))
	for _, d := range desired {
		if want[d.IP] {
			continue // first claim wins; conflicts are rejected at PutEndpoint
		}
		want[d.IP] = true
		if c, ok := cur[d.IP]; !ok || !c.same(d) {
			upsert = append(upsert, d)
		}
	}
	for _, c := range current {
		if !want[c.IP] {
			del = append(del, c.IP)
		}
	}
	slices.SortFunc(upsert, func(a, b MapEntry) int { return a.IP.Compare(b.IP) })
	slices.SortFunc(del, func(a, b netip.Addr) int { return a.Compare(b) })
	return upsert, del
}

// linkInfo is what the agent reads about a host-side pod device.
type linkInfo struct {
	Index int
	MAC   net.HardwareAddr
}

// DesiredEntries maps registry endpoints to map entries, skipping endpoints
// whose host device is gone (lookup returns false). Index and host MAC come
// from the live device: the ifindex can change under the same name.
func DesiredEntries(eps []api.Endpoint, lookup func(name string) (linkInfo, bool)) []MapEntry {
	var out []MapEntry
	for _, ep := range eps {
		li, ok := lookup(ep.HostIfName)
		if !ok {
			continue
		}
		hostMAC := li.MAC
		if len(hostMAC) == 0 {
			hostMAC = ep.HostMAC
		}
		for _, ip := range ep.IPs {
			out = append(out, MapEntry{IP: ip.Unmap(), IfIndex: li.Index, PodMAC: ep.PodMAC, HostMAC: hostMAC})
		}
	}
	slices.SortFunc(out, func(a, b MapEntry) int { return cmp.Compare(a.IP.String(), b.IP.String()) })
	return out
}
