/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* uplink_ingress.c: tc ingress of the node uplink. Traffic for a pod on
 * this node goes straight into the pod netns with bpf_redirect_peer;
 * everything else continues up the stack untouched. When the north-south
 * LB runs before it with cfg_deliver_pods (lb_tc.c), pod-bound TCP and UDP
 * never get here: this program sees the rest (ICMP, other protocols, what
 * the LB passed on). */
#include "lib/common.h"
#include "lib/eth_ip.h"
#include "lib/endpoint.h"
#include "lib/metrics.h"
#include "lib/forward.h"

SEC("tc")
int axon_uplink_ingress(struct __sk_buff *skb)
{
	const enum axon_dir dir = AXON_DIR_UPLINK_INGRESS;
	struct packet pkt = {};
	struct endpoint_info *ep;

	if (!parse_or_count(skb, &pkt, dir))
		return TC_ACT_OK;

	ep = local_lookup(&pkt);
	if (!ep) {
		metrics_count(dir, AXON_PASS_NOT_LOCAL);
		return TC_ACT_OK;
	}
	if (ttl_expired(&pkt, dir))
		return TC_ACT_OK;
	return uplink_to_pod(skb, &pkt, ep, AXON_PROG_UPLINK_INGRESS);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
