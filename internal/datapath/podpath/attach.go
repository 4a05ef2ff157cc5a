package podpath

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/axonhq/axon/internal/datapath"
)

const (
	rolePod    = datapath.RolePod
	roleUplink = datapath.RoleUplink
)

// podHook is where the program of role (rolePod, roleUplink) goes: the tc
// ingress, with a tcx link or (attach mode legacy) a cls_bpf filter.
func podHook(role, attachMode string) datapath.Hook {
	return datapath.TCHook(role, attachMode == datapath.ModeLegacy)
}

func (d *Datapath) hook(role string) datapath.Hook { return podHook(role, d.attachMode) }

// listLinkPins lists the datapath's links/<kind>-<role>-<ifname> entries
// under pinDir.
func listLinkPins(pinDir string) ([]datapath.LinkPin, error) {
	return datapath.ListPins(pinDir, func(kind, role string) bool {
		return (kind == datapath.PinTCX || kind == datapath.PinTC || kind == pinNKPeer || kind == pinNKPrimary) &&
			(role == rolePod || role == roleUplink)
	})
}

// AttachPod attaches the pod egress program to the pod's host-side device
// ifname: the tc ingress of a veth, or the peer of a netkit pair (plus a
// pass-through program on the primary, then the netkit policy goes from
// blackhole to forward). The device type is read from the kernel, so veth
// and netkit pods can live side by side. Idempotent: an existing attachment
// is updated in place (tcx/netkit link update / cls_bpf replace). With legacy
// host routing it only makes sure nothing is attached (and opens a netkit).
func (d *Datapath) AttachPod(ifname string) error {
	if err := datapath.ValidIfname(ifname); err != nil {
		return fmt.Errorf("attach pod: %w", err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.hostRouting != datapath.RoutingBPF {
		return errors.Join(d.detachLocked(rolePod, ifname), d.detachNetkitLocked(ifname, true))
	}
	return d.attachLocked(rolePod, ifname, d.podProg)
}

// DetachPod removes the pod program and its pin. Idempotent; a device that is
// already gone is fine.
func (d *Datapath) DetachPod(ifname string) error {
	if err := datapath.ValidIfname(ifname); err != nil {
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
		if p.Role != rolePod {
			continue
		}
		if keep[p.Ifname] && datapath.DeviceExists(p.Ifname) && !defunctTCX(p) {
			continue
		}
		d.log.Info("gc pod link", "ifname", p.Ifname, "kind", p.Kind)
		if err := datapath.DetachPin(p, d.hook(p.Role)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// defunctTCX reports a pinned tcx or netkit link whose device went away.
func defunctTCX(p datapath.LinkPin) bool {
	if p.Kind != datapath.PinTCX && p.Kind != pinNKPeer && p.Kind != pinNKPrimary {
		return false
	}
	l, err := link.LoadPinnedLink(p.Path, nil)
	if err != nil {
		return true
	}
	defer l.Close()
	return datapath.LinkIfindex(l) == 0
}

func (d *Datapath) attachLocked(role, ifname string, prog *ebpf.Program) error {
	dev, err := netlink.LinkByName(ifname)
	if err != nil {
		return fmt.Errorf("attach %s program to %s: device not found in this netns: %w", role, ifname, err)
	}
	if nk, ok := dev.(*netlink.Netkit); ok && role == rolePod {
		return d.attachNetkitLocked(nk)
	}
	if err := datapath.Attach(d.cfg.PinDir, dev, prog, d.hook(role)); err != nil {
		return fmt.Errorf("attach %s program to %s: %w", role, ifname, err)
	}
	return nil
}

func (d *Datapath) detachLocked(role, ifname string) error {
	return datapath.Detach(d.cfg.PinDir, ifname, d.hook(role))
}
