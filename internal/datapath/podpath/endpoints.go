package podpath

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/cilium/ebpf"
)

// Endpoint is one local pod address as stored in axon_ep_v4 / axon_ep_v6.
type Endpoint struct {
	IP      netip.Addr
	IfIndex int              // host-side veth ifindex in the node netns
	PodMAC  net.HardwareAddr // MAC of the pod's interface
	HostMAC net.HardwareAddr // MAC of the host-side veth
}

type endpointInfo = podEgressEndpointInfo

func (ep Endpoint) validate() error {
	if !ep.IP.IsValid() {
		return errors.New("endpoint has no IP address")
	}
	if ep.IfIndex <= 0 {
		return fmt.Errorf("endpoint %s: ifindex %d is not a device index (> 0)", ep.IP, ep.IfIndex)
	}
	if len(ep.PodMAC) != 6 {
		return fmt.Errorf("endpoint %s: pod MAC %q is not a 6-byte ethernet address", ep.IP, ep.PodMAC)
	}
	if len(ep.HostMAC) != 6 {
		return fmt.Errorf("endpoint %s: host MAC %q is not a 6-byte ethernet address", ep.IP, ep.HostMAC)
	}
	return nil
}

// mapFor returns the endpoint map and marshalled key for ip.
func (d *Datapath) mapFor(ip netip.Addr) (*ebpf.Map, any, error) {
	ip = ip.Unmap()
	switch {
	case ip.Is4():
		return d.epV4, ip.As4(), nil
	case ip.Is6():
		return d.epV6, ip.As16(), nil
	default:
		return nil, nil, fmt.Errorf("invalid IP address %v", ip)
	}
}

// UpsertEndpoint creates or replaces the map entry of ep.IP.
func (d *Datapath) UpsertEndpoint(ep Endpoint) error {
	if err := ep.validate(); err != nil {
		return fmt.Errorf("upsert endpoint: %w", err)
	}
	m, key, err := d.mapFor(ep.IP)
	if err != nil {
		return fmt.Errorf("upsert endpoint: %w", err)
	}
	val := endpointInfo{Ifindex: uint32(ep.IfIndex)}
	copy(val.PodMac[:], ep.PodMAC)
	copy(val.HostMac[:], ep.HostMAC)
	if err := m.Put(key, &val); err != nil {
		return fmt.Errorf("upsert endpoint %s in %s: %w", ep.IP, m, err)
	}
	return nil
}

// DeleteEndpoint removes the map entry of ip; an absent entry is no error.
func (d *Datapath) DeleteEndpoint(ip netip.Addr) error {
	m, key, err := d.mapFor(ip)
	if err != nil {
		return fmt.Errorf("delete endpoint: %w", err)
	}
	if err := m.Delete(key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete endpoint %s: %w", ip, err)
	}
	return nil
}

// Endpoints lists the entries of both endpoint maps, sorted by address.
func (d *Datapath) Endpoints() ([]Endpoint, error) {
	var out []Endpoint
	toEP := func(ip netip.Addr, v endpointInfo) Endpoint {
		return Endpoint{
			IP:      ip,
			IfIndex: int(v.Ifindex),
			PodMAC:  slices.Clone(net.HardwareAddr(v.PodMac[:])),
			HostMAC: slices.Clone(net.HardwareAddr(v.HostMac[:])),
		}
	}
	var k4 [4]byte
	var v endpointInfo
	it := d.epV4.Iterate()
	for it.Next(&k4, &v) {
		out = append(out, toEP(netip.AddrFrom4(k4), v))
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("list axon_ep_v4: %w", err)
	}
	var k6 [16]byte
	it = d.epV6.Iterate()
	for it.Next(&k6, &v) {
		out = append(out, toEP(netip.AddrFrom16(k6), v))
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("list axon_ep_v6: %w", err)
	}
	slices.SortFunc(out, func(a, b Endpoint) int { return a.IP.Compare(b.IP) })
	return out, nil
}
