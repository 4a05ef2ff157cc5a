/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* ctx.h: one packet context for tc and XDP, so the load-balancing code in
 * nodeport.h is written once and compiled twice (lb_tc.c, lb_xdp.c).
 *
 * The including .c file defines AXON_CTX_XDP (XDP) or nothing (tc) before
 * including any lib header. This is the only compile-time switch of the LB:
 * everything else is a load-time constant.
 *
 * Verdicts:
 *   CTX_NEXT  not ours / continue: tc -> TC_ACT_UNSPEC (the next tcx program,
 *             axon's uplink_ingress, runs); XDP -> XDP_PASS (the stack, then tc)
 *   CTX_PASS  to the stack now (tc TC_ACT_OK, XDP XDP_PASS)
 *   CTX_DROP  drop
 */
#ifndef AXON_CTX_H
#define AXON_CTX_H

#include "common.h"

#ifdef AXON_CTX_XDP
typedef struct xdp_md axon_ctx_t;
#define CTX_NEXT XDP_PASS
#define CTX_PASS XDP_PASS
#define CTX_DROP XDP_DROP
#define CTX_IS_XDP 1
#else
typedef struct __sk_buff axon_ctx_t;
#define CTX_NEXT TC_ACT_UNSPEC
#define CTX_PASS TC_ACT_OK
#define CTX_DROP TC_ACT_SHOT
#define CTX_IS_XDP 0
#endif

AXON_INLINE void *ctx_data(const axon_ctx_t *ctx)
{
	return (void *)(long)ctx->data;
}

AXON_INLINE void *ctx_data_end(const axon_ctx_t *ctx)
{
	return (void *)(long)ctx->data_end;
}

/* ctx_ifindex: the device the packet arrived on. */
AXON_INLINE __u32 ctx_ifindex(const axon_ctx_t *ctx)
{
#ifdef AXON_CTX_XDP
	return ctx->ingress_ifindex;
#else
	return ctx->ifindex;
#endif
}

/* ctx_len: the packet's length from the ethernet header on, paged data
 * included at tc (skb->len); at XDP the linear frame (no BIG TCP there:
 * XDP sees packets before GRO). */
AXON_INLINE __u32 ctx_len(const axon_ctx_t *ctx)
{
#ifdef AXON_CTX_XDP
	return (__u32)(ctx->data_end - ctx->data);
#else
	return ctx->len;
#endif
}

/* ctx_gso_size: the skb's gso_size (non-zero for a GSO packet, BIG TCP
 * included); 0 at XDP, which sees packets before GRO. */
AXON_INLINE __u32 ctx_gso_size(const axon_ctx_t *ctx)
{
#ifdef AXON_CTX_XDP
	return 0;
#else
	return ctx->gso_size;
#endif
}

/* Largest packet offset the LB reads or writes at (headers only). */
#define CTX_MAX_OFF 192

/* ctx_bound_off returns off (already checked <= CTX_MAX_OFF) masked to 8
 * bits in the register that is added to the packet pointer. Verifiers
 * before ~6.3 do not carry a bounds check over to a copy of the offset the
 * compiler spilled before it, and reject the access as unbounded; the mask
 * gives them the bound on the register itself. */
AXON_INLINE __u32 ctx_bound_off(__u32 off)
{
	asm volatile("%0 &= 0xff" : "+r"(off));
	return off;
}

/* ctx_load copies len bytes at packet offset off into dst (len constant).
 * Direct packet access where the bytes are in the linear area (always at
 * XDP); tc falls back to bpf_skb_load_bytes, which also reads paged data. */
#define ctx_load(ctx, off, dst, len) ctx_load_bytes(ctx, off, dst, len)
AXON_INLINE int ctx_load_bytes(axon_ctx_t *ctx, __u32 off, void *dst, __u32 len)
{
	void *data = ctx_data(ctx), *end = ctx_data_end(ctx);
	void *p;

	if (off <= CTX_MAX_OFF) {
		p = data + ctx_bound_off(off);
		if (p + len <= end) {
			__builtin_memcpy(dst, p, len);
			return 0;
		}
	}
#ifdef AXON_CTX_XDP
	return -1;
#else
	return bpf_skb_load_bytes(ctx, off, dst, len);
#endif
}

/* ctx_store copies len bytes from src to packet offset off (len constant):
 * direct packet access where linear (the verifier un-clones tc skbs for
 * direct writes), else bpf_skb_store_bytes at tc. */
AXON_INLINE int ctx_store(axon_ctx_t *ctx, __u32 off, const void *src, __u32 len)
{
	void *data = ctx_data(ctx), *end = ctx_data_end(ctx);
	void *p;

	if (off <= CTX_MAX_OFF) {
		p = data + ctx_bound_off(off);
		if (p + len <= end) {
			__builtin_memcpy(p, src, len);
			return 0;
		}
	}
#ifdef AXON_CTX_XDP
	return -1;
#else
	return bpf_skb_store_bytes(ctx, off, src, len, 0);
#endif
}

/* csum_fold_diff applies a ones'-complement difference (as returned by
 * bpf_csum_diff) to a 16-bit checksum field, the way the kernel's
 * csum_replace_by_diff does: new = ~fold(diff + ~old). */
AXON_INLINE __u16 csum_fold_diff(__u16 old, __s64 diff)
{
	__u64 s = (__u64)(__u32)diff + (__u16)~old;

	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	return (__u16)~s;
}

/* ctx_l3_csum_diff adds diff to the IPv4 header checksum at packet offset
 * off: in place where linear (always at XDP). At tc that is what
 * bpf_l3_csum_replace does too (the header checksum is not part of an
 * skb's checksum state: a header whose checksum is right sums to the same
 * before and after); the helper (invalidates packet pointers) is the
 * fallback for a header outside the linear area. */
AXON_INLINE int ctx_l3_csum_diff(axon_ctx_t *ctx, __u32 off, __s64 diff)
{
	void *data = ctx_data(ctx), *end = ctx_data_end(ctx);
	__u16 *p;

	if (off <= CTX_MAX_OFF) {
		p = data + ctx_bound_off(off);
		if ((void *)(p + 1) <= end) {
			*p = csum_fold_diff(*p, diff);
			return 0;
		}
	}
#ifdef AXON_CTX_XDP
	return -1;
#else
	return bpf_l3_csum_replace(ctx, off, 0, (__u32)diff, 0);
#endif
}

/* ctx_l4_csum_diff adds diff to the TCP/UDP/ICMPv6 checksum at packet
 * offset off. pseudo: diff changes the pseudo header (addresses), which
 * matters for tc skbs with CHECKSUM_PARTIAL/COMPLETE. udp4: a zero UDP/IPv4
 * checksum means "none" and stays zero; a result of zero is sent as 0xffff.
 * tc uses bpf_l4_csum_replace (invalidates packet pointers). */
AXON_INLINE int ctx_l4_csum_diff(axon_ctx_t *ctx, __u32 off, __s64 diff, int pseudo, int udp4)
{
#ifdef AXON_CTX_XDP
	void *data = ctx_data(ctx), *end = ctx_data_end(ctx);
	__u16 *p;
	__u16 v;

	if (off > 512)
		return -1;
	p = data + off;
	if ((void *)(p + 1) > end)
		return -1;
	if (udp4 && *p == 0)
		return 0;
	v = csum_fold_diff(*p, diff);
	if (udp4 && v == 0)
		v = 0xffff;
	*p = v;
	return 0;
#else
	__u64 flags = 0;

	if (pseudo)
		flags |= BPF_F_PSEUDO_HDR;
	if (udp4)
		flags |= BPF_F_MARK_MANGLED_0;
	return bpf_l4_csum_replace(ctx, off, 0, (__u32)diff, flags);
#endif
}

/* ctx_grow_head inserts len bytes between the ethernet and the IP header
 * (for an outer IP header, lib/dsr.h). proto is the outer family
 * (ETH_P_IP / ETH_P_IPV6). On success the caller re-reads every pointer. */
AXON_INLINE int ctx_grow_head(axon_ctx_t *ctx, __u32 len, int outer_v6)
{
#ifdef AXON_CTX_XDP
	struct ethhdr eth;
	void *data, *end;

	data = ctx_data(ctx);
	end = ctx_data_end(ctx);
	if (data + sizeof(eth) > end)
		return -1;
	__builtin_memcpy(&eth, data, sizeof(eth));
	if (bpf_xdp_adjust_head(ctx, -(int)len))
		return -1;
	data = ctx_data(ctx);
	end = ctx_data_end(ctx);
	if (data + sizeof(eth) > end)
		return -1;
	__builtin_memcpy(data, &eth, sizeof(eth));
	return 0;
#else
	__u64 flags = outer_v6 ? BPF_F_ADJ_ROOM_ENCAP_L3_IPV6 : BPF_F_ADJ_ROOM_ENCAP_L3_IPV4;

	return bpf_skb_adjust_room(ctx, len, BPF_ADJ_ROOM_MAC, flags);
#endif
}

#endif /* AXON_CTX_H */
