/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* l4.h: a TCP/UDP flow as the load balancers see it, one code base for tc
 * and XDP (ctx.h): the tuple, the parsed packet, its parser and the NAT
 * rewrite with incremental checksums. No maps: the north-south LB
 * (nodeport.h) and the per-packet pod LB (pod_lb.c) both build on it.
 */
#ifndef AXON_L4_H
#define AXON_L4_H

#include "common.h"
#include "ctx.h"
#include "eth_ip.h"

/* np_tuple: one direction of a flow as seen in the packet (40 bytes).
 * Addresses are 16 bytes, IPv4 as ::ffff:a.b.c.d; ports network order. */
struct np_tuple {
	__u8 saddr[16];
	__u8 daddr[16];
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 pad[3];
};

AXON_INLINE void np_addr4(__u8 *a, __be32 ip)
{
	__u32 *w = (__u32 *)a;

	w[0] = 0;
	w[1] = 0;
	w[2] = bpf_htonl(0x0000ffff);
	w[3] = ip;
}

/* np_addr6 copies the IPv6 address ip into a (np_tuple) as two 64-bit
 * loads and four 32-bit stores. ip is 8-byte aligned in a copy
 * (union parse_buf), unaligned in place at XDP (allowed for packet data).
 * A 64-bit word is unknown to the verifier, so 6.1 keeps what is stored
 * at a's 8-byte slots as plain data; a 32-bit load is a bounded value,
 * which 6.1 keeps as a spilled register and marks precise, and the
 * caller's states after an IPv6 parse then never matched those after an
 * IPv4 one (+12 % of axon_lb_ingress on 6.1). */
AXON_INLINE void np_addr6(__u8 *a, const struct in6_addr *ip)
{
	const __u64 *s = (const void *)ip;
	__u64 w[2] = { s[0], s[1] };

	__builtin_memcpy((__u32 *)a, w, 16);
}

AXON_INLINE __be32 np_v4(const __u8 *a)
{
	return ((const __u32 *)a)[3];
}

AXON_INLINE int np_addr_zero(const __u8 *a, int v6)
{
	const __u32 *w = (const __u32 *)a;

	if (!v6)
		return w[3] == 0;
	return (w[0] | w[1] | w[2] | w[3]) == 0;
}

/* np_addr_eq compares two 16-byte addresses. */
AXON_INLINE int np_addr_eq(const __u8 *x, const __u8 *y)
{
	const __u32 *a = (const __u32 *)x, *b = (const __u32 *)y;

	return ((a[0] ^ b[0]) | (a[1] ^ b[1]) | (a[2] ^ b[2]) | (a[3] ^ b[3])) == 0;
}

/* A parsed packet. */
struct np_pkt {
	struct np_tuple t; /* as in the packet */
	__u32 l4_off;
	__u8 v6;
	__u8 ttl;
	__u8 tcp_flags;
	__u8 frag;         /* AXON_FRAG_* (eth_ip.h, frag.h) */
	__be16 tot_len;
	__u16 pad;
	__be32 frag_id;    /* IP identification of a fragment (frag.h) */
	__u32 dsr_be;      /* a DSR request for a local pod (np_dsr_accept): its backend id, else 0 */
};

#define NP_TCP_FIN 0x01
#define NP_TCP_SYN 0x02
#define NP_TCP_RST 0x04
#define NP_TCP_ACK 0x10

/* np_may_open: p may open a new flow: any UDP datagram, a TCP segment only
 * when it is a SYN without ACK (nor FIN or RST). */
AXON_INLINE int np_may_open(const struct np_pkt *p)
{
	return p->t.proto != AXON_IPPROTO_TCP ||
	       (p->tcp_flags & (NP_TCP_SYN | NP_TCP_ACK | NP_TCP_FIN | NP_TCP_RST)) == NP_TCP_SYN;
}

/* How the LB parses (eth_ip.h): the transport header too; at tc through
 * copies (ctx_load reads paged data), at XDP in place (the frame is linear). */
#define NP_PARSE ((CTX_IS_XDP ? 0 : PARSE_COPY) | PARSE_L4)

/* np_parse_ip reads the IPv4 (v6 = 0) or IPv6 header at packet offset off
 * into p (not the ports): the packet's own header (np_parse_l3) or the
 * inner header of a DSR request (np_dsr_accept). p must be zeroed: frag
 * and frag_id are written for a fragment only. 0: ok; -1: malformed. Not
 * inlined: its header copies (tc) stay off the callers' frames (the stack limit
 * counts the whole call chain). One parse_ip call per family: a common
 * tail testing v6 again costs the verifier more than it saves. */
static __noinline int np_parse_ip(axon_ctx_t *ctx, struct np_pkt *p, __u32 off, int v6)
{
	union parse_buf buf;
	struct packet l3 = {};

	if (off > CTX_MAX_OFF)
		return -1;
	if (!v6) {
		if (parse_ip(ctx, off, 0, NP_PARSE, &l3, &buf) == PARSE_MALFORMED)
			return -1;
		p->v6 = 0;
		p->l4_off = l3.l4_off;
		p->t.proto = l3.proto;
		p->ttl = l3.ip4->ttl;
		p->tot_len = l3.ip4->tot_len;
		if (l3.frag) { /* p is zeroed: a stored 0 only costs the verifier states (6.1) */
			p->frag = l3.frag;
			p->frag_id = l3.frag_id;
		}
		np_addr4(p->t.saddr, l3.ip4->saddr);
		np_addr4(p->t.daddr, l3.ip4->daddr);
		return 0;
	}
	if (parse_ip(ctx, off, 1, NP_PARSE, &l3, &buf) == PARSE_MALFORMED)
		return -1;
	p->v6 = 1;
	p->l4_off = l3.l4_off;
	p->t.proto = l3.proto;
	p->ttl = l3.ip6->hop_limit;
	p->tot_len = l3.ip6->payload_len;
	if (l3.frag) {
		p->frag = l3.frag;
		p->frag_id = l3.frag_id;
	}
	np_addr6(p->t.saddr, &l3.ip6->saddr);
	np_addr6(p->t.daddr, &l3.ip6->daddr);
	return 0;
}

/* np_parse_l3 reads the packet's IP header into p (not the ports). 0:
 * IPv4/IPv6 to act on; 1: not IP; -1: malformed. */
AXON_INLINE int np_parse_l3(axon_ctx_t *ctx, struct np_pkt *p)
{
	struct packet l3;
	enum parse_result r = parse_eth(ctx, &l3);

	if (r == PARSE_IPV4)
		return np_parse_ip(ctx, p, ETH_HLEN, 0);
	if (r == PARSE_IPV6)
		return np_parse_ip(ctx, p, ETH_HLEN, 1);
	return r == PARSE_NON_IP ? 1 : -1;
}

/* np_parse_ports reads the TCP/UDP ports (and TCP flags). */
AXON_INLINE int np_parse_ports(axon_ctx_t *ctx, struct np_pkt *p)
{
	__be16 ports[2];
	__u8 fl = 0;

	if (p->frag == AXON_FRAG_LATER) /* frag.h: no L4 header, ports from axon_np_frag */
		return 0;
	if (ctx_load(ctx, p->l4_off, ports, sizeof(ports)))
		return -1;
	p->t.sport = ports[0];
	p->t.dport = ports[1];
	if (p->t.proto == AXON_IPPROTO_TCP) {
		if (ctx_load(ctx, p->l4_off + 13, &fl, 1))
			return -1;
		p->tcp_flags = fl;
	}
	return 0;
}

AXON_INLINE __u32 np_l4_csum_off(const struct np_pkt *p)
{
	return p->l4_off + (p->t.proto == AXON_IPPROTO_TCP ? 16 : 6);
}

/* np_csum_fold32 folds a 64-bit sum of 32-bit words into the 32-bit
 * ones'-complement sum bpf_csum_diff returns (the same value modulo
 * 0xffff, which is all a 16-bit checksum sees). */
AXON_INLINE __u32 np_csum_fold32(__u64 s)
{
	s = (s & 0xffffffffULL) + (s >> 32);
	s = (s & 0xffffffffULL) + (s >> 32);
	return (__u32)s;
}

/* np_csum_step adds the change of one 32-bit word (memory order, as
 * bpf_csum_diff reads it) from o to n to sum s. */
AXON_INLINE __u64 np_csum_step(__u64 s, __u32 o, __u32 n)
{
	return s + (__u32)~o + n;
}

/* np_rewrite replaces addresses and ports of the packet's L3/L4 headers
 * with those of n, updating the IPv4 and TCP/UDP checksums incrementally;
 * with dec_ttl (the node forwards the packet, the caller checked ttl > 1)
 * the TTL / hop limit too. The differences are summed here, not by
 * bpf_csum_diff (a helper call each), and the IPv4 header checksum is
 * written once; at XDP the L4 checksum too (at tc the address part goes to
 * bpf_l4_csum_replace as a pseudo-header change, which a CHECKSUM_PARTIAL
 * or CHECKSUM_COMPLETE skb needs apart from the ports). */
AXON_INLINE int np_rewrite(axon_ctx_t *ctx, const struct np_pkt *p, const struct np_tuple *n, int dec_ttl)
{
	__u32 oldp, newp, d_addr, d_port;
	__u32 csum_off = np_l4_csum_off(p);
	int udp4 = !p->v6 && p->t.proto == AXON_IPPROTO_UDP;
	__u8 ttl = p->ttl - 1;

	__builtin_memcpy(&oldp, &p->t.sport, 4);
	__builtin_memcpy(&newp, &n->sport, 4);
	d_port = np_csum_fold32(np_csum_step(0, oldp, newp));
	if (p->v6) {
		const __u32 *o = (const __u32 *)p->t.saddr, *w = (const __u32 *)n->saddr; /* saddr, daddr: 32 bytes */
		__u64 s = 0;
		int i;

#pragma unroll
		for (i = 0; i < 8; i++)
			s = np_csum_step(s, o[i], w[i]);
		d_addr = np_csum_fold32(s);
		if (ctx_store(ctx, ETH_HLEN + 8, n->saddr, 32))
			return -1;
		if (dec_ttl && ctx_store(ctx, ETH_HLEN + 7, &ttl, 1))
			return -1;
	} else {
		__be32 w[2] = {np_v4(n->saddr), np_v4(n->daddr)};
		__u64 s = np_csum_step(np_csum_step(0, np_v4(p->t.saddr), w[0]), np_v4(p->t.daddr), w[1]);

		d_addr = np_csum_fold32(s);
		if (ctx_store(ctx, ETH_HLEN + 12, w, 8))
			return -1;
		if (dec_ttl) {
			/* the TTL is the first byte of its 16-bit word */
			s = np_csum_step(s, p->ttl, ttl);
			if (ctx_store(ctx, ETH_HLEN + 8, &ttl, 1))
				return -1;
		}
		if (ctx_l3_csum_diff(ctx, ETH_HLEN + 10, np_csum_fold32(s)))
			return -1;
	}
	if (p->frag == AXON_FRAG_LATER) /* frag.h: IP header only, the first fragment carried the L4 checksum */
		return 0;
	if (ctx_store(ctx, p->l4_off, &newp, 4))
		return -1;
	if (CTX_IS_XDP)
		return ctx_l4_csum_diff(ctx, csum_off, np_csum_fold32((__u64)d_addr + d_port), 1, udp4);
	if (ctx_l4_csum_diff(ctx, csum_off, d_addr, 1, udp4))
		return -1;
	return ctx_l4_csum_diff(ctx, csum_off, d_port, 0, udp4);
}

/* np_dec_ttl: the node forwards the packet. The caller checked ttl > 1. */
AXON_INLINE int np_dec_ttl(axon_ctx_t *ctx, const struct np_pkt *p)
{
	__u8 ttl = p->ttl - 1;

	if (p->v6)
		return ctx_store(ctx, ETH_HLEN + 7, &ttl, 1);
	if (ctx_store(ctx, ETH_HLEN + 8, &ttl, 1))
		return -1;
	return ctx_l3_csum_diff(ctx, ETH_HLEN + 10, np_csum_fold32(np_csum_step(0, p->ttl, ttl)));
}

#endif /* AXON_L4_H */
