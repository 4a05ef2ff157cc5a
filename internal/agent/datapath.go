package agent

import (
	"log/slog"
	"net/netip"

	"github.com/axonhq/axon/internal/cni"
	"github.com/axonhq/axon/internal/datapath/podpath"
)

// loadDatapath returns the loader used by Run: internal/datapath in the
// agent's netns, adopting maps and links pinned under cfg.BPFRoot.
func loadDatapath(cfg Config, log *slog.Logger) func(uplink string) (dataplane, error) {
	return func(uplink string) (dataplane, error) {
		d, err := podpath.Load(podpath.Config{
			PinDir:      cfg.BPFRoot,
			Uplink:      uplink,
			AttachMode:  cfg.AttachMode,
			HostRouting: cfg.HostRouting,
			Logger:      log.With("component", "datapath"),
			// pod devices and BIG TCP
			DeviceMode:       cfg.DeviceMode,
			EnableIPv4BigTCP: cfg.EnableIPv4BigTCP,
			EnableIPv6BigTCP: cfg.EnableIPv6BigTCP,
			NoFibCache:       !cfg.FibCache,
			// the gateway axon-cni routes every pod through: ARP for it answered
			GatewayV4: cni.GatewayV4,
		})
		if err != nil {
			return nil, err
		}
		return dpAdapter{d}, nil
	}
}

// dpAdapter maps *podpath.Datapath onto the agent's dataplane interface.
type dpAdapter struct{ *podpath.Datapath }

func (d dpAdapter) UpsertEndpoint(e MapEntry) error {
	return d.Datapath.UpsertEndpoint(podpath.Endpoint{IP: e.IP, IfIndex: e.IfIndex, PodMAC: e.PodMAC, HostMAC: e.HostMAC})
}

func (d dpAdapter) DeleteEndpoint(ip netip.Addr) error { return d.Datapath.DeleteEndpoint(ip) }

func (d dpAdapter) Endpoints() ([]MapEntry, error) {
	eps, err := d.Datapath.Endpoints()
	if err != nil {
		return nil, err
	}
	out := make([]MapEntry, 0, len(eps))
	for _, e := range eps {
		out = append(out, MapEntry{IP: e.IP, IfIndex: e.IfIndex, PodMAC: e.PodMAC, HostMAC: e.HostMAC})
	}
	return out, nil
}
