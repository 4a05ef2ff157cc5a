package podpath

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"strings"
	"sync"

	"github.com/cilium/ebpf"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/datapath"
)

// Config selects where and how the datapath is installed in the current netns.
type Config struct {
	PinDir      string // bpffs dir for this node, e.g. /sys/fs/bpf/axon-lab/node1; created if missing
	Uplink      string // uplink device name in the current netns, e.g. "eth0"
	AttachMode  string // "auto" (default) | "tcx" | "legacy"
	HostRouting string // "auto" (default) | "bpf" | "legacy" (attach nothing; kernel routes forward)
	Logger      *slog.Logger
	// pod devices (veth or netkit) and BIG TCP
	DeviceMode       string // DeviceMode*: "veth" (default) | "netkit" | "netkit-l2" | "auto"
	EnableIPv4BigTCP bool   // BIG TCP for IPv4 on pod devices where the kernel and uplink allow it
	EnableIPv6BigTCP bool   // BIG TCP for IPv6 on pod devices where the kernel and uplink allow it
	// NoFibCache turns the per-CPU IPv4 route cache of axon_pod_egress off
	// (bpf/lib/fib_cache.h): every packet to another node is then looked up
	// in the FIB. The zero value uses the cache where the kernel loads it.
	NoFibCache bool
	// GatewayV4 is the pods' IPv4 gateway (axon-cni's cni.GatewayV4):
	// axon_pod_egress answers a pod's ARP request for it with the host-side
	// device's MAC (bpf/lib/arp.h), for what keeps its own ARP cache behind
	// the pod's interface, such as a VM guest on the pod's bridge. The zero
	// value answers nothing.
	GatewayV4 netip.Addr
}

// Datapath is the loaded datapath of one node netns. Methods are safe for
// concurrent use; call them from the netns Load ran in.
type Datapath struct {
	cfg   Config
	log   *slog.Logger
	feats datapath.Features

	attachMode  string // ModeTCX | ModeLegacy
	hostRouting string // RoutingBPF | ModeLegacy
	decisions   []api.Decision

	epV4, epV6, metrics *ebpf.Map
	podProg, upProg     *ebpf.Program // nil when hostRouting is legacy

	// pod devices and BIG TCP (netkit.go, bigtcp.go)
	devType, nkMode string      // operational pod device: api.DeviceVeth|DeviceNetkit, "l3"|"l2"
	nk              netkitProgs // programs for netkit pods, loaded on first use
	bigTCP          BigTCP
	fibCache        bool // cfg_fib_cache of axon_pod_egress (decideFibCache)

	mu sync.Mutex // serialises attach/detach
}

func (c *Config) normalise() error {
	if c.PinDir == "" {
		return errors.New("datapath config: PinDir is empty: set a bpffs directory such as /sys/fs/bpf/axon")
	}
	if c.AttachMode == "" {
		c.AttachMode = datapath.ModeAuto
	}
	if c.HostRouting == "" {
		c.HostRouting = datapath.ModeAuto
	}
	switch c.AttachMode {
	case datapath.ModeAuto, datapath.ModeTCX, datapath.ModeLegacy:
	default:
		return fmt.Errorf("datapath config: attach mode %q is not one of auto, tcx, legacy", c.AttachMode)
	}
	switch c.HostRouting {
	case datapath.ModeAuto, datapath.RoutingBPF, datapath.ModeLegacy:
	default:
		return fmt.Errorf("datapath config: host routing %q is not one of auto, bpf, legacy", c.HostRouting)
	}
	if c.GatewayV4.IsValid() && (!c.GatewayV4.Is4() || c.GatewayV4.IsUnspecified()) {
		return fmt.Errorf("datapath config: gateway %s is not an IPv4 address", c.GatewayV4)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// decide picks attach mode and host routing from the probes.
func (d *Datapath) decide() error {
	f := d.feats
	switch {
	case d.cfg.AttachMode == datapath.ModeLegacy:
		d.attachMode = datapath.ModeLegacy
		d.decisions = append(d.decisions, api.Decision{Name: "attach", Value: datapath.ModeLegacy, Reason: "legacy: clsact + cls_bpf requested by configuration"})
	case f.TCX.Available:
		d.attachMode = datapath.ModeTCX
		d.decisions = append(d.decisions, api.Decision{Name: "attach", Value: datapath.ModeTCX, Reason: f.TCX.Reason})
	case d.cfg.AttachMode == datapath.ModeTCX:
		return fmt.Errorf("attach mode tcx requested but unavailable (%s): use attach mode auto or legacy", f.TCX.Reason)
	default:
		d.attachMode = datapath.ModeLegacy
		d.decisions = append(d.decisions, api.Decision{Name: "attach", Value: datapath.ModeLegacy, Reason: "legacy: clsact + cls_bpf fallback because " + f.TCX.Reason})
	}

	var missing []string
	for _, c := range []datapath.Capability{f.RedirectPeer, f.FibLookup} {
		if !c.Available {
			missing = append(missing, c.Reason)
		}
	}
	switch {
	case d.cfg.HostRouting == datapath.ModeLegacy:
		d.hostRouting = datapath.ModeLegacy
		d.decisions = append(d.decisions, api.Decision{Name: "host_routing", Value: datapath.ModeLegacy, Reason: "legacy: kernel routing requested by configuration, no programs attached"})
	case len(missing) == 0:
		d.hostRouting = datapath.RoutingBPF
		reason := "bpf: bpf_redirect_peer for local pods, bpf_fib_lookup + bpf_redirect"
		if f.RedirectNeigh.Available {
			reason += "/bpf_redirect_neigh"
		} else {
			reason += " (unresolved neighbours via the stack: " + f.RedirectNeigh.Reason + ")"
		}
		reason += " for the rest (probed)"
		d.decisions = append(d.decisions, api.Decision{Name: "host_routing", Value: datapath.RoutingBPF, Reason: reason})
	case d.cfg.HostRouting == datapath.RoutingBPF:
		return fmt.Errorf("host routing bpf requested but unavailable (%s): use host routing auto or legacy", strings.Join(missing, "; "))
	default:
		d.hostRouting = datapath.ModeLegacy
		d.decisions = append(d.decisions, api.Decision{Name: "host_routing", Value: datapath.ModeLegacy, Reason: "legacy: kernel routing because " + strings.Join(missing, "; ")})
	}

	if err := d.decideDevice(); err != nil { // netkit.go
		return err
	}
	d.decideBigTCP() // bigtcp.go
	d.decideFibCache()
	return nil
}

// decideFibCache: the IPv4 route cache is used with BPF host routing where
// pod_egress loads with it, unless configured off.
func (d *Datapath) decideFibCache() {
	dec := api.Decision{Name: "fib_cache", Value: "off"}
	switch {
	case d.hostRouting != datapath.RoutingBPF:
		dec.Reason = "off: no BPF host routing, the kernel forwards"
	case d.cfg.NoFibCache:
		dec.Reason = "off: --fib-cache=false, every packet to another node is looked up in the FIB"
	case !d.feats.FibCache.Available:
		dec.Reason = "off: " + d.feats.FibCache.Reason
	default:
		d.fibCache = true
		dec.Value = "ipv4"
		dec.Reason = "IPv4 routes to other nodes cached per CPU, used while the netns' route generation (rt_genid) is unchanged; " +
			"neighbours resolved per packet (bpf_redirect_neigh); IPv6 looked up per packet"
	}
	d.decisions = append(d.decisions, dec)
}

// Load probes the kernel, loads the programs (reusing maps pinned under
// cfg.PinDir), attaches the uplink program (adopting a pinned link with an
// in-place program update) and swaps the program of every pinned pod link.
func Load(cfg Config) (*Datapath, error) {
	if err := cfg.normalise(); err != nil {
		return nil, err
	}
	if err := datapath.EnsurePinDir(cfg.PinDir); err != nil {
		return nil, fmt.Errorf("load datapath: %w", err)
	}
	d := &Datapath{cfg: cfg, log: cfg.Logger, feats: datapath.Probe()}
	if err := d.decide(); err != nil {
		return nil, fmt.Errorf("load datapath: %w", err)
	}
	if err := d.loadObjects(); err != nil {
		return nil, fmt.Errorf("load datapath: %w", err)
	}
	if err := d.install(); err != nil {
		d.Close()
		return nil, fmt.Errorf("load datapath: %w", err)
	}
	d.log.Info("datapath loaded", "pinDir", cfg.PinDir, "uplink", cfg.Uplink,
		"attach", d.attachMode, "hostRouting", d.hostRouting)
	return d, nil
}

// loadObjects loads maps (pinned by name) and, for bpf host routing, programs.
func (d *Datapath) loadObjects() error {
	podSpec, err := loadPodEgress()
	if err != nil {
		return fmt.Errorf("parse pod_egress object: %w", err)
	}
	if err := metricsMigration(d.cfg.PinDir, podSpec.Maps["axon_metrics"], d.log); err != nil {
		return err
	}
	opts := &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: d.cfg.PinDir}}
	// The pinned maps the datapath keeps; the programs' private maps (the
	// route cache) are created with each program.
	var maps struct {
		AxonEpV4    *ebpf.Map `ebpf:"axon_ep_v4"`
		AxonEpV6    *ebpf.Map `ebpf:"axon_ep_v6"`
		AxonMetrics *ebpf.Map `ebpf:"axon_metrics"`
	}
	if err := podSpec.LoadAndAssign(&maps, opts); err != nil {
		return fmt.Errorf("load maps: %w", datapath.IncompatibleHint(err, d.cfg.PinDir))
	}
	d.epV4, d.epV6, d.metrics = maps.AxonEpV4, maps.AxonEpV6, maps.AxonMetrics
	if d.hostRouting != datapath.RoutingBPF {
		return nil
	}
	if err := podSpec.Variables["cfg_enable_neigh"].Set(datapath.BoolU8(d.feats.RedirectNeigh.Available)); err != nil {
		return fmt.Errorf("set cfg_enable_neigh: %w", err)
	}
	if err := podSpec.Variables["cfg_fib_cache"].Set(datapath.BoolU8(d.fibCache)); err != nil {
		return fmt.Errorf("set cfg_fib_cache: %w", err)
	}
	var gw [4]byte // network byte order, as the ARP message carries it
	if d.cfg.GatewayV4.Is4() {
		gw = d.cfg.GatewayV4.As4()
	}
	if err := podSpec.Variables["cfg_gateway_v4"].Set(gw); err != nil {
		return fmt.Errorf("set cfg_gateway_v4: %w", err)
	}
	opts.MapReplacements = map[string]*ebpf.Map{
		"axon_ep_v4": d.epV4, "axon_ep_v6": d.epV6, "axon_metrics": d.metrics,
	}
	d.nk.spec = podSpec.Copy() // netkit pods load the same program with cfg_netkit=1
	var pp podEgressPrograms
	if err := podSpec.LoadAndAssign(&pp, opts); err != nil {
		return fmt.Errorf("load axon_pod_egress: %w", datapath.VerifierDetail(err))
	}
	d.podProg = pp.AxonPodEgress
	upSpec, err := loadUplinkIngress()
	if err != nil {
		return fmt.Errorf("parse uplink_ingress object: %w", err)
	}
	var up uplinkIngressPrograms
	if err := upSpec.LoadAndAssign(&up, opts); err != nil {
		return fmt.Errorf("load axon_uplink_ingress: %w", datapath.VerifierDetail(err))
	}
	d.upProg = up.AxonUplinkIngress
	return nil
}

// install attaches (or, for legacy host routing, removes) the programs.
func (d *Datapath) install() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	pods, err := listLinkPins(d.cfg.PinDir)
	if err != nil {
		return err
	}
	if d.hostRouting != datapath.RoutingBPF {
		for _, p := range pods {
			if err := d.detachLocked(p.Role, p.Ifname); err != nil {
				return err
			}
		}
		return nil
	}
	if d.cfg.Uplink == "" {
		return errors.New("uplink device is empty: set Config.Uplink (e.g. eth0) or use host routing legacy")
	}
	if err := d.attachLocked(roleUplink, d.cfg.Uplink, d.upProg); err != nil {
		return err
	}
	for _, p := range pods {
		switch {
		case p.Role == roleUplink && p.Ifname != d.cfg.Uplink:
			// the uplink changed: the old device gets nothing any more
			if err := d.detachLocked(p.Role, p.Ifname); err != nil {
				return err
			}
		case p.Role == rolePod:
			if !datapath.DeviceExists(p.Ifname) {
				continue // left for GCPodLinks
			}
			if err := d.attachLocked(rolePod, p.Ifname, d.podProg); err != nil {
				d.log.Warn("adopt pod link", "ifname", p.Ifname, "err", err)
			}
		}
	}
	return nil
}

// Features returns the probe results found by Load.
func (d *Datapath) Features() []api.Feature { return d.feats.List() }

// Decisions returns attach mode, host routing and device mode with reasons.
func (d *Datapath) Decisions() []api.Decision {
	return append([]api.Decision(nil), d.decisions...)
}

// AttachMode returns "tcx" or "legacy"; HostRouting "bpf" or "legacy".
func (d *Datapath) AttachMode() string  { return d.attachMode }
func (d *Datapath) HostRouting() string { return d.hostRouting }

// Close releases file descriptors. Pins, links and filters stay: forwarding
// continues while the agent is down and the next Load adopts them.
func (d *Datapath) Close() error {
	d.nk.close()
	var errs []error
	for _, c := range []interface{ Close() error }{d.podProg, d.upProg, d.epV4, d.epV6, d.metrics} {
		if c == nil || isNilPtr(c) {
			continue
		}
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

func isNilPtr(c any) bool {
	switch v := c.(type) {
	case *ebpf.Program:
		return v == nil
	case *ebpf.Map:
		return v == nil
	}
	return false
}

// Uninstall detaches every link and filter pinned under pinDir (devices are
// looked up in the current netns) and removes the pins and the directory.
// A missing pinDir is no error.
func Uninstall(pinDir string) error {
	if _, err := os.Stat(pinDir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	ok, err := datapath.IsBPFFS(pinDir)
	if err != nil {
		return fmt.Errorf("uninstall: %w", err)
	}
	if !ok {
		return fmt.Errorf("uninstall: %s is not on a bpf filesystem, refusing to remove it", pinDir)
	}
	pins, err := listLinkPins(pinDir)
	if err != nil {
		return fmt.Errorf("uninstall: %w", err)
	}
	var errs []error
	for _, p := range pins {
		if err := datapath.DetachPin(p, podHook(p.Role, datapath.ModeLegacy)); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("uninstall %s: %w", pinDir, errors.Join(errs...))
	}
	if err := os.RemoveAll(pinDir); err != nil {
		return fmt.Errorf("uninstall: remove pins under %s: %w", pinDir, err)
	}
	return nil
}

// Program names of Datapath.Program (also BenchmarkPrograms' keys).
const (
	ProgPodEgress     = "pod_egress"     // axon_pod_egress
	ProgUplinkIngress = "uplink_ingress" // axon_uplink_ingress
)

// Program is the loaded program named name (ProgPodEgress,
// ProgUplinkIngress), for tests and tools that run it with
// BPF_PROG_TEST_RUN (the fuzzer, internal/datapath/fuzz); nil with legacy
// host routing or for another name.
func (d *Datapath) Program(name string) *ebpf.Program {
	switch name {
	case ProgPodEgress:
		return d.podProg
	case ProgUplinkIngress:
		return d.upProg
	}
	return nil
}
