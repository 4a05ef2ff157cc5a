/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* icmp_err.h: ICMP errors quoting a translated flow (included by
 * nodeport.h), so Path MTU discovery and unreachable errors work through
 * the load balancer. Handled: ICMPv4 destination unreachable (incl.
 * fragmentation needed) and time exceeded; ICMPv6 destination unreachable,
 * packet too big and time exceeded. The quoted (inner) header must be
 * TCP/UDP right after the IP header.
 *
 *  a) error about a packet the node sent to a backend after SNAT (inner
 *     snat:natport -> backend, found in axon_np_nat as the reverse of the
 *     inner header): inner becomes client -> frontend, outer frontend ->
 *     client; sent on toward the client.
 *  b) error about a reply sent to the client (inner frontend -> client,
 *     found in axon_np_ct as the reverse of the inner header): inner
 *     becomes what the backend sent (backend -> snat:natport for SNAT,
 *     backend -> client for a local backend), outer goes to the backend;
 *     DSR flows get the error IPIP-encapsulated unchanged, and the backend
 *     node's np_dsr_accept takes it in when the quoted flow is a local
 *     DNAT to the pod it was sent to, then translates it here as for a
 *     local backend.
 * Checksums: outer IPv4 header, ICMP (incl. the ICMPv6 pseudo header) and
 * the inner IPv4 header are updated; the quoted TCP/UDP checksum is left
 * as is (usually truncated, never verified by the receiver).
 */
#ifndef AXON_ICMP_ERR_H
#define AXON_ICMP_ERR_H

/* np_icmp_rewrite rewrites outer source/destination to osrc/odst and the
 * quoted tuple (inner_off: inner IP header, inner_l4: its ports) from *old
 * to *nw, with every checksum. */
AXON_INLINE int np_icmp_rewrite(axon_ctx_t *ctx, const struct np_pkt *p, __u32 inner_off, __u32 inner_l4,
				const struct np_tuple *old, const struct np_tuple *nw,
				const __u8 *osrc, const __u8 *odst)
{
	__u32 icsum_off = p->l4_off + 2;
	__u32 op, np;
	__s64 d_icmp;

	__builtin_memcpy(&op, &old->sport, 4);
	__builtin_memcpy(&np, &nw->sport, 4);
	d_icmp = bpf_csum_diff(&op, 4, &np, 4, 0);
	if (ctx_store(ctx, inner_l4, &np, 4))
		return -1;
	if (p->v6) {
		__s64 d_o;

		d_icmp = bpf_csum_diff((__be32 *)old->saddr, 32, (__be32 *)nw->saddr, 32, d_icmp);
		if (ctx_store(ctx, inner_off + 8, nw->saddr, 32))
			return -1;
		/* ICMPv6: the outer addresses are in the pseudo header */
		d_o = bpf_csum_diff((__be32 *)p->t.saddr, 16, (__be32 *)osrc, 16, 0);
		d_o = bpf_csum_diff((__be32 *)p->t.daddr, 16, (__be32 *)odst, 16, d_o);
		if (ctx_store(ctx, ETH_HLEN + 8, osrc, 16) || ctx_store(ctx, ETH_HLEN + 24, odst, 16))
			return -1;
		if (ctx_l4_csum_diff(ctx, icsum_off, d_icmp, 0, 0))
			return -1;
		return ctx_l4_csum_diff(ctx, icsum_off, d_o, 1, 0);
	} else {
		__be32 oi[2] = {np_v4(old->saddr), np_v4(old->daddr)};
		__be32 ni[2] = {np_v4(nw->saddr), np_v4(nw->daddr)};
		__be32 oo[2] = {np_v4(p->t.saddr), np_v4(p->t.daddr)};
		__be32 no[2] = {np_v4(osrc), np_v4(odst)};
		__u32 oc = 0, nc = 0;
		__u16 c16;
		__s64 d_ia = bpf_csum_diff(oi, 8, ni, 8, 0);

		/* inner IPv4 header checksum */
		if (ctx_load(ctx, inner_off + 10, &c16, 2))
			return -1;
		oc = c16;
		c16 = csum_fold_diff(c16, d_ia);
		nc = c16;
		if (ctx_store(ctx, inner_off + 12, ni, 8) || ctx_store(ctx, inner_off + 10, &c16, 2))
			return -1;
		d_icmp = bpf_csum_diff(oi, 8, ni, 8, d_icmp);
		d_icmp = bpf_csum_diff(&oc, 4, &nc, 4, d_icmp);
		if (ctx_l4_csum_diff(ctx, icsum_off, d_icmp, 0, 0))
			return -1;
		/* outer header */
		if (ctx_store(ctx, ETH_HLEN + 12, no, 8))
			return -1;
		return ctx_l3_csum_diff(ctx, ETH_HLEN + 10, bpf_csum_diff(oo, 8, no, 8, 0));
	}
}

AXON_INLINE void np_tuple_swap(struct np_tuple *dst, const struct np_tuple *src)
{
	__builtin_memcpy(dst->saddr, src->daddr, 16);
	__builtin_memcpy(dst->daddr, src->saddr, 16);
	dst->sport = src->dport;
	dst->dport = src->sport;
	dst->proto = src->proto;
	dst->pad[0] = dst->pad[1] = dst->pad[2] = 0;
}

/* np_icmp_quoted reads the flow an ICMP error at p->l4_off is about: it
 * (the quoted header's tuple, as the quoted packet was sent), the quoted IP
 * header's offset and its ports' offset. 0: an error type this file
 * handles, quoting TCP/UDP; 1: anything else; -1: truncated. */
AXON_INLINE int np_icmp_quoted(axon_ctx_t *ctx, const struct np_pkt *p, struct np_tuple *it,
			       __u32 *inner_off, __u32 *inner_l4)
{
	__be16 ports[2];
	__u8 type;

	*inner_off = p->l4_off + 8;
	if (ctx_load(ctx, p->l4_off, &type, 1))
		return 1;
	if (p->v6) {
		struct ipv6hdr ip6;

		if (type != AXON_ICMP6_DEST_UNREACH && type != AXON_ICMP6_PKT_TOOBIG && type != AXON_ICMP6_TIME_EXCEED)
			return 1;
		if (ctx_load(ctx, *inner_off, &ip6, sizeof(ip6)))
			return -1;
		it->proto = ip6.nexthdr;
		__builtin_memcpy(it->saddr, &ip6.saddr, 16);
		__builtin_memcpy(it->daddr, &ip6.daddr, 16);
		*inner_l4 = *inner_off + sizeof(ip6);
	} else {
		struct iphdr ip;

		if (type != AXON_ICMP_DEST_UNREACH && type != AXON_ICMP_TIME_EXCEEDED)
			return 1;
		if (ctx_load(ctx, *inner_off, &ip, sizeof(ip)))
			return -1;
		if (ip.ihl < 5)
			return -1;
		it->proto = ip.protocol;
		np_addr4(it->saddr, ip.saddr);
		np_addr4(it->daddr, ip.daddr);
		*inner_l4 = *inner_off + (__u32)ip.ihl * 4;
	}
	if (it->proto != AXON_IPPROTO_TCP && it->proto != AXON_IPPROTO_UDP)
		return 1;
	if (ctx_load(ctx, *inner_l4, ports, sizeof(ports)))
		return -1;
	it->sport = ports[0];
	it->dport = ports[1];
	return 0;
}

/* Not inlined: its own stack frame (the BPF stack is 512 bytes). */
static __noinline int np_icmp_error(axon_ctx_t *ctx, struct np_pkt *p, enum np_hook hook)
{
	struct np_scratch *sc = np_scratch();
	struct np_tuple it = {}, rk, nw;
	struct bpf_fib_lookup *fp;
	struct np_nat *nat;
	struct np_ct *ctp, ct;
	__u8 osrc[16], odst[16];
	__u32 inner_off, inner_l4;
	long rc = 0;

	if (!sc)
		return CTX_NEXT;
	fp = &sc->fp;
	rc = np_icmp_quoted(ctx, p, &it, &inner_off, &inner_l4);
	if (rc > 0)
		goto not_ours;
	if (rc < 0)
		goto malformed;
	np_tuple_swap(&rk, &it);

	if (p->ttl <= 1) {
		np_count(hook, NP_TTL);
		return CTX_PASS;
	}
	/* a) about a packet sent to a backend after SNAT */
	nat = bpf_map_lookup_elem(&axon_np_nat, &rk);
	if (nat && (nat->flags & NP_NAT_SNAT)) {
		__builtin_memcpy(nw.saddr, nat->daddr, 16);
		__builtin_memcpy(nw.daddr, nat->saddr, 16);
		nw.sport = nat->dport;
		nw.dport = nat->sport;
		nw.proto = it.proto;
		__builtin_memcpy(osrc, nat->saddr, 16);
		__builtin_memcpy(odst, nat->daddr, 16);
		goto route;
	}
	/* b) about a reply sent to the client */
	ctp = np_ct_any(&rk);
	if (!ctp)
		goto not_ours;
	__builtin_memcpy(&ct, ctp, sizeof(ct));
	if (ct.flags & NP_CT_DSR) {
		if (np_snat_addr(&rk, p->v6, osrc)) {
			return np_drop(ctx, hook, NP_DROP_NO_SNAT_ADDR);
		}
		if (!cfg_dry_run) {
			rc = np_fib(ctx, p->v6, osrc, ct.be_addr, fp, NULL, NULL);
			if (!np_fib_usable(rc))
				goto no_route;
		}
		if (p->v6 ? dsr_encap6(ctx, osrc, ct.be_addr) : dsr_encap4(ctx, np_v4(osrc), np_v4(ct.be_addr))) {
			return np_drop(ctx, hook, NP_REWRITE_FAIL);
		}
		np_count(hook, NP_ICMP_ERROR);
		return cfg_dry_run ? CTX_PASS : np_send(ctx, rc, fp);
	}
	__builtin_memcpy(nw.saddr, ct.be_addr, 16);
	nw.sport = ct.be_port;
	nw.proto = it.proto;
	__builtin_memcpy(odst, ct.be_addr, 16);
	if (ct.flags & NP_CT_LOCAL) {
		__builtin_memcpy(nw.daddr, it.daddr, 16);
		nw.dport = it.dport;
		__builtin_memcpy(osrc, p->t.saddr, 16);
		if (np_icmp_rewrite(ctx, p, inner_off, inner_l4, &it, &nw, osrc, odst)) {
			return np_drop(ctx, hook, NP_REWRITE_FAIL);
		}
		np_count(hook, NP_ICMP_ERROR);
		return CTX_NEXT;
	}
	if (np_snat_addr(&rk, p->v6, nw.daddr)) {
		return np_drop(ctx, hook, NP_DROP_NO_SNAT_ADDR);
	}
	nw.dport = ct.nat_port;
	__builtin_memcpy(osrc, nw.daddr, 16);
route:
	if (!cfg_dry_run) {
		rc = np_fib(ctx, p->v6, osrc, odst, fp, NULL, NULL);
		if (!np_fib_usable(rc))
			goto no_route;
	}
	if (np_icmp_rewrite(ctx, p, inner_off, inner_l4, &it, &nw, osrc, odst) || np_dec_ttl(ctx, p)) {
		return np_drop(ctx, hook, NP_REWRITE_FAIL);
	}
	np_count(hook, NP_ICMP_ERROR);
	return cfg_dry_run ? CTX_PASS : np_send(ctx, rc, fp);

no_route:
	return np_unroutable(ctx, rc, hook);
malformed:
	np_count(hook, NP_MALFORMED);
	return CTX_NEXT;
not_ours:
	np_count(hook, NP_NOT_SERVICE);
	return CTX_NEXT;
}

#endif /* AXON_ICMP_ERR_H */
