package datapath

import (
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/brnf"
)

// nsCfg configures one named netns through netlink, the way `ip` would, so
// the tests need no userland tools (the VM kernel matrix runs them under
// busybox). Every method fails the test on error.
type nsCfg struct {
	t  testing.TB
	ns string
	h  *netlink.Handle
}

// nsConf opens a netlink handle inside netns ns (closed at cleanup).
func nsConf(t testing.TB, ns string) *nsCfg {
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
	return &nsCfg{t: t, ns: ns, h: h}
}

func (c *nsCfg) link(name string) netlink.Link {
	c.t.Helper()
	l, err := c.h.LinkByName(name)
	if err != nil {
		c.t.Fatalf("%s: link %s: %v", c.ns, name, err)
	}
	return l
}

func (c *nsCfg) index(name string) int { return c.link(name).Attrs().Index }

// veth adds a veth pair name/peer. Optional MACs may be empty; peerNS, when
// set, is the netns the peer is created in.
func (c *nsCfg) veth(name, mac, peer, peerMAC, peerNS string) {
	c.t.Helper()
	v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: peer}
	if mac != "" {
		v.HardwareAddr = mustMAC(c.t, mac)
	}
	if peerMAC != "" {
		v.PeerHardwareAddr = mustMAC(c.t, peerMAC)
	}
	if peerNS != "" {
		fd, err := netns.GetFromName(peerNS)
		if err != nil {
			c.t.Fatalf("open netns %s: %v", peerNS, err)
		}
		defer fd.Close()
		v.PeerNamespace = netlink.NsFd(int(fd))
	}
	if err := c.h.LinkAdd(v); err != nil {
		c.t.Fatalf("%s: add veth %s/%s: %v", c.ns, name, peer, err)
	}
}

func (c *nsCfg) up(names ...string) {
	c.t.Helper()
	for _, n := range names {
		if err := c.h.LinkSetUp(c.link(n)); err != nil {
			c.t.Fatalf("%s: set %s up: %v", c.ns, n, err)
		}
	}
}

// addr adds cidr to dev; IPv6 addresses skip DAD (like `nodad`).
func (c *nsCfg) addr(dev, cidr string) {
	c.t.Helper()
	a, err := netlink.ParseAddr(cidr)
	if err != nil {
		c.t.Fatal(err)
	}
	if a.IP.To4() == nil {
		a.Flags |= unix.IFA_F_NODAD
	}
	if err := c.h.AddrAdd(c.link(dev), a); err != nil {
		c.t.Fatalf("%s: add address %s to %s: %v", c.ns, cidr, dev, err)
	}
}

func ipNet(t testing.TB, s string) *net.IPNet {
	t.Helper()
	p, err := netip.ParsePrefix(s)
	if err != nil {
		t.Fatal(err)
	}
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// route adds dst ("default" or a prefix) via gw (may be empty) on dev (may
// be empty); with neither it is an unreachable route.
func (c *nsCfg) route(dst, gw, dev string) {
	c.t.Helper()
	r := &netlink.Route{}
	if dst != "default" {
		r.Dst = ipNet(c.t, dst)
	}
	if gw != "" {
		r.Gw = net.ParseIP(gw)
	}
	if dev != "" {
		r.LinkIndex = c.index(dev)
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
	if err := c.h.RouteAdd(r); err != nil {
		c.t.Fatalf("%s: add route %s via %q dev %q: %v", c.ns, dst, gw, dev, err)
	}
}

// neigh sets a PERMANENT neighbour entry (ip neigh replace ... nud permanent).
func (c *nsCfg) neigh(dev, ip, mac string) {
	c.t.Helper()
	addr := net.ParseIP(ip)
	fam := netlink.FAMILY_V4
	if addr.To4() == nil {
		fam = netlink.FAMILY_V6
	}
	n := &netlink.Neigh{LinkIndex: c.index(dev), Family: fam, State: netlink.NUD_PERMANENT,
		IP: addr, HardwareAddr: mustMAC(c.t, mac)}
	if err := c.h.NeighSet(n); err != nil {
		c.t.Fatalf("%s: set neighbour %s on %s: %v", c.ns, ip, dev, err)
	}
}

// sysctl writes a net.* sysctl of this netns ("net.ipv4.ip_forward", "1").
func (c *nsCfg) sysctl(key, val string) {
	c.t.Helper()
	path := filepath.Join("/proc/sys", strings.ReplaceAll(key, ".", "/"))
	inNetns(c.t, c.ns, func() {
		if err := os.WriteFile(path, []byte(val), 0o644); err != nil {
			c.t.Errorf("%s: sysctl %s=%s: %v", c.ns, key, val, err)
		}
	})
}

// noBridgeNetfilter keeps br_netfilter off this netns' bridges, as on a
// switch; with it, some kernels drop IPv6 BIG TCP packets at the bridge port
// (package brnf).
func (c *nsCfg) noBridgeNetfilter() {
	c.t.Helper()
	if err := brnf.Disable("/run/netns/" + c.ns); err != nil {
		c.t.Fatal(err)
	}
}

// procNet reads /proc/net/<file> as seen from this netns (thread-self: the
// calling thread is the one switched into the netns).
func (c *nsCfg) procNet(file string) string {
	c.t.Helper()
	var out []byte
	inNetns(c.t, c.ns, func() {
		var err error
		out, err = os.ReadFile(filepath.Join("/proc/thread-self/net", file))
		if err != nil {
			c.t.Errorf("%s: read /proc/net/%s: %v", c.ns, file, err)
		}
	})
	return string(out)
}
