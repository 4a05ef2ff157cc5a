package podpath

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/datapath"
)

// Device modes (Config.DeviceMode, agent --device-mode).
const (
	DeviceModeVeth     = "veth"      // veth pairs
	DeviceModeNetkit   = "netkit"    // netkit pairs, L3 mode; refused where the kernel has no netkit
	DeviceModeNetkitL2 = "netkit-l2" // netkit pairs, L2 mode (MACs, ARP)
	DeviceModeAuto     = "auto"      // netkit (L3) where the probe succeeds, else veth
)

// DeviceModes are the valid device modes.
var DeviceModes = []string{DeviceModeVeth, DeviceModeNetkit, DeviceModeNetkitL2, DeviceModeAuto}

// Pin kinds of the two netkit links of a pod (links/<kind>-pod-<ifname>).
const (
	pinNKPeer    = "nkpeer" // pod_egress (cfg_netkit=1) on BPF_NETKIT_PEER
	pinNKPrimary = "nkprim" // pass-through on BPF_NETKIT_PRIMARY (traffic into the pod)
)

// netkitProgs are the programs attached to netkit pods, loaded on first use.
type netkitProgs struct {
	spec    *ebpf.CollectionSpec // pod_egress with the loader's constants (set by loadObjects)
	peer    *ebpf.Program        // axon_pod_egress with cfg_netkit = 1
	primary *ebpf.Program        // returns NETKIT_NEXT: the place for pod-ingress policy
}

func (n *netkitProgs) close() {
	for _, p := range []*ebpf.Program{n.peer, n.primary} {
		if p != nil {
			p.Close()
		}
	}
	n.peer, n.primary = nil, nil
}

// DeviceDecision resolves a configured device mode against the netkit probe:
// the operational device type ("veth"|"netkit"), the netkit mode ("l3"|"l2")
// and why. A forced netkit mode on a kernel without netkit is an error that
// says what to do.
func DeviceDecision(mode string, netkit datapath.Capability) (typ, nkMode, reason string, err error) {
	switch mode {
	case "", DeviceModeVeth:
		r := "configured veth"
		if netkit.Available {
			r += " (netkit is available: --device-mode=auto or netkit uses it for new pods)"
		}
		return api.DeviceVeth, "", r, nil
	case DeviceModeNetkit, DeviceModeNetkitL2:
		nkMode = "l3"
		if mode == DeviceModeNetkitL2 {
			nkMode = "l2"
		}
		if !netkit.Available {
			return "", "", "", fmt.Errorf("--device-mode=%s but this kernel cannot create netkit devices (%s): "+
				"netkit needs Linux 6.7+ with CONFIG_NETKIT; use --device-mode=auto (falls back to veth) or veth", mode, netkit.Reason)
		}
		return api.DeviceNetkit, nkMode, "configured " + mode + ": " + netkit.Reason, nil
	case DeviceModeAuto:
		if netkit.Available {
			return api.DeviceNetkit, "l3", "configured auto: " + netkit.Reason, nil
		}
		return api.DeviceVeth, "", "configured auto, veth because " + netkit.Reason, nil
	}
	return "", "", "", fmt.Errorf("device mode %q is invalid: use one of veth, netkit, netkit-l2, auto", mode)
}

// decideDevice adds the "device" decision (called by decide).
func (d *Datapath) decideDevice() error {
	typ, mode, reason, err := DeviceDecision(d.cfg.DeviceMode, d.feats.Netkit)
	if err != nil {
		return err
	}
	d.devType, d.nkMode = typ, mode
	value := typ
	if typ == api.DeviceNetkit {
		value += " " + mode
	}
	reason += "; pods keep the device they were created with until recreated"
	d.decisions = append(d.decisions, api.Decision{Name: "device", Value: value, Reason: reason})
	return nil
}

// Device is the pod device new pods get, with the BIG TCP sizes for both
// ends; axon-cni reads it from the agent's Allocate answer.
func (d *Datapath) Device() api.DeviceConfig {
	dev := api.DeviceConfig{Type: d.devType, NetkitMode: d.nkMode}
	if dev.Type == "" {
		dev.Type = api.DeviceVeth
	}
	d.bigTCP.apply(&dev)
	return dev
}

// netkitPrograms loads the netkit programs once. Called with d.mu held.
func (d *Datapath) netkitPrograms() (peer, primary *ebpf.Program, err error) {
	if d.nk.peer != nil {
		return d.nk.peer, d.nk.primary, nil
	}
	if d.nk.spec == nil {
		return nil, nil, errors.New("netkit programs: pod_egress was not loaded (host routing legacy?)")
	}
	spec := d.nk.spec.Copy()
	if err := spec.Variables["cfg_netkit"].Set(uint8(1)); err != nil {
		return nil, nil, fmt.Errorf("set cfg_netkit: %w", err)
	}
	opts := &ebpf.CollectionOptions{
		Maps: ebpf.MapOptions{PinPath: d.cfg.PinDir},
		MapReplacements: map[string]*ebpf.Map{
			"axon_ep_v4": d.epV4, "axon_ep_v6": d.epV6, "axon_metrics": d.metrics,
		},
	}
	var pp podEgressPrograms
	if err := spec.LoadAndAssign(&pp, opts); err != nil {
		return nil, nil, fmt.Errorf("load axon_pod_egress for netkit: %w", datapath.VerifierDetail(err))
	}
	prim, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:    "axon_nk_primary",
		Type:    ebpf.SchedCLS,
		License: "Dual BSD/GPL",
		// return NETKIT_NEXT (TC_ACT_UNSPEC): later programs, or pass to the pod
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, -1), asm.Return()},
	})
	if err != nil {
		pp.AxonPodEgress.Close()
		return nil, nil, fmt.Errorf("load netkit primary program: %w", err)
	}
	d.nk.peer, d.nk.primary = pp.AxonPodEgress, prim
	return d.nk.peer, d.nk.primary, nil
}

// attachNetkitLocked attaches pod_egress to the peer and the pass-through
// program to the primary of the netkit pair whose primary is nk (in the
// current netns), pins both links, then opens the device (policy forward).
// From inside the pod nothing can detach them: netkit only accepts attach
// and detach requests that name the primary, which lives in the node netns.
func (d *Datapath) attachNetkitLocked(nk *netlink.Netkit) error {
	name, idx := nk.Attrs().Name, nk.Attrs().Index
	if !nk.IsPrimary() {
		return fmt.Errorf("attach pod program to %s: it is a netkit peer, not the primary", name)
	}
	peer, primary, err := d.netkitPrograms()
	if err != nil {
		return fmt.Errorf("attach pod program to %s: %w", name, err)
	}
	// The peer link reports the peer's ifindex (in the pod netns).
	if err := attachNetkitLink(datapath.PinPath(d.cfg.PinDir, pinNKPeer, rolePod, name), idx, nk.Attrs().ParentIndex, peer, ebpf.AttachNetkitPeer); err != nil {
		return fmt.Errorf("attach pod program to netkit peer of %s: %w", name, err)
	}
	if err := attachNetkitLink(datapath.PinPath(d.cfg.PinDir, pinNKPrimary, rolePod, name), idx, idx, primary, ebpf.AttachNetkitPrimary); err != nil {
		return fmt.Errorf("attach program to netkit primary %s: %w", name, err)
	}
	if err := SetNetkitPolicy(idx, netlink.NETKIT_POLICY_FORWARD, netlink.NETKIT_POLICY_FORWARD); err != nil {
		return fmt.Errorf("open netkit %s after attach: %w", name, err)
	}
	return d.detachLocked(rolePod, name)
}

// detachNetkitLocked removes both netkit links of ifname; when the device
// still exists its policy goes back to blackhole (no programs, no traffic),
// unless open is set (legacy host routing: the kernel routes, nothing attached).
func (d *Datapath) detachNetkitLocked(ifname string, open bool) error {
	err := errors.Join(
		datapath.DetachLink(datapath.LinkPin{Path: datapath.PinPath(d.cfg.PinDir, pinNKPeer, rolePod, ifname), Kind: pinNKPeer, Role: rolePod, Ifname: ifname}),
		datapath.DetachLink(datapath.LinkPin{Path: datapath.PinPath(d.cfg.PinDir, pinNKPrimary, rolePod, ifname), Kind: pinNKPrimary, Role: rolePod, Ifname: ifname}),
	)
	if l, lerr := netlink.LinkByName(ifname); lerr == nil {
		if nk, ok := l.(*netlink.Netkit); ok && nk.IsPrimary() {
			p := netlink.NETKIT_POLICY_BLACKHOLE
			if open {
				p = netlink.NETKIT_POLICY_FORWARD
			}
			err = errors.Join(err, SetNetkitPolicy(nk.Attrs().Index, p, p))
		}
	}
	return err
}

// attachNetkitLink keeps a pinned netkit link of prog: updated in place when
// it is still on devIdx (the ifindex the link reports: the primary's, or the
// peer's for a peer link), otherwise attached anew through primaryIdx.
func attachNetkitLink(pin string, primaryIdx, devIdx int, prog *ebpf.Program, at ebpf.AttachType) error {
	return datapath.AttachLink(pin, "netkit", devIdx, prog, func() (link.Link, error) {
		l, err := link.AttachNetkit(link.NetkitOptions{Interface: primaryIdx, Program: prog, Attach: at})
		if err != nil {
			return nil, fmt.Errorf("netkit attach to ifindex %d: %w", primaryIdx, err)
		}
		return l, nil
	})
}

// SetNetkitPolicy sets the default policies (used while no program is
// attached) of the netkit pair whose primary is ifindex, in the current
// netns: RTM_NEWLINK with only IFLA_NETKIT_POLICY and IFLA_NETKIT_PEER_POLICY
// (the kernel refuses changes of mode or scrubbing, which netlink.LinkModify
// would send).
func SetNetkitPolicy(ifindex int, primary, peer netlink.NetkitPolicy) error {
	req := nl.NewNetlinkRequest(unix.RTM_NEWLINK, unix.NLM_F_ACK)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(ifindex)
	req.AddData(msg)
	info := nl.NewRtAttr(unix.IFLA_LINKINFO, nil)
	info.AddRtAttr(nl.IFLA_INFO_KIND, nl.NonZeroTerminated("netkit"))
	data := info.AddRtAttr(nl.IFLA_INFO_DATA, nil)
	data.AddRtAttr(nl.IFLA_NETKIT_POLICY, nl.Uint32Attr(uint32(primary)))
	data.AddRtAttr(nl.IFLA_NETKIT_PEER_POLICY, nl.Uint32Attr(uint32(peer)))
	req.AddData(info)
	if _, err := req.Execute(unix.NETLINK_ROUTE, 0); err != nil {
		return fmt.Errorf("set netkit policy of ifindex %d: %w", ifindex, err)
	}
	return nil
}
