package podpath

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"runtime"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/axonhq/axon/internal/inetcsum"
)

// requireFibCache skips where pod_egress does not load with the route cache
// (bpf_cast_to_kern_ctx is Linux 6.3+; the 6.1 matrix VM lacks it).
func requireFibCache(t *testing.T, d *Datapath) {
	t.Helper()
	if !d.FibCacheEnabled() {
		t.Skipf("route cache not loaded on this kernel: %s", d.feats.FibCache.Reason)
	}
}

// pinnedRunner runs pod_egress through PROG_TEST_RUN on one CPU (the cache
// is per CPU) inside the fixture's netns.
type pinnedRunner struct {
	t *testing.T
	f *progFixture
}

type runResult struct {
	verdict uint32
	out     []byte
	reason  string // the one pod_egress counter that moved
}

func (r pinnedRunner) run(pkt []byte) runResult {
	r.t.Helper()
	before, err := r.f.d.MetricsByDirection()
	if err != nil {
		r.t.Fatal(err)
	}
	res := runResult{out: make([]byte, len(pkt)+256)}
	dptest.InNetns(r.t, r.f.ns, func() {
		var old, one unix.CPUSet
		if err := unix.SchedGetaffinity(0, &old); err != nil {
			r.t.Fatal(err)
		}
		one.Set(0)
		if err := unix.SchedSetaffinity(0, &one); err != nil {
			r.t.Fatal(err)
		}
		defer func() { _ = unix.SchedSetaffinity(0, &old) }()
		runtime.Gosched()
		opts := &ebpf.RunOptions{Data: pkt, DataOut: res.out, Context: dptest.SKBCtx(r.f.podIf)}
		res.verdict, err = r.f.d.podProg.Run(opts)
		res.out = opts.DataOut
	})
	if err != nil {
		r.t.Fatalf("prog run: %v", err)
	}
	after, err := r.f.d.MetricsByDirection()
	if err != nil {
		r.t.Fatal(err)
	}
	for name, v := range after["pod_egress"] {
		if d := v - before["pod_egress"][name]; d == 1 && res.reason == "" {
			res.reason = name
		} else if d != 0 {
			r.t.Errorf("counter pod_egress/%s moved by %d", name, d)
		}
	}
	return res
}

// cachedRoutes returns the cache's routes that keep says yes to.
func cachedRoutes(t *testing.T, d *Datapath, keep func(FibRoute) bool) []FibRoute {
	t.Helper()
	all, err := d.FibCache()
	if err != nil {
		t.Fatal(err)
	}
	var out []FibRoute
	for _, r := range all {
		if keep(r) {
			out = append(out, r)
		}
	}
	return out
}

// TestFibCacheRoutes runs pod_egress against the fixture netns' real FIB:
// a route is looked up once and then served from the cache (the kernel
// fills the MACs: bpf_redirect_neigh), and every change the kernel makes to
// its route generation (route replaced, forwarding off) is seen on the
// next packet. A packet over the route's MTU is not served from the cache.
func TestFibCacheRoutes(t *testing.T) {
	f := newProgFixture(t)
	requireFibCache(t, f.d)
	r := pinnedRunner{t: t, f: f}
	src, dst := netip.MustParseAddr("10.244.1.7"), netip.MustParseAddr("10.244.2.9")
	pkt := dptest.IPv4Packet(f.hostMAC, f.podMAC, src, dst, 64, nil)
	viaGW := dptest.Forwarded(pkt, f.gwMAC, f.upMAC)      // looked up: MACs from the FIB's neighbour
	ttlOnly := dptest.Forwarded(pkt, f.hostMAC, f.podMAC) // from the cache: TTL-1, MACs left to the kernel
	c := dptest.NSConf(t, f.ns)
	gw13MAC := dptest.MustMAC(t, "02:00:00:00:00:13")
	via13 := dptest.Forwarded(pkt, gw13MAC, f.upMAC)

	steps := []struct {
		desc    string
		change  func()
		verdict uint32
		reason  string
		want    []byte
		nh      string // cached next hop afterwards ("" = no entry)
	}{
		{desc: "first packet: looked up (fib MACs), cached", verdict: dptest.TCActRedirect, reason: "redirect_fib", want: viaGW, nh: "198.18.0.12"},
		{desc: "second packet: from the cache", verdict: dptest.TCActRedirect, reason: "redirect_fib", want: ttlOnly, nh: "198.18.0.12"},
		{desc: "third packet: still cached", verdict: dptest.TCActRedirect, reason: "redirect_fib", want: ttlOnly, nh: "198.18.0.12"},
		{desc: "route replaced by one via .13 (no neighbour): looked up again, NO_NEIGH",
			change: func() {
				rt := &netlink.Route{Dst: dptest.IPNet(t, "10.244.2.0/24"), Gw: net.ParseIP("198.18.0.13"), LinkIndex: f.upIf}
				if err := c.H.RouteReplace(rt); err != nil {
					t.Fatal(err)
				}
			},
			verdict: dptest.TCActRedirect, reason: "redirect_neigh", want: ttlOnly, nh: "198.18.0.13"},
		{desc: "NO_NEIGH route: its MTU is unknown, so a non-GSO packet is looked up again",
			verdict: dptest.TCActRedirect, reason: "redirect_neigh", want: ttlOnly, nh: "198.18.0.13"},
		{desc: "neighbour .13 known (no route change): looked up, SUCCESS, cached with the MTU",
			change:  func() { c.Neigh("eth0", "198.18.0.13", gw13MAC.String()) },
			verdict: dptest.TCActRedirect, reason: "redirect_fib", want: via13, nh: "198.18.0.13"},
		{desc: "new route from the cache", verdict: dptest.TCActRedirect, reason: "redirect_fib", want: ttlOnly, nh: "198.18.0.13"},
		{desc: "forwarding off: the lookup refuses, the stack decides",
			change:  func() { c.Sysctl("net.ipv4.conf.all.forwarding", "0") },
			verdict: dptest.TCActOK, reason: "pass_no_route", want: pkt, nh: "198.18.0.13"},
		{desc: "forwarding on, route back via .12: looked up again",
			change: func() {
				c.Sysctl("net.ipv4.conf.all.forwarding", "1")
				rt := &netlink.Route{Dst: dptest.IPNet(t, "10.244.2.0/24"), Gw: net.ParseIP("198.18.0.12"), LinkIndex: f.upIf}
				if err := c.H.RouteReplace(rt); err != nil {
					t.Fatal(err)
				}
			},
			verdict: dptest.TCActRedirect, reason: "redirect_fib", want: viaGW, nh: "198.18.0.12"},
	}
	var genids []uint32
	for _, s := range steps {
		if s.change != nil {
			s.change()
		}
		got := r.run(pkt)
		if got.verdict != s.verdict || got.reason != s.reason {
			t.Errorf("%s: verdict %d reason %q, want %d %q", s.desc, got.verdict, got.reason, s.verdict, s.reason)
		}
		if !bytes.Equal(got.out, s.want) {
			t.Errorf("%s: output frame\n got %x\nwant %x", s.desc, got.out, s.want)
		}
		rs := cachedRoutes(t, f.d, func(r FibRoute) bool { return r.Dst == dst && r.CPU == 0 })
		if len(rs) != 1 || rs[0].NextHop.String() != s.nh || rs[0].OutIfIndex != f.upIf ||
			rs[0].Src != src || rs[0].InIfIndex != f.podIf || rs[0].Proto != unix.IPPROTO_UDP {
			t.Errorf("%s: cached %+v, want one route via %s out of ifindex %d", s.desc, rs, s.nh, f.upIf)
			continue
		}
		genids = append(genids, rs[0].Genid)
	}
	if len(genids) == len(steps) && (genids[0] != genids[2] || genids[2] == genids[3] || genids[3] != genids[6] || genids[6] == genids[8]) {
		t.Errorf("route generations per step %v: want equal while no route changed (a neighbour is not a route), different after each route change", genids)
	}

	// A non-GSO packet over the egress MTU (1500) is looked up, and the
	// lookup says FRAG_NEEDED (the stack sends the ICMP), cached or not.
	big := oversizedIPv4(pkt, 1600)
	if got := r.run(big); got.verdict != dptest.TCActOK || got.reason != "pass_no_route" {
		t.Errorf("1600-byte packet on a cached 1500-MTU route: verdict %d reason %q, want %d pass_no_route",
			got.verdict, got.reason, dptest.TCActOK)
	}
	if got := r.run(pkt); got.reason != "redirect_fib" || !bytes.Equal(got.out, ttlOnly) {
		t.Errorf("after the oversized packet: reason %q, cached path %v", got.reason, bytes.Equal(got.out, ttlOnly))
	}
}

// TestFibCacheOff: with NoFibCache the program looks up every packet (the
// FIB's MACs on each), the decision says so and no route is cached.
func TestFibCacheOff(t *testing.T) {
	f := newProgFixtureWith(t, func(c *Config) { c.NoFibCache = true })
	r := pinnedRunner{t: t, f: f}
	pkt := dptest.IPv4Packet(f.hostMAC, f.podMAC, netip.MustParseAddr("10.244.1.7"), netip.MustParseAddr("10.244.2.9"), 64, nil)
	want := dptest.Forwarded(pkt, f.gwMAC, f.upMAC)
	for i := 0; i < 3; i++ {
		if got := r.run(pkt); got.reason != "redirect_fib" || !bytes.Equal(got.out, want) {
			t.Errorf("packet %d: reason %q, output %x, want redirect_fib with the FIB's MACs %x", i, got.reason, got.out, want)
		}
	}
	var dec string
	for _, d := range f.d.decisions {
		if d.Name == "fib_cache" {
			dec = d.Value + ": " + d.Reason
		}
	}
	if dec == "" || dec[:4] != "off:" {
		t.Errorf("fib_cache decision %q, want off", dec)
	}
	if rs, err := f.d.FibCache(); err != nil || len(rs) != 0 {
		t.Errorf("FibCache() = %v, %v; want nothing", rs, err)
	}
}

// oversizedIPv4 pads an IPv4 frame to an IP total length of n, with a valid
// header checksum.
func oversizedIPv4(frame []byte, n int) []byte {
	out := append(append([]byte(nil), frame...), make([]byte, n-(len(frame)-14))...)
	binary.BigEndian.PutUint16(out[14+2:], uint16(n))
	out[14+10], out[14+11] = 0, 0
	binary.BigEndian.PutUint16(out[14+10:], inetcsum.Checksum(out[14:14+20], 0))
	return out
}

// TestTrafficFibCache: real UDP echoes from a pod to a host on the wire go
// through the route cache, and the cache follows the kernel: a blackhole
// route stops them at once (the route cached before it is not used),
// removing it lets them through, and a new MAC for the destination (a
// neighbour change, no route change) is used on the next packet, because the
// cache holds routes, not MACs.
//
// The cache is per CPU, so every check is made on the CPU the echoes ran
// on. The client sends from one CPU (dptest.PinOneCPU): a veth queues a packet on
// the backlog of the CPU that sent it, and axon_pod_egress runs there; the
// program's per-CPU counters confirm it for every batch, and no other CPU
// may hold a route of the flow. Unpinned, batches may run on different
// CPUs: a CPU's entry filled before the blackhole stays there, stale (two
// route generations old), until a packet runs on that CPU again, finds it
// stale, is looked up and refills it under the current generation, as it
// must. Comparing entries of different CPUs then takes that refill for a
// generation change the neighbour change caused, and a blackhole batch on a
// CPU without an entry does not test the cache at all.
func TestTrafficFibCache(t *testing.T) {
	dptest.RequireRoot(t)
	node, ext := newTrafficNode(t)
	a := addPod(t, node, "lxcA", "10.244.1.2", "fd00:10:244:1::2")
	d := loadWithPods(t, node, a)
	requireFibCache(t, d)
	wire := netip.MustParseAddr("198.18.0.250")
	nc := dptest.NSConf(t, node)
	eth0, podIf := nc.Index("eth0"), nc.Index(a.hostIf)
	cpu, err := dptest.FirstCPU()
	if err != nil {
		t.Fatal(err)
	}
	const n = 5

	// echo sends k echoes from the pod to the wire from CPU cpu, checks
	// that axon_pod_egress handled all k on that CPU (counted under one of
	// reasons) and returns how many came back and the route CPU cpu has
	// cached for the flow afterwards.
	echo := func(step string, k int, reasons ...string) (int, FibRoute) {
		t.Helper()
		before := podEgressByCPU(t, d, reasons...)
		var got int
		done := make(chan struct{})
		go func() {
			defer close(done)
			if err := dptest.PinOneCPU(cpu); err != nil {
				t.Error(err)
				return
			}
			got = dptest.UDPEcho(t, a.ns, ext, wire, k)
		}()
		<-done
		after := podEgressByCPU(t, d, reasons...)
		for c := range after {
			want := uint64(0)
			if c == cpu {
				want = uint64(k)
			}
			if moved := after[c] - before[c]; moved != want {
				t.Errorf("%s: axon_pod_egress counted %d packets as %v on CPU %d, want %d (all %d on CPU %d, where the client runs)",
					step, moved, reasons, c, want, k, cpu)
			}
		}
		var mine FibRoute
		rs := cachedRoutes(t, d, func(r FibRoute) bool { return r.Dst == wire && r.Src == a.ip4 })
		for _, r := range rs {
			if r.CPU != cpu {
				t.Fatalf("%s: a route of the flow is cached on CPU %d, where no packet of it ran: %+v", step, r.CPU, rs)
			}
			mine = r
		}
		if len(rs) != 1 || mine.NextHop != wire || mine.OutIfIndex != eth0 || mine.InIfIndex != podIf {
			t.Fatalf("%s: cached routes %+v, want one on CPU %d, from ifindex %d on-link to %s via eth0 (ifindex %d)", step, rs, cpu, podIf, wire, eth0)
		}
		return got, mine
	}

	got, warm := echo("pod -> wire", n, "redirect_fib", "redirect_neigh")
	if got != n {
		t.Fatalf("pod -> wire: %d of %d echoes came back", got, n)
	}

	blackhole := &netlink.Route{Dst: dptest.IPNet(t, "198.18.0.250/32"), Type: unix.RTN_BLACKHOLE}
	if err := nc.H.RouteAdd(blackhole); err != nil {
		t.Fatal(err)
	}
	got, kept := echo("blackhole route", 3, "pass_no_route")
	if got != 0 {
		t.Errorf("blackhole route to %s: %d of 3 echoes came back, want 0 (a stale cached route was used)", wire, got)
	}
	if kept != warm {
		t.Errorf("blackhole route: cached %+v, want the route from before it left as it was %+v (a blackhole is not cached)", kept, warm)
	}
	if err := nc.H.RouteDel(blackhole); err != nil {
		t.Fatal(err)
	}
	got, fresh := echo("blackhole removed", n, "redirect_fib")
	if got != n {
		t.Errorf("blackhole removed: %d of %d echoes came back", got, n)
	}
	if fresh.Genid == warm.Genid {
		t.Errorf("blackhole added and removed: cached route generation still %d, want a new one (looked up again)", fresh.Genid)
	}

	newMAC := "02:00:00:00:aa:50"
	ec := dptest.NSConf(t, ext)
	if err := ec.H.LinkSetHardwareAddr(ec.Link("wire"), dptest.MustMAC(t, newMAC)); err != nil {
		t.Fatal(err)
	}
	nc.Neigh("eth0", wire.String(), newMAC)
	got, after := echo("destination MAC changed", n, "redirect_fib")
	if got != n {
		t.Errorf("destination MAC changed to %s: %d of %d echoes came back", newMAC, got, n)
	}
	if after != fresh {
		t.Errorf("route cached on CPU %d before %+v and after the neighbour change %+v: want the same (the echoes were served from the cache: a neighbour is not a route)", cpu, fresh, after)
	}
}

// podEgressByCPU returns, per CPU, how many packets axon_pod_egress has
// counted under any of reasons.
func podEgressByCPU(t *testing.T, d *Datapath, reasons ...string) []uint64 {
	t.Helper()
	m, err := readMetricsPerCPU(d.metrics)
	if err != nil {
		t.Fatal(err)
	}
	var out []uint64
	for _, r := range reasons {
		perCPU, ok := m["pod_egress"][r]
		if !ok {
			t.Fatalf("no pod_egress counter %q", r)
		}
		for c, v := range perCPU {
			if c >= len(out) {
				out = append(out, make([]uint64, c+1-len(out))...)
			}
			out[c] += v
		}
	}
	return out
}
