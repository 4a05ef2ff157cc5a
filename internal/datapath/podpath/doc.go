// Package podpath is axon's pod datapath: the programs that forward pod
// traffic on a node (BPF host routing), with the endpoint and metrics maps
// they share, the route (FIB) cache, netkit pod devices and BIG TCP.
//
// Programs (bpf/pod_egress.c, bpf/uplink_ingress.c; see gen.go), with their
// roles in the base's link-pin registry (datapath.TCHooks):
//   - axon_pod_egress on the tc ingress of every pod's host-side veth (role
//     pod), or on the peer of a netkit pair, with a pass-through program on
//     its primary (pins nkpeer-pod-, nkprim-pod-<ifname>);
//   - axon_uplink_ingress on the tc ingress of the node uplink (role uplink).
//
// Everything is per network namespace: call Load and the Datapath methods
// from the node's netns. Load probes the kernel (datapath.Probe) and decides
// attach mode, host routing, device mode, BIG TCP and the route cache
// (Decisions says which and why). Maps are pinned by name under
// Config.PinDir and links under PinDir/links, so forwarding continues while
// the agent is down and a restarted agent adopts (updates) the existing
// links instead of flapping them.
//
// Pin layout under PinDir:
//
//	axon_ep_v4, axon_ep_v6, axon_metrics   maps (LIBBPF_PIN_BY_NAME)
//	links/tcx-uplink-<ifname>              tcx link of the uplink program
//	links/tcx-pod-<ifname>                 tcx link of a pod's program
//	links/tc-uplink-<ifname>, tc-pod-<ifname>  legacy mode: the program attached
//	                                       with a cls_bpf filter (a marker for GC/Uninstall)
//	links/nkpeer-pod-<ifname>, nkprim-pod-<ifname>  the two netkit links of a netkit pod
//
// The route cache of axon_pod_egress is a private per-CPU map, created with
// the program and not pinned.
package podpath
