// Package podlb attaches a pod's own per-packet Service load balancer
// (bpf/pod_lb.c) to the pod's interface, inside the pod's netns: for the pods
// whose sockets the socket LB leaves alone (the axon.io/socket-lb: disabled
// opt-out, --socket-lb-mode hostns-only), which would otherwise reach no
// ClusterIP. It reads the socket LB's service maps (pinned in the node's pin
// dir, written by socklb.LB) and keeps, per pod, its own flow table and
// counters, pinned with its links under <pin dir>/podlb/<id>.
package podlb

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/netnsutil"
)

// counterNames mirror enum axon_podlb_counter (same order; enums_btf_test.go
// checks them against the object's BTF).
var counterNames = []string{
	"new",          // egress: a new flow to a frontend got a backend
	"hit",          // egress: a packet of a known flow rewritten to its backend
	"reply",        // ingress: a reply given its frontend back as source
	"reselect",     // egress: a known flow's backend was gone or unusable at a SYN or UDP datagram
	"no_backend",   // egress: a frontend without a usable backend: dropped
	"untracked",    // egress: TCP without SYN to a frontend, no flow known: passed untranslated
	"fragment",     // egress: an IP fragment to a frontend: passed untranslated
	"ct_fail",      // egress: the flow table refused the flow: dropped
	"rewrite_fail", // a header write failed: dropped
	"stale_rev",    // egress: a new direct TCP connection removed an old translated flow's reverse entry on its tuple
	"rev_restored", // egress: a known flow's reverse entry, evicted by the LRU, written again at a SYN or UDP datagram
}

// CounterNames lists the counters' names in enum order.
func CounterNames() []string { return append([]string(nil), counterNames...) }

// Pin names of a pod's own maps, in PodPinDir.
const (
	CTMapName    = "axon_podlb_ct"
	StatsMapName = "axon_podlb_stats"
)

// sharedMaps are the socket LB's maps the programs read (lb_select), pinned
// by name in the node's pin dir by socklb.LB.
var sharedMaps = []string{"axon_lb_svc", "axon_lb_be", "axon_lb_aff"}

// DefaultIfname is the pod interface the LB attaches to.
const DefaultIfname = "eth0"

// Config is where the pod LB keeps its pins and how it attaches.
type Config struct {
	PinDir     string // the node's bpffs dir (the socket LB's maps are there); each pod's LB is pinned under PinDir/podlb/<id>
	AttachMode string // auto | tcx | legacy
	CTSize     uint32 // entries of each pod's flow table (two per flow); 0: the object's default (8192)
	Logger     *slog.Logger
}

// LB attaches and removes the per-packet LB of the node's pods. Its state is
// in the pins: a restarted agent finds what the last one attached.
type LB struct {
	cfg  Config
	mode string
	log  *slog.Logger
}

// New checks cfg and chooses the attach mode (tcx where the kernel has it).
func New(cfg Config) (*LB, error) {
	if cfg.PinDir == "" {
		return nil, errors.New("pod LB: pin dir is empty: set a bpffs directory such as /sys/fs/bpf/axon")
	}
	if cfg.CTSize != 0 && (cfg.CTSize < 64 || cfg.CTSize > 1<<20) {
		return nil, fmt.Errorf("pod LB: flow table size %d out of range 64 … 1048576", cfg.CTSize)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	mode, err := datapath.ResolveAttachMode(cfg.AttachMode)
	if err != nil {
		return nil, fmt.Errorf("pod LB: %w", err)
	}
	return &LB{cfg: cfg, mode: mode, log: cfg.Logger}, nil
}

// AttachMode returns "tcx" or "legacy".
func (l *LB) AttachMode() string { return l.mode }

var idRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

func validID(id string) error {
	if !idRE.MatchString(id) {
		return fmt.Errorf("invalid pod LB id %q: 1-64 characters of letters, digits, '_', '.', '-', starting with a letter or digit (use the pod UID)", id)
	}
	return nil
}

// PodPinDir is where the LB of pod id is pinned: its maps and
// links/<tcx|tc>-<podlbout|podlbin|podlbtap>-<ifname>.
func PodPinDir(pinDir, id string) string { return filepath.Join(pinDir, "podlb", id) }

func (l *LB) hook(role string) datapath.Hook {
	return datapath.TCHook(role, l.mode == datapath.ModeLegacy)
}

// Target is what a pod's LB attaches to, in the pod's netns.
type Target struct {
	// Ifname is the pod's interface (DefaultIfname when empty): what the
	// workload sends is translated at its tc egress, the replies at its tc
	// ingress.
	Ifname string
	// Tap, for a VM pod (KubeVirt's bridge binding), is the VM's tap: the
	// replies are translated at its tc egress instead, after whichever path
	// (the in-pod bridge or the VM bypass) carried them toward the guest, so
	// nothing on the pod interface's ingress (the bypass's redirect) comes
	// first. The guest's packets leave through the pod interface's egress
	// either way.
	Tap string
}

// Attach puts the LB on target in the netns at netnsPath, pinned under
// PodPinDir(id): the replies' program first, then the egress one, so no flow
// is translated whose replies would not be. Idempotent: an attached LB is
// updated in place, its flow table and counters kept; a reply program left on
// the other place (the pod became, or stopped being, a VM pod) is removed.
// The socket LB's maps must be pinned in the pin dir (the agent runs the
// socket LB).
func (l *LB) Attach(id, netnsPath string, target Target) error {
	if err := validID(id); err != nil {
		return err
	}
	ifname := target.Ifname
	if ifname == "" {
		ifname = DefaultIfname
	}
	for _, n := range []string{ifname, target.Tap} {
		if n == "" {
			continue
		}
		if err := datapath.ValidIfname(n); err != nil {
			return fmt.Errorf("attach pod LB %s: %w", id, err)
		}
	}
	cookie, err := netnsutil.Cookie(netnsPath)
	if err != nil {
		return fmt.Errorf("attach pod LB %s: netns cookie of %s: %w", id, netnsPath, err)
	}
	spec, err := loadPodLB()
	if err != nil {
		return fmt.Errorf("attach pod LB %s: parse pod_lb object: %w", id, err)
	}
	if err := spec.Variables["cfg_netns_cookie"].Set(cookie); err != nil {
		return fmt.Errorf("attach pod LB %s: set cfg_netns_cookie: %w", id, err)
	}
	// The shared maps as pinned (the socket LB may have resized them).
	for _, name := range sharedMaps {
		m, err := ebpf.LoadPinnedMap(filepath.Join(l.cfg.PinDir, name), nil)
		if err != nil {
			return fmt.Errorf("attach pod LB %s: the socket LB's %s is not pinned in %s (the pod LB serves the socket LB's Services: run the agent with the socket LB on): %w", id, name, l.cfg.PinDir, err)
		}
		info, err := m.Info()
		m.Close()
		if err != nil {
			return fmt.Errorf("attach pod LB %s: %s: %w", id, name, err)
		}
		spec.Maps[name].MaxEntries = info.MaxEntries
	}
	dir := PodPinDir(l.cfg.PinDir, id)
	if err := datapath.EnsurePinDir(dir); err != nil {
		return fmt.Errorf("attach pod LB %s: %w", id, err)
	}
	if l.cfg.CTSize != 0 {
		spec.Maps[CTMapName].MaxEntries = l.cfg.CTSize
	}
	own, err := podMaps(spec, dir)
	if err != nil {
		return fmt.Errorf("attach pod LB %s: %w", id, err)
	}
	defer func() {
		for _, m := range own {
			m.Close()
		}
	}()
	var progs podLBPrograms
	opts := &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: l.cfg.PinDir}, MapReplacements: own}
	if err := spec.LoadAndAssign(&progs, opts); err != nil {
		return fmt.Errorf("attach pod LB %s: load: %w", id, datapath.VerifierDetail(datapath.IncompatibleHint(err, l.cfg.PinDir)))
	}
	defer progs.Close()
	err = netnsutil.DoAt(netnsPath, func() error {
		dev, err := netlink.LinkByName(ifname)
		if err != nil {
			return fmt.Errorf("pod interface %s: %w", ifname, err)
		}
		replyDev, replyRole, otherRole := dev, datapath.RolePodLBIn, datapath.RolePodLBTap
		if target.Tap != "" {
			if replyDev, err = netlink.LinkByName(target.Tap); err != nil {
				return fmt.Errorf("VM tap %s: %w", target.Tap, err)
			}
			replyRole, otherRole = datapath.RolePodLBTap, datapath.RolePodLBIn
		}
		if err := datapath.Attach(dir, replyDev, progs.AxonPodlbIngress, l.hook(replyRole)); err != nil {
			return fmt.Errorf("%s replies: %w", replyDev.Attrs().Name, err)
		}
		if err := datapath.Attach(dir, dev, progs.AxonPodlbEgress, l.hook(datapath.RolePodLBOut)); err != nil {
			return fmt.Errorf("%s egress: %w", ifname, err)
		}
		stale, err := datapath.ListPins(dir, func(_, role string) bool { return role == otherRole })
		if err != nil {
			return err
		}
		for _, p := range stale {
			if err := datapath.DetachPin(p, datapath.TCHook(p.Role, true)); err != nil {
				return fmt.Errorf("remove the reply program's old place: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("attach pod LB %s in %s: %w", id, netnsPath, err)
	}
	l.log.Info("pod LB attached", "id", id, "netns", netnsPath, "ifname", ifname, "tap", target.Tap, "attach", l.mode)
	return nil
}

// podMaps opens the pod's pinned flow table and counters, or creates and pins
// them (spec's sizes) the first time.
func podMaps(spec *ebpf.CollectionSpec, dir string) (map[string]*ebpf.Map, error) {
	out := map[string]*ebpf.Map{}
	for _, name := range []string{CTMapName, StatsMapName} {
		pin := filepath.Join(dir, name)
		m, err := ebpf.LoadPinnedMap(pin, nil)
		if err == nil {
			if err := spec.Maps[name].Compatible(m); err != nil {
				// another size asked: a new table (the old flows are re-chosen)
				m.Close()
				if err := os.Remove(pin); err != nil {
					return nil, fmt.Errorf("replace %s: %w", pin, err)
				}
				m = nil
			}
		} else if !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("open %s: %w", pin, err)
		}
		if m == nil {
			if m, err = ebpf.NewMap(spec.Maps[name]); err != nil {
				return nil, fmt.Errorf("create %s: %w", name, err)
			}
			if err := m.Pin(pin); err != nil {
				m.Close()
				return nil, fmt.Errorf("pin %s: %w", pin, err)
			}
		}
		out[name] = m
	}
	return out, nil
}

// Detach removes pod id's LB: the egress program first (no new translation),
// then the replies' one, then the pins. A netns or device that is gone is
// fine (its programs went with it).
func (l *LB) Detach(id, netnsPath string) error {
	if err := validID(id); err != nil {
		return err
	}
	dir := PodPinDir(l.cfg.PinDir, id)
	pins, err := datapath.ListPins(dir, isPodLBRole)
	if err != nil {
		return fmt.Errorf("detach pod LB %s: %w", id, err)
	}
	// egress first
	for i, p := range pins {
		if p.Role == datapath.RolePodLBOut && i != 0 {
			pins[0], pins[i] = pins[i], pins[0]
		}
	}
	var errs []error
	err = netnsutil.DoAt(netnsPath, func() error {
		for _, p := range pins {
			errs = append(errs, datapath.DetachPin(p, datapath.TCHook(p.Role, true)))
		}
		return nil
	})
	if err != nil {
		if _, serr := os.Stat(netnsPath); serr == nil {
			return fmt.Errorf("detach pod LB %s: enter %s: %w", id, netnsPath, err)
		}
		for _, p := range pins { // netns gone: drop the pins only
			errs = append(errs, removePin(p.Path))
		}
	}
	errs = append(errs, removePin(filepath.Join(dir, CTMapName)), removePin(filepath.Join(dir, StatsMapName)),
		removePin(datapath.LinksDir(dir)), removePin(dir))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("detach pod LB %s: %w", id, err)
	}
	l.log.Info("pod LB detached", "id", id, "netns", netnsPath)
	return nil
}

func isPodLBRole(_, role string) bool {
	return role == datapath.RolePodLBOut || role == datapath.RolePodLBIn || role == datapath.RolePodLBTap
}

func removePin(p string) error { return datapath.RemovePin(p) }

// Counters reads pod id's counters, summed over CPUs, by name.
func (l *LB) Counters(id string) (map[string]uint64, error) {
	if err := validID(id); err != nil {
		return nil, err
	}
	pin := filepath.Join(PodPinDir(l.cfg.PinDir, id), StatsMapName)
	m, err := ebpf.LoadPinnedMap(pin, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("pod LB %s is not attached (no %s)", id, pin)
	}
	if err != nil {
		return nil, fmt.Errorf("pod LB %s: open counters: %w", id, err)
	}
	defer m.Close()
	out := make(map[string]uint64, len(counterNames))
	for i, name := range counterNames {
		var per []uint64
		if err := m.Lookup(uint32(i), &per); err != nil {
			return nil, fmt.Errorf("pod LB %s: read counter %s: %w", id, name, err)
		}
		for _, v := range per {
			out[name] += v
		}
	}
	return out, nil
}

// Attached lists the pods (ids) with an LB pinned under pinDir.
func Attached(pinDir string) ([]string, error) {
	ents, err := os.ReadDir(filepath.Join(pinDir, "podlb"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("pod LB: list %s: %w", pinDir, err)
	}
	var ids []string
	for _, e := range ents {
		if e.IsDir() && validID(e.Name()) == nil {
			ids = append(ids, e.Name())
		}
	}
	return ids, nil
}

// Uninstall removes every pod LB pinned under pinDir (axon uninstall): tcx
// links by their pins; legacy cls_bpf filters, which live in the pods' netns,
// by looking for each pinned program's filter in every netns of netnsPaths
// (only a filter still running the pinned program is deleted); then the pins.
// A netns that cannot be entered is skipped.
func Uninstall(pinDir string, netnsPaths []string) error {
	ids, err := Attached(pinDir)
	if err != nil {
		return err
	}
	var errs []error
	for _, id := range ids {
		errs = append(errs, datapath.UninstallPodDir(PodPinDir(pinDir, id), isPodLBRole, netnsPaths, CTMapName, StatsMapName))
	}
	errs = append(errs, removePin(filepath.Join(pinDir, "podlb")))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("uninstall pod LB: %w", err)
	}
	return nil
}

// Programs returns pod id's attached programs (egress, and the replies'),
// from their pins, for tools that run them directly (the fuzzer). The caller
// closes them.
func (l *LB) Programs(id string) (egress, replies *ebpf.Program, err error) {
	if err := validID(id); err != nil {
		return nil, nil, err
	}
	pins, err := datapath.ListPins(PodPinDir(l.cfg.PinDir, id), isPodLBRole)
	if err != nil {
		return nil, nil, err
	}
	for _, p := range pins {
		prog, err := datapath.PinnedProgram(p)
		if err != nil {
			egress.Close()
			replies.Close()
			return nil, nil, fmt.Errorf("pod LB %s: %w", id, err)
		}
		if p.Role == datapath.RolePodLBOut {
			egress = prog
		} else {
			replies = prog
		}
	}
	if egress == nil || replies == nil {
		egress.Close()
		replies.Close()
		return nil, nil, fmt.Errorf("pod LB %s is not attached (pins %v)", id, pins)
	}
	return egress, replies, nil
}
