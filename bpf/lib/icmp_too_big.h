/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* icmp_too_big.h: the LB's answer to a packet that does not fit the DSR
 * encapsulation (included by nodeport.h).
 *
 * DSR adds an outer header (20 bytes IPv4, 40 IPv6; dsr.h) on the way to
 * the backend node, and BPF cannot fragment. A TCP client is held below
 * that by the MSS clamp (np_dsr_clamp_mss); anything else that would exceed
 * cfg_dsr_mtu once encapsulated is dropped here and answered like a router
 * on a smaller-MTU path answers: ICMP "fragmentation needed" (type 3 code 4,
 * next-hop MTU = cfg_dsr_mtu - 20) or ICMPv6 "packet too big" (MTU =
 * cfg_dsr_mtu - 40). The client's stack records that path MTU for the
 * frontend address and sends later datagrams in pieces that fit (Linux
 * does so for UDP sockets whatever their IP_MTU_DISCOVER mode, as the
 * route's PMTU caps its fragment size); the backend node accepts the
 * fragments (np_dsr_accept, frag.h).
 *
 * The answer is written over the packet and sent back where it came from
 * (MACs swapped; tc: redirect to the ingress device, XDP: XDP_TX): from the
 * frontend address (the destination the client used, so firewalls on the
 * way back match it to the flow) to the client, quoting the packet's IP
 * header and what follows it up to the ports the client's stack matches the
 * error to its socket with (NP_QUOTE4/6). An IPv4
 * packet with IP options is dropped without an answer. GSO packets (tc) are
 * never "too big": they are segmented on the way out, within the MSS clamp.
 * Counted as NP_DSR_TOO_BIG (and NP_REWRITE_FAIL if the answer could not
 * be written: dropped).
 */
#ifndef AXON_ICMP_TOO_BIG_H
#define AXON_ICMP_TOO_BIG_H

#include "common.h"
#include "ctx.h"

/* cfg_dsr_mtu: the uplink MTU the DSR encapsulation must fit (the agent
 * sets nodeport.Options.UplinkMTU); 0 = never answer "too big". */
volatile const __u32 cfg_dsr_mtu = 0;

/* NP_RET_TOO_BIG: np_forward's return value (not a tc or XDP verdict) for
 * "answer with np_reply_too_big", which np_ingress calls on its shallower
 * stack. */
#define NP_RET_TOO_BIG 0x7f00

/* What the answer quotes of the packet: IPv4, the header (no options) and
 * 8 bytes, which hold the ports even in a first fragment; IPv6, the header
 * and 64 bytes, since Linux reads the ports after any extension header (a
 * first fragment: fragment header, then the UDP/TCP header) and drops a
 * "packet too big" that does not quote them. */
#define NP_QUOTE4 (20 + 8)
#define NP_QUOTE6 (40 + 64)

/* np_dsr_too_big reports whether p, IPIP-encapsulated, exceeds cfg_dsr_mtu. */
AXON_INLINE int np_dsr_too_big(const axon_ctx_t *ctx, const struct np_pkt *p)
{
	__u32 len;

	if (!cfg_dsr_mtu)
		return 0;
#ifndef AXON_CTX_XDP
	if (ctx->gso_size)
		return 0;
#endif
	len = bpf_ntohs(p->tot_len);
	if (p->v6)
		len += sizeof(struct ipv6hdr) + sizeof(struct ipv6hdr);
	else
		len += sizeof(struct iphdr);
	return len > cfg_dsr_mtu;
}

/* np_icmp4_too_big / np_icmp6_too_big: the answer after the ethernet header. */
struct np_icmp4_too_big {
	struct iphdr ip;
	__u8 type, code;
	__u16 check;
	__be16 unused;
	__be16 mtu;
	__u8 quote[NP_QUOTE4];
};

struct np_icmp6_too_big {
	struct ipv6hdr ip6;
	__u8 type, code;
	__u16 check;
	__be32 mtu;
	__u8 quote[NP_QUOTE6];
};

/* np_resize sets the packet's length to len (shorter than it is). */
AXON_INLINE int np_resize(axon_ctx_t *ctx, __u32 len)
{
#ifdef AXON_CTX_XDP
	return bpf_xdp_adjust_tail(ctx, (int)len - (int)(ctx_data_end(ctx) - ctx_data(ctx)));
#else
	return bpf_skb_change_tail(ctx, len, 0);
#endif
}

/* np_store_all writes len bytes at off; tc keeps skb->csum right for a
 * CHECKSUM_COMPLETE packet, since every byte changes. */
AXON_INLINE int np_store_all(axon_ctx_t *ctx, __u32 off, const void *src, __u32 len)
{
#ifdef AXON_CTX_XDP
	return ctx_store(ctx, off, src, len);
#else
	return bpf_skb_store_bytes(ctx, off, src, len, BPF_F_RECOMPUTE_CSUM);
#endif
}

_Static_assert(sizeof(struct np_icmp4_too_big) <= sizeof(((struct np_scratch *)0)->answer), "answer buffer");
_Static_assert(sizeof(struct np_icmp6_too_big) <= sizeof(((struct np_scratch *)0)->answer), "answer buffer");

/* np_reply_too_big turns p into the ICMP answer and sends it back (see the
 * top of this file). The answer is built in the per-CPU scratch: the
 * callers' frames leave no room for it on the stack. */
static __noinline int np_reply_too_big(axon_ctx_t *ctx, const struct np_pkt *p, enum np_hook hook)
{
	struct np_scratch *sc = np_scratch();
	struct ethhdr eth;
	__u8 mac[ETH_ALEN];
	__s64 sum;

	np_drop(ctx, hook, NP_DSR_TOO_BIG); /* the request is dropped; its frame becomes the answer */
	if (!sc || ctx_load(ctx, 0, &eth, sizeof(eth)))
		goto drop;
	__builtin_memcpy(mac, eth.h_dest, ETH_ALEN);
	__builtin_memcpy(eth.h_dest, eth.h_source, ETH_ALEN);
	__builtin_memcpy(eth.h_source, mac, ETH_ALEN);
	if (!p->v6) {
		struct np_icmp4_too_big *r = (void *)sc->answer;

		if (p->l4_off != ETH_HLEN + sizeof(struct iphdr))
			return CTX_DROP; /* IP options: no answer */
		__builtin_memset(r, 0, sizeof(*r));
		if (ctx_load(ctx, ETH_HLEN, r->quote, sizeof(r->quote)))
			goto drop;
		r->ip.version = 4;
		r->ip.ihl = 5;
		r->ip.tos = 0xc0; /* internetwork control, as Linux sends its ICMP errors */
		r->ip.tot_len = bpf_htons(sizeof(*r));
		r->ip.ttl = 64;
		r->ip.protocol = AXON_IPPROTO_ICMP;
		r->ip.saddr = np_v4(p->t.daddr);
		r->ip.daddr = np_v4(p->t.saddr);
		sum = bpf_csum_diff(0, 0, (__be32 *)&r->ip, sizeof(r->ip), 0);
		r->ip.check = csum_fold_diff(0xffff, sum);
		r->type = AXON_ICMP_DEST_UNREACH;
		r->code = AXON_ICMP_FRAG_NEEDED;
		r->mtu = bpf_htons((__u16)(cfg_dsr_mtu - sizeof(struct iphdr)));
		sum = bpf_csum_diff(0, 0, (__be32 *)&r->type, sizeof(*r) - sizeof(r->ip), 0);
		r->check = csum_fold_diff(0xffff, sum);
		if (np_resize(ctx, ETH_HLEN + sizeof(*r)) || np_store_all(ctx, 0, &eth, sizeof(eth)) ||
		    np_store_all(ctx, ETH_HLEN, r, sizeof(*r)))
			goto drop;
	} else {
		struct np_icmp6_too_big *r = (void *)sc->answer;
		__be32 ph[2];

		__builtin_memset(r, 0, sizeof(*r));
		if (ctx_load(ctx, ETH_HLEN, r->quote, sizeof(r->quote)))
			goto drop;
		r->ip6.version = 6;
		r->ip6.payload_len = bpf_htons(sizeof(*r) - sizeof(r->ip6));
		r->ip6.nexthdr = AXON_IPPROTO_ICMPV6;
		r->ip6.hop_limit = 64;
		__builtin_memcpy(&r->ip6.saddr, p->t.daddr, 16);
		__builtin_memcpy(&r->ip6.daddr, p->t.saddr, 16);
		r->type = AXON_ICMP6_PKT_TOOBIG;
		r->mtu = bpf_htonl(cfg_dsr_mtu - sizeof(struct ipv6hdr));
		/* pseudo header: addresses, upper-layer length, next header */
		ph[0] = bpf_htonl(sizeof(*r) - sizeof(r->ip6));
		ph[1] = bpf_htonl(AXON_IPPROTO_ICMPV6);
		sum = bpf_csum_diff(0, 0, (__be32 *)&r->ip6.saddr, 32, 0);
		sum = bpf_csum_diff(0, 0, ph, sizeof(ph), sum);
		sum = bpf_csum_diff(0, 0, (__be32 *)&r->type, sizeof(*r) - sizeof(r->ip6), sum);
		r->check = csum_fold_diff(0xffff, sum);
		if (np_resize(ctx, ETH_HLEN + sizeof(*r)) || np_store_all(ctx, 0, &eth, sizeof(eth)) ||
		    np_store_all(ctx, ETH_HLEN, r, sizeof(*r)))
			goto drop;
	}
	if (cfg_dry_run)
		return CTX_PASS;
#ifdef AXON_CTX_XDP
	return XDP_TX;
#else
	return bpf_redirect(ctx->ifindex, 0);
#endif
drop:
	np_count(hook, NP_REWRITE_FAIL); /* a drop counted as dsr_too_big above */
	return CTX_DROP;
}

#endif /* AXON_ICMP_TOO_BIG_H */
