package vmbypass

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/netnsutil"
)

// counterNames mirror enum axon_vmb_counter (same order; enums_btf_test.go
// checks them against the object's BTF).
var counterNames = []string{
	"tap_frames",     // guest -> node frames redirected from the tap to the pod interface
	"tap_bytes",      // their bytes
	"pod_frames",     // node -> guest frames redirected from the pod interface to the tap
	"pod_bytes",      // their bytes
	"tap_to_bridge",  // guest frames to the bridge's own MAC, passed to the bridge
	"tap_bcast_copy", // guest broadcast/multicast also delivered to the bridge itself
	"redirect_fail",  // redirects the helper refused (the frame took the bridge path)
}

// DefaultPodIfname is the pod interface of a VM pod (KubeVirt enslaves it to
// its bridge k6t-eth0).
const DefaultPodIfname = "eth0"

// StatsMapName is the per-pod counter map's pin name (in the pod's dir).
const StatsMapName = "axon_vmb_stats"

// Reason says why a pod netns does not have the bridge-binding layout.
type Reason string

// Reasons of a LayoutError.
const (
	ReasonNoNetns        Reason = "netns_unavailable"         // the pod's netns cannot be entered
	ReasonNoPodInterface Reason = "no_pod_interface"          // the pod interface does not exist
	ReasonNotBridged     Reason = "pod_interface_not_bridged" // the pod interface is not a port of a Linux bridge
	ReasonNoTap          Reason = "no_tap"                    // the bridge has no tap port (no VM, or not the bridge binding)
	ReasonSeveralTaps    Reason = "several_taps"              // the bridge has more than one tap: which guest is the pod's is ambiguous
	ReasonOtherPorts     Reason = "other_bridge_ports"        // the bridge has ports besides the pod interface and the tap: the bypass would cut them off
)

// LayoutError is Detect's answer for a netns without the bridge-binding
// layout: why, and what was found.
type LayoutError struct {
	Reason Reason
	Detail string
}

func (e *LayoutError) Error() string {
	return fmt.Sprintf("no VM bridge-binding layout (%s): %s", e.Reason, e.Detail)
}

// ReasonOf returns the reason of a LayoutError in err's chain, or "".
func ReasonOf(err error) Reason {
	var le *LayoutError
	if errors.As(err, &le) {
		return le.Reason
	}
	return ""
}

// Layout is a VM pod's bridge binding as found in its netns.
type Layout struct {
	Bridge, Tap, Pod                string // device names
	BridgeIndex, TapIndex, PodIndex int    // their ifindexes in the pod netns
	BridgeMAC                       net.HardwareAddr
}

// Detect looks into the netns at netnsPath for KubeVirt's bridge binding: a
// Linux bridge enslaving the pod interface podIf (DefaultPodIfname when
// empty) and exactly one tap device, and nothing else. Anything else is a
// *LayoutError with the reason.
func Detect(netnsPath, podIf string) (Layout, error) {
	if podIf == "" {
		podIf = DefaultPodIfname
	}
	if err := datapath.ValidIfname(podIf); err != nil {
		return Layout{}, fmt.Errorf("detect VM layout: pod interface: %w", err)
	}
	var l Layout
	var lerr error
	err := netnsutil.DoAt(netnsPath, func() error {
		l, lerr = detect(podIf)
		return nil
	})
	if err != nil {
		return Layout{}, &LayoutError{Reason: ReasonNoNetns, Detail: err.Error()}
	}
	return l, lerr
}

// detect is Detect in the current netns.
func detect(podIf string) (Layout, error) {
	pod, err := netlink.LinkByName(podIf)
	if err != nil {
		return Layout{}, &LayoutError{Reason: ReasonNoPodInterface, Detail: fmt.Sprintf("%s: %v", podIf, err)}
	}
	master := pod.Attrs().MasterIndex
	var br netlink.Link
	if master != 0 {
		br, err = netlink.LinkByIndex(master)
		if err != nil {
			return Layout{}, fmt.Errorf("detect VM layout: master %d of %s: %w", master, podIf, err)
		}
	}
	if br == nil || br.Type() != "bridge" {
		return Layout{}, &LayoutError{Reason: ReasonNotBridged, Detail: podIf + " is not a port of a Linux bridge"}
	}
	links, err := netlink.LinkList()
	if err != nil {
		return Layout{}, fmt.Errorf("detect VM layout: list devices: %w", err)
	}
	var taps, others []string
	var tap netlink.Link
	for _, lk := range links {
		a := lk.Attrs()
		if a.MasterIndex != master || a.Index == pod.Attrs().Index {
			continue
		}
		if tt, ok := lk.(*netlink.Tuntap); ok && tt.Mode == netlink.TUNTAP_MODE_TAP {
			taps = append(taps, a.Name)
			tap = lk
			continue
		}
		others = append(others, a.Name+" ("+lk.Type()+")")
	}
	switch {
	case len(taps) == 0:
		return Layout{}, &LayoutError{Reason: ReasonNoTap, Detail: fmt.Sprintf("bridge %s has no tap port", br.Attrs().Name)}
	case len(taps) > 1:
		return Layout{}, &LayoutError{Reason: ReasonSeveralTaps, Detail: fmt.Sprintf("bridge %s has taps %v", br.Attrs().Name, taps)}
	case len(others) > 0:
		return Layout{}, &LayoutError{Reason: ReasonOtherPorts, Detail: fmt.Sprintf("bridge %s also enslaves %v", br.Attrs().Name, others)}
	}
	return Layout{
		Bridge: br.Attrs().Name, Tap: tap.Attrs().Name, Pod: podIf,
		BridgeIndex: br.Attrs().Index, TapIndex: tap.Attrs().Index, PodIndex: pod.Attrs().Index,
		BridgeMAC: br.Attrs().HardwareAddr,
	}, nil
}

// Config is where the bypass keeps its pins and how it attaches.
type Config struct {
	PinDir     string // the node's bpffs dir; each pod's bypass is pinned under PinDir/vmbypass/<id>
	AttachMode string // auto | tcx | legacy
	Logger     *slog.Logger
}

// Bypass attaches and removes the VM-pod bridge bypass of the node's VM
// pods. It keeps no state of its own: everything is in the pins, so a
// restarted agent finds what the last one attached.
type Bypass struct {
	cfg  Config
	mode string // datapath.ModeTCX | datapath.ModeLegacy
	log  *slog.Logger
}

// New checks cfg and chooses the attach mode (tcx where the kernel has it).
func New(cfg Config) (*Bypass, error) {
	if cfg.PinDir == "" {
		return nil, errors.New("VM bypass: pin dir is empty: set a bpffs directory such as /sys/fs/bpf/axon")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	b := &Bypass{cfg: cfg, log: cfg.Logger}
	mode, err := datapath.ResolveAttachMode(cfg.AttachMode)
	if err != nil {
		return nil, fmt.Errorf("VM bypass: %w", err)
	}
	b.mode = mode
	return b, nil
}

// AttachMode returns "tcx" or "legacy".
func (b *Bypass) AttachMode() string { return b.mode }

var idRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

// validID checks a pod's bypass id: it names a directory under the pin dir.
func validID(id string) error {
	if !idRE.MatchString(id) {
		return fmt.Errorf("invalid VM bypass id %q: 1-64 characters of letters, digits, '_', '.', '-', starting with a letter or digit (use the pod UID)", id)
	}
	return nil
}

// PodPinDir is where the bypass of pod id is pinned: its counter map and
// links/<tcx|tc>-<vmbtap|vmbpod>-<ifname>.
func PodPinDir(pinDir, id string) string { return filepath.Join(pinDir, "vmbypass", id) }

func (b *Bypass) hook(role string) datapath.Hook {
	return datapath.TCHook(role, b.mode == datapath.ModeLegacy)
}

// Attach detects the layout in the netns at netnsPath (see Detect) and puts
// the bypass on it, pinned under PodPinDir(id): the pod interface's program
// first, then the tap's, so that each direction switches over whole.
// Idempotent: an attached bypass is updated in place (its counters kept). A
// netns without the layout gets nothing and returns Detect's *LayoutError.
func (b *Bypass) Attach(id, netnsPath, podIf string) (Layout, error) {
	if err := validID(id); err != nil {
		return Layout{}, err
	}
	l, err := Detect(netnsPath, podIf)
	if err != nil {
		return Layout{}, err
	}
	dir := PodPinDir(b.cfg.PinDir, id)
	if err := datapath.EnsurePinDir(dir); err != nil {
		return Layout{}, fmt.Errorf("attach VM bypass %s: %w", id, err)
	}
	spec, err := loadVmBypass()
	if err != nil {
		return Layout{}, fmt.Errorf("attach VM bypass %s: parse vm_bypass object: %w", id, err)
	}
	var mac [6]byte
	copy(mac[:], l.BridgeMAC)
	for name, v := range map[string]any{
		"cfg_tap_ifindex": uint32(l.TapIndex), "cfg_pod_ifindex": uint32(l.PodIndex),
		"cfg_bridge_ifindex": uint32(l.BridgeIndex), "cfg_bridge_mac": mac,
	} {
		if err := spec.Variables[name].Set(v); err != nil {
			return Layout{}, fmt.Errorf("attach VM bypass %s: set %s: %w", id, name, err)
		}
	}
	var objs vmBypassObjects
	opts := &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: dir}}
	if err := spec.LoadAndAssign(&objs, opts); err != nil {
		return Layout{}, fmt.Errorf("attach VM bypass %s: load: %w", id, datapath.VerifierDetail(datapath.IncompatibleHint(err, dir)))
	}
	defer objs.Close()
	err = netnsutil.DoAt(netnsPath, func() error {
		// the ifindexes baked into the programs must still name these devices
		now, err := detect(l.Pod)
		if err != nil {
			return err
		}
		if now.TapIndex != l.TapIndex || now.PodIndex != l.PodIndex || now.BridgeIndex != l.BridgeIndex {
			return fmt.Errorf("layout changed while attaching (tap %s ifindex %d -> %d): retry", l.Tap, l.TapIndex, now.TapIndex)
		}
		pod, err := netlink.LinkByIndex(l.PodIndex)
		if err != nil {
			return fmt.Errorf("pod interface %s: %w", l.Pod, err)
		}
		tap, err := netlink.LinkByIndex(l.TapIndex)
		if err != nil {
			return fmt.Errorf("tap %s: %w", l.Tap, err)
		}
		if err := datapath.Attach(dir, pod, objs.AxonVmbFromPod, b.hook(datapath.RoleVMBPod)); err != nil {
			return fmt.Errorf("pod interface %s: %w", l.Pod, err)
		}
		if err := datapath.Attach(dir, tap, objs.AxonVmbFromTap, b.hook(datapath.RoleVMBTap)); err != nil {
			_ = datapath.Detach(dir, l.Pod, datapath.TCHook(datapath.RoleVMBPod, false))
			return fmt.Errorf("tap %s: %w", l.Tap, err)
		}
		return nil
	})
	if err != nil {
		return Layout{}, fmt.Errorf("attach VM bypass %s in %s: %w", id, netnsPath, err)
	}
	b.log.Info("VM bypass attached", "id", id, "netns", netnsPath, "tap", l.Tap, "pod_if", l.Pod, "bridge", l.Bridge, "attach", b.mode)
	return l, nil
}

// Detach removes pod id's bypass: the tap's program first (the guest's
// frames go back to the bridge), then the pod interface's, then the pins.
// The bridge path carries the traffic again at once; its forwarding database
// relearns the guest's MAC from the next frame (until then it floods). A
// netns or device that is gone is fine (its programs went with it).
func (b *Bypass) Detach(id, netnsPath string) error {
	if err := validID(id); err != nil {
		return err
	}
	dir := PodPinDir(b.cfg.PinDir, id)
	pins, err := datapath.ListPins(dir, isVMBRole)
	if err != nil {
		return fmt.Errorf("detach VM bypass %s: %w", id, err)
	}
	slices.SortStableFunc(pins, func(a, b datapath.LinkPin) int { // the tap's first
		rank := func(p datapath.LinkPin) int {
			if p.Role == datapath.RoleVMBTap {
				return 0
			}
			return 1
		}
		return cmp.Compare(rank(a), rank(b))
	})
	var errs []error
	detach := func() error {
		for _, p := range pins {
			errs = append(errs, datapath.DetachPin(p, datapath.TCHook(p.Role, true)))
		}
		return nil
	}
	if err := netnsutil.DoAt(netnsPath, detach); err != nil {
		// netns gone: its devices and their filters went with it; the tcx
		// links are already detached; drop the pins only
		if _, serr := os.Stat(netnsPath); serr == nil {
			return fmt.Errorf("detach VM bypass %s: enter %s: %w", id, netnsPath, err)
		}
		for _, p := range pins {
			errs = append(errs, removePin(p.Path))
		}
	}
	errs = append(errs, removePin(filepath.Join(dir, StatsMapName)), removePin(datapath.LinksDir(dir)), removePin(dir))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("detach VM bypass %s: %w", id, err)
	}
	b.log.Info("VM bypass detached", "id", id, "netns", netnsPath)
	return nil
}

func removePin(p string) error { return datapath.RemovePin(p) }

func isVMBRole(_, role string) bool {
	return role == datapath.RoleVMBTap || role == datapath.RoleVMBPod
}

// Stats is the state of one pod's bypass: its counters (summed over CPUs,
// by counter name) and whether both programs are still attached. A tap
// that disappeared (the VM stopped, or it was re-created: its program went
// with it) shows as TapAttached false with Problem saying so: remove the
// bypass (Detach) and attach again if a new tap is there.
type Stats struct {
	Counters    map[string]uint64
	TapAttached bool
	PodAttached bool
	Problem     string // empty while the bypass is whole
}

// Stats reads pod id's counters and checks its attachments in the netns at
// netnsPath against the layout there now.
func (b *Bypass) Stats(id, netnsPath string) (Stats, error) {
	if err := validID(id); err != nil {
		return Stats{}, err
	}
	dir := PodPinDir(b.cfg.PinDir, id)
	m, err := ebpf.LoadPinnedMap(filepath.Join(dir, StatsMapName), nil)
	if errors.Is(err, os.ErrNotExist) {
		return Stats{}, fmt.Errorf("VM bypass %s is not attached (no %s under %s)", id, StatsMapName, dir)
	}
	if err != nil {
		return Stats{}, fmt.Errorf("VM bypass %s: open counters: %w", id, err)
	}
	defer m.Close()
	st := Stats{Counters: make(map[string]uint64, len(counterNames))}
	for i, name := range counterNames {
		var per []uint64
		if err := m.Lookup(uint32(i), &per); err != nil {
			return Stats{}, fmt.Errorf("VM bypass %s: read counter %s: %w", id, name, err)
		}
		for _, v := range per {
			st.Counters[name] += v
		}
	}
	pins, err := datapath.ListPins(dir, isVMBRole)
	if err != nil {
		return Stats{}, fmt.Errorf("VM bypass %s: %w", id, err)
	}
	err = netnsutil.DoAt(netnsPath, func() error {
		for _, p := range pins {
			dev, err := netlink.LinkByName(p.Ifname)
			if err != nil {
				continue
			}
			ok := datapath.Attached(dir, dev, datapath.TCHook(p.Role, p.Kind == datapath.PinTC))
			switch p.Role {
			case datapath.RoleVMBTap:
				st.TapAttached = ok
			case datapath.RoleVMBPod:
				st.PodAttached = ok
			}
		}
		return nil
	})
	switch {
	case err != nil:
		st.Problem = fmt.Sprintf("pod netns %s is gone: detach the bypass", netnsPath)
	case !st.TapAttached:
		st.Problem = "the tap is gone or re-created (its program went with it): detach the bypass, attach again when a new tap is there"
	case !st.PodAttached:
		st.Problem = "the pod interface lost its program: detach and attach again"
	}
	return st, nil
}

// Uninstall removes every VM bypass pinned under pinDir (axon uninstall):
// tcx links by their pins; legacy cls_bpf filters, which live in the pods'
// netns, by looking for each pinned program's filter in every netns of
// netnsPaths (the node's pod netns; only a filter still running the pinned
// program is deleted, so the wrong netns is left alone); then the pins. A
// netns that cannot be entered is skipped.
func Uninstall(pinDir string, netnsPaths []string) error {
	root := filepath.Join(pinDir, "vmbypass")
	ents, err := os.ReadDir(root)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("uninstall VM bypass: %w", err)
	}
	var errs []error
	for _, e := range ents {
		errs = append(errs, datapath.UninstallPodDir(filepath.Join(root, e.Name()), isVMBRole, netnsPaths, StatsMapName))
	}
	errs = append(errs, removePin(root))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("uninstall VM bypass: %w", err)
	}
	return nil
}
