package cni

import (
	"errors"
	"fmt"
	"net"
	"slices"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/api"
)

// Device modes of the "deviceMode" config key (and the agent's --device-mode).
const (
	ModeVeth     = "veth"      // veth pair (works everywhere)
	ModeNetkit   = "netkit"    // netkit pair, L3 mode (no ARP, no MACs)
	ModeNetkitL2 = "netkit-l2" // netkit pair, L2 mode (random MACs, ARP)
	ModeAuto     = "auto"      // netkit (L3) when the kernel can create one, else veth
)

// DeviceModes lists the valid values of "deviceMode".
var DeviceModes = []string{ModeVeth, ModeNetkit, ModeNetkitL2, ModeAuto}

// deviceFor decides the pod device: the network config's "deviceMode" wins
// when set, else what the agent answered in Allocate, else a veth. BIG TCP
// sizes always come from the agent (it knows the uplink's limits).
func deviceFor(conf *NetConf, fromAgent *api.DeviceConfig) api.DeviceConfig {
	var dev api.DeviceConfig
	if fromAgent != nil {
		dev = *fromAgent
	}
	switch conf.DeviceMode {
	case ModeVeth:
		dev.Type, dev.NetkitMode = api.DeviceVeth, ""
	case ModeNetkit:
		dev.Type, dev.NetkitMode = api.DeviceNetkit, "l3"
	case ModeNetkitL2:
		dev.Type, dev.NetkitMode = api.DeviceNetkit, "l2"
	case ModeAuto:
		if netkitAvailable() {
			dev.Type, dev.NetkitMode = api.DeviceNetkit, "l3"
		} else {
			dev.Type, dev.NetkitMode = api.DeviceVeth, ""
		}
	}
	if dev.Type == "" {
		dev.Type = api.DeviceVeth
	}
	if dev.Type == api.DeviceNetkit && dev.NetkitMode == "" {
		dev.NetkitMode = "l3"
	}
	return dev
}

// netkitAvailable reports whether the kernel knows the netkit link kind
// (rtnl_link_ops registered), without creating anything: a RTM_NEWLINK for
// kind "netkit" with an invalid mode fails with EINVAL when netkit exists and
// EOPNOTSUPP when it does not.
func netkitAvailable() bool {
	nk := &netlink.Netkit{LinkAttrs: netlink.LinkAttrs{Name: "axcni-probe0"}, Mode: netlink.NetkitMode(99)}
	nk.SetPeerAttrs(&netlink.LinkAttrs{Name: "axcni-probe1"})
	err := netlink.LinkAdd(nk)
	if err == nil { // cannot happen (mode 99), but never leave it behind
		_ = netlink.LinkDel(nk)
		return true
	}
	return errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ERANGE)
}

// createNetkit creates a netkit pair in the current (node) netns with the peer
// directly in podNS. Both default policies are blackhole: nothing passes
// until the agent has attached axon's programs and opened the device
// (datapath.AttachPod), so a pod never has an unfiltered window.
func createNetkit(hostName, ifName, containerID string, mtu int, podNS ns.NetNS, mode string) (netlink.Link, error) {
	nkMode := netlink.NETKIT_MODE_L3
	if mode == "l2" {
		nkMode = netlink.NETKIT_MODE_L2
	}
	nk := &netlink.Netkit{
		LinkAttrs:  netlink.LinkAttrs{Name: hostName, MTU: mtu, Alias: hostAlias(containerID, ifName)},
		Mode:       nkMode,
		Policy:     netlink.NETKIT_POLICY_BLACKHOLE,
		PeerPolicy: netlink.NETKIT_POLICY_BLACKHOLE,
		Scrub:      netlink.NETKIT_SCRUB_DEFAULT,
		PeerScrub:  netlink.NETKIT_SCRUB_DEFAULT,
	}
	nk.SetPeerAttrs(&netlink.LinkAttrs{Name: ifName, MTU: mtu, Namespace: netlink.NsFd(int(podNS.Fd()))})
	if err := netlink.LinkAdd(nk); err != nil {
		switch {
		case errors.Is(err, unix.EEXIST):
			return nil, fmt.Errorf("create netkit %s/%s: a device with one of these names already exists (in the node or the pod netns)", hostName, ifName)
		case errors.Is(err, unix.EOPNOTSUPP), errors.Is(err, unix.ENOTSUP):
			return nil, fmt.Errorf("create netkit %s: this kernel has no netkit devices (needs Linux 6.7+ with CONFIG_NETKIT): "+
				`use "deviceMode": "veth" or "auto" in the network config, or run axon-agent with --device-mode=veth|auto (%w)`, hostName, err)
		}
		return nil, fmt.Errorf("create netkit %s (peer %s in %s, mode %s): %w", hostName, ifName, podNS.Path(), mode, err)
	}
	return newHostLink("netkit", hostName, containerID, ifName)
}

// createDevice creates the pod device pair of type dev.Type.
func createDevice(dev api.DeviceConfig, hostName, ifName, containerID string, mtu int, podNS ns.NetNS) (netlink.Link, error) {
	if dev.Type == api.DeviceNetkit {
		return createNetkit(hostName, ifName, containerID, mtu, podNS, dev.NetkitMode)
	}
	return createVeth(hostName, ifName, containerID, mtu, podNS)
}

// deviceTypeOf returns the api device type and netkit mode of a host-side link.
func deviceTypeOf(l netlink.Link) (typ, mode string) {
	if nk, ok := l.(*netlink.Netkit); ok {
		if nk.Mode == netlink.NETKIT_MODE_L2 {
			return api.DeviceNetkit, "l2"
		}
		return api.DeviceNetkit, "l3"
	}
	return l.Type(), ""
}

// podDeviceTypes are the link kinds axon-cni creates on the node side.
var podDeviceTypes = []string{"veth", "netkit"}

func isPodDevice(l netlink.Link) bool { return slices.Contains(podDeviceTypes, l.Type()) }

// peerIndex is the ifindex (in the pod netns) of the host-side link's peer.
func peerIndex(host netlink.Link) (int, error) {
	if v, ok := host.(*netlink.Veth); ok {
		return netlink.VethPeerIndex(v)
	}
	if host.Attrs().ParentIndex > 0 { // IFLA_LINK = ndo_get_iflink = the netkit peer
		return host.Attrs().ParentIndex, nil
	}
	return 0, fmt.Errorf("%s (%s) has no peer index", host.Attrs().Name, host.Type())
}

// noARP reports an L3 device (netkit L3): no neighbour entries needed or used.
func noARP(l netlink.Link) bool { return l.Attrs().RawFlags&unix.IFF_NOARP != 0 }

// applyBigTCP sets the BIG TCP sizes of dev on link in the current netns.
// gso_max_size goes first: the kernel lowers gso_ipv4_max_size with it.
func applyBigTCP(l netlink.Link, dev api.DeviceConfig) error {
	steps := []struct {
		name string
		size uint32
		set  func(netlink.Link, int) error
	}{
		{"gso_max_size", dev.GSOMaxSize, netlink.LinkSetGSOMaxSize},
		{"gro_max_size", dev.GROMaxSize, netlink.LinkSetGROMaxSize},
		{"gso_ipv4_max_size", dev.GSOIPv4MaxSize, netlink.LinkSetGSOIPv4MaxSize},
		{"gro_ipv4_max_size", dev.GROIPv4MaxSize, netlink.LinkSetGROIPv4MaxSize},
	}
	for _, s := range steps {
		if s.size == 0 {
			continue
		}
		if err := s.set(l, int(s.size)); err != nil {
			return fmt.Errorf("set %s %d on %s: %w", s.name, s.size, l.Attrs().Name, err)
		}
	}
	return nil
}

// checkBigTCP lists differences between l's sizes and dev's (0 = not managed).
func checkBigTCP(l netlink.Link, dev api.DeviceConfig, where string) []string {
	var problems []string
	a := l.Attrs()
	for _, c := range []struct {
		name      string
		want, got uint32
	}{
		{"gso_max_size", dev.GSOMaxSize, a.GSOMaxSize},
		{"gro_max_size", dev.GROMaxSize, a.GROMaxSize},
		{"gso_ipv4_max_size", dev.GSOIPv4MaxSize, a.GSOIPv4MaxSize},
		{"gro_ipv4_max_size", dev.GROIPv4MaxSize, a.GROIPv4MaxSize},
	} {
		if c.want != 0 && c.want != c.got {
			problems = append(problems, fmt.Sprintf("%s device %s has %s %d, want %d", where, a.Name, c.name, c.got, c.want))
		}
	}
	return problems
}

// zeroMACIfNone gives L3 devices (no link-layer address) an all-zero 6-byte
// MAC, which is what the BPF endpoint map stores for them.
func zeroMACIfNone(mac net.HardwareAddr) net.HardwareAddr {
	if len(mac) == 6 {
		return mac
	}
	return make(net.HardwareAddr, 6)
}
