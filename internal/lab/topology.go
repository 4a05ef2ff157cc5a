package lab

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/brnf"
	"github.com/axonhq/axon/internal/netnsutil"
)

// Addressing plan (docs/lab.md "Lab topology"). Indices are written
// in decimal inside the IPv6 text on purpose: node 1 is fd00:198:18::11.
func nodeName(i int) string { return fmt.Sprintf("node%d", i) }

func wireV4(host int) netip.Addr { return netip.AddrFrom4([4]byte{198, 18, 0, byte(host)}) }
func wireV6(host int) netip.Addr {
	return netip.MustParseAddr(fmt.Sprintf("fd00:198:18::%d", host))
}
func podCIDRs(i int) []netip.Prefix {
	return []netip.Prefix{
		netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i), 0}), 24),
		netip.MustParsePrefix(fmt.Sprintf("fd00:10:244:%d::/64", i)),
	}
}
func baselineCIDRs(i int) []netip.Prefix {
	return []netip.Prefix{
		netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 245, byte(i), 0}), 24),
		netip.MustParsePrefix(fmt.Sprintf("fd00:10:245:%d::/64", i)),
	}
}

const externalHost = 250

func newNode(stateDir, cgRoot string, i int) Node {
	name := nodeName(i)
	nd := filepath.Join(stateDir, "nodes", name)
	return Node{
		Name:          name,
		Index:         i,
		Netns:         NetnsPrefix + name,
		IP:            wireV4(10 + i),
		IPs:           []netip.Addr{wireV4(10 + i), wireV6(10 + i)},
		PodCIDRs:      podCIDRs(i),
		BaselineCIDRs: baselineCIDRs(i),
		StateDir:      filepath.Join(nd, "state"),
		Socket:        filepath.Join(nd, "axon.sock"),
		PinDir:        filepath.Join(PinRoot, name),
		Cgroup:        filepath.Join(cgRoot, name),
	}
}

func newExternal() External {
	return External{
		Name:  ExternalName,
		Netns: NetnsPrefix + ExternalName,
		IP:    wireV4(externalHost),
		IPs:   []netip.Addr{wireV4(externalHost), wireV6(externalHost)},
	}
}

// createWire creates the wire namespace with its bridge.
func createWire() error {
	if err := createNetns(WireNetns); err != nil {
		return err
	}
	// The wire is pure L2: no addresses, no IPv6 autoconf on its ports.
	if err := writeSysctls(WireNetns, [][2]string{
		{"net.ipv6.conf.all.disable_ipv6", "1"},
		{"net.ipv6.conf.default.disable_ipv6", "1"},
	}); err != nil {
		return err
	}
	// A switch runs no netfilter: br_netfilter would cost every packet on
	// the wire CPU time (both sides of a lab benchmark) and, on some
	// kernels, drop IPv6 BIG TCP packets (package brnf).
	if err := brnf.Disable(netnsutil.Path(WireNetns)); err != nil {
		return err
	}
	nl, h, err := netlinkAt(WireNetns)
	if err != nil {
		return err
	}
	defer h.Close()
	defer nl.Close()
	off := false
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: WireBridge, MTU: 1500}, MulticastSnooping: &off}
	if err := nl.LinkAdd(br); err != nil {
		return fmt.Errorf("create bridge %s in %s: %w", WireBridge, WireNetns, err)
	}
	if err := nl.LinkSetUp(br); err != nil {
		return fmt.Errorf("set %s up: %w", WireBridge, err)
	}
	for _, n := range []string{"lo"} {
		if l, err := nl.LinkByName(n); err == nil {
			_ = nl.LinkSetUp(l)
		}
	}
	return nil
}

// plugIntoWire creates the namespace nsName with uplink eth0 (a veth whose
// peer "w-<short>" is a port of the wire bridge) carrying addrs.
func plugIntoWire(nsName, short string, addrs []netip.Prefix, forwarding bool) error {
	if err := createNetns(nsName); err != nil {
		return err
	}
	fwd := "0"
	if forwarding {
		fwd = "1"
	}
	// Set before eth0 exists so it inherits accept_dad=0 (no DAD wait).
	if err := writeSysctls(nsName, [][2]string{
		{"net.ipv6.conf.default.accept_dad", "0"},
		{"net.ipv6.conf.all.accept_dad", "0"},
		{"net.ipv4.ip_forward", fwd},
		{"net.ipv6.conf.all.forwarding", fwd},
	}); err != nil {
		return err
	}
	wire, wh, err := netlinkAt(WireNetns)
	if err != nil {
		return err
	}
	defer wh.Close()
	defer wire.Close()
	nl, h, err := netlinkAt(nsName)
	if err != nil {
		return err
	}
	defer h.Close()
	defer nl.Close()

	br, err := wire.LinkByName(WireBridge)
	if err != nil {
		return fmt.Errorf("find bridge %s in %s: %w", WireBridge, WireNetns, err)
	}
	port := WirePort(short)
	if len(port) > 15 {
		return fmt.Errorf("name %q too long for a wire port (max 13 characters)", short)
	}
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: port, MTU: 1500, MasterIndex: br.Attrs().Index},
		PeerName:      "eth0",
		PeerNamespace: netlink.NsFd(int(h)),
	}
	if err := wire.LinkAdd(veth); err != nil {
		return fmt.Errorf("create veth %s <-> %s/eth0: %w", port, nsName, err)
	}
	if err := wire.LinkSetUp(veth); err != nil {
		return fmt.Errorf("set %s up: %w", port, err)
	}
	lo, err := nl.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find lo in %s: %w", nsName, err)
	}
	if err := nl.LinkSetUp(lo); err != nil {
		return fmt.Errorf("set lo up in %s: %w", nsName, err)
	}
	eth0, err := nl.LinkByName("eth0")
	if err != nil {
		return fmt.Errorf("find eth0 in %s: %w", nsName, err)
	}
	for _, a := range addrs {
		addr := &netlink.Addr{IPNet: prefixToIPNet(a), Flags: unix.IFA_F_NODAD}
		if err := nl.AddrAdd(eth0, addr); err != nil {
			return fmt.Errorf("add %s to %s/eth0: %w", a, nsName, err)
		}
	}
	if err := nl.LinkSetUp(eth0); err != nil {
		return fmt.Errorf("set eth0 up in %s: %w", nsName, err)
	}
	return nil
}

// addBaselineRoutes installs, in node n, static routes to every other node's
// baseline (ptp + host-local) pod ranges via that node's wire address: the
// "plain kernel routing" of the baseline datapath. Harmless for axon pods.
func addBaselineRoutes(n Node, all []Node) error {
	var routes []netlink.Route
	for _, o := range all {
		if o.Name == n.Name {
			continue
		}
		for _, dst := range o.BaselineCIDRs {
			gw := o.IPs[0]
			if dst.Addr().Is6() {
				gw = o.IPs[1]
			}
			routes = append(routes, netlink.Route{Dst: prefixToIPNet(dst), Gw: net.IP(gw.AsSlice())})
		}
	}
	return replaceEth0Routes(n.Netns, routes)
}

// replaceEth0Routes adds or replaces routes out of eth0 in the named
// namespace (their LinkIndex is set to eth0's).
func replaceEth0Routes(nsName string, routes []netlink.Route) error {
	nl, h, err := netlinkAt(nsName)
	if err != nil {
		return err
	}
	defer h.Close()
	defer nl.Close()
	eth0, err := nl.LinkByName("eth0")
	if err != nil {
		return fmt.Errorf("find eth0 in %s: %w", nsName, err)
	}
	for _, r := range routes {
		r.LinkIndex = eth0.Attrs().Index
		if err := nl.RouteReplace(&r); err != nil {
			if r.Gw != nil {
				return fmt.Errorf("route %s via %s in %s: %w", r.Dst, r.Gw, nsName, err)
			}
			return fmt.Errorf("route %s dev eth0 in %s: %w", r.Dst, nsName, err)
		}
	}
	return nil
}

func prefixToIPNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// nodeAddrPrefixes returns eth0's addresses: /24 and /64 on the wire.
func wirePrefixes(ips []netip.Addr) []netip.Prefix {
	var out []netip.Prefix
	for _, ip := range ips {
		bits := 24
		if ip.Is6() {
			bits = 64
		}
		out = append(out, netip.PrefixFrom(ip, bits))
	}
	return out
}

// deleteAllLabNetns removes every axonlab-* namespace after killing the
// processes still inside (they can only be lab processes).
func deleteAllLabNetns() error {
	names, err := labNetns()
	if err != nil {
		return err
	}
	// Pods first, then nodes, the wire last: order is cosmetic, deletion of
	// a namespace takes its devices (and their veth peers) with it.
	order := func(n string) int {
		switch n {
		case WireNetns:
			return 2
		case NetnsPrefix + ExternalName:
			return 1
		}
		return 0
	}
	var errs []error
	for pass := 0; pass <= 2; pass++ {
		for _, n := range names {
			if order(n) != pass {
				continue
			}
			pids, err := pidsInNetns(n)
			if err != nil {
				errs = append(errs, err)
			}
			killPIDs(pids)
			if err := deleteNetns(n); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}
