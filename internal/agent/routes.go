package agent

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Route is one podCIDR route to another node: Dst via Gw dev LinkIndex.
type Route struct {
	Dst       netip.Prefix
	Gw        netip.Addr
	LinkIndex int
	Node      string // owner Node, informational (not compared)
}

func (r Route) String() string {
	return fmt.Sprintf("%s via %s dev #%d", r.Dst, r.Gw, r.LinkIndex)
}

func (r Route) same(o Route) bool {
	return r.Dst == o.Dst && r.Gw == o.Gw && r.LinkIndex == o.LinkIndex
}

// RoutePlan is what it takes to turn the current routes into the desired ones.
type RoutePlan struct {
	Add     []Route // missing
	Replace []Route // present with another gateway or device
	Delete  []Route // ours but no longer desired
}

// Empty reports whether the plan changes nothing.
func (p RoutePlan) Empty() bool { return len(p.Add)+len(p.Replace)+len(p.Delete) == 0 }

// DiffRoutes compares desired and current routes by destination. Current
// routes must be the agent's own (protocol RouteProtocol) only.
func DiffRoutes(desired, current []Route) RoutePlan {
	var plan RoutePlan
	cur := make(map[netip.Prefix]Route, len(current))
	for _, r := range current {
		if _, dup := cur[r.Dst]; dup {
			plan.Delete = append(plan.Delete, r) // a second route to the same dst: drop it
			continue
		}
		cur[r.Dst] = r
	}
	want := make(map[netip.Prefix]bool, len(desired))
	for _, d := range desired {
		want[d.Dst] = true
		c, ok := cur[d.Dst]
		switch {
		case !ok:
			plan.Add = append(plan.Add, d)
		case !c.same(d):
			plan.Replace = append(plan.Replace, d)
		}
	}
	for _, c := range current {
		if !want[c.Dst] && !slices.ContainsFunc(plan.Delete, c.same) {
			plan.Delete = append(plan.Delete, c)
		}
	}
	for _, s := range [][]Route{plan.Add, plan.Replace, plan.Delete} {
		slices.SortFunc(s, func(a, b Route) int { return cmp.Compare(a.Dst.String(), b.Dst.String()) })
	}
	return plan
}

// NodeInfo is the part of a Node the agent uses.
type NodeInfo struct {
	Name        string
	InternalIPs []netip.Addr
	PodCIDRs    []netip.Prefix
}

// DesiredRoutes computes the podCIDR routes to every other node. A v4 CIDR
// goes via the node's v4 InternalIP, a v6 CIDR via its v6 InternalIP. CIDRs
// without a gateway of their family, overlapping our own podCIDRs, or already
// claimed by another node are skipped and reported as problems.
func DesiredRoutes(self string, own []netip.Prefix, nodes []NodeInfo, linkIndex int) (routes []Route, problems []string) {
	nodes = slices.Clone(nodes)
	slices.SortFunc(nodes, func(a, b NodeInfo) int { return cmp.Compare(a.Name, b.Name) })
	claimed := map[netip.Prefix]string{}
	for _, n := range nodes {
		if n.Name == self {
			continue
		}
		for _, cidr := range n.PodCIDRs {
			gw, ok := firstOfFamily(n.InternalIPs, cidr.Addr().Is4())
			if !ok {
				problems = append(problems, fmt.Sprintf("node %s: no %s InternalIP for podCIDR %s: route skipped", n.Name, family(cidr.Addr()), cidr))
				continue
			}
			if slices.ContainsFunc(own, cidr.Overlaps) {
				problems = append(problems, fmt.Sprintf("node %s: podCIDR %s overlaps this node's podCIDRs: route skipped", n.Name, cidr))
				continue
			}
			if other, ok := claimed[cidr]; ok {
				problems = append(problems, fmt.Sprintf("node %s: podCIDR %s is also claimed by node %s: route skipped", n.Name, cidr, other))
				continue
			}
			claimed[cidr] = n.Name
			routes = append(routes, Route{Dst: cidr, Gw: gw, LinkIndex: linkIndex, Node: n.Name})
		}
	}
	return routes, problems
}

func firstOfFamily(addrs []netip.Addr, v4 bool) (netip.Addr, bool) {
	for _, a := range addrs {
		if a.Unmap().Is4() == v4 {
			return a.Unmap(), true
		}
	}
	return netip.Addr{}, false
}

func family(a netip.Addr) string {
	if a.Is4() {
		return "IPv4"
	}
	return "IPv6"
}

// routeTable is the routes feature: the agent's podCIDR routes to the
// other nodes in the main table of the current netns, and what status
// reports of them. Only the reconcile writes routes (sync), so the writes
// need no lock; mu guards the fields below it and is a leaf.
type routeTable struct {
	h   *netlink.Handle
	log *slog.Logger

	mu       sync.Mutex
	count    int      // routes desired by the last sync
	problems []string // problems with other Nodes (skipped routes), logged when they change
}

// sync programs the routes to the podCIDRs of every node but self (own:
// self's podCIDRs) via linkIndex and records them with problems, what was
// already found wrong with the Nodes.
func (t *routeTable) sync(self string, own []netip.Prefix, nodes []NodeInfo, linkIndex int, problems []string) error {
	desired, rproblems := DesiredRoutes(self, own, nodes, linkIndex)
	problems = append(problems, rproblems...)
	current, err := t.Current()
	if err != nil {
		return err
	}
	rerr := t.Apply(DiffRoutes(desired, current))
	t.mu.Lock()
	defer t.mu.Unlock()
	if !slices.Equal(problems, t.problems) {
		for _, p := range problems {
			t.log.Warn(p)
		}
	}
	t.problems = problems
	t.count = len(desired)
	return rerr
}

// routes returns how many routes the last sync programmed.
func (t *routeTable) routes() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.count
}

// Current lists the routes with protocol RouteProtocol in the main table.
func (t *routeTable) Current() ([]Route, error) {
	var out []Route
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rs, err := t.h.RouteListFiltered(fam, &netlink.Route{Protocol: RouteProtocol, Table: unix.RT_TABLE_MAIN},
			netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
		if err != nil {
			return nil, fmt.Errorf("list axon routes: %w", err)
		}
		for _, r := range rs {
			if r.Dst == nil {
				continue
			}
			dst, ok := prefixFromIPNet(r.Dst)
			if !ok {
				continue
			}
			gw, _ := netip.AddrFromSlice(r.Gw)
			out = append(out, Route{Dst: dst, Gw: gw.Unmap(), LinkIndex: r.LinkIndex})
		}
	}
	return out, nil
}

// Apply executes a plan; it goes on after a failed route and returns all errors.
func (t *routeTable) Apply(p RoutePlan) error {
	var errs []error
	for _, r := range p.Delete {
		if err := t.h.RouteDel(t.nl(r)); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("delete route %s: %w", r, err))
			continue
		}
		t.log.Info("route deleted", "dst", r.Dst, "via", r.Gw)
	}
	for _, r := range slices.Concat(p.Add, p.Replace) {
		if err := t.h.RouteReplace(t.nl(r)); err != nil {
			errs = append(errs, fmt.Errorf("replace route %s (node %s): %w", r, r.Node, err))
			continue
		}
		t.log.Info("route programmed", "dst", r.Dst, "via", r.Gw, "node", r.Node)
	}
	return errors.Join(errs...)
}

func (t *routeTable) nl(r Route) *netlink.Route {
	return &netlink.Route{
		Dst:       &net.IPNet{IP: r.Dst.Addr().AsSlice(), Mask: net.CIDRMask(r.Dst.Bits(), r.Dst.Addr().BitLen())},
		Gw:        r.Gw.AsSlice(),
		LinkIndex: r.LinkIndex,
		Protocol:  RouteProtocol,
		Table:     unix.RT_TABLE_MAIN,
	}
}

func prefixFromIPNet(n *net.IPNet) (netip.Prefix, bool) {
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones).Masked(), true
}
