// Package nodeport is axon's north-south load balancer: NodePort, HostPort,
// ExternalIP and LoadBalancer traffic arriving on the node uplink, balanced
// with Maglev to local or remote backends (SNAT or DSR), with its own
// conntrack and reverse NAT. LB loads it, writes the frontends (lb.Writer)
// and attaches it; the agent, the standalone L4LB (internal/l4lb) and `axon
// lb` use it.
//
// Programs (bpf/lb_tc.c and bpf/lb_xdp.c, shared code in bpf/lib/nodeport.h;
// one object per hook, same maps), with their roles in the base's link-pin
// registry (datapath.TCHooks):
//   - axon_lb_ingress on the uplink's tc ingress, first in the chain, before
//     axon_uplink_ingress (role lbin);
//   - axon_lb_egress on the uplink's tc egress, first in the chain (role lbout);
//   - axon_lb_xdp as the uplink's XDP program with --lb-acceleration (role
//     lbxdp), tc ingress staying the path for what it passes up;
//   - axon_lb_decap on the tc ingress of a DSR backend without an ipip or
//     ip6tnl device (role lbdecap).
//
// Maps, pinned by name under the node's pin dir: axon_np_svc (MapService),
// axon_np_be (MapBackend), axon_np_local (MapLocal), axon_np_srcrange
// (MapSrcRange), axon_np_aff (MapAffinity), axon_np_ct (MapCT), axon_np_ct_new (MapCTNew), axon_np_nat
// (MapNAT), axon_np_metrics (MapMetrics), axon_lb_maglev (MapLBMaglev),
// axon_np_frag (MapFrag), axon_np_dsr (MapDSR), axon_np_cluster
// (MapCluster), axon_np_pods (MapPods). With Options.DeliverPods the tc
// program also uses the pod datapath's axon_ep_v4, axon_ep_v6, axon_metrics
// and the Bandwidth Manager's axon_bw_* maps, pinned in the same dir.
//
// Pins of the attachments: <pinDir>/links/tcx-lbin-<ifname>,
// tcx-lbout-<ifname>, xdp-lbxdp-<ifname>, tcx-lbdecap-<ifname>, or in
// legacy mode tc-lbin-, tc-lbout-, tc-lbdecap-<ifname> (the programs of the
// cls_bpf filters "axon_lb", handles 0xa17 and, for decap, 0xa18). A
// restarted agent adopts them (program update in place).
package nodeport
