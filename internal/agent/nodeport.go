package agent

// Issue 7: the north-south load balancer (nodeport.LB) on the
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
	"hash/fnv"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/datapath/nodeport"
	"github.com/axonhq/axon/internal/healthcheck"
	"github.com/axonhq/axon/internal/lb"
	"github.com/axonhq/axon/internal/maglev"
)

// DecisionNodePortLB is the name of the north-south LB decision in `axon status`.
const DecisionNodePortLB = "nodeport_lb"

// nodePort is the agent's north-south LB state. Fields are guarded by mu;
// ensureNodePort runs with dpMu held as well.
type nodePort struct {
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
	tables    maglevCache
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
// writes both when the LB is loaded. Called with dpMu held, from the Node
// reconciliation.
func (a *Agent) setClusterPrefixes(nodes []NodeInfo) {
	var ps, own []netip.Prefix
	for _, ni := range nodes {
		ps = append(ps, ni.PodCIDRs...)
		for _, ip := range ni.InternalIPs {
			ps = append(ps, netip.PrefixFrom(ip, ip.BitLen()))
		}
		if ni.Name == a.cfg.NodeName {
			own = ni.PodCIDRs
		}
	}
	n := &a.nport
	n.mu.Lock()
	defer n.mu.Unlock()
	podsChanged := !n.podsOK || !slices.Equal(own, n.pods)
	n.cluster, n.pods = ps, own
	if n.np == nil {
		return
	}
	a.writeClusterPrefixes(n)
	if podsChanged { // every Node event lands here; the podCIDRs rarely change
		a.writePodCIDRs(n)
	}
}

// writeClusterPrefixes writes the recorded cluster ranges into the loaded
// LB. Called with n.mu held.
func (a *Agent) writeClusterPrefixes(n *nodePort) {
	if err := n.np.SetClusterPrefixes(n.cluster); err != nil {
		a.log.Warn("nodeport LB: cluster address ranges not written; in-cluster clients of DSR frontends may get DSR", "error", err)
	}
}

// writePodCIDRs writes the recorded podCIDRs into the loaded LB (which
// warns once per write about frontends inside them). Called with n.mu held.
func (a *Agent) writePodCIDRs(n *nodePort) {
	err := n.np.SetPodCIDRs(n.pods)
	if err != nil {
		a.log.Warn("nodeport LB: podCIDRs not written; pod traffic is looked up like any other (slower, same result)", "error", err)
	}
	n.podsOK = err == nil // a failed write is tried again at the next Node event
}

// ensureNodePort loads and attaches the north-south LB once the tc datapath
// is up, keeps its node addresses current and installs the tee writer
// (again when the socket LB appears later). Called with dpMu held.
func (a *Agent) ensureNodePort() {
	c := a.cfg.NodePortLB
	n := &a.nport
	n.mu.Lock()
	defer n.mu.Unlock()
	if !c.Enabled {
		if !n.offDone {
			n.offDone = true
			if err := nodeport.Uninstall(a.cfg.BPFRoot); err != nil {
				a.log.Warn("--nodeport=false: could not remove the north-south LB of a previous run", "error", err)
			}
		}
		return
	}
	addrs, err := nodeLocalAddrs(a.nl)
	if err != nil {
		a.log.Warn("nodeport LB: list node addresses", "error", err)
		return
	}
	if n.np == nil && a.servicesFirst() {
		return // a reconcile pass is kicked when the first Service sync is done
	}
	if n.np == nil {
		snatMin, snatMax, _ := c.SNATPortRange() // validated at start
		if w := snatRangeWarning(snatMin, snatMax); w != "" {
			a.log.Warn("nodeport LB: "+w, "snatPorts", c.SNATPorts)
		}
		a.stMu.Lock()
		up := a.uplink
		a.stMu.Unlock()
		var mtu uint32 // DSR MSS clamp; 0 (no clamp) if the uplink is not known yet
		if l, err := a.nl.LinkByName(up); err == nil {
			mtu = uint32(l.Attrs().MTU)
		} else {
			a.log.Warn("nodeport LB: read the uplink MTU, DSR SYN-ACKs keep their MSS", "uplink", up, "error", err)
		}
		np, err := nodeport.Load(nodeport.Options{
			UplinkMTU:       mtu,
			PinDir:          a.cfg.BPFRoot,
			NodeName:        a.cfg.NodeName,
			NodeAddrs:       addrs,
			Mode:            c.Mode,
			CTMax:           uint32(c.CTMax),
			NATMax:          uint32(c.NATMax),
			SNATPortMin:     snatMin,
			SNATPortMax:     snatMax,
			MaglevTableSize: uint32(c.MaglevSize),
			HashSeed:        hashSeed(c.MaglevSeed),
			DeliverPods:     a.podsRoutedByBPF(),
			Logger:          a.log.With("component", "nodeport"),
		})
		if err != nil {
			a.setNodePortErr(n, fmt.Sprintf("load failed, NodePort/LoadBalancer/externalIP traffic is not translated: %v", err))
			return
		}
		np.SetFrontendOptions(a.npFrontendOptions)
		n.np = np
		a.writeClusterPrefixes(n)
		a.writePodCIDRs(n)
		n.addrs, n.err = addrs, ""
	}
	if n.attached == "" {
		a.stMu.Lock()
		up := a.uplink
		a.stMu.Unlock()
		how, err := attachNodePort(n.np, up, c.Acceleration)
		if err != nil {
			a.setNodePortErr(n, fmt.Sprintf("attach to uplink %s failed: %v", up, err))
			return
		}
		n.attached, n.uplink, n.err = how, up, ""
		a.log.Info("nodeport LB attached", "uplink", up, "how", how)
	}
	if !slices.Equal(addrs, n.addrs) {
		if err := n.np.SetNodeAddrs(addrs); err != nil {
			a.log.Warn("nodeport LB: set node addresses", "error", err)
		} else {
			n.addrs = addrs
			a.log.Info("nodeport LB node addresses set", "addresses", addrs)
		}
	}
	// (Re)build the tee whenever the socket LB changed (loaded later, or not at all).
	var primary lb.Writer
	if a.lb != nil {
		primary = a.lb
	}
	if n.tee == nil || n.primary != primary {
		n.tee, n.primary = newTeeWriter(primary, n.np), primary
		a.SetLBWriter(n.tee)
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
func (a *Agent) servicesFirst() bool {
	return a.svc != nil && !a.svc.initialSynced() && time.Since(a.started) < nodePortAfterServices
}

func (a *Agent) setNodePortErr(n *nodePort, msg string) {
	if n.err != msg {
		a.log.Warn("north-south load balancing not active; the agent keeps running without it", "reason", msg)
	}
	n.err = msg
}

// hashSeed maps --maglev-hash-seed to the datapath's 32-bit flow-hash seed
// (0 = the datapath default).
func hashSeed(s string) uint32 {
	if s == "" {
		return 0
	}
	h := fnv.New32a()
	h.Write([]byte(s))
	return h.Sum32() | 1
}

// npFrontendOptions gives the datapath a frontend's Maglev table and source
// ranges (nodeport.LB.SetFrontendOptions).
func (a *Agent) npFrontendOptions(f lb.Frontend) nodeport.FrontendOptions {
	c := a.cfg.NodePortLB
	o := nodeport.FrontendOptions{SourceRanges: f.SourceRanges}
	alg := f.Algorithm
	if alg == lb.AlgorithmDefault {
		alg = c.Algorithm
	}
	if alg == lb.AlgorithmMaglev {
		tab, err := a.nport.tables.get(f.Backends, c.MaglevSize, c.MaglevSeed)
		if err != nil {
			a.log.Warn("maglev table not built; the frontend picks backends at random", "frontend", f.Key.String(), "error", err)
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

// runNodePort runs the health-check servers and the conntrack GC until ctx
// is done. Started by run; waits for the LB to be loaded.
func (a *Agent) runNodePort(ctx context.Context) {
	if !a.cfg.NodePortLB.Enabled {
		return
	}
	hcTick := time.NewTicker(time.Second)
	defer hcTick.Stop()
	gcTick := time.NewTicker(a.cfg.NodePortLB.CTGCInterval)
	defer gcTick.Stop()
	events := map[string]bool{} // annotation problems reported as Events
	defer func() {
		a.nport.mu.Lock()
		if a.nport.hc != nil {
			a.nport.hc.Close()
		}
		a.nport.mu.Unlock()
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-hcTick.C:
			a.syncHealthChecks()
			a.emitAnnotationEvents(ctx, events)
		case <-gcTick.C:
			a.ctGC()
		}
	}
}

// syncHealthChecks serves one kube-proxy-compatible /healthz per Service
// with a healthCheckNodePort, on the node addresses.
func (a *Agent) syncHealthChecks() {
	if a.svc == nil {
		return
	}
	want := healthcheck.FromFrontends(a.svc.frontends(), a.cfg.NodeName)
	n := &a.nport
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
		n.hc = healthcheck.New(n.addrs, a.log.With("component", "healthcheck"))
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

// nodePortDecision is the nodeport_lb line of `axon status`.
func (a *Agent) nodePortDecision() api.Decision {
	d := api.Decision{Name: DecisionNodePortLB, Value: "disabled"}
	c := a.cfg.NodePortLB
	if !c.Enabled {
		d.Reason = "--nodeport=false"
		return d
	}
	n := &a.nport
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

// closeNodePort releases the LB's file descriptors (pins stay).
func (a *Agent) closeNodePort() {
	n := &a.nport
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.np != nil {
		if err := n.np.Close(); err != nil {
			a.log.Warn("close nodeport LB", "error", err)
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
func (a *Agent) ctGC() {
	n := &a.nport
	n.mu.Lock()
	np := n.np
	n.mu.Unlock()
	if np == nil {
		return
	}
	c := a.cfg.NodePortLB
	start := time.Now()
	st, err := np.GC(nodeport.CTTimeouts{TCP: c.CTTCPTimeout, TCPClosing: c.CTTCPClose, UDP: c.CTUDPTimeout, SNATTimeWait: c.SNATTimeWait})
	gc := ctGCStats{At: start, Took: time.Since(start), Scanned: st.CTEntries, Removed: st.CTDeleted, Used: st.CTEntries - st.CTDeleted}
	if err != nil {
		gc.Err = err.Error()
		a.log.Warn("conntrack garbage collection failed", "error", err)
	}
	if cs, err := np.CTStats(); err == nil {
		gc.Used, gc.Max = cs.Entries, int(cs.Max)
		if cs.Max > 0 && cs.Entries*10 >= int(cs.Max)*9 {
			a.log.Warn("north-south conntrack table is more than 90 % full: the least recently used flows are evicted; raise --ct-max", "entries", cs.Entries, "max", cs.Max)
		}
	}
	n.mu.Lock()
	n.gc = gc
	n.gcDeleted += uint64(st.CTDeleted)
	n.mu.Unlock()
	if st.CTDeleted > 0 || st.NATDeleted > 0 {
		a.log.Debug("conntrack gc", "ctScanned", st.CTEntries, "ctDeleted", st.CTDeleted, "natScanned", st.NATEntries, "natDeleted", st.NATDeleted)
	}
}

// podsRoutedByBPF reports whether the pod datapath is loaded with BPF host
// routing (axon_uplink_ingress on the uplink, its maps pinned under
// BPFRoot): the north-south LB then delivers pod-bound TCP and UDP itself
// (nodeport.Options.DeliverPods). Before the datapath is loaded it
// is false, and the uplink program delivers everything.
func (a *Agent) podsRoutedByBPF() bool {
	v := a.dpView.Load()
	return v != nil && (*v).HostRouting() == datapath.RoutingBPF
}
