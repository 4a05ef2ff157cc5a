// Package datapath loads, attaches and pins axon's BPF programs and owns the
// endpoint and metrics maps they share.
//
// Programs (bpf/*.c, compiled by bpf2go, see gen*.go), with the role that
// names their pins (the registry in links.go):
//   - axon_pod_egress (bpf/pod_egress.c) on the tc ingress of every pod's
//     host-side veth, or the peer of a netkit pair (role pod);
//   - axon_uplink_ingress (bpf/uplink_ingress.c) on the tc ingress of the
//     node uplink (role uplink).
//
// The other objects have a package each, on this base: bandwidth (the
// Bandwidth Manager, axon_uplink_egress, role bwm), nodeport (the
// north-south LB, axon_lb_ingress, axon_lb_egress, axon_lb_decap,
// axon_lb_xdp, roles lbin, lbout, lbdecap, lbxdp) and socklb (the socket
// LB's cgroup hooks and socket iterators).
//
// Everything is per network namespace: call Load and the Datapath methods
// from the node's netns. Maps are pinned by name under Config.PinDir and links
// under PinDir/links, so forwarding continues while the agent is down and a
// restarted agent adopts (updates) the existing links instead of flapping them.
//
// Every program that sits on a device goes through one attach API
// (links.go): Attach / Detach / Attached for a tc Hook (a tcx link, or
// clsact + cls_bpf in legacy mode), AttachLink for any other pinned bpf_link
// (XDP, netkit). The kernel feature probes are a table (features.go): one
// row per probe with its name, function and the reason when absent.
//
// Package lbmap holds the LB map helpers socklb and nodeport share; dptest
// the helpers the packages' tests share.
//
// Pin layout under PinDir:
//
//	axon_ep_v4, axon_ep_v6, axon_metrics   maps (LIBBPF_PIN_BY_NAME)
//	links/tcx-uplink-<ifname>              tcx link of the uplink program
//	links/tcx-pod-<ifname>                 tcx link of a pod's program
//	links/tc-uplink-<ifname>, tc-pod-<ifname>  legacy mode: the program attached
//	                                       with a cls_bpf filter (a marker for GC/Uninstall)
//	links/nkpeer-pod-<ifname>, nkprim-pod-<ifname>  the two netkit links of a netkit pod
//	links/{tcx,tc}-bwm-<uplink>            the Bandwidth Manager; axon_bw_* its maps
//	links/{tcx,tc}-{lbin,lbout}-<ifname>, xdp-lbxdp-<ifname>, {tcx,tc}-lbdecap-<ifname>
//	                                       the nodeport LB; axon_np_*, axon_lb_maglev its maps
package datapath
