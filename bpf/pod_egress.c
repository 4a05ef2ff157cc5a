/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* pod_egress.c: tc ingress of a pod's host-side veth, i.e. every packet
 * leaving the pod. Local pod -> bpf_redirect_peer; routable -> FIB +
 * bpf_redirect / bpf_redirect_neigh; everything else -> the stack. */
#include "lib/common.h"
#include "lib/eth_ip.h"
#include "lib/endpoint.h"
#include "lib/metrics.h"
#include "lib/forward.h"
#include "lib/fib.h"

/* Load-time configuration (set by the loader from feature probes; the
 * verifier prunes the disabled branches, so a kernel without a helper still
 * loads the program). */
volatile const __u8 cfg_enable_fib = 1;   /* 0: non-local traffic goes to the stack */
volatile const __u8 cfg_enable_neigh = 1; /* 0: NO_NEIGH goes to the stack */

SEC("tc")
int axon_pod_egress(struct __sk_buff *skb)
{
	const enum axon_dir dir = AXON_DIR_POD_EGRESS;
	struct packet pkt = {};
	struct endpoint_info *ep;

	if (!parse_or_count(skb, &pkt, dir))
		return TC_ACT_OK;
	if (local_scope(&pkt, dir))
		return TC_ACT_OK;
	if (ttl_expired(&pkt, dir))
		return TC_ACT_OK;

	ep = local_lookup(&pkt);
	if (ep)
		return deliver_local(&pkt, ep, dir);

	if (!cfg_enable_fib) {
		metrics_count(dir, AXON_PASS_NO_ROUTE);
		return TC_ACT_OK;
	}
	return fib_forward(skb, &pkt, dir, cfg_enable_neigh);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
