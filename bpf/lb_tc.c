/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* lb_tc.c: north-south load balancing at tc on the node uplink
 * (lib/nodeport.h). Two programs:
 *   axon_lb_ingress  tcx ingress, ordered before axon_uplink_ingress; packets
 *                    it does not finish continue to it (TC_ACT_UNSPEC);
 *                    with cfg_deliver_pods it also delivers pod-bound TCP
 *                    and UDP itself (lb_deliver_pod)
 *   axon_lb_egress   tcx egress: replies of local backends get their
 *                    frontend back as source
 *   axon_lb_decap    tc ingress of a DSR backend: strips the IPIP / IPv6-in-IPv6
 *                    header the LB added (lib/dsr.h), for hosts without an
 *                    ipip / ip6tnl device; counted in the egress row
 * The same code runs at XDP (lb_xdp.c); with XDP attached, this ingress
 * program still runs for what XDP passes up (neighbour resolution). */
#include "lib/common.h"
#include "lib/ctx.h"
#include "lib/nodeport.h"
#include "lib/forward.h"

/* cfg_deliver_pods (load time): 1 when the node's pods are reached with
 * BPF host routing, i.e. axon_uplink_ingress runs after this program. TCP
 * and UDP for a local pod are then delivered here (uplink_to_pod), as
 * axon_uplink_ingress would: one program run per packet instead of two on
 * the hottest pod path. Whatever needs a decision (no endpoint, TTL <= 1)
 * goes on to axon_uplink_ingress, which decides and counts it. 0 (the
 * standalone L4 LB, legacy host routing): the LB never delivers. */
volatile const __u8 cfg_deliver_pods = 0;

/* lb_deliver_pod: a pod-bound TCP/UDP packet np_ingress left alone. Not
 * inlined: its parse state (struct packet) and the pod path's frames would
 * otherwise sit on the program's own frame beside np_ingress's, and with
 * the LB's deepest call chain (np_ingress_l4, np_nat_stale) the verifier's
 * 512-byte limit for the combined stack is exceeded. */
static __noinline int lb_deliver_pod(struct __sk_buff *skb)
{
	struct packet pkt = {};
	struct endpoint_info *ep;
	enum parse_result r = parse_packet(skb, &pkt);

	if (r != PARSE_IPV4 && r != PARSE_IPV6)
		return TC_ACT_UNSPEC;
	ep = local_lookup(&pkt);
	if (!ep || (pkt.ip4 ? pkt.ip4->ttl : pkt.ip6->hop_limit) <= 1)
		return TC_ACT_UNSPEC;
	return uplink_to_pod(skb, &pkt, ep, AXON_PROG_LB_TC);
}

SEC("tc")
int axon_lb_ingress(struct __sk_buff *skb)
{
	int pod = 0;
	int rc = np_ingress(skb, NP_HOOK_TC, &pod);

	if (pod && cfg_deliver_pods)
		return lb_deliver_pod(skb);
	return rc;
}

SEC("tc")
int axon_lb_egress(struct __sk_buff *skb)
{
	return np_egress(skb);
}

SEC("tc")
int axon_lb_decap(struct __sk_buff *skb)
{
	int rc = dsr_decap(skb);

	if (rc > 0)
		np_count(NP_HOOK_EGRESS, NP_DSR_DECAP);
	else if (rc < 0)
		np_count(NP_HOOK_EGRESS, NP_REWRITE_FAIL);
	return TC_ACT_UNSPEC;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
