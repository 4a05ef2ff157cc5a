package dptest

import (
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/brnf"
	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/testutil"
)

// NSCfg configures one named netns through netlink, the way `ip` would, so
// the tests need no userland tools (the VM kernel matrix runs them under
// busybox). Every method fails the test on error.
type NSCfg struct {
	T  testing.TB
	NS string          // the netns' name
	H  *netlink.Handle // netlink inside NS
}

// NSConf opens a netlink handle inside netns ns (closed at cleanup).
func NSConf(t testing.TB, ns string) *NSCfg {
	t.Helper()
	fd, err := netns.GetFromName(ns)
	if err != nil {
		t.Fatalf("open netns %s: %v", ns, err)
	}
	defer fd.Close()
	h, err := netlink.NewHandleAt(fd, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatalf("netlink handle in %s: %v", ns, err)
	}
	t.Cleanup(h.Close)
	return &NSCfg{T: t, NS: ns, H: h}
}

// Link is the device name in the netns.
func (c *NSCfg) Link(name string) netlink.Link {
	c.T.Helper()
	l, err := c.H.LinkByName(name)
	if err != nil {
		c.T.Fatalf("%s: link %s: %v", c.NS, name, err)
	}
	return l
}

// Index is the ifindex of device name.
func (c *NSCfg) Index(name string) int { return c.Link(name).Attrs().Index }

// Veth adds a veth pair name/peer. Optional MACs may be empty; peerNS, when
// set, is the netns the peer is created in.
func (c *NSCfg) Veth(name, mac, peer, peerMAC, peerNS string) {
	c.T.Helper()
	v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: peer}
	if mac != "" {
		v.HardwareAddr = MustMAC(c.T, mac)
	}
	if peerMAC != "" {
		v.PeerHardwareAddr = MustMAC(c.T, peerMAC)
	}
	if peerNS != "" {
		fd, err := netns.GetFromName(peerNS)
		if err != nil {
			c.T.Fatalf("open netns %s: %v", peerNS, err)
		}
		defer fd.Close()
		v.PeerNamespace = netlink.NsFd(int(fd))
	}
	if err := c.H.LinkAdd(v); err != nil {
		c.T.Fatalf("%s: add veth %s/%s: %v", c.NS, name, peer, err)
	}
}

// Up sets the devices up.
func (c *NSCfg) Up(names ...string) {
	c.T.Helper()
	for _, n := range names {
		if err := c.H.LinkSetUp(c.Link(n)); err != nil {
			c.T.Fatalf("%s: set %s up: %v", c.NS, n, err)
		}
	}
}

// Addr adds cidr to dev; IPv6 addresses skip DAD (like `nodad`).
func (c *NSCfg) Addr(dev, cidr string) {
	c.T.Helper()
	a, err := netlink.ParseAddr(cidr)
	if err != nil {
		c.T.Fatal(err)
	}
	if a.IP.To4() == nil {
		a.Flags |= unix.IFA_F_NODAD
	}
	if err := c.H.AddrAdd(c.Link(dev), a); err != nil {
		c.T.Fatalf("%s: add address %s to %s: %v", c.NS, cidr, dev, err)
	}
}

// IPNet parses the CIDR s or fails the test.
func IPNet(t testing.TB, s string) *net.IPNet {
	t.Helper()
	p, err := netip.ParsePrefix(s)
	if err != nil {
		t.Fatal(err)
	}
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// Route adds dst ("default" or a prefix) via gw (may be empty) on dev (may
// be empty); with neither it is an unreachable route.
func (c *NSCfg) Route(dst, gw, dev string) {
	c.T.Helper()
	r := &netlink.Route{}
	if dst != "default" {
		r.Dst = IPNet(c.T, dst)
	}
	if gw != "" {
		r.Gw = net.ParseIP(gw)
	}
	if dev != "" {
		r.LinkIndex = c.Index(dev)
	}
	switch {
	case gw == "" && dev == "":
		r.Type = unix.RTN_UNREACHABLE
	case gw == "":
		r.Scope = netlink.SCOPE_LINK
	}
	if dst == "default" && r.Gw != nil && r.Gw.To4() == nil {
		r.Family = netlink.FAMILY_V6
	}
	if err := c.H.RouteAdd(r); err != nil {
		c.T.Fatalf("%s: add route %s via %q dev %q: %v", c.NS, dst, gw, dev, err)
	}
}

// Neigh sets a PERMANENT neighbour entry (ip neigh replace ... nud permanent).
func (c *NSCfg) Neigh(dev, ip, mac string) {
	c.T.Helper()
	addr := net.ParseIP(ip)
	fam := netlink.FAMILY_V4
	if addr.To4() == nil {
		fam = netlink.FAMILY_V6
	}
	n := &netlink.Neigh{LinkIndex: c.Index(dev), Family: fam, State: netlink.NUD_PERMANENT,
		IP: addr, HardwareAddr: MustMAC(c.T, mac)}
	if err := c.H.NeighSet(n); err != nil {
		c.T.Fatalf("%s: set neighbour %s on %s: %v", c.NS, ip, dev, err)
	}
}

// Sysctl writes a net.* sysctl of this netns ("net.ipv4.ip_forward", "1").
func (c *NSCfg) Sysctl(key, val string) {
	c.T.Helper()
	InNetns(c.T, c.NS, func() {
		if err := testutil.WriteSysctl(key, val); err != nil {
			c.T.Errorf("%s: %v", c.NS, err)
		}
	})
}

// NoBridgeNetfilter keeps br_netfilter off this netns' bridges, as on a
// switch; with it, some kernels drop IPv6 BIG TCP packets at the bridge port
// (package brnf).
func (c *NSCfg) NoBridgeNetfilter() {
	c.T.Helper()
	if err := brnf.Disable(netnsutil.Path(c.NS)); err != nil {
		c.T.Fatal(err)
	}
}

// ProcNet reads /proc/net/<file> as seen from this netns (thread-self: the
// calling thread is the one switched into the netns).
func (c *NSCfg) ProcNet(file string) string {
	c.T.Helper()
	var out []byte
	InNetns(c.T, c.NS, func() {
		var err error
		out, err = os.ReadFile(filepath.Join("/proc/thread-self/net", file))
		if err != nil {
			c.T.Errorf("%s: read /proc/net/%s: %v", c.NS, file, err)
		}
	})
	return string(out)
}
