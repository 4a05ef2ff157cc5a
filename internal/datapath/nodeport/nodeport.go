package nodeport

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/cilium/ebpf"

	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/datapath/drops"
	"github.com/axonhq/axon/internal/datapath/lbmap"
	"github.com/axonhq/axon/internal/lb"
)

// North-south load balancing (bpf/lb_tc.c, bpf/lb_xdp.c, shared code in
// bpf/lib/nodeport.h): NodePort, LoadBalancer, externalIP and HostPort
// frontends translated per packet at the node uplink, at tc and/or XDP, with
// BPF conntrack, SNAT or DSR (IPIP) to remote backends, Maglev or random
// selection, session affinity and source ranges. LB loads the
// programs, owns their maps (pinned by name under the node's pin dir, apart
// from the socket LB's) and implements lb.Writer.

// Map names, pinned by name under the pin dir.
const (
	MapService  = "axon_np_svc"
	MapBackend  = "axon_np_be"
	MapLocal    = "axon_np_local"
	MapSrcRange = "axon_np_srcrange"
	MapAffinity = "axon_np_aff"
	MapCT       = "axon_np_ct"
	// MapCTNew: flows not answered yet (bpf/lib/ct.h); the first reply
	// moves a flow to MapCT.
	MapCTNew    = "axon_np_ct_new"
	MapNAT      = "axon_np_nat"
	MapMetrics  = "axon_np_metrics"
	MapLBMaglev = "axon_lb_maglev"
	// MapDSR: {frontend id, local backend address} -> backend id, the
	// backend side of DSR (bpf/lib/nodeport.h np_dsr_accept).
	MapDSR = "axon_np_dsr"
	// MapCluster: the cluster's pod and node address ranges (clients
	// there get SNAT, not DSR).
	MapCluster = "axon_np_cluster"
	// MapPods: this node's podCIDRs; TCP/UDP to them skips the LB's
	// lookups (bpf/lib/nodeport.h np_to_local_pod).
	MapPods = "axon_np_pods"
)

// Defaults of Options (the sizes in bpf/lib/*.h).
const (
	DefaultCTMax = 131072
	// DefaultCTUnrepliedMax: flows not answered yet (axon_np_ct_new), at
	// most a quarter of CTMax. Kept well below one backend's SNAT port
	// range, so that a SYN flood cannot hold all its ports (bpf/lib/nat.h
	// np_nat_stale).
	DefaultCTUnrepliedMax  = 8192
	DefaultNATMax          = 131072
	DefaultAffinityMax     = 65536
	DefaultMaglevTableSize = 16381
	// SNAT ports 1024-29999 (bpf/lib/nat.h): clear of Linux's ephemeral
	// range (32768-60999, the node's own connections) and of the NodePort
	// range (30000-32767); 28 976 ports per node address and backend
	// address:port, each held SNATTimeWait after its flow closed.
	DefaultSNATPortMin = 1024
	DefaultSNATPortMax = 29999
	DefaultHashSeed    = 0x61786f6e
)

// Remote-backend modes (Options.Mode, FrontendOptions.Mode).
const (
	ModeSNAT = "snat" // source NAT to the node address, replies back through this node
	ModeDSR  = "dsr"  // IPIP to the backend, replies go directly to the client
)

// Options configure Load. Sizes and addresses are
// load-time constants: changing them means loading again (pinned maps of
// another size are refused with a hint).
type Options struct {
	PinDir string // bpffs dir of the node, e.g. /sys/fs/bpf/axon; created if missing
	// NodeName marks backends with lb.Backend.NodeName == NodeName as local:
	// DNAT only, client address preserved, replies fixed up at uplink egress.
	// Empty (standalone L4LB): every backend is remote.
	NodeName string
	// NodeAddrs are the node's addresses: NodePort/HostPort frontends match
	// them and SNAT replies come back to them. The first IPv4 and the first
	// IPv6 one are the SNAT source of frontends that are not a node address
	// (LoadBalancer IP, externalIP) and the DSR outer source. Can be changed
	// later with SetNodeAddrs (match only; the SNAT source stays).
	NodeAddrs []netip.Addr
	// Mode for remote backends: ModeSNAT (default) or ModeDSR. A
	// frontend may override it (FrontendOptions.Mode).
	Mode string
	// Map sizes; 0 = default.
	CTMax, NATMax, AffinityMax uint32
	// CTUnrepliedMax: flows whose backend has not answered yet
	// (axon_np_ct_new, an LRU of its own: a flood of new flows evicts only
	// those, never established flows); 0 = min(DefaultCTUnrepliedMax,
	// CTMax/4), at least 64.
	CTUnrepliedMax uint32
	// FragMax: datagrams whose fragments can be in flight at once
	// (axon_np_frag, bpf/lib/frag.h); 0 = DefaultFragMax.
	FragMax uint32
	// FragTimeout: how long a first fragment's translation serves the
	// datagram's later fragments (cfg_frag_timeout_ns); 0 = 1 s.
	FragTimeout time.Duration
	// MaglevTableSize M: a prime, 0 = 16381. Every Maglev table written
	// through FrontendOptions.Maglev has exactly M slots.
	MaglevTableSize uint32
	// SNAT source port range (inclusive); 0,0 = 1024-29999. Keep it clear
	// of the node's ip_local_port_range and of the NodePort range.
	SNATPortMin, SNATPortMax uint16
	// HashSeed of the flow hash (Maglev slot, SNAT port): the same on every
	// node so every node picks the same Maglev backend. 0 = default.
	HashSeed uint32
	// UplinkMTU is the MTU of the node's uplink. DSR requests of other
	// nodes' LBs arrive with an outer header (20 / 40 bytes), so the
	// SYN-ACK of such a flow gets its MSS clamped to fit it (the clamp
	// assumes the same MTU on every node), and a packet this LB would
	// encapsulate beyond it is answered with ICMP "fragmentation needed" /
	// "packet too big" (bpf/lib/icmp_too_big.h). 0: neither.
	UplinkMTU uint32
	// NoNeigh: the kernel lacks bpf_redirect_neigh (tc falls back to the
	// stack for unresolved neighbours). Normally false (probed by the caller).
	NoNeigh bool
	// NoFibCache turns the next-hop cache off (nodeport_neigh.go): every
	// forwarded packet is then looked up in the FIB. Without it the cache
	// is on where the kernel can run it (Linux 6.3+ with BTF) once
	// WatchNeighbours (Attach) runs.
	NoFibCache bool
	fibCache   bool // decided by Load
	// DeliverPods: the node's pod datapath (Load, same PinDir) is loaded
	// with BPF host routing, so axon_uplink_ingress runs after the LB on the
	// uplink. The LB's tc program then delivers TCP and UDP for a local pod
	// itself, with the pod datapath's endpoint, metrics and bandwidth maps
	// (shared through their pins): one program run per packet on that path
	// instead of two (bpf/lb_tc.c, cfg_deliver_pods). False (the standalone
	// L4 LB, legacy host routing): the LB never delivers to pods.
	DeliverPods bool
	Logger      *slog.Logger
}

// FrontendOptions are the per-frontend settings lb.Frontend does not carry.
type FrontendOptions struct {
	// Maglev is the frontend's Maglev lookup table (internal/maglev): for
	// each of the MaglevTableSize slots an index into the Backends of the
	// lb.Frontend passed with it (in the caller's order). nil: random pick.
	Maglev []uint32
	// SourceRanges (loadBalancerSourceRanges): only clients inside one of
	// them are served, others are dropped. Empty: everyone.
	SourceRanges []netip.Prefix
	// Mode overrides Options.Mode for this frontend ("" = default).
	Mode string
}

// LB is the loaded north-south load balancer of one node. Methods
// are safe for concurrent use.
type LB struct {
	log  *slog.Logger
	opts Options
	tc   lbTCObjects

	// xdpMu guards xdp, the XDP object, loaded on first use (loadXDP): an
	// LB attached without XDP, the agent's default, never verifies it.
	xdpMu sync.Mutex
	xdp   lbXDPObjects

	mu       sync.Mutex
	pods     []netip.Prefix // SetPodCIDRs: TCP/UDP to them is not looked up
	fe       map[lb.FrontendKey]*npFrontend
	feIDs    lbmap.IDAlloc
	beIDs    lbmap.IDAlloc
	optFn    func(lb.Frontend) FrontendOptions
	explain  *npExplainer // dry-run instance, loaded on first Explain
	fibCache bool         // programs loaded with the next-hop cache (cfg_fib_cache)
	neigh    *neighWatch  // WatchNeighbours, nil before
}

// Verdict names of enum np_reason (bpf/lib/nodeport.h), in order; also the
// metric names and Explanation.Verdict.
var npReasonNames = []string{
	"not_service", "ct_hit", "ct_new", "ct_insert_fail", "snat_no_port", "rev_nat",
	"dnat_local", "snat_fwd", "dsr_encap", "icmp_error", "drop_no_backend",
	"drop_src_range", "drop_not_local", "drop_no_route", "xdp_punt", "fragment",
	"malformed", "ttl", "egress_rev", "drop_no_snat_addr", "rewrite_fail", "dsr_decap",
	"frag_tracked", "frag_not_found", // IP fragments (bpf/lib/frag.h)
	"dsr_too_big", // bpf/lib/icmp_too_big.h
	// conntrack of handshake-less and unanswered flows (bpf/lib/ct.h)
	"ct_no_syn", "ct_established", "snat_port_reused", "ct_maglev_resume", "nat_full",
	"direct_reuse", // a client reached a local pod directly with a NodePort flow's ports
}

// npHookNames are the rows of axon_np_metrics (enum np_hook).
var npHookNames = []string{"tc", "xdp", "egress"}

func (o *Options) normalise() error {
	if o.PinDir == "" {
		return errors.New("nodeport LB: PinDir is empty: set a bpffs directory such as /sys/fs/bpf/axon")
	}
	if o.Mode == "" {
		o.Mode = ModeSNAT
	}
	if o.Mode != ModeSNAT && o.Mode != ModeDSR {
		return fmt.Errorf("nodeport LB: mode %q is not %s or %s", o.Mode, ModeSNAT, ModeDSR)
	}
	if o.CTMax == 0 {
		o.CTMax = DefaultCTMax
	}
	if o.NATMax == 0 {
		o.NATMax = DefaultNATMax
	}
	if o.CTUnrepliedMax == 0 {
		o.CTUnrepliedMax = max(min(DefaultCTUnrepliedMax, o.CTMax/4), 64)
	}
	if o.AffinityMax == 0 {
		o.AffinityMax = DefaultAffinityMax
	}
	if o.FragTimeout <= 0 {
		o.FragTimeout = time.Second
	}
	if o.FragMax == 0 {
		o.FragMax = DefaultFragMax
	}
	if o.MaglevTableSize == 0 {
		o.MaglevTableSize = DefaultMaglevTableSize
	}
	if !isPrime(o.MaglevTableSize) {
		return fmt.Errorf("nodeport LB: Maglev table size %d is not a prime: use one such as 251, 1021, 4093, 16381 or 65521", o.MaglevTableSize)
	}
	if o.SNATPortMin == 0 && o.SNATPortMax == 0 {
		o.SNATPortMin, o.SNATPortMax = DefaultSNATPortMin, DefaultSNATPortMax
	}
	if o.SNATPortMin == 0 || o.SNATPortMax < o.SNATPortMin {
		return fmt.Errorf("nodeport LB: SNAT port range %d-%d is empty or starts at 0: give min <= max, e.g. 1024-29999", o.SNATPortMin, o.SNATPortMax)
	}
	if o.HashSeed == 0 {
		o.HashSeed = DefaultHashSeed
	}
	for _, a := range o.NodeAddrs {
		if !a.IsValid() || a.IsUnspecified() {
			return fmt.Errorf("nodeport LB: node address %q is not a usable address", a)
		}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return nil
}

func isPrime(n uint32) bool {
	if n < 2 {
		return false
	}
	for d := uint32(2); d*d <= n; d++ {
		if n%d == 0 {
			return false
		}
	}
	return true
}

// snatAddrs returns the first IPv4 and IPv6 node address (zero if none).
func (o *Options) snatAddrs() (v4 [4]byte, v6 [16]byte) {
	var have4, have6 bool
	for _, a := range o.NodeAddrs {
		a = a.Unmap()
		if a.Is4() && !have4 {
			v4, have4 = a.As4(), true
		}
		if a.Is6() && !have6 {
			v6, have6 = a.As16(), true
		}
	}
	return v4, v6
}

// dsrMSS is the MSS clamp of DSR flows for an uplink MTU (0: none).
func dsrMSS(mtu uint32, overhead uint32) uint16 {
	if mtu <= overhead || mtu-overhead > 0xffff {
		return 0
	}
	return uint16(mtu - overhead)
}

// setVariables writes the load-time constants into a spec of either object.
func (o *Options) setVariables(spec *ebpf.CollectionSpec, dryRun bool) error {
	v4, v6 := o.snatAddrs()
	vals := map[string]any{
		"cfg_snat_v4":         v4, // __be32 in memory order
		"cfg_snat_v6":         v6,
		"cfg_snat_port_min":   o.SNATPortMin,
		"cfg_frag_timeout_ns": uint64(o.FragTimeout.Nanoseconds()),
		"cfg_snat_port_max":   o.SNATPortMax,
		"cfg_maglev_size":     o.MaglevTableSize,
		"cfg_hash_seed":       o.HashSeed,
		"cfg_enable_neigh":    datapath.BoolU8(!o.NoNeigh),
		"cfg_dry_run":         datapath.BoolU8(dryRun),
		"cfg_dsr_mss_v4":      dsrMSS(o.UplinkMTU, 60),  // - IPv4, TCP, outer IPv4
		"cfg_dsr_mss_v6":      dsrMSS(o.UplinkMTU, 100), // - IPv6, TCP, outer IPv6
		"cfg_dsr_mtu":         o.UplinkMTU,              // larger once encapsulated: ICMP "too big"
		"cfg_fib_cache":       datapath.BoolU8(o.fibCache && !dryRun),
	}
	for name, v := range vals {
		vs, ok := spec.Variables[name]
		if !ok {
			return fmt.Errorf("object has no variable %s (stale object: run go generate ./internal/datapath/...)", name)
		}
		if err := vs.Set(v); err != nil {
			return fmt.Errorf("set %s: %w", name, err)
		}
	}
	if err := o.setPodDelivery(spec, dryRun); err != nil {
		return err
	}
	for name, n := range map[string]uint32{MapCT: o.CTMax, MapCTNew: o.CTUnrepliedMax, MapNAT: o.NATMax, MapAffinity: o.AffinityMax, MapFrag: o.FragMax} {
		if ms := spec.Maps[name]; ms != nil {
			ms.MaxEntries = n
		}
	}
	if ms := spec.Maps[MapLBMaglev]; ms != nil && ms.InnerMap != nil {
		ms.InnerMap.MaxEntries = o.MaglevTableSize
	}
	return nil
}

// podDeliveryMaps are the pod datapath's maps the tc LB program uses to
// deliver pod-bound traffic (bpf/lib/forward.h, bpf/lib/edt.h).
var podDeliveryMaps = []string{"axon_ep_v4", "axon_ep_v6", "axon_metrics", datapath.MapBWAddr, datapath.MapBWState, datapath.MapBWStats, datapath.MapBWGate}

// setPodDelivery sets cfg_deliver_pods in the tc object (the XDP object has
// no such variable and is left alone). With delivery on, the pod maps are
// taken from their pins under PinDir, which the pod datapath created. Off
// (and in the dry-run instance), the code using them is pruned by the
// verifier, so they are loaded as one-entry maps that are not pinned: an LB
// without a pod datapath does not leave pod maps behind.
func (o *Options) setPodDelivery(spec *ebpf.CollectionSpec, dryRun bool) error {
	vs, ok := spec.Variables["cfg_deliver_pods"]
	if !ok {
		return nil
	}
	on := o.DeliverPods && !dryRun
	if err := vs.Set(datapath.BoolU8(on)); err != nil {
		return fmt.Errorf("set cfg_deliver_pods: %w", err)
	}
	for _, name := range podDeliveryMaps {
		ms := spec.Maps[name]
		if ms == nil {
			return fmt.Errorf("lb_tc object has no map %s (stale object: run go generate ./internal/datapath/...)", name)
		}
		if on {
			if _, err := os.Stat(filepath.Join(o.PinDir, name)); err != nil {
				return fmt.Errorf("DeliverPods: the pod datapath's map %s is not pinned under %s (load the pod datapath first): %w", name, o.PinDir, err)
			}
			continue
		}
		ms.Pinning = ebpf.PinNone
		ms.MaxEntries = 1
	}
	return nil
}

// Load loads the tc load-balancer programs with their maps pinned under
// o.PinDir (existing pins are reused: frontends and flows survive an agent
// restart), writes the node addresses and reads the programmed frontends
// back. Nothing is attached: see Attach. The XDP program is loaded on first
// use (an Attach with XDP, Program(HookXDP)): it shares every pinned map
// with the tc programs, and a node that does not accelerate with XDP, the
// default, saves its verification (a fifth to two fifths of the LB's,
// by kernel).
func Load(o Options) (*LB, error) {
	if err := o.normalise(); err != nil {
		return nil, err
	}
	if err := datapath.EnsurePinDir(o.PinDir); err != nil {
		return nil, fmt.Errorf("load nodeport LB: %w", err)
	}
	if !o.NoFibCache {
		var why string
		if o.fibCache, why = kernelFibCache(); !o.fibCache {
			o.Logger.Info("nodeport LB: next-hop cache off", "reason", why)
		}
	}
	n := &LB{log: o.Logger, opts: o, fe: map[lb.FrontendKey]*npFrontend{}, fibCache: o.fibCache}
	tcSpec, err := loadLbTC()
	if err != nil {
		return nil, fmt.Errorf("load nodeport LB: parse lb_tc object: %w", err)
	}
	if err := o.setVariables(tcSpec, false); err != nil {
		return nil, fmt.Errorf("load nodeport LB: %w", err)
	}
	opts := &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: o.PinDir}}
	restoreNAT, err := npNATMigration(o.PinDir) // an older LRU axon_np_nat (nodeport_maps.go)
	if err != nil {
		return nil, fmt.Errorf("load nodeport LB: %w", err)
	}
	if err := npMetricsMigration(o.PinDir, tcSpec.Maps[MapMetrics], n.log); err != nil {
		return nil, fmt.Errorf("load nodeport LB: %w", err)
	}
	restoreCT, err := npGrownMigration(o.PinDir, tcSpec.Maps[MapCT], tcSpec.Maps[MapCTNew]) // an older, shorter np_ct
	if err != nil {
		return nil, fmt.Errorf("load nodeport LB: %w", err)
	}
	if err := tcSpec.LoadAndAssign(&n.tc, opts); err != nil {
		return nil, fmt.Errorf("load nodeport LB tc programs: %w", datapath.VerifierDetail(npIncompatibleHint(err, o.PinDir)))
	}
	if restoreNAT != nil {
		if err := restoreNAT(n.tc.AxonNpNat); err != nil {
			n.log.Warn("nodeport LB: reverse entries of the old NAT map lost (their flows re-create them within a second)", "error", err)
		}
	}
	if restoreCT != nil {
		if err := restoreCT(map[string]*ebpf.Map{MapCT: n.tc.AxonNpCt, MapCTNew: n.tc.AxonNpCtNew}); err != nil {
			n.log.Warn("nodeport LB: connections of the old CT maps lost (a lost TCP flow is reset or, with Maglev, resumes)", "error", err)
		}
	}
	if err := n.SetNodeAddrs(o.NodeAddrs); err != nil {
		n.Close()
		return nil, fmt.Errorf("load nodeport LB: %w", err)
	}
	if err := n.rebuild(); err != nil {
		n.Close()
		return nil, fmt.Errorf("load nodeport LB: %w", err)
	}
	n.log.Info("nodeport LB loaded", "pinDir", o.PinDir, "mode", o.Mode, "ctMax", o.CTMax, "ctUnrepliedMax", o.CTUnrepliedMax,
		"maglevM", o.MaglevTableSize, "frontends", len(n.fe))
	return n, nil
}

// loadXDP loads the XDP object once, over the tc object's maps.
func (n *LB) loadXDP() error {
	n.xdpMu.Lock()
	defer n.xdpMu.Unlock()
	if n.xdp.AxonLbXdp != nil { // loaded
		return nil
	}
	spec, err := loadLbXDP()
	if err != nil {
		return fmt.Errorf("load nodeport LB: parse lb_xdp object: %w", err)
	}
	if err := n.opts.setVariables(spec, false); err != nil {
		return fmt.Errorf("load nodeport LB XDP program: %w", err)
	}
	opts := &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: n.opts.PinDir}, MapReplacements: n.sharedMaps()}
	if err := spec.LoadAndAssign(&n.xdp, opts); err != nil {
		return fmt.Errorf("load nodeport LB XDP program: %w", datapath.VerifierDetail(err))
	}
	return nil
}

// XDPProgram is the loaded XDP program (axon_lb_xdp), loaded now if it was
// not yet.
func (n *LB) XDPProgram() (*ebpf.Program, error) {
	if err := n.loadXDP(); err != nil {
		return nil, err
	}
	return n.xdp.AxonLbXdp, nil
}

// sharedMaps are the maps every program instance shares (all pinned ones).
func (n *LB) sharedMaps() map[string]*ebpf.Map {
	m := n.tc.lbTCMaps
	return map[string]*ebpf.Map{
		MapService: m.AxonNpSvc, MapBackend: m.AxonNpBe, MapLocal: m.AxonNpLocal,
		MapSrcRange: m.AxonNpSrcrange, MapAffinity: m.AxonNpAff, MapCT: m.AxonNpCt, MapCTNew: m.AxonNpCtNew,
		MapNAT: m.AxonNpNat, MapMetrics: m.AxonNpMetrics, MapLBMaglev: m.AxonLbMaglev,
		MapFrag: m.AxonNpFrag, MapDSR: m.AxonNpDsr, MapCluster: m.AxonNpCluster,
		MapPods: m.AxonNpPods, MapNeighGen: m.AxonNpNeighGen,
		// the drop maps (bpf/lib/drop.h): the dry run writes none of them
		drops.MapCounts: m.AxonDrops, drops.MapListen: m.AxonDropListen,
		drops.MapRingStats: m.AxonDropRingStats, drops.MapEvents: m.AxonDropEvents,
	}
}

func npIncompatibleHint(err error, pinDir string) error {
	if errors.Is(err, ebpf.ErrMapIncompatible) {
		return fmt.Errorf("%w (a map pinned under %s has another layout or size: CT/NAT/affinity sizes and the Maglev "+
			"table size are load-time settings; remove the pins with Uninstall (flows are lost) or load with the old sizes)", err, pinDir)
	}
	return err
}

// Options returns the options the LB was loaded with (defaults filled in).
func (n *LB) Options() Options { return n.opts }

// SetFrontendOptions installs the function UpsertFrontend (the lb.Writer
// method) asks for a frontend's Maglev table, source ranges and mode. nil:
// defaults (random, everyone, Options.Mode).
func (n *LB) SetFrontendOptions(fn func(lb.Frontend) FrontendOptions) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.optFn = fn
}

// SetClusterPrefixes replaces the cluster's own address ranges (every
// Node's podCIDRs and InternalIPs; axon_np_cluster). Clients inside them
// are served by SNAT even by DSR frontends: their replies would not pass
// the backend node's uplink egress, where DSR replies get the frontend
// address back. Empty: DSR for every client (the standalone L4LB).
func (n *LB) SetClusterPrefixes(prefixes []netip.Prefix) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	want := map[lbTCNpClusterKey]bool{}
	for _, p := range prefixes {
		if !p.IsValid() {
			return fmt.Errorf("set cluster prefixes: %q is not a prefix", p)
		}
		want[npClusterKey(p)] = true
	}
	return datapath.ReplaceKeys(n.tc.AxonNpCluster, MapCluster, want)
}

// SetPodCIDRs tells the LB this node's podCIDRs (at most one per family,
// as a Node's spec.podCIDRs): TCP and UDP to them is pod traffic, which no
// frontend can match, and the uplink programs hand it on without their CT
// and frontend lookups (axon_np_pods). Empty: everything is looked up (the
// standalone L4LB). A frontend address inside them would not be translated
// on this node: UpsertFrontend warns about one.
func (n *LB) SetPodCIDRs(prefixes []netip.Prefix) error {
	vals, err := npPodCIDRs(prefixes)
	if err != nil {
		return fmt.Errorf("set pod CIDRs: %w", err)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	for fam, v := range vals {
		if err := n.tc.AxonNpPods.Put(uint32(fam), v); err != nil {
			return fmt.Errorf("set pod CIDRs: write %s[%d]: %w", MapPods, fam, err)
		}
	}
	n.pods = slices.Clone(prefixes)
	for k := range n.fe {
		n.warnPodFrontend(k)
	}
	return nil
}

// npPodCIDRs are the axon_np_pods values ([0] IPv4, [1] IPv6) of prefixes,
// in np_tuple address form (IPv4 v4-mapped); a family without a prefix has
// Set 0.
func npPodCIDRs(prefixes []netip.Prefix) ([2]lbTCNpPodCidr, error) {
	var vals [2]lbTCNpPodCidr
	for _, p := range prefixes {
		if !p.IsValid() {
			return vals, fmt.Errorf("%q is not a prefix", p)
		}
		fam := 1
		if p.Addr().Unmap().Is4() {
			fam = 0
		}
		if vals[fam].Set != 0 {
			return vals, fmt.Errorf("two podCIDRs of one family (%v): a node has at most one per family", prefixes)
		}
		addr, bits := prefix16(p)
		mask := net.CIDRMask(bits, 128)
		v := lbTCNpPodCidr{Set: 1}
		for w := range 4 {
			v.Net[w] = binary.NativeEndian.Uint32(addr[4*w:])
			v.Mask[w] = binary.NativeEndian.Uint32(mask[4*w:])
		}
		vals[fam] = v
	}
	return vals, nil
}

// PodCIDRs reads back the podCIDRs the LB hands pod traffic on for
// (axon_np_pods), IPv4 first.
func (n *LB) PodCIDRs() ([]netip.Prefix, error) {
	var out []netip.Prefix
	for fam := range uint32(2) {
		var v lbTCNpPodCidr
		if err := n.tc.AxonNpPods.Lookup(fam, &v); err != nil {
			return nil, fmt.Errorf("read %s[%d]: %w", MapPods, fam, err)
		}
		if v.Set == 0 {
			continue
		}
		var addr [16]byte
		mask := make(net.IPMask, 16)
		for w := range 4 {
			binary.NativeEndian.PutUint32(addr[4*w:], v.Net[w])
			binary.NativeEndian.PutUint32(mask[4*w:], v.Mask[w])
		}
		bits, _ := mask.Size()
		a := netip.AddrFrom16(addr)
		if fam == 0 {
			a, bits = a.Unmap(), bits-96
		}
		out = append(out, netip.PrefixFrom(a, bits))
	}
	return out, nil
}

// warnPodFrontend logs a frontend whose address lies inside this node's
// podCIDRs: the uplink programs take it for pod traffic and do not
// translate it. Called with mu held.
func (n *LB) warnPodFrontend(k lb.FrontendKey) {
	if k.Scope != lb.ScopeCluster {
		return // NodePort / HostPort: the node's own addresses
	}
	for _, p := range n.pods {
		if p.Contains(k.Addr.Unmap()) {
			n.log.Warn("nodeport LB: frontend address inside this node's podCIDR is taken for pod traffic and not translated on this node",
				"frontend", lbmap.KeyString(k), "podCIDR", p)
		}
	}
}

// prefix16 is p in the maps' 16-byte address form: unmapped and masked,
// an IPv4 prefix v4-mapped with 96 added to its bits.
func prefix16(p netip.Prefix) ([16]byte, int) {
	p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()).Masked()
	bits := p.Bits()
	if p.Addr().Is4() {
		bits += 96
	}
	return p.Addr().As16(), bits
}

// npClusterKey is the axon_np_cluster key of p.
func npClusterKey(p netip.Prefix) lbTCNpClusterKey {
	addr, bits := prefix16(p)
	return lbTCNpClusterKey{Prefixlen: uint32(bits), Addr: addr}
}

// SetNodeAddrs replaces the node addresses NodePort/HostPort frontends
// match (axon_np_local). The SNAT source chosen at load stays.
func (n *LB) SetNodeAddrs(addrs []netip.Addr) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	want := map[[16]byte]bool{}
	for _, a := range addrs {
		if !a.IsValid() || a.IsUnspecified() {
			return fmt.Errorf("set node addresses: %q is not a usable address", a)
		}
		want[a.Unmap().As16()] = true
	}
	return datapath.ReplaceKeys(n.tc.AxonNpLocal, MapLocal, want)
}

// Close releases file descriptors. Pinned maps and links stay: traffic keeps
// being balanced while the agent is down and the next load adopts them.
func (n *LB) Close() error {
	var errs []error
	n.stopNeighbours()
	if n.explain != nil {
		errs = append(errs, n.explain.close())
	}
	n.xdpMu.Lock()
	errs = append(errs, n.xdp.Close(), n.tc.Close())
	n.xdpMu.Unlock()
	return errors.Join(errs...)
}

// Uninstall detaches every nodeport LB attachment pinned under
// pinDir (in the current netns) and removes its maps. Missing pins are fine.
func Uninstall(pinDir string) error {
	if _, err := os.Stat(pinDir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	var errs []error
	pins, err := listNPLinkPins(pinDir)
	if err != nil {
		errs = append(errs, err)
	}
	for _, p := range pins {
		errs = append(errs, detachNPPin(p))
	}
	for _, m := range []string{MapService, MapBackend, MapLocal, MapSrcRange, MapAffinity, MapCT, MapCTNew, MapNAT, MapMetrics, MapLBMaglev, MapFrag, MapDSR, MapCluster, MapPods} {
		if err := os.Remove(filepath.Join(pinDir, m)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove pinned map %s: %w", m, err))
		}
	}
	return errors.Join(errs...)
}
