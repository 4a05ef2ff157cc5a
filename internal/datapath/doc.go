// Package datapath is the small base that axon's BPF objects are loaded on;
// each object (one per bpf/*.c attach point) has its own package under it:
//   - podpath: axon_pod_egress and axon_uplink_ingress, the pod datapath;
//   - nodeport: axon_lb_ingress, axon_lb_egress, axon_lb_decap and
//     axon_lb_xdp, the north-south LB;
//   - socklb: the socket LB's cgroup hooks and socket iterators;
//   - bandwidth: axon_uplink_egress, the Bandwidth Manager.
//
// The base holds what they share:
//   - bpffs and the pin layout: maps pinned by name under a node's pin dir,
//     links under <pinDir>/links/<kind>-<role>-<ifname> (links.go);
//   - the link-pin registry (RolePod ... RoleLBXDP, TCHooks): the roles that
//     name the pins and the cls_bpf filters of legacy mode, a contract with
//     running nodes (a restarted agent adopts its attachments by them);
//   - one attach API: Attach / Detach / Attached put a program on a tc Hook
//     (a tcx link, or clsact + cls_bpf in legacy mode) and AttachLink any
//     other pinned bpf_link (XDP, netkit), adopting and updating in place
//     what a previous run pinned; ListPins, DetachPin and DetachLink for GC
//     and uninstall;
//   - the kernel feature probes, as a table (features.go): one row per
//     probe with its name, function and the reason when absent; Probe,
//     ProbeFeature and Features.List walk it;
//   - the maps several objects share (maps.go), map helpers (DumpMap,
//     ReplaceKeys) and load helpers (VerifierDetail, IncompatibleHint);
//   - Objects, every embedded object, for the verifier report.
//
// Package lbmap holds the LB map helpers socklb and nodeport share; dptest
// the helpers the packages' tests share.
package datapath
