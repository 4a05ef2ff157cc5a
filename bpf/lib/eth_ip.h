/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* eth_ip.h: the packet parser (Ethernet, IPv4, IPv6) and address scopes. */
#ifndef AXON_ETH_IP_H
#define AXON_ETH_IP_H

#include "common.h"
#include "ctx.h"

/* The one parser of the Ethernet and IPv4/IPv6 headers, for every program
 * (tc and XDP, through ctx.h). Its callers differ only in how the headers
 * are read and which checks they need, chosen by PARSE_* flags that are a
 * constant at every call (the other ways compile away):
 *
 *   pod path (forward.h, uplink_egress.c, lb_tc.c's lb_deliver_pod):
 *     parse_packet, in place | PARSE_STRICT: pointers into the linear
 *     area, which the programs rewrite (MACs, TTL) and forward past the
 *     stack's own checks.
 *   north-south LB (nodeport.h; the packet's own header and the inner
 *   header of a DSR request): np_parse_l3 / np_parse_ip, PARSE_L4 for the
 *   transport header behind fragments and IPv6 extension headers; at tc
 *   PARSE_COPY (IP headers copied through ctx_load, which also reads
 *   headers in paged data), at XDP in place (the frame is linear: the same
 *   bounds as ctx_load, without the copy).
 *
 * The Ethernet header is always read in place, PARSE_COPY or not: a tc
 * program sees it in the linear area (the stack pulled it at ingress,
 * built it in the headroom at egress), an XDP frame is linear. A copy
 * through ctx_load would add its bpf_skb_load_bytes fallback, a second
 * version of every state after the parse for the verifier to walk.
 *
 * Checks, for everyone: a whole Ethernet header; a whole fixed IPv4/IPv6
 * header; IPv4 version 4 and IHL >= 5 (options accepted); IPv6 version 6.
 * PARSE_STRICT: the IPv4 options in the linear area too, and the IPv4
 * total length (BIG TCP, below). PARSE_L4: an IPv6 hop-by-hop header of at
 * most PARSE_HBH_MAX bytes, a whole fragment header. Anything else is
 * malformed (PARSE_MALFORMED); an ethertype other than IPv4/IPv6 is
 * PARSE_NON_IP. The LB leaves out PARSE_STRICT: a packet it does not
 * translate goes on to the stack, which checks it, one it translates keeps
 * its length field, and a transport header cut short is malformed there
 * (np_parse_ports).
 *
 * IPv4 BIG TCP (PARSE_STRICT): a TCP GSO packet over 64 KiB has tot_len
 * 0, its length is the skb's (the kernel's iph_totlen()). It is accepted
 * as the kernel does: tot_len 0, TCP, and a GSO skb (gso_size set; never
 * at XDP, which sees packets before GRO). Anything else with a total length
 * shorter than its header is malformed. Turning these away sent every BIG
 * TCP packet through the stack (ip_forward) instead of the BPF fast path,
 * and past the Bandwidth Manager's limits. */

/* Result of the parser. */
enum parse_result {
	PARSE_IPV4 = 0,
	PARSE_IPV6 = 1,
	PARSE_NON_IP = 2,    /* ARP or any other ethertype: the stack handles it */
	PARSE_MALFORMED = 3, /* truncated or inconsistent headers */
};

/* How the parser reads the headers and how far it goes (constants). */
#define PARSE_COPY 0x1    /* copy the IP headers through ctx_load into the caller's buffer; else in place */
#define PARSE_STRICT 0x2  /* in place only. IPv4: options in the linear area, a total length at least the header (BIG TCP excepted) */
#define PARSE_L4 0x4      /* find the transport header (IPv4 fragment fields, IPv6 extension headers) */
#define PARSE_ETH_ONLY 0x8 /* parse_eth: stop at the ethertype */

/* Longest IPv6 hop-by-hop header PARSE_L4 skips (bytes): a BIG TCP jumbo
 * header is 8; the bound keeps every header the LB reads below
 * CTX_MAX_OFF. */
#define PARSE_HBH_MAX 64

/* packet.frag (PARSE_L4): the packet is an IP fragment. */
#define AXON_FRAG_FIRST 1 /* offset 0: has the L4 header */
#define AXON_FRAG_LATER 2 /* offset > 0: no L4 header (the LB takes the ports from axon_np_frag, frag.h) */

/* union parse_buf: where PARSE_COPY puts the IP header (the caller's
 * stack). 8-byte aligned: the LB reads IPv6 addresses as 64-bit words
 * (np_addr6), and the verifier refuses a misaligned stack access. */
union parse_buf {
	struct iphdr ip4;
	struct ipv6hdr ip6;
} __attribute__((aligned(8)));

/* struct packet: what the parser found. eth points into the packet, ip4
 * and ip6 too (in place) or to the caller's copy (PARSE_COPY); a pointer
 * into the packet is valid until the next helper that may change packet
 * data. */
struct packet {
	struct ethhdr *eth;  /* parse_eth */
	struct iphdr *ip4;   /* set for PARSE_IPV4 */
	struct ipv6hdr *ip6; /* set for PARSE_IPV6 */
	__u32 l4_off;        /* PARSE_L4: the transport header's packet offset (a later fragment: its payload's) */
	__u8 proto;          /* PARSE_L4: the transport protocol, behind the IPv6 extension headers */
	__u8 frag;           /* PARSE_L4: AXON_FRAG_FIRST / AXON_FRAG_LATER, 0 when not a fragment */
	__u16 pad;
	__be32 frag_id;      /* PARSE_L4: the fragment's IP identification (IPv4: 16 bits) */
};

/* parse_hdr finds the len bytes at packet offset off (len constant): *hdr
 * points into the linear area (in place) or to the copy in buf
 * (PARSE_COPY; in place, buf is unused). In place, an offset that is not a
 * constant is bounded as ctx_load bounds it (CTX_MAX_OFF, ctx_bound_off).
 * 0: found; -1: not there. */
AXON_INLINE int parse_hdr(axon_ctx_t *ctx, __u32 off, void *buf, __u32 len, int how, void **hdr)
{
	void *p;

	if (how & PARSE_COPY) {
		*hdr = buf;
		return ctx_load(ctx, off, buf, len);
	}
	if (!__builtin_constant_p(off)) {
		if (off > CTX_MAX_OFF)
			return -1;
		off = ctx_bound_off(off);
	}
	p = ctx_data(ctx) + off;
	if (p + len > ctx_data_end(ctx))
		return -1;
	*hdr = p;
	return 0;
}

/* parse_ip4_len_ok: the IPv4 total length check of PARSE_STRICT (above). */
AXON_INLINE int parse_ip4_len_ok(const axon_ctx_t *ctx, const struct iphdr *ip4, __u32 hlen)
{
	return bpf_ntohs(ip4->tot_len) >= hlen ||
	       (ip4->tot_len == 0 && ip4->protocol == AXON_IPPROTO_TCP && ctx_gso_size(ctx));
}

/* parse_ip parses the IPv4 (v6 = 0) or IPv6 header at packet offset off:
 * the packet's own (parse_packet, np_parse_l3) or the inner header of an IP-in-IP
 * packet. PARSE_IPV4, PARSE_IPV6 or PARSE_MALFORMED. */
AXON_INLINE enum parse_result parse_ip(axon_ctx_t *ctx, __u32 off, int v6, int how,
				       struct packet *l3, union parse_buf *buf)
{
	if (!v6) {
		struct iphdr *ip4;
		__u32 hlen;

		if (parse_hdr(ctx, off, (how & PARSE_COPY) ? &buf->ip4 : NULL, sizeof(*ip4), how, (void **)&ip4))
			return PARSE_MALFORMED;
		if (ip4->version != 4 || ip4->ihl < 5)
			return PARSE_MALFORMED;
		hlen = (__u32)ip4->ihl * 4;
		if ((how & PARSE_STRICT) && ((void *)ip4 + hlen > ctx_data_end(ctx) ||
					     !parse_ip4_len_ok(ctx, ip4, hlen)))
			return PARSE_MALFORMED;
		if (how & PARSE_L4) {
			l3->l4_off = off + hlen;
			l3->proto = ip4->protocol;
			/* MF or an offset; offset 0 is the first fragment */
			if (ip4->frag_off & bpf_htons(0x3fff)) {
				l3->frag = (ip4->frag_off & bpf_htons(0x1fff)) ? AXON_FRAG_LATER : AXON_FRAG_FIRST;
				l3->frag_id = ip4->id;
			}
		}
		l3->ip4 = ip4;
		return PARSE_IPV4;
	}
	{
		struct ipv6hdr *ip6;

		if (parse_hdr(ctx, off, (how & PARSE_COPY) ? &buf->ip6 : NULL, sizeof(*ip6), how, (void **)&ip6))
			return PARSE_MALFORMED;
		if (ip6->version != 6)
			return PARSE_MALFORMED;
		if (how & PARSE_L4) {
			l3->l4_off = off + sizeof(*ip6);
			l3->proto = ip6->nexthdr;
			if (ip6->nexthdr == AXON_IPPROTO_HOPOPTS) {
				/* A hop-by-hop header, first when present. IPv6 BIG
				 * TCP puts one in every GSO packet over 64 KiB (a
				 * jumbo payload option, payload_len 0) on kernels
				 * that have not dropped it (6.18 still has it): skip
				 * it to the transport (or fragment) header. Longer
				 * than PARSE_HBH_MAX: not parsed, malformed. */
				struct { __u8 nexthdr, len; } hbh, *h;

				if (parse_hdr(ctx, l3->l4_off, &hbh, sizeof(hbh), how, (void **)&h))
					return PARSE_MALFORMED;
				if (((__u32)h->len + 1) * 8 > PARSE_HBH_MAX)
					return PARSE_MALFORMED;
				l3->proto = h->nexthdr;
				l3->l4_off += ((__u32)h->len + 1) * 8;
			}
			if (l3->proto == AXON_IPPROTO_FRAGMENT) {
				/* fragment header right after the fixed header (or
				 * the hop-by-hop header): nexthdr, reserved,
				 * offset << 3 | M, identification */
				struct { __u8 nexthdr, res; __be16 off; __be32 id; } fh, *f;

				if (parse_hdr(ctx, l3->l4_off, &fh, sizeof(fh), how, (void **)&f))
					return PARSE_MALFORMED;
				l3->proto = f->nexthdr;
				l3->l4_off += sizeof(fh);
				l3->frag = (f->off & bpf_htons(0xfff8)) ? AXON_FRAG_LATER : AXON_FRAG_FIRST;
				l3->frag_id = f->id;
			}
		}
		l3->ip6 = ip6;
		return PARSE_IPV6;
	}
}

/* parse_eth_ip parses the Ethernet header into pkt->eth (in place, above)
 * and the IP header behind it (parse_ip); with PARSE_ETH_ONLY it stops at
 * the ethertype (parse_eth). The IP header in place, or copied into ip_buf
 * (PARSE_COPY). */
AXON_INLINE enum parse_result parse_eth_ip(axon_ctx_t *ctx, int how, struct packet *pkt,
					   union parse_buf *ip_buf)
{
	if (parse_hdr(ctx, 0, NULL, sizeof(struct ethhdr), how & ~PARSE_COPY, (void **)&pkt->eth))
		return PARSE_MALFORMED;
	if (pkt->eth->h_proto == bpf_htons(ETH_P_IP))
		return (how & PARSE_ETH_ONLY) ? PARSE_IPV4 : parse_ip(ctx, ETH_HLEN, 0, how, pkt, ip_buf);
	if (pkt->eth->h_proto == bpf_htons(ETH_P_IPV6))
		return (how & PARSE_ETH_ONLY) ? PARSE_IPV6 : parse_ip(ctx, ETH_HLEN, 1, how, pkt, ip_buf);
	return PARSE_NON_IP;
}

/* parse_eth points pkt->eth at the Ethernet header (in place): PARSE_IPV4
 * / PARSE_IPV6 by its ethertype, PARSE_NON_IP, or PARSE_MALFORMED when it
 * is cut short. */
AXON_INLINE enum parse_result parse_eth(axon_ctx_t *ctx, struct packet *pkt)
{
	return parse_eth_ip(ctx, PARSE_ETH_ONLY, pkt, NULL);
}

/* parse_packet is the pod path's parse of pkt (zeroed by the caller):
 * Ethernet and IP header in place, PARSE_STRICT. */
AXON_INLINE enum parse_result parse_packet(axon_ctx_t *ctx, struct packet *pkt)
{
	return parse_eth_ip(ctx, PARSE_STRICT, pkt, NULL);
}

/* ipv6_is_local_scope: link-local (fe80::/10) and multicast (ff00::/8)
 * destinations (NDP, router solicitations, ...) always belong to the stack. */
AXON_INLINE int ipv6_is_local_scope(const struct in6_addr *a)
{
	__u8 b0 = a->in6_u.u6_addr8[0];
	__u8 b1 = a->in6_u.u6_addr8[1];

	return b0 == 0xff || (b0 == 0xfe && (b1 & 0xc0) == 0x80);
}

/* ipv4_is_local_scope: multicast, limited broadcast, link-local 169.254/16. */
AXON_INLINE int ipv4_is_local_scope(__be32 a)
{
	__u32 h = bpf_ntohl(a);

	return (h & 0xf0000000) == 0xe0000000 || h == 0xffffffff ||
	       (h & 0xffff0000) == 0xa9fe0000;
}

#endif /* AXON_ETH_IP_H */
