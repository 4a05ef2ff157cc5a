package fuzz

import (
	"fmt"

	"github.com/cilium/ebpf"
	"net"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/axonhq/axon/internal/cni"
	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/datapath/bandwidth"
	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/axonhq/axon/internal/datapath/nodeport"
	"github.com/axonhq/axon/internal/datapath/podlb"
	"github.com/axonhq/axon/internal/datapath/podpath"
	"github.com/axonhq/axon/internal/datapath/socklb"
	"github.com/axonhq/axon/internal/lb"
	"github.com/axonhq/axon/internal/maglev"
	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/testutil"
)

// The node every program runs on: one network namespace holding what the
// agent sets up (an uplink with its addresses, neighbours and routes to the
// other nodes' podCIDRs, two local pods on veth devices) and the three
// loaders of the uplink and pod programs (podpath, bandwidth, nodeport)
// sharing one pin dir, as the agent with BPF host routing loads them. The
// maps are filled through the loaders: endpoints, bandwidth limits,
// Services; conntrack entries come from real packets (seed flows).

// Addresses of the node and its neighbours.
var (
	node4, node6       = netip.MustParseAddr("198.18.0.11"), netip.MustParseAddr("fd00:198:18::11")
	node2v4, node2v6   = netip.MustParseAddr("198.18.0.12"), netip.MustParseAddr("fd00:198:18::12")
	client4, client6   = netip.MustParseAddr("198.18.0.250"), netip.MustParseAddr("fd00:198:18::250")
	router4, router6   = netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("fd00:198:18::1")
	podA4, podA6       = netip.MustParseAddr("10.244.1.5"), netip.MustParseAddr("fd00:10:244:1::5")
	podB4, podB6       = netip.MustParseAddr("10.244.1.6"), netip.MustParseAddr("fd00:10:244:1::6")
	remote4, remote6   = netip.MustParseAddr("10.244.2.5"), netip.MustParseAddr("fd00:10:244:2::5")
	noNeigh4, unreach4 = netip.MustParseAddr("10.244.3.9"), netip.MustParseAddr("10.244.9.9")
	vip4, vip6         = netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("2001:db8::10")
	extIP4             = netip.MustParseAddr("203.0.113.5")
)

// Service ports.
const (
	npTCP   = 30080 // NodePort TCP: Maglev, a local and a remote backend
	npUDP   = 30053 // NodePort UDP: a remote backend
	npLocal = 30090 // NodePort TCP, externalTrafficPolicy Local: only a remote backend (dropped)
	npEmpty = 30099 // NodePort TCP without endpoints
	npAway  = 30070 // NodePort TCP: backends without a route or a neighbour
	vipPort = 80    // LoadBalancer IP, DSR: a local and a remote backend
	extPort = 443   // externalIP with source ranges and session affinity, the NodePort's backends
)

type node struct {
	ns, pin               string
	upIf, podAIf, podBIf  int
	upMAC, gwMAC, cliMAC  net.HardwareAddr
	podAMAC, hostAMAC     net.HardwareAddr
	podBMAC, hostBMAC     net.HardwareAddr
	dp                    *podpath.Datapath
	bw                    *bandwidth.Manager
	lb                    *nodeport.LB
	sock                  *socklb.LB
	plb                   *podlb.LB
	plbEgress, plbReplies *ebpf.Program
	horizon               time.Duration
	frontends             []lb.Frontend // as read back after writing
	endpoints             []podpath.Endpoint
	checked               invStats
}

// invStats: what the map invariants looked at, summed over their runs.
type invStats struct {
	runs, snat, local, nat int
}

func mac(t testing.TB, s string) net.HardwareAddr { return dptest.MustMAC(t, s) }

func newNode(t testing.TB) *node {
	t.Helper()
	dptest.RequireRoot(t)
	n := &node{
		gwMAC: mac(t, "02:00:00:00:00:12"), cliMAC: mac(t, "02:00:00:00:00:fa"),
		podAMAC: mac(t, "02:00:00:00:01:05"), hostAMAC: mac(t, "02:00:00:00:02:05"),
		podBMAC: mac(t, "02:00:00:00:01:06"), hostBMAC: mac(t, "02:00:00:00:02:06"),
		horizon: 2 * time.Second, // the agent's default (DefaultBandwidthHorizon)
	}
	n.ns = dptest.NewNetns(t, "fuzz")
	c := dptest.NSConf(t, n.ns)
	c.Veth("eth0", "", "wire", "", "")
	c.Veth("lxcA", n.hostAMAC.String(), "podA", n.podAMAC.String(), "")
	c.Veth("lxcB", n.hostBMAC.String(), "podB", n.podBMAC.String(), "")
	c.Up("eth0", "wire", "lxcA", "podA", "lxcB", "podB")
	c.Addr("eth0", "198.18.0.11/24")
	c.Addr("eth0", "fd00:198:18::11/64")
	for _, a := range []string{"198.18.0.12", "fd00:198:18::12"} {
		c.Neigh("eth0", a, n.gwMAC.String())
	}
	for _, a := range []string{"198.18.0.250", "fd00:198:18::250", "198.18.0.1", "fd00:198:18::1"} {
		c.Neigh("eth0", a, n.cliMAC.String())
	}
	c.Route("10.244.2.0/24", "198.18.0.12", "eth0")
	c.Route("fd00:10:244:2::/64", "fd00:198:18::12", "eth0")
	c.Route("10.244.3.0/24", "198.18.0.13", "eth0") // no neighbour
	c.Route("10.244.9.0/24", "", "")                // unreachable
	c.Sysctl("net.ipv4.ip_forward", "1")
	c.Sysctl("net.ipv6.conf.all.forwarding", "1")
	n.upIf, n.upMAC = c.Index("eth0"), c.Link("eth0").Attrs().HardwareAddr
	n.podAIf, n.podBIf = c.Index("lxcA"), c.Index("lxcB")
	n.pin = dptest.NewPinDir(t, datapath.BPFFSRoot, datapath.EnsureBPFFS, func(dir string) error {
		// in the node's netns: Uninstall looks devices up by name
		return netnsutil.Do(n.ns, func() error { return uninstallAll(n, dir) })
	})
	dptest.InNetns(t, n.ns, func() { n.load(t) })
	return n
}

func uninstallAll(n *node, dir string) error {
	var errs []string
	if n.lb != nil {
		n.lb.Close()
	}
	if n.bw != nil {
		n.bw.Close()
	}
	if n.dp != nil {
		n.dp.Close()
	}
	if err := nodeport.Uninstall(dir); err != nil {
		errs = append(errs, err.Error())
	}
	if err := podpath.Uninstall(dir); err != nil {
		errs = append(errs, err.Error())
	}
	if len(errs) > 0 {
		return fmt.Errorf("uninstall %s: %s", dir, strings.Join(errs, "; "))
	}
	return nil
}

// load runs the loaders in the node's netns, as the agent does.
func (n *node) load(t testing.TB) {
	t.Helper()
	log := dptest.Logger(t)
	dp, err := podpath.Load(podpath.Config{PinDir: n.pin, Uplink: "eth0", Logger: log, GatewayV4: cni.GatewayV4})
	if err != nil {
		t.Fatal(err)
	}
	n.dp = dp
	if dp.Program(podpath.ProgPodEgress) == nil {
		t.Fatalf("host routing is %s on this kernel: no pod programs to fuzz (%v)", dp.HostRouting(), dp.Decisions())
	}
	n.endpoints = []podpath.Endpoint{
		{IP: podA4, IfIndex: n.podAIf, PodMAC: n.podAMAC, HostMAC: n.hostAMAC},
		{IP: podA6, IfIndex: n.podAIf, PodMAC: n.podAMAC, HostMAC: n.hostAMAC},
		{IP: podB4, IfIndex: n.podBIf, PodMAC: n.podBMAC, HostMAC: n.hostBMAC},
		{IP: podB6, IfIndex: n.podBIf, PodMAC: n.podBMAC, HostMAC: n.hostBMAC},
	}
	for _, ep := range n.endpoints {
		if err := dp.UpsertEndpoint(ep); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"lxcA", "lxcB"} {
		if err := dp.AttachPod(name); err != nil {
			t.Fatal(err)
		}
	}
	bw, err := bandwidth.Load(bandwidth.Config{PinDir: n.pin, Uplink: "eth0", Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	n.bw = bw
	// pod A: 10 Mbit/s out (its packets are paced and, beyond the horizon,
	// dropped), 100 kbit/s in (its 128 KiB bucket empties within a pass);
	// pod B: 1 Gbit/s out
	if err := bw.Apply([]bandwidth.Limit{
		{Addrs: []netip.Addr{podA4, podA6}, EgressBits: 10e6, IngressBits: 100e3},
		{Addrs: []netip.Addr{podB4, podB6}, EgressBits: 1e9},
	}, n.horizon); err != nil {
		t.Fatal(err)
	}
	l, err := nodeport.Load(nodeport.Options{
		PinDir: n.pin, NodeName: "node1", NodeAddrs: []netip.Addr{node4, node6},
		DeliverPods: true, UplinkMTU: 1500, MaglevTableSize: maglev.MinSize,
		// small tables and a pool of 128 SNAT ports fill up between two
		// GCs: the full-table and no-port paths run too
		CTMax: 16384, NATMax: 16384, AffinityMax: 1024, FragMax: 256,
		SNATPortMin: 1024, SNATPortMax: 1151,
		Logger: log,
	})
	if err != nil {
		t.Fatal(err)
	}
	n.lb = l
	if err := l.SetPodCIDRs([]netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:10:244:1::/64")}); err != nil {
		t.Fatal(err)
	}
	var cluster []netip.Prefix
	for _, s := range []string{"10.244.0.0/16", "fd00:10:244::/48", "198.18.0.11/32", "198.18.0.12/32", "fd00:198:18::11/128", "fd00:198:18::12/128"} {
		cluster = append(cluster, netip.MustParsePrefix(s))
	}
	if err := l.SetClusterPrefixes(cluster); err != nil {
		t.Fatal(err)
	}
	for _, fo := range n.services(t) {
		if err := l.UpsertFrontendWith(fo.fe, fo.opts); err != nil {
			t.Fatalf("frontend %v: %v", fo.fe.Key, err)
		}
	}
	if n.frontends, err = l.Frontends(); err != nil {
		t.Fatal(err)
	}
	n.loadPodLB(t)
}

type frontendWith struct {
	fe   lb.Frontend
	opts nodeport.FrontendOptions
}

func be(addr string, node string) lb.Backend {
	a := netip.MustParseAddrPort(addr)
	return lb.Backend{Addr: a.Addr(), Port: a.Port(), NodeName: node}
}

// services are the node's north-south frontends, one per path of the LB.
func (n *node) services(t testing.TB) []frontendWith {
	t.Helper()
	maglevOf := func(bs []lb.Backend) []uint32 {
		var in []maglev.Backend
		for _, b := range bs {
			in = append(in, maglev.Backend{Name: netip.AddrPortFrom(b.Addr, b.Port).String(), Weight: 1})
		}
		tab, err := maglev.Build(in, maglev.Config{Size: maglev.MinSize})
		if err != nil {
			t.Fatal(err)
		}
		out := make([]uint32, len(tab))
		for i, v := range tab {
			out[i] = uint32(v)
		}
		return out
	}
	nodePort := func(port uint16, proto lb.Proto, v6 bool, bs ...lb.Backend) lb.Frontend {
		a := netip.IPv4Unspecified()
		if v6 {
			a = netip.IPv6Unspecified()
		}
		return lb.Frontend{Key: lb.FrontendKey{Addr: a, Port: port, Proto: proto, Scope: lb.ScopeNodePort}, Kind: lb.KindNodePort, Backends: bs}
	}
	ip := func(kind lb.Kind, a netip.Addr, port uint16, bs ...lb.Backend) lb.Frontend {
		return lb.Frontend{Key: lb.FrontendKey{Addr: a, Port: port, Proto: lb.TCP, Scope: lb.ScopeCluster}, Kind: kind, Backends: bs}
	}
	web4 := []lb.Backend{be("10.244.2.5:8080", "node2"), be("10.244.1.5:8080", "node1")}
	web6 := []lb.Backend{be("[fd00:10:244:2::5]:8080", "node2"), be("[fd00:10:244:1::5]:8080", "node1")}
	dsr4 := []lb.Backend{be("10.244.2.7:80", "node2"), be("10.244.1.6:80", "node1")}
	dsr6 := []lb.Backend{be("[fd00:10:244:2::7]:80", "node2"), be("[fd00:10:244:1::6]:80", "node1")}
	local := nodePort(npLocal, lb.TCP, false, be("10.244.2.8:8080", "node2"))
	local.LocalOnly = true
	ext := ip(lb.KindExternalIP, extIP4, extPort, web4...)
	ext.Affinity = 3 * time.Hour
	return []frontendWith{
		{nodePort(npTCP, lb.TCP, false, web4...), nodeport.FrontendOptions{Maglev: maglevOf(web4)}},
		{nodePort(npTCP, lb.TCP, true, web6...), nodeport.FrontendOptions{Maglev: maglevOf(web6)}},
		{nodePort(npUDP, lb.UDP, false, be("10.244.2.6:53", "node2")), nodeport.FrontendOptions{}},
		{nodePort(npUDP, lb.UDP, true, be("[fd00:10:244:2::6]:53", "node2")), nodeport.FrontendOptions{}},
		{local, nodeport.FrontendOptions{}},
		{nodePort(npEmpty, lb.TCP, false), nodeport.FrontendOptions{}},
		{nodePort(npAway, lb.TCP, false, be("10.244.9.7:80", "node9"), be("10.244.3.7:80", "node3")), nodeport.FrontendOptions{}},
		{ip(lb.KindLoadBalancer, vip4, vipPort, dsr4...), nodeport.FrontendOptions{Mode: nodeport.ModeDSR}},
		{ip(lb.KindLoadBalancer, vip6, vipPort, dsr6...), nodeport.FrontendOptions{Mode: nodeport.ModeDSR}},
		{ext, nodeport.FrontendOptions{SourceRanges: []netip.Prefix{netip.MustParsePrefix("198.18.0.0/25"), netip.MustParsePrefix("198.18.0.250/32")}}},
	}
}

// ---- counters ----

// counters reads every counter of the node: the pod programs'
// (pod.<dir>.<reason>), the LB's (lb.<hook>.<reason>), the Bandwidth
// Manager's (bw.<stat>) and the drops of each limit (bw.drops.<id>.<dir>).
func (n *node) counters() (map[string]uint64, error) {
	out := map[string]uint64{}
	pm, err := n.dp.MetricsByDirection()
	if err != nil {
		return nil, err
	}
	for dir, row := range pm {
		for r, v := range row {
			out["pod."+dir+"."+r] = v
		}
	}
	lm, err := n.lb.Metrics()
	if err != nil {
		return nil, err
	}
	for hook, row := range lm {
		for r, v := range row {
			out["lb."+hook+"."+r] = v
		}
	}
	if err := n.podLBCounters(out); err != nil {
		return nil, err
	}
	bs, err := n.bw.Stats()
	if err != nil {
		return nil, err
	}
	for k, v := range bs {
		out["bw."+k] = v
	}
	rows, err := n.bw.List()
	if err != nil {
		return nil, err
	}
	for _, r := range rows {
		out[fmt.Sprintf("bw.drops.%d.%s", r.ID, r.Dir)] = r.Drops
	}
	return out, nil
}

// counterNames lists the counters of the given prefixes ("pod.pod_egress.",
// "lb.tc.", "bw."), for the "never moved" line of the report.
func (n *node) counterNames(t testing.TB, prefixes ...string) []string {
	t.Helper()
	var out []string
	for _, r := range podpath.ReasonNames() {
		for _, d := range []string{"pod_egress", "uplink_ingress"} {
			out = append(out, "pod."+d+"."+r)
		}
	}
	for _, r := range nodeport.ReasonNames() {
		for _, h := range []string{"tc", "xdp", "egress"} {
			out = append(out, "lb."+h+"."+r)
		}
	}
	bs, err := n.bw.Stats()
	if err != nil {
		t.Fatal(err)
	}
	for k := range bs {
		out = append(out, "bw."+k)
	}
	for _, k := range podlb.CounterNames() {
		out = append(out, "podlb."+k)
	}
	var sel []string
	for _, name := range out {
		for _, p := range prefixes {
			if strings.HasPrefix(name, p) {
				sel = append(sel, name)
				break
			}
		}
	}
	return sel
}

// ---- map invariants ----

// invariants are the rules the maps keep after any packets (stated in
// docs/reliability.md, "Fuzzing"):
//  1. every CT entry of an SNAT flow has its reverse entry in axon_np_nat
//     (reply backend -> node address:SNAT port, kind snat) translating back
//     to exactly its client and frontend;
//  2. no SNAT port is owned twice: two SNAT flows of one backend
//     address:port and protocol never hold the same port;
//  3. every CT entry of a local backend has its reverse entry (reply
//     backend -> client, kind local or local-dsr) translating back to its
//     frontend, or to the frontend of another CT entry with the same reply
//     (two frontends of one local backend, one client address:port: the
//     backend itself sees one 4-tuple, the last flow wins);
//  4. the programs never write the maps the agent owns: the frontends,
//     backends and endpoints read back equal what the loaders wrote.
func (n *node) invariants() error {
	cts, err := n.lb.CT()
	if err != nil {
		return err
	}
	nats, err := n.lb.NAT()
	if err != nil {
		return err
	}
	nat := make(map[nodeport.Tuple]nodeport.NATEntry, len(nats))
	for _, e := range nats {
		nat[e.Reply] = e
	}
	type portKey struct {
		proto lb.Proto
		be    netip.AddrPort
		v6    bool
		port  uint16
	}
	n.checked.runs++
	n.checked.nat += len(nats)
	owner := map[portKey]nodeport.Tuple{}
	localBy := map[nodeport.Tuple][]nodeport.CTEntry{}
	for _, c := range cts {
		switch c.Mode {
		case "snat":
			n.checked.snat++
			snatAddr := node4
			if c.Flow.Dst.Addr().Is6() && !c.Flow.Dst.Addr().Is4In6() {
				snatAddr = node6
			}
			reply := nodeport.Tuple{Proto: c.Flow.Proto, Src: c.Backend, Dst: netip.AddrPortFrom(snatAddr, c.NATPort)}
			e, ok := nat[reply]
			if !ok {
				return fmt.Errorf("CT entry %v (snat via port %d to %v) has no reverse NAT entry %v", c.Flow, c.NATPort, c.Backend, reply)
			}
			if e.Kind != "snat" || e.NewSrc != c.Flow.Dst || e.NewDst != c.Flow.Src {
				return fmt.Errorf("CT entry %v (snat via port %d to %v): its reverse entry %v is %s %v -> %v", c.Flow, c.NATPort, c.Backend, reply, e.Kind, e.NewSrc, e.NewDst)
			}
			k := portKey{c.Flow.Proto, c.Backend, snatAddr.Is6(), c.NATPort}
			if o, dup := owner[k]; dup && o != c.Flow {
				return fmt.Errorf("SNAT port %d to %v owned twice: by %v and %v", c.NATPort, c.Backend, o, c.Flow)
			}
			owner[k] = c.Flow
		case "local":
			n.checked.local++
			reply := nodeport.Tuple{Proto: c.Flow.Proto, Src: c.Backend, Dst: c.Flow.Src}
			localBy[reply] = append(localBy[reply], c)
		}
	}
	for reply, cs := range localBy {
		e, ok := nat[reply]
		if !ok {
			return fmt.Errorf("CT entry %v (local backend %v) has no reverse NAT entry %v", cs[0].Flow, cs[0].Backend, reply)
		}
		match := false
		for _, c := range cs {
			match = match || (strings.HasPrefix(e.Kind, "local") && e.NewSrc == c.Flow.Dst && e.NewDst == c.Flow.Src)
		}
		if !match {
			return fmt.Errorf("CT entry %v (local backend %v): its reverse entry %v is %s %v -> %v", cs[0].Flow, cs[0].Backend, reply, e.Kind, e.NewSrc, e.NewDst)
		}
	}
	fes, err := n.lb.Frontends()
	if err != nil {
		return err
	}
	if !reflect.DeepEqual(fes, n.frontends) {
		return fmt.Errorf("the frontends changed under the programs:\nnow  %v\nwere %v", fes, n.frontends)
	}
	eps, err := n.dp.Endpoints()
	if err != nil {
		return err
	}
	if len(eps) != len(n.endpoints) {
		return fmt.Errorf("%d endpoints in the map, %d written", len(eps), len(n.endpoints))
	}
	return nil
}

// gc is the agent's conntrack GC with every timeout at its minimum: the
// tables are emptied of what the previous batches made, as idle flows are
// in a node's life, and the seed flows are made again.
func (n *node) gc() error {
	time.Sleep(5 * time.Millisecond) // one tick of the coarse clock: every entry is idle
	_, err := n.lb.GC(nodeport.CTTimeouts{TCP: time.Nanosecond, TCPClosing: time.Nanosecond, UDP: time.Nanosecond, SNATTimeWait: time.Nanosecond})
	return err
}

// inNetns runs fn in the node's netns and returns its error.
func (n *node) inNetns(t testing.TB, fn func() error) error {
	t.Helper()
	var err error
	testutil.InNetns(t, n.ns, func() error { err = fn(); return nil })
	return err
}
