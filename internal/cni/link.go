package cni

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/api"
)

// Gateways the pod routes through. The pod has PERMANENT neighbour entries
// mapping them to the host-side device's MAC. Something that keeps its own
// neighbour cache (a VM guest behind the pod's bridge, a pod whose entry was
// flushed) resolves them: the IPv4 one exists nowhere, and axon_pod_egress
// answers its ARP requests (bpf/lib/arp.h); the IPv6 one, link-local, is an
// address of every host-side device (gatewayAddrV6), so the node's kernel
// answers its Neighbor Solicitations and NUD probes like for any address it
// has.
var (
	GatewayV4 = netip.MustParseAddr("169.254.1.1")
	GatewayV6 = netip.MustParseAddr("fe80::1")
)

// AliasPrefix marks host-side devices created by axon-cni (IFLA_IFALIAS), so
// axon-agent and axon uninstall recognise them, and so
// GC only ever removes devices it can prove are ours.
const AliasPrefix = "axon-cni:"

// HostVethName is the node-side device name of a pod interface:
// "lxc" + 11 hex digits of sha256(containerID + "/" + ifName).
func HostVethName(containerID, ifName string) string {
	sum := sha256.Sum256([]byte(containerID + "/" + ifName))
	return "lxc" + hex.EncodeToString(sum[:])[:11]
}

func hostAlias(containerID, ifName string) string {
	return AliasPrefix + containerID + "/" + ifName
}

func isNotFound(err error) bool {
	var lnf netlink.LinkNotFoundError
	return errors.As(err, &lnf) || errors.Is(err, unix.ENODEV) || errors.Is(err, unix.ENOENT)
}

func hostPrefix(ip netip.Addr) *net.IPNet {
	return &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(ip.BitLen(), ip.BitLen())}
}

func writeSysctl(name, value string) error {
	p := filepath.Join("/proc/sys", strings.ReplaceAll(name, ".", "/"))
	if err := os.WriteFile(p, []byte(value), 0o644); err != nil {
		return fmt.Errorf("sysctl %s=%s: %w", name, value, err)
	}
	return nil
}

// createVeth creates the pair in the current (node) netns with the peer
// directly in podNS, both with mtu. It returns the host-side link.
func createVeth(hostName, ifName, containerID string, mtu int, podNS ns.NetNS) (netlink.Link, error) {
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: hostName, MTU: mtu, Alias: hostAlias(containerID, ifName)},
		PeerName:      ifName,
		PeerMTU:       uint32(mtu),
		PeerNamespace: netlink.NsFd(int(podNS.Fd())),
	}
	if err := netlink.LinkAdd(veth); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("create veth %s/%s: a device with one of these names already exists (in the node or the pod netns)", hostName, ifName)
		}
		return nil, fmt.Errorf("create veth %s (peer %s in %s): %w", hostName, ifName, podNS.Path(), err)
	}
	return newHostLink("veth", hostName, containerID, ifName)
}

// newHostLink returns the node side of a pod device just created (kind is
// "veth" or "netkit"), with the alias naming its pod attachment set: older
// kernels ignore IFLA_IFALIAS on create.
func newHostLink(kind, hostName, containerID, ifName string) (netlink.Link, error) {
	host, err := netlink.LinkByName(hostName)
	if err != nil {
		return nil, fmt.Errorf("find new %s %s: %w", kind, hostName, err)
	}
	if host.Attrs().Alias == "" {
		if err := netlink.LinkSetAlias(host, hostAlias(containerID, ifName)); err != nil {
			return nil, fmt.Errorf("set alias of %s: %w", hostName, err)
		}
	}
	return host, nil
}

// setupHost brings the host side up, sets its sysctls and routes each pod
// address to it (scope link), in the current (node) netns.
func setupHost(host netlink.Link, ips []netip.Addr) error {
	name := host.Attrs().Name
	// rp_filter off: the BPF datapath redirects into and out of this device.
	// accept_ra off: the pod never sends RAs we would want to follow.
	sysctls := [][2]string{
		{"net.ipv4.conf." + name + ".rp_filter", "0"},
		{"net.ipv4.conf." + name + ".forwarding", "1"},
	}
	if hasV6(ips) {
		sysctls = append(sysctls,
			[2]string{"net.ipv6.conf." + name + ".accept_ra", "0"},
			// No DAD on the host side: its link-local is usable at once,
			// so the node can resolve the pod's address right away.
			[2]string{"net.ipv6.conf." + name + ".accept_dad", "0"})
	}
	for _, s := range sysctls {
		if err := writeSysctl(s[0], s[1]); err != nil {
			return fmt.Errorf("node side: %w", err)
		}
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return fmt.Errorf("set %s up: %w", name, err)
	}
	if hasV6(ips) {
		if err := netlink.AddrReplace(host, gatewayAddrV6()); err != nil {
			return fmt.Errorf("node side: gateway %s on %s: %w", GatewayV6, name, err)
		}
	}
	for _, ip := range ips {
		r := &netlink.Route{LinkIndex: host.Attrs().Index, Dst: hostPrefix(ip), Scope: netlink.SCOPE_LINK}
		if err := netlink.RouteReplace(r); err != nil {
			return fmt.Errorf("node route %s dev %s: %w", r.Dst, name, err)
		}
	}
	return nil
}

// gatewayAddrV6 is GatewayV6 as an address of a host-side device: fe80::1/64,
// usable at once (no DAD: it is every such device's and nobody else's on
// the pod's link).
func gatewayAddrV6() *netlink.Addr {
	return &netlink.Addr{IPNet: &net.IPNet{IP: GatewayV6.AsSlice(), Mask: net.CIDRMask(64, 128)}, Flags: unix.IFA_F_NODAD}
}

func hasV6(ips []netip.Addr) bool {
	for _, ip := range ips {
		if ip.Is6() {
			return true
		}
	}
	return false
}

// podLink describes the pod side after setup.
type podLink struct {
	Index int
	MAC   net.HardwareAddr
}

// setupPod configures the pod side inside podNS: sysctls, addresses,
// gateway neighbours and default routes.
func setupPod(podNS ns.NetNS, ifName string, ips []netip.Addr, hostMAC net.HardwareAddr, dev api.DeviceConfig) (podLink, error) {
	var out podLink
	err := podNS.Do(func(ns.NetNS) error {
		if lo, err := netlink.LinkByName("lo"); err == nil {
			if err := netlink.LinkSetUp(lo); err != nil {
				return fmt.Errorf("set lo up: %w", err)
			}
		}
		link, err := netlink.LinkByName(ifName)
		if err != nil {
			return fmt.Errorf("find %s: %w", ifName, err)
		}
		sysctls := [][2]string{
			// Single-homed pod: the default route covers every source, so
			// loose reverse-path filtering loses nothing and never drops
			// replies that BPF redirects straight into the pod.
			{"net.ipv4.conf." + ifName + ".rp_filter", "2"},
		}
		if hasV6(ips) {
			sysctls = append(sysctls,
				[2]string{"net.ipv6.conf." + ifName + ".disable_ipv6", "0"},
				[2]string{"net.ipv6.conf." + ifName + ".accept_dad", "0"},
				[2]string{"net.ipv6.conf." + ifName + ".accept_ra", "0"},
			)
		}
		for _, s := range sysctls {
			if err := writeSysctl(s[0], s[1]); err != nil {
				return fmt.Errorf("pod side: %w", err)
			}
		}
		for _, ip := range ips {
			addr := &netlink.Addr{IPNet: hostPrefix(ip)}
			if ip.Is6() {
				addr.Flags = unix.IFA_F_NODAD
			}
			if err := netlink.AddrReplace(link, addr); err != nil {
				return fmt.Errorf("add %s to %s: %w", addr.IPNet, ifName, err)
			}
		}
		if err := applyBigTCP(link, dev); err != nil {
			return fmt.Errorf("pod side: %w", err)
		}
		if err := netlink.LinkSetUp(link); err != nil {
			return fmt.Errorf("set %s up: %w", ifName, err)
		}
		idx := link.Attrs().Index
		l3 := noARP(link) // netkit l3: no ARP/ND, the gateway needs no neighbour entry
		for _, gw := range gateways(ips) {
			if !l3 {
				n := &netlink.Neigh{
					LinkIndex:    idx,
					Family:       family(gw),
					State:        netlink.NUD_PERMANENT,
					IP:           gw.AsSlice(),
					HardwareAddr: hostMAC,
				}
				if err := netlink.NeighSet(n); err != nil {
					return fmt.Errorf("neighbour %s lladdr %s dev %s: %w", gw, hostMAC, ifName, err)
				}
			}
			if gw.Is4() {
				r := &netlink.Route{LinkIndex: idx, Dst: hostPrefix(gw), Scope: netlink.SCOPE_LINK}
				if err := netlink.RouteReplace(r); err != nil {
					return fmt.Errorf("route %s dev %s: %w", r.Dst, ifName, err)
				}
			}
			r := &netlink.Route{LinkIndex: idx, Dst: defaultDst(gw), Gw: gw.AsSlice()}
			if err := netlink.RouteReplace(r); err != nil {
				return fmt.Errorf("default route via %s dev %s: %w", gw, ifName, err)
			}
		}
		// Re-read: the MAC is final once the link exists.
		link, err = netlink.LinkByIndex(idx)
		if err != nil {
			return fmt.Errorf("read %s: %w", ifName, err)
		}
		out = podLink{Index: idx, MAC: link.Attrs().HardwareAddr}
		return nil
	})
	return out, err
}

func gateways(ips []netip.Addr) []netip.Addr {
	var gws []netip.Addr
	for _, ip := range ips {
		if ip.Is4() {
			gws = append(gws, GatewayV4)
		} else {
			gws = append(gws, GatewayV6)
		}
	}
	return gws
}

func family(ip netip.Addr) int {
	if ip.Is4() {
		return netlink.FAMILY_V4
	}
	return netlink.FAMILY_V6
}

func defaultDst(gw netip.Addr) *net.IPNet {
	if gw.Is4() {
		return &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}
	}
	return &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
}

// deleteHostVeth removes the pair by its node-side name; a missing device is fine.
func deleteHostVeth(name string) error {
	link, err := netlink.LinkByName(name)
	if err != nil {
		if isNotFound(err) {
			return nil
		}
		return fmt.Errorf("find %s: %w", name, err)
	}
	if err := netlink.LinkDel(link); err != nil && !isNotFound(err) {
		return fmt.Errorf("delete %s: %w", name, err)
	}
	return nil
}
