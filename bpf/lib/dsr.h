/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* dsr.h: direct server return by IP-in-IP encapsulation.
 *
 * The load balancer keeps the client's packet as it is (client -> service
 * address) and puts an outer header in front: node address -> backend
 * address, protocol IPIP (4) for IPv4 or IPv6 (41) for IPv6. The backend's
 * kernel decapsulates it with a plain ipip / ip6tnl device (fb tunnel or
 * `ip link add ... type ipip external`), finds the service address on a
 * local interface and replies to the client directly, with the service
 * address as source. Why IPIP rather than an IP option or Geneve: it needs
 * no BPF at the backend (any Linux host, the standalone L4LB's real
 * servers), works the same for IPv6 (an IPv4 option has no IPv6 twin that
 * routers pass), survives middleboxes that strip options, and costs 20
 * (IPv4) or 40 (IPv6) bytes of MTU on the LB -> backend path.
 */
#ifndef AXON_DSR_H
#define AXON_DSR_H

#include "common.h"
#include "ctx.h"
#include "eth_ip.h"

/* dsr_outer_len is the length field of an outer header that puts hdr bytes
 * in front of an inner packet whose own length field says inner_len (IPv4
 * tot_len, or IPv6 payload_len + 40). A BIG TCP packet (a GSO packet over
 * 64 KiB: the pod's own, or a GRO aggregate on an uplink with a large
 * gro_max_size) carries 0 there; its length is the packet's. A length that
 * does not fit 16 bits is written as 0, the form BIG TCP itself uses and the
 * kernel accepts on a TCP GSO skb (iph_totlen / ipv6_payload_len); GSO
 * writes the real length into every segment's outer header. */
AXON_INLINE __u16 dsr_outer_len(const axon_ctx_t *ctx, __u32 inner_len, __u32 hdr)
{
	__u32 len = inner_len;

	if (!len)
		len = ctx_len(ctx) - ETH_HLEN;
	len += hdr;
	return len > 0xffff ? 0 : bpf_htons((__u16)len);
}

/* dsr_encap4 puts an IPv4 outer header (src -> dst, IPIP) in front of the
 * IPv4 packet at offset ETH_HLEN. */
AXON_INLINE int dsr_encap4(axon_ctx_t *ctx, __be32 src, __be32 dst)
{
	struct iphdr inner, outer = {};
	__s64 sum;

	if (ctx_load(ctx, ETH_HLEN, &inner, sizeof(inner)))
		return -1;
	outer.version = 4;
	outer.ihl = 5;
	outer.tos = inner.tos;
	outer.tot_len = dsr_outer_len(ctx, bpf_ntohs(inner.tot_len), sizeof(outer));
	outer.ttl = 64;
	outer.protocol = AXON_IPPROTO_IPIP;
	outer.saddr = src;
	outer.daddr = dst;
	sum = bpf_csum_diff(0, 0, (__be32 *)&outer, sizeof(outer), 0);
	outer.check = csum_fold_diff(0xffff, sum);
	if (ctx_grow_head(ctx, sizeof(outer), 0))
		return -1;
	return ctx_store(ctx, ETH_HLEN, &outer, sizeof(outer));
}

/* dsr_encap6 puts an IPv6 outer header (src -> dst, next header IPv6). */
AXON_INLINE int dsr_encap6(axon_ctx_t *ctx, const __u8 *src, const __u8 *dst)
{
	struct ipv6hdr inner, outer = {};

	if (ctx_load(ctx, ETH_HLEN, &inner, sizeof(inner)))
		return -1;
	outer.version = 6;
	outer.priority = inner.priority;
	/* the outer payload is the whole inner packet, its header included */
	outer.payload_len = dsr_outer_len(ctx, inner.payload_len ? bpf_ntohs(inner.payload_len) + sizeof(inner) : 0,
					  0);
	outer.nexthdr = AXON_IPPROTO_IPV6;
	outer.hop_limit = 64;
	__builtin_memcpy(&outer.saddr, src, 16);
	__builtin_memcpy(&outer.daddr, dst, 16);
	if (ctx_grow_head(ctx, sizeof(outer), 1))
		return -1;
	return ctx_store(ctx, ETH_HLEN, &outer, sizeof(outer));
}

/* dsr_decap removes the outer header of an IPIP (IPv4 in IPv4) or IPv6 in
 * IPv6 packet at the backend (tc ingress), where the kernel has no ipip /
 * ip6tnl device (CONFIG_NET_IPIP unset, as on the dev host). The inner
 * packet (client -> service address) then goes up the stack, which owns the
 * service address on a local interface. Only what dsr_encap4/6 add is
 * removed: an outer IPv4 header without options that is not a fragment, or
 * a fixed IPv6 header, in front of a valid inner header of the same family
 * (eth_ip.h's parser, both). Returns 1 when it decapsulated, 0 when the
 * packet is not such IP-in-IP, -1 on error. Not inlined: the header copies
 * stay off the callers' frames. */
static __noinline int dsr_decap(axon_ctx_t *ctx)
{
	struct packet outer = {}, inner = {};
	union parse_buf outer_buf, inner_buf;
	__u32 hlen;

	switch (parse_eth(ctx, &outer)) {
	case PARSE_IPV4:
		if (parse_ip(ctx, ETH_HLEN, 0, PARSE_COPY, &outer, &outer_buf) != PARSE_IPV4 ||
		    outer.ip4->protocol != AXON_IPPROTO_IPIP || outer.ip4->ihl != 5 ||
		    (outer.ip4->frag_off & bpf_htons(0x3fff)))
			return 0;
		hlen = sizeof(struct iphdr);
		if (parse_ip(ctx, ETH_HLEN + hlen, 0, PARSE_COPY, &inner, &inner_buf) != PARSE_IPV4)
			return 0;
		break;
	case PARSE_IPV6:
		if (parse_ip(ctx, ETH_HLEN, 1, PARSE_COPY, &outer, &outer_buf) != PARSE_IPV6 ||
		    outer.ip6->nexthdr != AXON_IPPROTO_IPV6)
			return 0;
		hlen = sizeof(struct ipv6hdr);
		if (parse_ip(ctx, ETH_HLEN + hlen, 1, PARSE_COPY, &inner, &inner_buf) != PARSE_IPV6)
			return 0;
		break;
	default:
		return 0;
	}
#ifndef AXON_CTX_XDP
	if (bpf_skb_adjust_room(ctx, -(int)hlen, BPF_ADJ_ROOM_MAC, 0))
		return -1;
	return 1;
#else
	return 0;
#endif
}

#endif /* AXON_DSR_H */
