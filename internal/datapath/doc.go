// Package datapath loads, attaches and pins axon's BPF programs and owns the
// endpoint and metrics maps they share.
//
// Programs (bpf/*.c, compiled by bpf2go, see gen.go):
//   - axon_pod_egress on the tc ingress of every pod's host-side veth;
//   - axon_uplink_ingress on the tc ingress of the node uplink.
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
// The socket LB is package socklb; lbmap holds the LB map helpers it shares
// with the nodeport LB; dptest the helpers the packages' tests share.
//
// Pin layout under PinDir:
//
//	axon_ep_v4, axon_ep_v6, axon_metrics   maps (LIBBPF_PIN_BY_NAME)
//	links/tcx-uplink-<ifname>              tcx link of the uplink program
//	links/tcx-pod-<ifname>                 tcx link of a pod's program
//	links/tc-uplink-<ifname>, tc-pod-<ifname>  legacy mode: the program attached
//	                                       with a cls_bpf filter (a marker for GC/Uninstall)
package datapath
