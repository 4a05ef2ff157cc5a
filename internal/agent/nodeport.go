package agent

// The north-south load balancer (nodeport.LB) on the
// uplink. It is loaded after the tc datapath, the socket LB and the first
// Service sync (servicesFirst), attached per --lb-acceleration, and becomes
// a second lb.Writer beside the socket LB
// (teeWriter): NodePort, LoadBalancer, externalIP and HostPort frontends of
// the Service table are programmed into it. The agent also runs the
// healthCheckNodePort servers of externalTrafficPolicy=Local Services, the
// conntrack garbage collection and its metrics. A load failure never stops
// the agent: `axon status` shows decision nodeport_lb with the reason.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/datapath/nodeport"
	"github.com/axonhq/axon/internal/healthcheck"
	"github.com/axonhq/axon/internal/lb"
	"github.com/axonhq/axon/internal/maglev"
)

// DecisionNodePortLB is the name of the north-south LB decision in `axon status`.
const DecisionNodePortLB = "nodeport_lb"

// nodePort is the north-south LB feature: the loaded LB and how it is
// attached, the tee writer it shares the Service table through, the
// health-check servers, the conntrack GC and the cluster ranges it needs.
type nodePort struct {
	cfg     Config
	log     *slog.Logger
	nl      *netlink.Handle
	kube    func() *kube // the agent's kube client, nil until it is built
	svc     *serviceSync // the Service watch, nil until the agent runs it
	started time.Time    // when the agent started (servicesFirst)
	tables  maglevCache  // has its own mutex: the Service watch reads it

	// mu guards the fields below. It is held across the load, the attach
	// and the map writes of ensure (status waits for those), and it is
	// taken before the Service watch's mutex (SetWriter).
	mu        sync.Mutex
	np        *nodeport.LB
	err       string // why it is not loaded / attached
	attached  string // e.g. "xdp native on eth0", "tc (tcx) on eth0"
	uplink    string
	addrs     []netip.Addr
	primary   lb.Writer // the socket LB the tee was built with
	tee       *teeWriter
	offDone   bool
	gc        ctGCStats
	gcDeleted uint64 // CT entries removed by GC since start
	hc        *healthcheck.Server
	hcAddrs   []netip.Addr   // addresses hc listens on
	cluster   []netip.Prefix // every Node's podCIDRs and InternalIPs (SetClusterPrefixes)
	pods      []netip.Prefix // this node's podCIDRs (SetPodCIDRs)
	podsOK    bool           // pods are written in np
}

// ctGCStats is the last conntrack garbage collection pass.
type ctGCStats struct {
	At      time.Time
	Took    time.Duration
	Scanned int
	Removed int
	Used    int
	Max     int
	Err     string
}

// setClusterPrefixes records the cluster's own address ranges (every
// Node's podCIDRs and InternalIPs) for the north-south LB, which serves
// clients inside them by SNAT even for DSR frontends, and this node's
// podCIDRs, whose TCP/UDP traffic it hands on without looking it up; it
// writes both when the LB is loaded. Called by the Node reconciliation.
func (n *nodePort) setClusterPrefixes(nodes []NodeInfo) {
	var ps, own []netip.Prefix
	for _, ni := range nodes {
		ps = append(ps, ni.PodCIDRs...)
		for _, ip := range ni.InternalIPs {
			ps = append(ps, netip.PrefixFrom(ip, ip.BitLen()))
		}
		if ni.Name == n.cfg.NodeName {
			own = ni.PodCIDRs
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	podsChanged := !n.podsOK || !slices.Equal(own, n.pods)
	n.cluster, n.pods = ps, own
	if n.np == nil {
		return
	}
	n.writeClusterPrefixesLocked()
	if podsChanged { // every Node event lands here; the podCIDRs rarely change
		n.writePodCIDRsLocked()
	}
}

// writeClusterPrefixesLocked writes the recorded cluster ranges into the
// loaded LB.
func (n *nodePort) writeClusterPrefixesLocked() {
	if err := n.np.SetClusterPrefixes(n.cluster); err != nil {
		n.log.Warn("nodeport LB: cluster address ranges not written; in-cluster clients of DSR frontends may get DSR", "error", err)
	}
}

// writePodCIDRsLocked writes the recorded podCIDRs into the loaded LB
// (which warns once per write about frontends inside them).
func (n *nodePort) writePodCIDRsLocked() {
	err := n.np.SetPodCIDRs(n.pods)
	if err != nil {
		n.log.Warn("nodeport LB: podCIDRs not written; pod traffic is looked up like any other (slower, same result)", "error", err)
	}
	n.podsOK = err == nil // a failed write is tried again at the next Node event
}

// ensure loads and attaches the north-south LB on uplink once the tc
// datapath is up, keeps its node addresses current and installs the tee
// writer over primary, the loaded socket LB (nil: none), again when that
// changes. deliverPods: the pod datapath routes pods by BPF
// (podsRoutedByBPF). Called by the reconcile; never fails the pass.
func (n *nodePort) ensure(uplink string, primary lb.Writer, deliverPods bool) {
	c := n.cfg.NodePortLB
	n.mu.Lock()
	defer n.mu.Unlock()
	if !c.Enabled {
		if !n.offDone {
			n.offDone = true
			if err := nodeport.Uninstall(n.cfg.BPFRoot); err != nil {
				n.log.Warn("--nodeport=false: could not remove the north-south LB of a previous run", "error", err)
			}
		}
		return
	}
	addrs, err := nodeLocalAddrs(n.nl)
	if err != nil {
		n.log.Warn("nodeport LB: list node addresses", "error", err)
		return
	}
	if n.np == nil && n.servicesFirst() {
		return // a reconcile pass is kicked when the first Service sync is done
	}
	if n.np == nil {
		snatMin, snatMax, _ := c.SNATPortRange() // validated at start
		if w := snatRangeWarning(snatMin, snatMax); w != "" {
			n.log.Warn("nodeport LB: "+w, "snatPorts", c.SNATPorts)
		}
		var mtu uint32 // DSR MSS clamp; 0 (no clamp) if the uplink is not known yet
		if l, err := n.nl.LinkByName(uplink); err == nil {
			mtu = uint32(l.Attrs().MTU)
		} else {
			n.log.Warn("nodeport LB: read the uplink MTU, DSR SYN-ACKs keep their MSS", "uplink", uplink, "error", err)
		}
		np, err := nodeport.Load(nodeport.Options{
			UplinkMTU:       mtu,
			PinDir:          n.cfg.BPFRoot,
			NodeName:        n.cfg.NodeName,
			NodeAddrs:       addrs,
			Mode:            c.Mode,
			CTMax:           uint32(c.CTMax),
			CTUnrepliedMax:  uint32(c.CTUnrepliedMax),
			NATMax:          uint32(c.NATMax),
			SNATPortMin:     snatMin,
			SNATPortMax:     snatMax,
			MaglevTableSize: uint32(c.MaglevSize),
			HashSeed:        maglev.HashSeed(c.MaglevSeed),
			DeliverPods:     deliverPods,
			NoFibCache:      !n.cfg.FibCache, // --fib-cache covers the LB's next hops too
			Logger:          n.log.With("component", "nodeport"),
		})
		if err != nil {
			n.setErrLocked(fmt.Sprintf("load failed, NodePort/LoadBalancer/externalIP traffic is not translated: %v", err))
			return
		}
		np.SetFrontendOptions(n.frontendOptions)
		n.np = np
		n.writeClusterPrefixesLocked()
		n.writePodCIDRsLocked()
		n.addrs, n.err = addrs, ""
	}
	if n.attached == "" {
		how, err := attachNodePort(n.np, uplink, c.Acceleration)
		if err != nil {
			n.setErrLocked(fmt.Sprintf("attach to uplink %s failed: %v", uplink, err))
			return
		}
		n.attached, n.uplink, n.err = how, uplink, ""
		n.log.Info("nodeport LB attached", "uplink", uplink, "how", how)
	}
	if !slices.Equal(addrs, n.addrs) {
		if err := n.np.SetNodeAddrs(addrs); err != nil {
			n.log.Warn("nodeport LB: set node addresses", "error", err)
		} else {
			n.addrs = addrs
			n.log.Info("nodeport LB node addresses set", "addresses", addrs)
		}
	}
	// (Re)build the tee whenever the socket LB changed (loaded later, or not at all).
	if n.tee == nil || n.primary != primary {
		n.tee, n.primary = newTeeWriter(primary, n.np), primary
		if n.svc != nil {
			n.svc.SetWriter(n.tee)
		}
	}
}

// nodePortAfterServices bounds how long a starting agent holds the
// north-south LB back for its first Service sync (an apiserver that cannot
// be reached must not keep NodePorts untranslated).
const nodePortAfterServices = 10 * time.Second

// servicesFirst reports whether the north-south programs should wait for the
// first Service sync. A starting agent needs the CPU for both at the same
// moment: the verifier spends ~1 s on the north-south programs while the
// Service watch lists and writes every Service (10 000 × 10 in a 2-CPU lab:
// 2.9 s start → socket-LB maps with both at once). Pods' ClusterIP
// connections depend on the socket LB, and on a restart the previous run's
// north-south programs stay attached and keep forwarding meanwhile.
func (n *nodePort) servicesFirst() bool {
	return n.svc != nil && !n.svc.initialSynced() && time.Since(n.started) < nodePortAfterServices
}

// notServing says why the north-south LB does not serve the node's
// NodePort, LoadBalancer, externalIP and HostPort frontends yet, for
// readiness: "" once it is attached and holds the Service table. Also ""
// when it is off, and when it failed to load or attach: the agent serves
// everything else without it and says so in the nodeport_lb decision, and a
// readiness that never came would only stop a rollout that cannot fix it.
func (n *nodePort) notServing() string {
	if !n.cfg.NodePortLB.Enabled {
		return ""
	}
	n.mu.Lock()
	failed, attached, tee, svc := n.err != "", n.attached != "", n.tee != nil, n.svc
	n.mu.Unlock() // before the Service watch's mutex: not needed across it
	switch {
	case failed:
		return ""
	case !attached || !tee:
		return "the north-south LB is not attached yet (NodePort, LoadBalancer and externalIP traffic arriving at this node is not translated)"
	case svc != nil && !svc.northSouthWritten():
		return "the north-south LB does not hold the Service table yet"
	}
	return ""
}

func (n *nodePort) setErrLocked(msg string) {
	if n.err != msg {
		n.log.Warn("north-south load balancing not active; the agent keeps running without it", "reason", msg)
	}
	n.err = msg
}

// frontendOptions gives the datapath a frontend's Maglev table and source
// ranges (nodeport.LB.SetFrontendOptions). Called by the Service
// watch's writes, so it takes no lock but the Maglev cache's.
func (n *nodePort) frontendOptions(f lb.Frontend) nodeport.FrontendOptions {
	c := n.cfg.NodePortLB
	o := nodeport.FrontendOptions{SourceRanges: f.SourceRanges}
	alg := f.Algorithm
	if alg == lb.AlgorithmDefault {
		alg = c.Algorithm
	}
	if alg == lb.AlgorithmMaglev {
		tab, err := n.tables.get(f.Backends, c.MaglevSize, c.MaglevSeed)
		if err != nil {
			n.log.Warn("maglev table not built; the frontend picks backends at random", "frontend", f.Key.String(), "error", err)
		}
		o.Maglev = tab
	}
	return o
}

// maglevCache keeps recently built tables by backend set: a Service's
// NodePort, LoadBalancer and externalIP frontends share one, and a resync
// rebuilds nothing that did not change. Bounded: cleared at 1024 entries.
type maglevCache struct {
	mu sync.Mutex
	m  map[string][]uint32
}

func (c *maglevCache) get(bs []lb.Backend, size int, seed string) ([]uint32, error) {
	var key strings.Builder
	fmt.Fprintf(&key, "%d/%s", size, seed)
	for _, b := range bs {
		fmt.Fprintf(&key, "|%s/%d", netip.AddrPortFrom(b.Addr, b.Port), b.State)
	}
	c.mu.Lock()
	tab, ok := c.m[key.String()]
	c.mu.Unlock()
	if ok {
		return tab, nil
	}
	tab, err := maglevIndexes(bs, size, seed)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.m == nil || len(c.m) >= 1024 {
		c.m = map[string][]uint32{}
	}
	c.m[key.String()] = tab
	c.mu.Unlock()
	return tab, nil
}

// maglevIndexes builds a frontend's Maglev table over its Active backends
// (or, when none is active, its Terminating ones, as the datapath does):
// slot → index into backends. nil when no backend is eligible.
func maglevIndexes(bs []lb.Backend, size int, seed string) ([]uint32, error) {
	want := lb.Active
	if !slices.ContainsFunc(bs, func(b lb.Backend) bool { return b.State == lb.Active }) {
		want = lb.Terminating
	}
	in := make([]maglev.Backend, len(bs))
	eligible := 0
	for i, b := range bs {
		in[i] = maglev.Backend{Name: netip.AddrPortFrom(b.Addr, b.Port).String()}
		if b.State == want {
			in[i].Weight = 1
			eligible++
		}
	}
	if eligible == 0 {
		return nil, nil
	}
	tab, err := maglev.Build(in, maglev.Config{Size: size, Seed: seed})
	if err != nil {
		return nil, err
	}
	out := make([]uint32, len(tab))
	for i, v := range tab {
		out[i] = uint32(v)
	}
	return out, nil
}

// run runs the health-check servers, the annotation Events and the
// conntrack GC until ctx is done. Started by the agent's run; waits for
// the LB to be loaded.
func (n *nodePort) run(ctx context.Context) {
	if !n.cfg.NodePortLB.Enabled {
		return
	}
	hcTick := time.NewTicker(time.Second)
	defer hcTick.Stop()
	gcTick := time.NewTicker(n.cfg.NodePortLB.CTGCInterval)
	defer gcTick.Stop()
	events := map[string]bool{} // annotation problems reported as Events
	defer n.closeHealthChecks()
	for {
		select {
		case <-ctx.Done():
			return
		case <-hcTick.C:
			n.syncHealthChecks()
			n.emitAnnotationEvents(ctx, events)
		case <-gcTick.C:
			n.ctGC()
		}
	}
}

// closeHealthChecks stops the health-check servers.
func (n *nodePort) closeHealthChecks() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.hc != nil {
		n.hc.Close()
	}
}

// syncHealthChecks serves one kube-proxy-compatible /healthz per Service
// with a healthCheckNodePort, on the node addresses.
func (n *nodePort) syncHealthChecks() {
	if n.svc == nil {
		return
	}
	want := healthcheck.FromFrontends(n.svc.frontends(), n.cfg.NodeName)
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.hc != nil && !slices.Equal(n.hcAddrs, n.addrs) { // node addresses changed: listen anew
		n.hc.Close()
		n.hc = nil
	}
	if n.hc == nil {
		if len(want) == 0 {
			return
		}
		n.hc = healthcheck.New(n.addrs, n.log.With("component", "healthcheck"))
		n.hcAddrs = slices.Clone(n.addrs)
	}
	n.hc.SetHealthy(n.np != nil && n.attached != "")
	_ = n.hc.Sync(want) // failures are logged once and shown in status
}

// frontends returns the programmed table (for the health checks).
func (s *serviceSync) frontends() []lb.Frontend {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.table.Frontends()
}

// decision is the nodeport_lb line of `axon status`.
func (n *nodePort) decision() api.Decision {
	d := api.Decision{Name: DecisionNodePortLB, Value: "disabled"}
	c := n.cfg.NodePortLB
	if !c.Enabled {
		d.Reason = "--nodeport=false"
		return d
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	switch {
	case n.attached != "":
		d.Value = n.attached
		d.Reason = fmt.Sprintf("--lb-acceleration=%s, --nodeport-mode=%s, default algorithm %s", c.Acceleration, c.Mode, c.Algorithm)
		if n.gc.Max > 0 {
			d.Reason += fmt.Sprintf(", conntrack %d/%d", n.gc.Used, n.gc.Max)
		}
		if n.hc != nil {
			hs := n.hc.Statuses()
			d.Reason += fmt.Sprintf(", %d health check%s", len(hs), plural(len(hs)))
			for _, h := range hs {
				if h.Error != "" {
					d.Reason += fmt.Sprintf(" (%s: %s)", h.Service, h.Error)
				}
			}
		}
	case n.err != "":
		d.Reason = n.err
	default:
		d.Value = "pending"
		d.Reason = fmt.Sprintf("loads after the tc datapath and the first Service sync (at most %s after start)", nodePortAfterServices)
	}
	return d
}

// close releases the LB's file descriptors (pins stay).
func (n *nodePort) close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.np != nil {
		if err := n.np.Close(); err != nil {
			n.log.Warn("close nodeport LB", "error", err)
		}
		n.np = nil
	}
}

// attachNodePort attaches per --lb-acceleration and describes the result.
func attachNodePort(np *nodeport.LB, uplink, accel string) (string, error) {
	if uplink == "" {
		return "", fmt.Errorf("uplink not known yet")
	}
	how, err := np.AttachAccelerated(uplink, accel)
	if xe := (*nodeport.NativeXDPError)(nil); errors.As(err, &xe) {
		return "", fmt.Errorf("--lb-acceleration=native: %w (use best-effort to fall back to tc)", xe.Err)
	}
	return how, err
}

// ctGC removes expired conntrack entries and records the table's fullness.
func (n *nodePort) ctGC() {
	n.mu.Lock()
	np := n.np
	n.mu.Unlock()
	if np == nil {
		return
	}
	c := n.cfg.NodePortLB
	start := time.Now()
	st, err := np.GC(nodeport.CTTimeouts{TCP: c.CTTCPTimeout, TCPClosing: c.CTTCPClose, UDP: c.CTUDPTimeout,
		TCPUnreplied: c.CTTCPUnreplied, UDPUnreplied: c.CTUDPUnreplied, SNATTimeWait: c.SNATTimeWait})
	gc := ctGCStats{At: start, Took: time.Since(start), Scanned: st.CTEntries, Removed: st.CTDeleted, Used: st.CTEntries - st.CTDeleted}
	if err != nil {
		gc.Err = err.Error()
		n.log.Warn("conntrack garbage collection failed", "error", err)
	}
	if cs, err := np.CTStats(); err == nil {
		gc.Used, gc.Max = cs.Entries, int(cs.Max)
		if cs.Max > 0 && cs.Entries*10 >= int(cs.Max)*9 {
			n.log.Warn("north-south conntrack table is more than 90 % full: the least recently used flows are evicted; raise --ct-max", "entries", cs.Entries, "max", cs.Max)
		}
	}
	n.mu.Lock()
	n.gc = gc
	n.gcDeleted += uint64(st.CTDeleted)
	n.mu.Unlock()
	if st.CTDeleted > 0 || st.NATDeleted > 0 {
		n.log.Debug("conntrack gc", "ctScanned", st.CTEntries, "ctDeleted", st.CTDeleted, "natScanned", st.NATEntries, "natDeleted", st.NATDeleted)
	}
}
