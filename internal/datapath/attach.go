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

const (
	rolePod    = "pod"
	roleUplink = "uplink"

	pinTCX = "tcx" // pinned tcx link
	pinTC  = "tc"  // pinned program of a legacy cls_bpf filter

	// legacyHandle/legacyPrio identify axon's cls_bpf filter on a device's
	// clsact ingress hook, so it is replaced in place and removed precisely.
	legacyHandle = 0xa10
	legacyPrio   = 1
)

func linksDir(pinDir string) string { return filepath.Join(pinDir, "links") }

func pinPath(pinDir, kind, role, ifname string) string {
	return filepath.Join(linksDir(pinDir), kind+"-"+role+"-"+ifname)
}

type linkPin struct {
	path, kind, role, ifname string
}

// listLinkPins lists the datapath's links/<kind>-<role>-<ifname> entries
// under pinDir.
func listLinkPins(pinDir string) ([]linkPin, error) {
	return listPins(pinDir, func(kind, role string) bool {
		return (kind == pinTCX || kind == pinTC || kind == pinNKPeer || kind == pinNKPrimary) &&
			(role == rolePod || role == roleUplink)
	})
}

// listPins lists the links/<kind>-<role>-<ifname> entries under pinDir
// that keep accepts; a missing links directory is an empty list.
func listPins(pinDir string, keep func(kind, role string) bool) ([]linkPin, error) {
	ents, err := os.ReadDir(linksDir(pinDir))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list pinned links: %w", err)
	}
	var out []linkPin
	for _, e := range ents {
		parts := strings.SplitN(e.Name(), "-", 3)
		if len(parts) != 3 || !keep(parts[0], parts[1]) {
			continue
		}
		out = append(out, linkPin{path: filepath.Join(linksDir(pinDir), e.Name()), kind: parts[0], role: parts[1], ifname: parts[2]})
	}
	return out, nil
}

func deviceExists(ifname string) bool {
	_, err := netlink.LinkByName(ifname)
	return err == nil
}

// AttachPod attaches the pod egress program to the pod's host-side device
// ifname: the tc ingress of a veth, or the peer of a netkit pair (plus a
// pass-through program on the primary, then the netkit policy goes from
// blackhole to forward). The device type is read from the kernel, so veth
// and netkit pods can live side by side. Idempotent: an existing attachment
// is updated in place (tcx/netkit link update / cls_bpf replace). With legacy
// host routing it only makes sure nothing is attached (and opens a netkit).
func (d *Datapath) AttachPod(ifname string) error {
	if err := validIfname(ifname); err != nil {
		return fmt.Errorf("attach pod: %w", err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.hostRouting != RoutingBPF {
		return errors.Join(d.detachLocked(rolePod, ifname), d.detachNetkitLocked(ifname, true))
	}
	return d.attachLocked(rolePod, ifname, d.podProg)
}

// DetachPod removes the pod program and its pin. Idempotent; a device that is
// already gone is fine.
func (d *Datapath) DetachPod(ifname string) error {
	if err := validIfname(ifname); err != nil {
		return fmt.Errorf("detach pod: %w", err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return errors.Join(d.detachLocked(rolePod, ifname), d.detachNetkitLocked(ifname, false))
}

// GCPodLinks detaches pinned pod programs whose device is gone or whose
// ifname is not in keep.
func (d *Datapath) GCPodLinks(keep map[string]bool) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	pins, err := listLinkPins(d.cfg.PinDir)
	if err != nil {
		return err
	}
	var errs []error
	for _, p := range pins {
		if p.role != rolePod {
			continue
		}
		if keep[p.ifname] && deviceExists(p.ifname) && !defunctTCX(p) {
			continue
		}
		d.log.Info("gc pod link", "ifname", p.ifname, "kind", p.kind)
		if err := detachPin(p); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// defunctTCX reports a pinned tcx or netkit link whose device went away.
func defunctTCX(p linkPin) bool {
	if p.kind != pinTCX && p.kind != pinNKPeer && p.kind != pinNKPrimary {
		return false
	}
	l, err := link.LoadPinnedLink(p.path, nil)
	if err != nil {
		return true
	}
	defer l.Close()
	if p.kind != pinTCX {
		return netkitIfindex(l) == 0
	}
	return tcxIfindex(l) == 0
}

func validIfname(ifname string) error {
	if ifname == "" || len(ifname) > 15 || strings.ContainsAny(ifname, "/ \x00") {
		return fmt.Errorf("invalid interface name %q", ifname)
	}
	return nil
}

func (d *Datapath) attachLocked(role, ifname string, prog *ebpf.Program) error {
	dev, err := netlink.LinkByName(ifname)
	if err != nil {
		return fmt.Errorf("attach %s program to %s: device not found in this netns: %w", role, ifname, err)
	}
	if nk, ok := dev.(*netlink.Netkit); ok && role == rolePod { // issue 5
		return d.attachNetkitLocked(nk)
	}
	tcxPin := pinPath(d.cfg.PinDir, pinTCX, role, ifname)
	tcPin := pinPath(d.cfg.PinDir, pinTC, role, ifname)
	if d.attachMode == ModeTCX {
		if err := attachTCX(tcxPin, dev.Attrs().Index, prog); err != nil {
			return fmt.Errorf("attach %s program to %s: %w", role, ifname, err)
		}
		// a legacy filter left from a previous mode would never run: drop it
		return detachPin(linkPin{path: tcPin, kind: pinTC, role: role, ifname: ifname})
	}
	if err := attachLegacy(tcPin, dev, prog, role); err != nil {
		return fmt.Errorf("attach %s program to %s: %w", role, ifname, err)
	}
	return detachPin(linkPin{path: tcxPin, kind: pinTCX, role: role, ifname: ifname})
}

func (d *Datapath) detachLocked(role, ifname string) error {
	return errors.Join(
		detachPin(linkPin{path: pinPath(d.cfg.PinDir, pinTCX, role, ifname), kind: pinTCX, role: role, ifname: ifname}),
		detachPin(linkPin{path: pinPath(d.cfg.PinDir, pinTC, role, ifname), kind: pinTC, role: role, ifname: ifname}),
	)
}

func tcxIfindex(l link.Link) int {
	info, err := l.Info()
	if err != nil || info.TCX() == nil {
		return 0
	}
	return int(info.TCX().Ifindex)
}

// attachTCX updates the pinned link when it is still on ifindex, otherwise
// attaches a new tcx ingress link (appended to the chain) and pins it.
func attachTCX(pin string, ifindex int, prog *ebpf.Program) error {
	return attachTCXPinned(pin, ifindex, prog, ebpf.AttachTCXIngress, nil)
}

// attachTCXPinned keeps a pinned tcx link of prog on ifindex (see
// replacePinnedLink). at is ebpf.AttachTCXIngress or AttachTCXEgress; anchor
// places a new link in the tcx chain (nil appends, link.Head() goes first);
// an updated link keeps its place.
func attachTCXPinned(pin string, ifindex int, prog *ebpf.Program, at ebpf.AttachType, anchor link.Anchor) error {
	return replacePinnedLink(pin, "tcx", ifindex, prog, tcxIfindex, func() (link.Link, error) {
		l, err := link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: prog, Attach: at, Anchor: anchor})
		if err != nil {
			what := "tcx"
			if at == ebpf.AttachTCXEgress {
				what = "tcx egress"
			}
			return nil, fmt.Errorf("%s attach to ifindex %d: %w", what, ifindex, err)
		}
		return l, nil
	})
}

// replacePinnedLink is how every pinned bpf_link of axon on a device (tcx,
// XDP) is installed: a link pinned at pin that is still on ifindex is
// updated to prog in place (adoption after a restart, no gap); a stale one
// (device gone or re-created under the same name) is detached and unpinned;
// then attach creates a new link, which is pinned at pin. kind names the
// link in errors ("tcx", "XDP"); linkIfindex reads a link's device.
func replacePinnedLink(pin, kind string, ifindex int, prog *ebpf.Program, linkIfindex func(link.Link) int, attach func() (link.Link, error)) error {
	old, err := link.LoadPinnedLink(pin, nil)
	switch {
	case err == nil:
		defer old.Close()
		if linkIfindex(old) == ifindex {
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

// clsBPFFilter is one of axon's cls_bpf filters: direct action, all
// protocols, prio legacyPrio, on parent (netlink.HANDLE_MIN_INGRESS or
// HANDLE_MIN_EGRESS of the clsact qdisc) with handle, which tells axon's
// filters apart (legacyHandle, legacyEgressHandle, npLegacyHandle, ...).
func clsBPFFilter(ifindex, fd int, parent, handle uint32, name string) *netlink.BpfFilter {
	return &netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{
			LinkIndex: ifindex,
			Parent:    parent,
			Handle:    handle,
			Priority:  legacyPrio,
			Protocol:  unix.ETH_P_ALL,
		},
		Fd:           fd,
		Name:         name,
		DirectAction: true,
	}
}

// attachLegacy makes sure dev has a clsact qdisc, replaces axon's cls_bpf
// filter in place and pins the program as a marker for GC/Uninstall.
func attachLegacy(pin string, dev netlink.Link, prog *ebpf.Program, role string) error {
	return attachClsBPF(pin, dev, prog, netlink.HANDLE_MIN_INGRESS, legacyHandle, "axon_"+role)
}

// attachClsBPF makes sure dev has a clsact qdisc, replaces the cls_bpf
// filter parent/handle (see clsBPFFilter) with one running prog, and pins a
// clone of prog at pin: the marker that detach, GC and Uninstall find the
// filter by (deleteOwnFilter only deletes a filter still running it).
func attachClsBPF(pin string, dev netlink.Link, prog *ebpf.Program, parent, handle uint32, name string) error {
	q := &netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: dev.Attrs().Index, Parent: netlink.HANDLE_CLSACT, Handle: netlink.MakeHandle(0xffff, 0)},
		QdiscType:  "clsact",
	}
	if err := netlink.QdiscAdd(q); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("add clsact qdisc: %w", err)
	}
	if err := netlink.FilterReplace(clsBPFFilter(dev.Attrs().Index, prog.FD(), parent, handle, name)); err != nil {
		what := "filter"
		if parent == netlink.HANDLE_MIN_EGRESS {
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

// detachPin removes one attachment and its pin; missing pin or device is fine.
func detachPin(p linkPin) error {
	switch p.kind {
	case pinTCX, pinNKPeer, pinNKPrimary:
		return detachPinnedLink(p)
	case pinTC:
		if _, err := os.Stat(p.path); errors.Is(err, os.ErrNotExist) {
			return nil
		}
		dev, err := netlink.LinkByName(p.ifname)
		if err == nil { // device gone: the filter went with it
			if err := deleteOwnFilter(p, dev, netlink.HANDLE_MIN_INGRESS, legacyHandle); err != nil {
				return err
			}
		}
		if err := os.Remove(p.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove pin %s: %w", p.path, err)
		}
	}
	return nil
}

// detachPinnedLink detaches the bpf_link pinned at p.path (tcx, netkit,
// XDP) and removes the pin; a missing pin is fine.
func detachPinnedLink(p linkPin) error {
	l, err := link.LoadPinnedLink(p.path, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("detach %s: load pinned link %s: %w", p.ifname, p.path, err)
	}
	defer l.Close()
	if err := l.Detach(); err != nil && !errors.Is(err, link.ErrNotSupported) {
		return fmt.Errorf("detach %s link of %s: %w", p.kind, p.ifname, err)
	}
	if err := l.Unpin(); err != nil {
		return fmt.Errorf("unpin %s: %w", p.path, err)
	}
	return nil
}

// deleteOwnFilter removes axon's cls_bpf filter parent/handle from dev in
// the current netns, but only when it still runs the program pinned at
// p.path: called from another netns (or after someone replaced the filter)
// it touches nothing.
func deleteOwnFilter(p linkPin, dev netlink.Link, parent, handle uint32) error {
	prog, err := ebpf.LoadPinnedProgram(p.path, nil)
	if err != nil {
		return fmt.Errorf("load pinned program %s: %w", p.path, err)
	}
	defer prog.Close()
	info, err := prog.Info()
	if err != nil {
		return fmt.Errorf("program info of %s: %w", p.path, err)
	}
	id, ok := info.ID()
	if !ok {
		return fmt.Errorf("program id of %s: not supported by the kernel", p.path)
	}
	filters, err := netlink.FilterList(dev, parent)
	if err != nil {
		return nil // no clsact: nothing of ours there
	}
	for _, f := range filters {
		bf, ok := f.(*netlink.BpfFilter)
		if !ok || bf.Handle != handle || bf.Priority != legacyPrio || bf.Id != int(id) {
			continue
		}
		if err := netlink.FilterDel(clsBPFFilter(dev.Attrs().Index, 0, parent, handle, "")); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("delete cls_bpf filter on %s: %w", p.ifname, err)
		}
	}
	return nil
}
