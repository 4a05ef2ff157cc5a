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

// XDP modes of NodePortLB.Attach.
const (
	XDPNone    = ""        // tc only
	XDPNative  = "native"  // driver XDP; fails where the driver has none
	XDPGeneric = "generic" // skb XDP: works everywhere, slower than tc (tests)
)

// Pins of the LB's attachments: <pinDir>/links/<kind>-<role>-<ifname>, with
// roles the datapath's own pin listing ignores.
const (
	npRoleIn  = "lbin"    // tc ingress
	npRoleOut = "lbout"   // tc egress
	npRoleXDP = "lbxdp"   // XDP
	npRoleDec = "lbdecap" // tc ingress of a DSR backend
	pinXDP    = "xdp"

	// npLegacyHandle: the LB's cls_bpf filters in legacy mode (prio 1 like
	// axon's uplink filter 0xa10; cls_bpf runs filters of one prio newest
	// first, and the LB attaches after the datapath).
	npLegacyHandle = 0xa17
	npDecapHandle  = 0xa18 // the decap filter, so a node can be LB and DSR backend
)

func npHandle(role string) uint32 {
	if role == npRoleDec {
		return npDecapHandle
	}
	return npLegacyHandle
}

// Attachment says what Attach attached.
type Attachment struct {
	Ifname  string
	Ingress string // "tcx" or "tc-legacy": tc ingress, before axon_uplink_ingress
	Egress  string // "tcx" or "tc-legacy"
	XDP     string // "native", "generic" or "" (none)
}

// Attach attaches the LB to uplink ifname (in the current netns): the tc
// ingress program first in the tcx chain (before axon's uplink_ingress),
// the tc egress program, and with xdpMode native or generic the XDP program
// too (tc ingress stays as the path for what XDP passes up). Links are
// pinned under <pinDir>/links and updated in place when present. A failing
// XDP attach is returned as an error with nothing of XDP left behind: the
// caller decides whether to fall back (--lb-acceleration best-effort).
func (n *NodePortLB) Attach(ifname, xdpMode string) (Attachment, error) {
	a := Attachment{Ifname: ifname}
	if err := validIfname(ifname); err != nil {
		return a, fmt.Errorf("attach nodeport LB: %w", err)
	}
	if xdpMode != XDPNone && xdpMode != XDPNative && xdpMode != XDPGeneric {
		return a, fmt.Errorf("attach nodeport LB: XDP mode %q is not one of \"\", native, generic", xdpMode)
	}
	dev, err := netlink.LinkByName(ifname)
	if err != nil {
		return a, fmt.Errorf("attach nodeport LB to %s: device not found in this netns: %w", ifname, err)
	}
	idx := dev.Attrs().Index
	pd := n.opts.PinDir
	if Probe().TCX.Available {
		if err := attachTCXAt(pinPath(pd, pinTCX, npRoleIn, ifname), idx, n.tc.AxonLbIngress, ebpf.AttachTCXIngress, link.Head()); err != nil {
			return a, fmt.Errorf("attach nodeport LB ingress to %s: %w", ifname, err)
		}
		a.Ingress = "tcx"
		if err := attachTCXAt(pinPath(pd, pinTCX, npRoleOut, ifname), idx, n.tc.AxonLbEgress, ebpf.AttachTCXEgress, link.Head()); err != nil {
			return a, fmt.Errorf("attach nodeport LB egress to %s: %w", ifname, err)
		}
		a.Egress = "tcx"
	} else {
		if err := attachNPLegacy(pinPath(pd, pinTC, npRoleIn, ifname), dev, n.tc.AxonLbIngress, netlink.HANDLE_MIN_INGRESS); err != nil {
			return a, fmt.Errorf("attach nodeport LB ingress to %s: %w", ifname, err)
		}
		a.Ingress = "tc-legacy"
		if err := attachNPLegacy(pinPath(pd, pinTC, npRoleOut, ifname), dev, n.tc.AxonLbEgress, netlink.HANDLE_MIN_EGRESS); err != nil {
			return a, fmt.Errorf("attach nodeport LB egress to %s: %w", ifname, err)
		}
		a.Egress = "tc-legacy"
	}
	xpin := pinPath(pd, pinXDP, npRoleXDP, ifname)
	if xdpMode == XDPNone {
		return a, detachNPPin(linkPin{path: xpin, kind: pinXDP, role: npRoleXDP, ifname: ifname})
	}
	if err := attachXDPPinned(xpin, idx, n.xdp.AxonLbXdp, xdpMode); err != nil {
		return a, fmt.Errorf("attach nodeport LB XDP (%s) to %s: %w", xdpMode, ifname, err)
	}
	a.XDP = xdpMode
	return a, nil
}

// AttachDecap attaches the DSR decapsulation program (axon_lb_decap) to the
// tc ingress of ifname: on a DSR backend without an ipip / ip6tnl device it
// strips the outer header the LB added, so the inner packet (client ->
// service address) reaches the stack, which must own the service address
// (e.g. on lo). It decapsulates every IP-in-IP packet arriving there: attach
// it only where DSR traffic is expected. Detach removes it too.
func (n *NodePortLB) AttachDecap(ifname string) (string, error) {
	if err := validIfname(ifname); err != nil {
		return "", fmt.Errorf("attach DSR decap: %w", err)
	}
	dev, err := netlink.LinkByName(ifname)
	if err != nil {
		return "", fmt.Errorf("attach DSR decap to %s: device not found in this netns: %w", ifname, err)
	}
	if Probe().TCX.Available {
		if err := attachTCXAt(pinPath(n.opts.PinDir, pinTCX, npRoleDec, ifname), dev.Attrs().Index, n.tc.AxonLbDecap, ebpf.AttachTCXIngress, link.Head()); err != nil {
			return "", fmt.Errorf("attach DSR decap to %s: %w", ifname, err)
		}
		return "tcx", nil
	}
	if err := attachNPLegacy(pinPath(n.opts.PinDir, pinTC, npRoleDec, ifname), dev, n.tc.AxonLbDecap, netlink.HANDLE_MIN_INGRESS); err != nil {
		return "", fmt.Errorf("attach DSR decap to %s: %w", ifname, err)
	}
	return "tc-legacy", nil
}

// Detach removes every LB attachment of ifname and its pins.
func (n *NodePortLB) Detach(ifname string) error {
	if err := validIfname(ifname); err != nil {
		return fmt.Errorf("detach nodeport LB: %w", err)
	}
	pins, err := listNPLinkPins(n.opts.PinDir)
	if err != nil {
		return err
	}
	var errs []error
	for _, p := range pins {
		if p.ifname == ifname {
			errs = append(errs, detachNPPin(p))
		}
	}
	return errors.Join(errs...)
}

// attachTCXAt is attachTCX with an attach type and anchor for new links.
func attachTCXAt(pin string, ifindex int, prog *ebpf.Program, at ebpf.AttachType, anchor link.Anchor) error {
	old, err := link.LoadPinnedLink(pin, nil)
	switch {
	case err == nil:
		defer old.Close()
		if tcxIfindex(old) == ifindex {
			if err := old.Update(prog); err != nil {
				return fmt.Errorf("update pinned tcx link %s: %w", pin, err)
			}
			return nil
		}
		_ = old.Detach()
		if err := old.Unpin(); err != nil {
			return fmt.Errorf("unpin stale tcx link %s: %w", pin, err)
		}
	case !errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("load pinned tcx link %s: %w", pin, err)
	}
	l, err := link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: prog, Attach: at, Anchor: anchor})
	if err != nil {
		return fmt.Errorf("tcx attach to ifindex %d: %w", ifindex, err)
	}
	defer l.Close()
	if err := os.MkdirAll(filepath.Dir(pin), 0o700); err != nil {
		_ = l.Detach()
		return fmt.Errorf("create %s: %w", filepath.Dir(pin), err)
	}
	if err := l.Pin(pin); err != nil {
		_ = l.Detach()
		return fmt.Errorf("pin tcx link at %s: %w", pin, err)
	}
	return nil
}

func npLegacyFilter(ifindex, fd int, parent, handle uint32) *netlink.BpfFilter {
	return &netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{
			LinkIndex: ifindex, Parent: parent, Handle: handle,
			Priority: legacyPrio, Protocol: unix.ETH_P_ALL,
		},
		Fd: fd, Name: "axon_lb", DirectAction: true,
	}
}

// attachNPLegacy adds clsact if needed, replaces the LB's cls_bpf filter on
// parent (ingress or egress) and pins the program as a marker.
func attachNPLegacy(pin string, dev netlink.Link, prog *ebpf.Program, parent uint32) error {
	handle := uint32(npLegacyHandle)
	if strings.Contains(filepath.Base(pin), "-"+npRoleDec+"-") {
		handle = npDecapHandle
	}
	q := &netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: dev.Attrs().Index, Parent: netlink.HANDLE_CLSACT, Handle: netlink.MakeHandle(0xffff, 0)},
		QdiscType:  "clsact",
	}
	if err := netlink.QdiscAdd(q); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("add clsact qdisc: %w", err)
	}
	if err := netlink.FilterReplace(npLegacyFilter(dev.Attrs().Index, prog.FD(), parent, handle)); err != nil {
		return fmt.Errorf("replace cls_bpf filter: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(pin), 0o700); err != nil {
		return fmt.Errorf("create %s: %w", filepath.Dir(pin), err)
	}
	if err := os.Remove(pin); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove old pin %s: %w", pin, err)
	}
	c, err := prog.Clone()
	if err != nil {
		return fmt.Errorf("clone program: %w", err)
	}
	defer c.Close()
	if err := c.Pin(pin); err != nil {
		return fmt.Errorf("pin program at %s: %w", pin, err)
	}
	return nil
}

func xdpIfindex(l link.Link) int {
	info, err := l.Info()
	if err != nil || info.XDP() == nil {
		return 0
	}
	return int(info.XDP().Ifindex)
}

// attachXDPPinned updates the pinned XDP link on ifindex in place, or
// attaches a new one in mode and pins it.
func attachXDPPinned(pin string, ifindex int, prog *ebpf.Program, mode string) error {
	flags := link.XDPDriverMode
	if mode == XDPGeneric {
		flags = link.XDPGenericMode
	}
	old, err := link.LoadPinnedLink(pin, nil)
	switch {
	case err == nil:
		defer old.Close()
		if xdpIfindex(old) == ifindex {
			if err := old.Update(prog); err != nil {
				return fmt.Errorf("update pinned XDP link %s: %w", pin, err)
			}
			return nil
		}
		_ = old.Detach()
		if err := old.Unpin(); err != nil {
			return fmt.Errorf("unpin stale XDP link %s: %w", pin, err)
		}
	case !errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("load pinned XDP link %s: %w", pin, err)
	}
	l, err := link.AttachXDP(link.XDPOptions{Program: prog, Interface: ifindex, Flags: flags})
	if err != nil {
		return fmt.Errorf("XDP attach to ifindex %d: %w", ifindex, err)
	}
	defer l.Close()
	if err := os.MkdirAll(filepath.Dir(pin), 0o700); err != nil {
		_ = l.Detach()
		return fmt.Errorf("create %s: %w", filepath.Dir(pin), err)
	}
	if err := l.Pin(pin); err != nil {
		_ = l.Detach()
		return fmt.Errorf("pin XDP link at %s: %w", pin, err)
	}
	return nil
}

// listNPLinkPins lists the LB's link pins under pinDir.
func listNPLinkPins(pinDir string) ([]linkPin, error) {
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
		if len(parts) != 3 || (parts[1] != npRoleIn && parts[1] != npRoleOut && parts[1] != npRoleXDP && parts[1] != npRoleDec) {
			continue
		}
		out = append(out, linkPin{path: filepath.Join(linksDir(pinDir), e.Name()), kind: parts[0], role: parts[1], ifname: parts[2]})
	}
	return out, nil
}

// detachNPPin removes one LB attachment and its pin.
func detachNPPin(p linkPin) error {
	switch p.kind {
	case pinTCX, pinXDP:
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
	case pinTC:
		if _, err := os.Stat(p.path); errors.Is(err, os.ErrNotExist) {
			return nil
		}
		parent := uint32(netlink.HANDLE_MIN_INGRESS)
		if p.role == npRoleOut {
			parent = netlink.HANDLE_MIN_EGRESS
		}
		if dev, err := netlink.LinkByName(p.ifname); err == nil {
			if err := deleteNPFilter(p, dev, parent); err != nil {
				return err
			}
		}
		if err := os.Remove(p.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove pin %s: %w", p.path, err)
		}
	}
	return nil
}

// deleteNPFilter deletes the LB's cls_bpf filter when it runs the pinned program.
func deleteNPFilter(p linkPin, dev netlink.Link, parent uint32) error {
	prog, err := ebpf.LoadPinnedProgram(p.path, nil)
	if err != nil {
		return fmt.Errorf("load pinned program %s: %w", p.path, err)
	}
	defer prog.Close()
	info, err := prog.Info()
	if err != nil {
		return fmt.Errorf("program info of %s: %w", p.path, err)
	}
	id, _ := info.ID()
	filters, err := netlink.FilterList(dev, parent)
	if err != nil {
		return nil
	}
	for _, f := range filters {
		bf, ok := f.(*netlink.BpfFilter)
		if !ok || bf.Handle != npHandle(p.role) || bf.Id != int(id) {
			continue
		}
		if err := netlink.FilterDel(npLegacyFilter(dev.Attrs().Index, 0, parent, npHandle(p.role))); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("delete cls_bpf filter on %s: %w", p.ifname, err)
		}
	}
	return nil
}
