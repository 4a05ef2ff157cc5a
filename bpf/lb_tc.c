/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* lb_tc.c: north-south load balancing at tc on the node uplink
 * (lib/nodeport.h). Two programs:
 *   axon_lb_ingress  tcx ingress, ordered before axon_uplink_ingress; packets
 *                    it does not finish continue to it (TC_ACT_UNSPEC)
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

SEC("tc")
int axon_lb_ingress(struct __sk_buff *skb)
{
	return np_ingress(skb, NP_HOOK_TC);
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
