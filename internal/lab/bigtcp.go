package lab

import (
	"fmt"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/datapath/podpath"
)

// Pod devices of `axon lab up --device`: the agents' --device-mode.
const (
	DeviceVeth   = "veth"
	DeviceNetkit = "netkit"
	DeviceAuto   = "auto" // netkit where the kernel has it (the 6.12 VM), else veth (the 6.18 host)
)

// Devices lists the valid --device values.
var Devices = []string{DeviceAuto, DeviceVeth, DeviceNetkit}

// LabBigTCPSize is the GSO/GRO size `--big-tcp on` gives the wire: the
// bridge, its ports and every node's uplink (the agents size the pod
// devices themselves, from the uplink's limits).
const LabBigTCPSize = podpath.BigTCPMaxSize

// validateDevice checks --device; netkit is refused up front where the
// kernel has none (the agents would refuse to start anyway).
func validateDevice(dev string) error {
	if !slices.Contains(Devices, dev) {
		return fmt.Errorf("--device %q: want one of %s", dev, strings.Join(Devices, ", "))
	}
	if dev == DeviceNetkit {
		if c := datapath.ProbeNetkit(); !c.Available {
			return fmt.Errorf("--device netkit: this kernel cannot create netkit devices (%s); use --device veth, or a kernel with CONFIG_NETKIT (Debian 6.12: make test-vm KERNEL=debian-6.12)", c.Reason)
		}
	}
	return nil
}

// deviceAgentArgs are the agent flags for the lab's device, BIG TCP and
// route cache settings.
func deviceAgentArgs(st *State) []string {
	dev := st.Device
	if dev == "" {
		dev = DeviceVeth
	}
	args := []string{"--device-mode=" + dev}
	on := fmt.Sprint(st.BigTCP)
	args = append(args, "--enable-ipv4-big-tcp="+on, "--enable-ipv6-big-tcp="+on)
	if st.NoFibCache {
		args = append(args, "--fib-cache=false")
	}
	return args
}

// setWireBigTCP raises the GSO/GRO limits (IPv4 and IPv6) of the wire
// bridge, its ports and each node's uplink eth0 to LabBigTCPSize, so that
// host-to-host traffic uses the same GSO sizes as BIG TCP pods.
func setWireBigTCP(st *State) error {
	wire, wh, err := netlinkAt(WireNetns)
	if err != nil {
		return err
	}
	defer wh.Close()
	defer wire.Close()
	for _, n := range st.Nodes {
		if err := setBigTCPOn(wire, WirePort(n.Name)); err != nil {
			return err
		}
		nl, h, err := netlinkAt(n.Netns)
		if err != nil {
			return err
		}
		err = setBigTCPOn(nl, "eth0")
		nl.Close()
		h.Close()
		if err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	return setBigTCPOn(wire, WireBridge)
}

func setBigTCPOn(h *netlink.Handle, name string) error {
	l, err := h.LinkByName(name)
	if err != nil {
		return fmt.Errorf("big tcp: find %s: %w", name, err)
	}
	for _, s := range []struct {
		what string
		set  func(netlink.Link, int) error
	}{
		{"gso_max_size", h.LinkSetGSOMaxSize},
		{"gro_max_size", h.LinkSetGROMaxSize},
		{"gso_ipv4_max_size", h.LinkSetGSOIPv4MaxSize},
		{"gro_ipv4_max_size", h.LinkSetGROIPv4MaxSize},
	} {
		if err := s.set(l, LabBigTCPSize); err != nil {
			return fmt.Errorf("big tcp: set %s %d on %s: %w (the kernel needs BIG TCP: 5.19+, IPv4 6.3+)", s.what, LabBigTCPSize, name, err)
		}
	}
	return nil
}

// SetPodGSO sets the GSO/GRO limits (IPv4 and IPv6) of an axon pod's device,
// both ends, to size: `axon lab bench --compare-big-tcp` gives two pods the
// pre-BIG-TCP 65536 to measure BIG TCP on and off in the same run.
func SetPodGSO(p Pod, node Node, size int) error {
	ph, pns, err := netlinkAt(p.Netns)
	if err != nil {
		return err
	}
	defer pns.Close()
	defer ph.Close()
	nh, nns, err := netlinkAt(node.Netns)
	if err != nil {
		return err
	}
	defer nns.Close()
	defer nh.Close()
	pl, err := ph.LinkByName(p.IfName)
	if err != nil {
		return fmt.Errorf("pod %s: find %s: %w", p.Name, p.IfName, err)
	}
	hl, err := nh.LinkByIndex(pl.Attrs().ParentIndex)
	if err != nil {
		return fmt.Errorf("pod %s: find its host-side device (ifindex %d on %s): %w", p.Name, pl.Attrs().ParentIndex, node.Name, err)
	}
	for _, side := range []struct {
		h *netlink.Handle
		l netlink.Link
	}{{nh, hl}, {ph, pl}} {
		for _, set := range []func(netlink.Link, int) error{side.h.LinkSetGSOMaxSize, side.h.LinkSetGROMaxSize, side.h.LinkSetGSOIPv4MaxSize, side.h.LinkSetGROIPv4MaxSize} {
			if err := set(side.l, size); err != nil {
				return fmt.Errorf("pod %s: set GSO/GRO %d on %s: %w", p.Name, size, side.l.Attrs().Name, err)
			}
		}
	}
	return nil
}
