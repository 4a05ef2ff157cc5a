/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* fib.h: forwarding of non-local destinations through the kernel FIB. */
#ifndef AXON_FIB_H
#define AXON_FIB_H

#include "common.h"
#include "eth_ip.h"
#include "l3.h"
#include "metrics.h"
#include "fib_cache.h"

#define AXON_IPV6_FLOWINFO_MASK bpf_htonl(0x0FFFFFFF)

/* fib_forward looks the destination up in the FIB of the current netns as if
 * the packet had been received on skb->ifindex, and forwards it:
 *   SUCCESS  -> rewrite MACs from the result, TTL-1, bpf_redirect(egress)
 *   NO_NEIGH -> TTL-1, bpf_redirect_neigh (the kernel resolves the neighbour)
 *               when use_neigh, else the stack
 *   NOT_FWDED (local address, no route) -> the stack (AXON_PASS_HOST_BOUND)
 *   anything else (unreachable, frag needed, forwarding off...) -> the stack
 * tot_len is left 0 so the kernel checks the MTU with is_skb_forwardable,
 * which accepts GSO packets. TTL <= 1 was handled by the caller.
 *
 * use_cache (needs use_neigh): an IPv4 route found in fib_cache.h's cache
 * under the netns' current rt_genid is used without a lookup: TTL-1,
 * bpf_redirect_neigh to its next hop (the kernel fills the MACs), counted
 * as AXON_REDIRECT_FIB. SUCCESS and NO_NEIGH results with an IPv4 next hop
 * fill the cache. */
AXON_INLINE int fib_forward(struct __sk_buff *skb, struct packet *pkt,
			    enum axon_dir dir, int use_neigh, int use_cache)
{
	struct bpf_fib_lookup params = {};
	struct bpf_redir_neigh nh = {};
	struct fib_cache_entry *ce = NULL;
	__u32 iif = skb->ifindex; /* read once: the verifier refuses a kept ctx+off pointer */
	__u32 genid = 0;
	int hit = 0;
	long rc;

	if (use_cache && use_neigh && pkt->ip4 && fib_cache_genid(skb, &genid)) {
		ce = fib_cache_get(skb, iif, pkt->ip4, genid, &hit);
		if (ce && hit) {
			nh.nh_family = AXON_AF_INET;
			nh.ipv4_nh = ce->nh;
			ipv4_dec_ttl(pkt->ip4);
			metrics_count(dir, AXON_REDIRECT_FIB);
			return bpf_redirect_neigh(ce->oif, &nh, sizeof(nh), 0);
		}
	}

	params.ifindex = iif;
	if (pkt->ip4) {
		params.family = AXON_AF_INET;
		params.tos = pkt->ip4->tos;
		params.l4_protocol = pkt->ip4->protocol;
		params.ipv4_src = pkt->ip4->saddr;
		params.ipv4_dst = pkt->ip4->daddr;
	} else if (pkt->ip6) {
		params.family = AXON_AF_INET6;
		params.flowinfo = *(__be32 *)pkt->ip6 & AXON_IPV6_FLOWINFO_MASK;
		params.l4_protocol = pkt->ip6->nexthdr;
		__builtin_memcpy(params.ipv6_src, &pkt->ip6->saddr, 16);
		__builtin_memcpy(params.ipv6_dst, &pkt->ip6->daddr, 16);
	} else {
		return TC_ACT_OK;
	}

	rc = bpf_fib_lookup(skb, &params, sizeof(params), 0);
	if (ce && params.family == AXON_AF_INET &&
	    (rc == BPF_FIB_LKUP_RET_SUCCESS || rc == BPF_FIB_LKUP_RET_NO_NEIGH))
		fib_cache_put(ce, iif, pkt->ip4, genid, params.ifindex,
			      params.ipv4_dst, params.mtu_result);
	switch (rc) {
	case BPF_FIB_LKUP_RET_SUCCESS:
		/* bpf_fib_lookup does not change packet data: pkt is valid. */
		if (pkt->ip4)
			ipv4_dec_ttl(pkt->ip4);
		else
			ipv6_dec_hop_limit(pkt->ip6);
		eth_rewrite(pkt->eth, params.dmac, params.smac);
		metrics_count(dir, AXON_REDIRECT_FIB);
		return bpf_redirect(params.ifindex, 0);
	case BPF_FIB_LKUP_RET_NO_NEIGH:
		if (!use_neigh) {
			metrics_count(dir, AXON_PASS_NO_ROUTE);
			return TC_ACT_OK;
		}
		nh.nh_family = params.family;
		if (params.family == AXON_AF_INET)
			nh.ipv4_nh = params.ipv4_dst; /* gateway, or the destination if on-link */
		else
			__builtin_memcpy(nh.ipv6_nh, params.ipv6_dst, 16);
		if (pkt->ip4)
			ipv4_dec_ttl(pkt->ip4);
		else
			ipv6_dec_hop_limit(pkt->ip6);
		metrics_count(dir, AXON_REDIRECT_NEIGH);
		return bpf_redirect_neigh(params.ifindex, &nh, sizeof(nh), 0);
	case BPF_FIB_LKUP_RET_NOT_FWDED:
		metrics_count(dir, AXON_PASS_HOST_BOUND);
		return TC_ACT_OK;
	default:
		metrics_count(dir, AXON_PASS_NO_ROUTE);
		return TC_ACT_OK;
	}
}

#endif /* AXON_FIB_H */
