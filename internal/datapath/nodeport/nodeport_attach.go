package nodeport

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/axonhq/axon/internal/datapath"
)

// XDP modes of LB.Attach.
const (
	XDPNone    = ""        // tc only
	XDPNative  = "native"  // driver XDP; fails where the driver has none
	XDPGeneric = "generic" // skb XDP: works everywhere, slower than tc (tests)
)

// Pins of the LB's attachments: <pinDir>/links/<kind>-<role>-<ifname>, with
// roles of the registry (TCHooks) the datapath's own pin listing ignores.
const (
	npRoleIn  = datapath.RoleLBIn    // tc ingress
	npRoleOut = datapath.RoleLBOut   // tc egress
	npRoleXDP = datapath.RoleLBXDP   // XDP
	npRoleDec = datapath.RoleLBDecap // tc ingress of a DSR backend
)

// npHook is the place of the LB's tc program of role (npRoleIn, npRoleOut,
// npRoleDec): first in the tcx chain, or filter "axon_lb" in legacy mode.
func npHook(role string, legacy bool) datapath.Hook { return datapath.TCHook(role, legacy) }

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
func (n *LB) Attach(ifname, xdpMode string) (Attachment, error) {
	a := Attachment{Ifname: ifname}
	if err := datapath.ValidIfname(ifname); err != nil {
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
	// the uplink's netns is the one the LB forwards in
	if err := n.WatchNeighbours(); err != nil {
		n.log.Warn("nodeport LB: next-hop cache off", "error", err)
	}
	legacy := !datapath.ProbeTCX().Available
	mode := "tcx"
	if legacy {
		mode = "tc-legacy"
	}
	if err := datapath.Attach(pd, dev, n.tc.AxonLbIngress, npHook(npRoleIn, legacy)); err != nil {
		return a, fmt.Errorf("attach nodeport LB ingress to %s: %w", ifname, err)
	}
	a.Ingress = mode
	if err := datapath.Attach(pd, dev, n.tc.AxonLbEgress, npHook(npRoleOut, legacy)); err != nil {
		return a, fmt.Errorf("attach nodeport LB egress to %s: %w", ifname, err)
	}
	a.Egress = mode
	xpin := datapath.PinPath(pd, datapath.PinXDP, npRoleXDP, ifname)
	if xdpMode == XDPNone {
		return a, datapath.DetachLink(datapath.LinkPin{Path: xpin, Kind: datapath.PinXDP, Role: npRoleXDP, Ifname: ifname})
	}
	prog, err := n.XDPProgram()
	if err != nil {
		return a, fmt.Errorf("attach nodeport LB XDP (%s) to %s: %w", xdpMode, ifname, err)
	}
	if err := attachXDPPinned(xpin, idx, prog, xdpMode); err != nil {
		return a, fmt.Errorf("attach nodeport LB XDP (%s) to %s: %w", xdpMode, ifname, err)
	}
	a.XDP = xdpMode
	return a, nil
}

// Acceleration modes of AttachAccelerated (the agent's --lb-acceleration,
// axon lb's xdpMode).
const (
	AccelNative     = "native"      // native XDP or an error
	AccelBestEffort = "best-effort" // native XDP, else tc only
)

// NativeXDPError is AttachAccelerated's error when native XDP was asked for
// and could not be attached; callers say how to fall back.
type NativeXDPError struct{ Err error }

func (e *NativeXDPError) Error() string { return e.Err.Error() }
func (e *NativeXDPError) Unwrap() error { return e.Err }

// AttachAccelerated attaches the LB to ifname per accel: AccelNative (tc
// plus native XDP; a failing XDP attach is a *NativeXDPError),
// AccelBestEffort (the same, else tc only, with the reason in the
// description) or anything else (tc only). It describes the result, e.g.
// "xdp-native on eth0 (tc ingress tcx, egress tcx)" or
// "tc on eth0 (tc ingress tcx, egress tcx; no native XDP: ...)".
func (n *LB) AttachAccelerated(ifname, accel string) (string, error) {
	describe := func(at Attachment, note string) string {
		s := "tc"
		if at.XDP != "" {
			s = "xdp-" + at.XDP
		}
		s += fmt.Sprintf(" on %s (tc ingress %s, egress %s", at.Ifname, at.Ingress, at.Egress)
		if note != "" {
			s += "; " + note
		}
		return s + ")"
	}
	switch accel {
	case AccelNative:
		at, err := n.Attach(ifname, XDPNative)
		if err != nil {
			return "", &NativeXDPError{Err: err}
		}
		return describe(at, ""), nil
	case AccelBestEffort:
		at, err := n.Attach(ifname, XDPNative)
		if err == nil {
			return describe(at, ""), nil
		}
		at, err2 := n.Attach(ifname, XDPNone)
		if err2 != nil {
			return "", err2
		}
		return describe(at, fmt.Sprintf("no native XDP: %v", err)), nil
	default:
		at, err := n.Attach(ifname, XDPNone)
		if err != nil {
			return "", err
		}
		return describe(at, ""), nil
	}
}

// AttachDecap attaches the DSR decapsulation program (axon_lb_decap) to the
// tc ingress of ifname: on a DSR backend without an ipip / ip6tnl device it
// strips the outer header the LB added, so the inner packet (client ->
// service address) reaches the stack, which must own the service address
// (e.g. on lo). It decapsulates every IP-in-IP packet arriving there: attach
// it only where DSR traffic is expected. Detach removes it too.
func (n *LB) AttachDecap(ifname string) (string, error) {
	if err := datapath.ValidIfname(ifname); err != nil {
		return "", fmt.Errorf("attach DSR decap: %w", err)
	}
	dev, err := netlink.LinkByName(ifname)
	if err != nil {
		return "", fmt.Errorf("attach DSR decap to %s: device not found in this netns: %w", ifname, err)
	}
	legacy := !datapath.ProbeTCX().Available
	if err := datapath.Attach(n.opts.PinDir, dev, n.tc.AxonLbDecap, npHook(npRoleDec, legacy)); err != nil {
		return "", fmt.Errorf("attach DSR decap to %s: %w", ifname, err)
	}
	if legacy {
		return "tc-legacy", nil
	}
	return "tcx", nil
}

// Detach removes every LB attachment of ifname and its pins.
func (n *LB) Detach(ifname string) error {
	if err := datapath.ValidIfname(ifname); err != nil {
		return fmt.Errorf("detach nodeport LB: %w", err)
	}
	pins, err := listNPLinkPins(n.opts.PinDir)
	if err != nil {
		return err
	}
	var errs []error
	for _, p := range pins {
		if p.Ifname == ifname {
			errs = append(errs, detachNPPin(p))
		}
	}
	return errors.Join(errs...)
}

// attachXDPPinned updates the pinned XDP link on ifindex in place, or
// attaches a new one in mode and pins it.
func attachXDPPinned(pin string, ifindex int, prog *ebpf.Program, mode string) error {
	flags := link.XDPDriverMode
	if mode == XDPGeneric {
		flags = link.XDPGenericMode
	}
	return datapath.AttachLink(pin, "XDP", ifindex, prog, func() (link.Link, error) {
		l, err := link.AttachXDP(link.XDPOptions{Program: prog, Interface: ifindex, Flags: flags})
		if err != nil {
			return nil, fmt.Errorf("XDP attach to ifindex %d: %w", ifindex, err)
		}
		return l, nil
	})
}

// listNPLinkPins lists the LB's link pins under pinDir.
func listNPLinkPins(pinDir string) ([]datapath.LinkPin, error) {
	return datapath.ListPins(pinDir, func(_, role string) bool {
		return role == npRoleIn || role == npRoleOut || role == npRoleXDP || role == npRoleDec
	})
}

// detachNPPin removes one LB attachment and its pin.
func detachNPPin(p datapath.LinkPin) error {
	if p.Kind != datapath.PinTC {
		return datapath.DetachLink(p) // tcx, XDP
	}
	return datapath.DetachPin(p, npHook(p.Role, true))
}
