// Package vmbypass is the VM-pod bridge bypass: for a KubeVirt VM pod with
// the bridge binding (the guest's tap and the pod interface enslaved to an
// in-pod Linux bridge, k6t-eth0), it moves every frame directly between the
// tap and the pod interface with BPF, so the bridge is skipped.
//
// Program (bpf/vm_bypass.c): axon_vmb_from_tap on the tc ingress of the tap
// and axon_vmb_from_pod on the tc ingress of the pod interface, both in the
// pod's netns, each bpf_redirect()ing to the other device's egress. One
// instance per pod: the ifindexes (and the bridge's ifindex and MAC, for
// frames the guest sends to the pod's own DHCP server on the bridge) are
// load-time constants.
//
// Detect recognises the layout (or says why not, a *LayoutError with a
// Reason); Bypass.Attach, Detach and Stats put it on, take it off (the
// bridge path carries the traffic again) and read its counters and health.
//
// Pins, per pod under <pin dir>/vmbypass/<id>/ (id: the pod UID):
// axon_vmb_stats (per-CPU counters, enum axon_vmb_counter), and
// links/tcx-vmbtap-<tap>, links/tcx-vmbpod-<podif> (tcx links), or in legacy
// mode links/tc-vmbtap-<tap>, links/tc-vmbpod-<podif> (the programs of the
// cls_bpf filters "axon_vmb", handle 0xa19 on the devices' clsact ingress).
package vmbypass
