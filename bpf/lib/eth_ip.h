/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* eth_ip.h: bounds-checked ethernet + IPv4/IPv6 header parsing. */
#ifndef AXON_ETH_IP_H
#define AXON_ETH_IP_H

#include "common.h"

/* Result of parse_packet. */
enum parse_result {
	PARSE_IPV4 = 0,
	PARSE_IPV6 = 1,
	PARSE_NON_IP = 2,    /* ARP or any other ethertype: the stack handles it */
	PARSE_MALFORMED = 3, /* truncated or inconsistent headers */
};

struct packet {
	struct ethhdr *eth;
	struct iphdr *ip4;   /* set for PARSE_IPV4 */
	struct ipv6hdr *ip6; /* set for PARSE_IPV6 */
};

/* parse_packet validates the L2/L3 headers of a tc skb. Pointers in pkt are
 * valid until the next helper that may change packet data. IPv4 options are
 * accepted (IHL 5..15); the whole IPv4 header must be in the linear area.
 *
 * IPv4 BIG TCP: a TCP GSO packet over 64 KiB has tot_len 0, its length is
 * skb->len (the kernel's iph_totlen()). It is accepted as the kernel does:
 * tot_len 0, TCP, and a GSO skb (gso_size set). Anything else with a total
 * length shorter than its header is malformed. Turning these away sent every
 * BIG TCP packet through the stack (ip_forward) instead of the BPF fast path,
 * and past the Bandwidth Manager's limits. */
AXON_INLINE enum parse_result parse_packet(struct __sk_buff *skb, struct packet *pkt)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;

	if ((void *)(eth + 1) > data_end)
		return PARSE_MALFORMED;
	pkt->eth = eth;

	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip4 = (void *)(eth + 1);
		__u32 hlen;

		if ((void *)(ip4 + 1) > data_end)
			return PARSE_MALFORMED;
		if (ip4->version != 4 || ip4->ihl < 5)
			return PARSE_MALFORMED;
		hlen = (__u32)ip4->ihl * 4;
		if ((void *)ip4 + hlen > data_end)
			return PARSE_MALFORMED;
		if (bpf_ntohs(ip4->tot_len) < hlen &&
		    !(ip4->tot_len == 0 && ip4->protocol == AXON_IPPROTO_TCP && skb->gso_size))
			return PARSE_MALFORMED;
		pkt->ip4 = ip4;
		return PARSE_IPV4;
	}
	if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);

		if ((void *)(ip6 + 1) > data_end)
			return PARSE_MALFORMED;
		if (ip6->version != 6)
			return PARSE_MALFORMED;
		pkt->ip6 = ip6;
		return PARSE_IPV6;
	}
	return PARSE_NON_IP;
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
