package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The one way axon attaches a program to a device: Attach puts it on a tc
// hook (a tcx link, or clsact + cls_bpf in legacy mode), AttachLink installs
// any other bpf_link (XDP, netkit). Every attachment is pinned at
// <pinDir>/links/<kind>-<role>-<ifname>, so forwarding continues while the
// agent is down and a restarted agent adopts (updates in place) what it
// finds there instead of flapping it.

// Attach modes (tcx or clsact + cls_bpf, and auto: tcx where the kernel has
// it) and host routing values, as the loaders' decisions show them.
const (
	ModeAuto   = "auto"
	ModeTCX    = "tcx"
	ModeLegacy = "legacy"
	RoutingBPF = "bpf"
)

// ResolveAttachMode turns a loader's requested attach mode into the one it
// uses: legacy when asked, else tcx where the kernel has it; an explicit tcx
// request on a kernel without it is an error that says what to pass instead.
func ResolveAttachMode(requested string) (string, error) {
	switch {
	case requested == ModeLegacy:
		return ModeLegacy, nil
	case ProbeTCX().Available:
		return ModeTCX, nil
	case requested == ModeTCX:
		return "", errors.New("attach mode tcx requested but the kernel has no tcx: use auto or legacy")
	default:
		return ModeLegacy, nil
	}
}

// Pin kinds (the first part of a link pin's name).
const (
	PinTCX = "tcx" // pinned tcx link
	PinTC  = "tc"  // pinned program of a legacy cls_bpf filter (a marker for detach, GC and uninstall)
	PinXDP = "xdp" // pinned XDP link
)

// LegacyPrio is the priority of every cls_bpf filter of axon; the handle
// (Hook.Handle) tells them apart.
const LegacyPrio = 1

// LinksDir is the directory of the link pins under pinDir.
func LinksDir(pinDir string) string { return filepath.Join(pinDir, "links") }

// PinPath is the pin of one attachment: <pinDir>/links/<kind>-<role>-<ifname>.
func PinPath(pinDir, kind, role, ifname string) string {
	return filepath.Join(LinksDir(pinDir), kind+"-"+role+"-"+ifname)
}

// LinkPin is one entry of the links directory.
type LinkPin struct {
	Path, Kind, Role, Ifname string
}

// ListPins lists the links/<kind>-<role>-<ifname> entries under pinDir
// that keep accepts; a missing links directory is an empty list.
func ListPins(pinDir string, keep func(kind, role string) bool) ([]LinkPin, error) {
	ents, err := os.ReadDir(LinksDir(pinDir))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list pinned links: %w", err)
	}
	var out []LinkPin
	for _, e := range ents {
		parts := strings.SplitN(e.Name(), "-", 3)
		if len(parts) != 3 || !keep(parts[0], parts[1]) {
			continue
		}
		out = append(out, LinkPin{Path: filepath.Join(LinksDir(pinDir), e.Name()), Kind: parts[0], Role: parts[1], Ifname: parts[2]})
	}
	return out, nil
}

// DeviceExists reports whether ifname exists in the current netns.
func DeviceExists(ifname string) bool {
	_, err := netlink.LinkByName(ifname)
	return err == nil
}

// ValidIfname checks that ifname can be a device name and a pin name part.
func ValidIfname(ifname string) error {
	if ifname == "" || len(ifname) > 15 || strings.ContainsAny(ifname, "/ \x00") {
		return fmt.Errorf("invalid interface name %q", ifname)
	}
	return nil
}

// Hook is one of axon's places on a device's tc hooks.
type Hook struct {
	Role   string // names the pins: links/tcx-<role>-<ifname>, links/tc-<role>-<ifname>
	Egress bool   // tc egress; false: tc ingress
	Legacy bool   // clsact + cls_bpf filter instead of a tcx link
	First  bool   // tcx: a new link goes to the head of the chain (else appended); an updated one keeps its place
	Handle uint32 // cls_bpf filter handle (prio LegacyPrio), unique per hook among axon's filters
	Filter string // cls_bpf filter name, e.g. "axon_pod"
}

// The link-pin registry: the role of every program axon attaches to a
// device, which names its pins links/<kind>-<role>-<ifname>, and for the tc
// programs the hook and cls_bpf filter (TCHook). Pin names and filter
// handles are a contract with running nodes: a restarted agent finds and
// adopts its attachments by them.
const (
	RolePod       = "pod"      // axon_pod_egress: tc ingress of a pod's host-side veth, or the netkit peer
	RoleUplink    = "uplink"   // axon_uplink_ingress: tc ingress of the uplink
	RoleBandwidth = "bwm"      // axon_uplink_egress (Bandwidth Manager): tc egress of the uplink
	RoleLBIn      = "lbin"     // axon_lb_ingress (nodeport LB): tc ingress of the uplink, first in the chain
	RoleLBOut     = "lbout"    // axon_lb_egress (nodeport LB): tc egress of the uplink, first in the chain
	RoleLBDecap   = "lbdecap"  // axon_lb_decap (DSR backend): tc ingress, first in the chain
	RoleLBXDP     = "lbxdp"    // axon_lb_xdp (nodeport LB): XDP link of the uplink
	RoleVMBTap    = "vmbtap"   // axon_vmb_from_tap (VM-pod bridge bypass): tc ingress of a VM's tap, in the pod netns; pinned under the pod's own dir
	RoleVMBPod    = "vmbpod"   // axon_vmb_from_pod (VM-pod bridge bypass): tc ingress of the VM pod's interface, in the pod netns; pinned as above
	RolePodLBOut  = "podlbout" // axon_podlb_egress (a pod's per-packet Service LB): tc egress of the pod's interface, in the pod netns; pinned under the pod's own dir
	RolePodLBIn   = "podlbin"  // axon_podlb_ingress (same): tc ingress of the pod's interface, first in the chain; pinned as above
	RolePodLBTap  = "podlbtap" // axon_podlb_ingress of a VM pod: tc egress of its tap (what reaches the guest, by the bridge or the VM bypass); pinned as above
)

// TCHooks lists the tc hooks of the registry. Hooks that can share a
// device (the uplink's) have distinct filter handles per direction; all
// filters have prio LegacyPrio, and cls_bpf runs the filters of one prio
// newest first (the LB attaches after the datapath, so it runs first).
func TCHooks() []Hook {
	return []Hook{
		{Role: RolePod, Handle: 0xa10, Filter: "axon_pod"},
		{Role: RoleUplink, Handle: 0xa10, Filter: "axon_uplink"},
		{Role: RoleBandwidth, Egress: true, Handle: 0xa16, Filter: "axon_bwm"},
		{Role: RoleLBIn, First: true, Handle: 0xa17, Filter: "axon_lb"},
		{Role: RoleLBOut, Egress: true, First: true, Handle: 0xa17, Filter: "axon_lb"},
		{Role: RoleLBDecap, First: true, Handle: 0xa18, Filter: "axon_lb"}, // a node can be LB and DSR backend
		{Role: RoleVMBTap, First: true, Handle: 0xa19, Filter: "axon_vmb"}, // devices inside a VM pod's netns
		{Role: RoleVMBPod, First: true, Handle: 0xa19, Filter: "axon_vmb"},
		{Role: RolePodLBOut, Egress: true, First: true, Handle: 0xa1a, Filter: "axon_podlb"}, // a pod's own interface, in its netns
		{Role: RolePodLBIn, First: true, Handle: 0xa1a, Filter: "axon_podlb"},
		{Role: RolePodLBTap, Egress: true, First: true, Handle: 0xa1a, Filter: "axon_podlb"},
	}
}

// TCHook is the registry's hook of role, attached with a tcx link, or with
// legacy set as a cls_bpf filter. An unknown role is a programming error.
func TCHook(role string, legacy bool) Hook {
	for _, h := range TCHooks() {
		if h.Role == role {
			h.Legacy = legacy
			return h
		}
	}
	panic("datapath: no tc hook with role " + role)
}

func (h Hook) parent() uint32 {
	if h.Egress {
		return netlink.HANDLE_MIN_EGRESS
	}
	return netlink.HANDLE_MIN_INGRESS
}

// Attach puts prog on dev's hook h: a tcx link pinned at links/tcx-<role>-<ifname>
// (adopted and updated in place when it is still on dev, replaced when the
// device was re-created), or in legacy mode axon's cls_bpf filter, replaced in
// place, with the program pinned at links/tc-<role>-<ifname>. The attachment
// of the other mode, left from an earlier run, is removed.
func Attach(pinDir string, dev netlink.Link, prog *ebpf.Program, h Hook) error {
	ifname, ifindex := dev.Attrs().Name, dev.Attrs().Index
	tcxPin := PinPath(pinDir, PinTCX, h.Role, ifname)
	tcPin := PinPath(pinDir, PinTC, h.Role, ifname)
	if h.Legacy {
		if err := attachClsBPF(tcPin, dev, prog, h); err != nil {
			return err
		}
		return DetachLink(LinkPin{Path: tcxPin, Kind: PinTCX, Role: h.Role, Ifname: ifname})
	}
	at, what := ebpf.AttachTCXIngress, "tcx"
	if h.Egress {
		at, what = ebpf.AttachTCXEgress, "tcx egress"
	}
	var anchor link.Anchor
	if h.First {
		anchor = link.Head()
	}
	err := AttachLink(tcxPin, "tcx", ifindex, prog, func() (link.Link, error) {
		l, err := link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: prog, Attach: at, Anchor: anchor})
		if err != nil {
			return nil, fmt.Errorf("%s attach to ifindex %d: %w", what, ifindex, err)
		}
		return l, nil
	})
	if err != nil {
		return err
	}
	// a legacy filter left from a previous mode would never run: drop it
	return DetachPin(LinkPin{Path: tcPin, Kind: PinTC, Role: h.Role, Ifname: ifname}, h)
}

// Detach removes hook h from ifname in both modes, with the pins; a missing
// pin or device is fine.
func Detach(pinDir, ifname string, h Hook) error {
	return errors.Join(
		DetachLink(LinkPin{Path: PinPath(pinDir, PinTCX, h.Role, ifname), Kind: PinTCX, Role: h.Role, Ifname: ifname}),
		DetachPin(LinkPin{Path: PinPath(pinDir, PinTC, h.Role, ifname), Kind: PinTC, Role: h.Role, Ifname: ifname}, h),
	)
}

// Attached reports whether hook h of dev holds axon's program right now:
// the pinned tcx link is alive on dev, or (legacy) the filter exists.
func Attached(pinDir string, dev netlink.Link, h Hook) bool {
	if !h.Legacy {
		l, err := link.LoadPinnedLink(PinPath(pinDir, PinTCX, h.Role, dev.Attrs().Name), nil)
		if err != nil {
			return false
		}
		defer l.Close()
		return LinkIfindex(l) == dev.Attrs().Index
	}
	filters, err := netlink.FilterList(dev, h.parent())
	if err != nil {
		return false
	}
	for _, f := range filters {
		if bf, ok := f.(*netlink.BpfFilter); ok && bf.Handle == h.Handle {
			return true
		}
	}
	return false
}

// DetachPin removes one listed attachment of hook h and its pin: a pinned
// link (any kind but PinTC) is detached, a legacy filter deleted when it
// still runs the pinned program. A missing pin or device is fine.
func DetachPin(p LinkPin, h Hook) error {
	if p.Kind != PinTC {
		return DetachLink(p)
	}
	if _, err := os.Stat(p.Path); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	dev, err := netlink.LinkByName(p.Ifname)
	if err == nil { // device gone: the filter went with it
		if err := deleteOwnFilter(p, dev, h); err != nil {
			return err
		}
	}
	if err := os.Remove(p.Path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove pin %s: %w", p.Path, err)
	}
	return nil
}

// LinkIfindex is the device a tcx, XDP or netkit link is on (for a netkit
// peer link, the peer's ifindex); 0 when it is detached or its device gone.
func LinkIfindex(l link.Link) int {
	info, err := l.Info()
	if err != nil {
		return 0
	}
	switch {
	case info.TCX() != nil:
		return int(info.TCX().Ifindex)
	case info.XDP() != nil:
		return int(info.XDP().Ifindex)
	case info.Netkit() != nil:
		return int(info.Netkit().Ifindex)
	}
	return 0
}

// AttachLink is how every pinned bpf_link of axon on a device (tcx, XDP,
// netkit) is installed: a link pinned at pin that is still on ifindex (see
// LinkIfindex) is updated to prog in place (adoption after a restart, no
// gap); a stale one (device gone or re-created under the same name) is
// detached and unpinned; then attach creates a new link, which is pinned at
// pin. kind names the link in errors ("tcx", "XDP", "netkit").
func AttachLink(pin, kind string, ifindex int, prog *ebpf.Program, attach func() (link.Link, error)) error {
	old, err := link.LoadPinnedLink(pin, nil)
	switch {
	case err == nil:
		defer old.Close()
		if LinkIfindex(old) == ifindex {
			if err := old.Update(prog); err != nil {
				return fmt.Errorf("update pinned %s link %s: %w", kind, pin, err)
			}
			return nil
		}
		// device gone or re-created under the same name: replace the link
		_ = old.Detach()
		if err := old.Unpin(); err != nil {
			return fmt.Errorf("unpin stale %s link %s: %w", kind, pin, err)
		}
	case !errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("load pinned %s link %s: %w", kind, pin, err)
	}
	l, err := attach()
	if err != nil {
		return err
	}
	defer l.Close()
	if err := os.MkdirAll(filepath.Dir(pin), 0o700); err != nil {
		_ = l.Detach()
		return fmt.Errorf("create %s: %w", filepath.Dir(pin), err)
	}
	if err := l.Pin(pin); err != nil {
		_ = l.Detach()
		return fmt.Errorf("pin %s link at %s: %w", kind, pin, err)
	}
	return nil
}

// DetachLink detaches the bpf_link pinned at p.Path (tcx, netkit, XDP) and
// removes the pin; a missing pin is fine.
func DetachLink(p LinkPin) error {
	l, err := link.LoadPinnedLink(p.Path, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("detach %s: load pinned link %s: %w", p.Ifname, p.Path, err)
	}
	defer l.Close()
	if err := l.Detach(); err != nil && !errors.Is(err, link.ErrNotSupported) {
		return fmt.Errorf("detach %s link of %s: %w", p.Kind, p.Ifname, err)
	}
	if err := l.Unpin(); err != nil {
		return fmt.Errorf("unpin %s: %w", p.Path, err)
	}
	return nil
}

// clsBPFFilter is axon's cls_bpf filter of hook h: direct action, all
// protocols, prio LegacyPrio, handle h.Handle.
func clsBPFFilter(ifindex, fd int, h Hook) *netlink.BpfFilter {
	return &netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{
			LinkIndex: ifindex,
			Parent:    h.parent(),
			Handle:    h.Handle,
			Priority:  LegacyPrio,
			Protocol:  unix.ETH_P_ALL,
		},
		Fd:           fd,
		Name:         h.Filter,
		DirectAction: true,
	}
}

// attachClsBPF makes sure dev has a clsact qdisc, replaces the cls_bpf
// filter of hook h with one running prog, and pins a clone of prog at pin:
// the marker that detach, GC and Uninstall find the filter by
// (deleteOwnFilter only deletes a filter still running it).
func attachClsBPF(pin string, dev netlink.Link, prog *ebpf.Program, h Hook) error {
	q := &netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: dev.Attrs().Index, Parent: netlink.HANDLE_CLSACT, Handle: netlink.MakeHandle(0xffff, 0)},
		QdiscType:  "clsact",
	}
	if err := netlink.QdiscAdd(q); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("add clsact qdisc: %w", err)
	}
	if err := netlink.FilterReplace(clsBPFFilter(dev.Attrs().Index, prog.FD(), h)); err != nil {
		what := "filter"
		if h.Egress {
			what = "egress filter"
		}
		return fmt.Errorf("replace cls_bpf %s: %w", what, err)
	}
	if err := os.MkdirAll(filepath.Dir(pin), 0o700); err != nil {
		return fmt.Errorf("create %s: %w", filepath.Dir(pin), err)
	}
	if err := os.Remove(pin); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove old pin %s: %w", pin, err)
	}
	c, err := prog.Clone() // Pin on a shared *Program would move its pin
	if err != nil {
		return fmt.Errorf("clone program: %w", err)
	}
	defer c.Close()
	if err := c.Pin(pin); err != nil {
		return fmt.Errorf("pin program at %s: %w", pin, err)
	}
	return nil
}

// DeleteOwnFilter is deleteOwnFilter for callers that look for one pinned
// program's filter in several netns (the VM-pod bridge bypass's uninstall
// does not know which pod netns holds it) and remove the pin themselves.
func DeleteOwnFilter(p LinkPin, dev netlink.Link, h Hook) error { return deleteOwnFilter(p, dev, h) }

// deleteOwnFilter removes the cls_bpf filter of hook h from dev in the
// current netns, but only when it still runs the program pinned at p.Path:
// called from another netns (or after someone replaced the filter) it
// touches nothing.
func deleteOwnFilter(p LinkPin, dev netlink.Link, h Hook) error {
	prog, err := ebpf.LoadPinnedProgram(p.Path, nil)
	if err != nil {
		return fmt.Errorf("load pinned program %s: %w", p.Path, err)
	}
	defer prog.Close()
	info, err := prog.Info()
	if err != nil {
		return fmt.Errorf("program info of %s: %w", p.Path, err)
	}
	id, ok := info.ID()
	if !ok {
		return fmt.Errorf("program id of %s: not supported by the kernel", p.Path)
	}
	filters, err := netlink.FilterList(dev, h.parent())
	if err != nil {
		return nil // no clsact: nothing of ours there
	}
	for _, f := range filters {
		bf, ok := f.(*netlink.BpfFilter)
		if !ok || bf.Handle != h.Handle || bf.Priority != LegacyPrio || bf.Id != int(id) {
			continue
		}
		del := h
		del.Filter = ""
		if err := netlink.FilterDel(clsBPFFilter(dev.Attrs().Index, 0, del)); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("delete cls_bpf filter on %s: %w", p.Ifname, err)
		}
	}
	return nil
}

// PinnedProgram opens the program of an attachment pin: the pinned program of
// a legacy filter, the program of a pinned link. The caller closes it.
func PinnedProgram(p LinkPin) (*ebpf.Program, error) {
	if p.Kind == PinTC {
		prog, err := ebpf.LoadPinnedProgram(p.Path, nil)
		if err != nil {
			return nil, fmt.Errorf("open %s: %w", p.Path, err)
		}
		return prog, nil
	}
	l, err := link.LoadPinnedLink(p.Path, nil)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", p.Path, err)
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		return nil, fmt.Errorf("%s: link info: %w", p.Path, err)
	}
	prog, err := ebpf.NewProgramFromID(info.Program)
	if err != nil {
		return nil, fmt.Errorf("%s: program %d: %w", p.Path, info.Program, err)
	}
	return prog, nil
}
