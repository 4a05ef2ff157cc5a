/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* l3.h: TTL / hop limit handling and MAC rewrite. */
#ifndef AXON_L3_H
#define AXON_L3_H

#include "common.h"

/* ipv4_dec_ttl decrements the TTL and patches the header checksum
 * incrementally (RFC 1624, as the kernel's ip_decrease_ttl). The caller has
 * checked ttl > 1. */
AXON_INLINE void ipv4_dec_ttl(struct iphdr *ip4)
{
	__u32 check = (__u32)ip4->check;

	check += (__u32)bpf_htons(0x0100);
	ip4->check = (__sum16)(check + (check >= 0xFFFF));
	ip4->ttl--;
}

AXON_INLINE void ipv6_dec_hop_limit(struct ipv6hdr *ip6)
{
	ip6->hop_limit--;
}

AXON_INLINE void eth_rewrite(struct ethhdr *eth, const __u8 *dst, const __u8 *src)
{
	__builtin_memcpy(eth->h_dest, dst, ETH_ALEN);
	__builtin_memcpy(eth->h_source, src, ETH_ALEN);
}

#endif /* AXON_L3_H */
