/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* srcguard.h: source address validation at pod egress. A pod may send only
 * as itself; everything else it sends is dropped and counted here, before
 * any forwarding decision, so a spoofed packet reaches neither another pod,
 * nor the node's stack, nor the uplink.
 *
 * What a pod owns: an address whose endpoint entry (axon_ep_v4/axon_ep_v6,
 * lib/endpoint.h) names the device the packet came from. That device is
 * skb->ifindex: at tc ingress of a veth it is the host-side veth; on a
 * netkit peer (cfg_netkit) netkit has already set skb->dev to the primary
 * before its programs run. Both are the endpoint's ifindex, so one compare
 * serves both device types. An address with no entry (not yet written by
 * the agent, or already deleted) is owned by nobody: the agent attaches the
 * program before it writes the pod's entries, and the pod's own traffic of
 * that window is dropped; the sandbox's containers only start after CNI ADD
 * returns, when the entries exist, and the kernel's own traffic of the
 * window (DAD, router solicitations, MLD) uses link-local or unspecified
 * sources, which pass below.
 *
 * The rules (a verdict per frame):
 *   - a VLAN tag (skb->vlan_present; the stack strips 802.1Q into metadata
 *     before tc) -> AXON_DROP_L2: forwarded, the tag would leave the uplink
 *     and reach another VLAN.
 *   - ARP (Ethernet/IPv4) -> the sender address must be the pod's, or
 *     0.0.0.0 (an ARP probe); otherwise, or a short or non-Ethernet/IPv4
 *     ARP, AXON_DROP_SPOOF_ARP.
 *   - any other non-IP ethertype -> AXON_DROP_L2: a pod network carries IP
 *     and ARP only.
 *   - headers the parser cannot check (truncated, or not in the linear area:
 *     a packet socket's frame over a page) -> AXON_DROP_MALFORMED. Passed to
 *     the stack, which pulls and accepts what this program cannot see, they
 *     were forwarded with any source.
 *   - IPv4: the source must be the pod's (0.0.0.0, 169.254/16 and every
 *     other address included) -> AXON_DROP_SPOOF_SRC.
 *   - IPv6: the source must be the pod's; or link-local (fe80::/10) to a
 *     link-local or multicast destination (ND, router solicitation, MLD: a
 *     link-local address means something on this link only, the pod's own
 *     link to the node); or unspecified (::) to a multicast destination
 *     (DAD's Neighbor Solicitation, MLD reports during DAD). Else
 *     AXON_DROP_SPOOF_SRC.
 *   - ICMPv6 (directly or behind a hop-by-hop header): a Neighbor
 *     Advertisement must claim an address the pod owns or a link-local one;
 *     Router Advertisements and Redirects are never a pod's to send ->
 *     AXON_DROP_SPOOF_ND.
 *
 * Cost: one endpoint-map lookup per packet (the source's; the forwarding
 * decision's lookup is of the destination, another key), and for ICMPv6 or
 * a hop-by-hop header the ND check. */
#ifndef AXON_SRCGUARD_H
#define AXON_SRCGUARD_H

#include "common.h"
#include "eth_ip.h"
#include "endpoint.h"
#include "metrics.h"
#include "drop.h"
#include "arp.h"

/* ICMPv6 types the guard reads (RFC 4861). */
#define SRCGUARD_ND_RA 134       /* Router Advertisement */
#define SRCGUARD_ND_NA 136       /* Neighbor Advertisement */
#define SRCGUARD_ND_REDIRECT 137 /* Redirect */

/* struct srcguard_icmp6: the ICMPv6 header and the first 16 bytes of an ND
 * message: a Neighbor Advertisement's target address. */
struct srcguard_icmp6 {
	__u8 type, code;
	__be16 csum;
	__be32 flags;
	struct in6_addr target;
};

/* srcguard_owns_v4 / _v6: the pod behind the device the packet came in on
 * owns address a (see above). */
AXON_INLINE int srcguard_owns_v4(const struct __sk_buff *skb, __be32 a)
{
	const struct endpoint_info *ep = endpoint_lookup_v4(a);

	return ep && ep->ifindex == skb->ifindex;
}

AXON_INLINE int srcguard_owns_v6(const struct __sk_buff *skb, const struct in6_addr *a)
{
	const struct endpoint_info *ep = endpoint_lookup_v6(a);

	return ep && ep->ifindex == skb->ifindex;
}

AXON_INLINE int ipv6_is_link_local(const struct in6_addr *a)
{
	return a->in6_u.u6_addr8[0] == 0xfe && (a->in6_u.u6_addr8[1] & 0xc0) == 0x80;
}

AXON_INLINE int ipv6_is_unspecified(const struct in6_addr *a)
{
	return (a->in6_u.u6_addr32[0] | a->in6_u.u6_addr32[1] |
		a->in6_u.u6_addr32[2] | a->in6_u.u6_addr32[3]) == 0;
}

/* srcguard_arp: 0 when the pod may send this ARP message (copied into
 * *buf), else the drop reason. */
AXON_INLINE int srcguard_arp(struct __sk_buff *skb, struct arp_ipv4 *buf)
{
	struct arp_ipv4 *arp;
	__be32 spa;

	if (parse_hdr(skb, ETH_HLEN, buf, sizeof(*buf), PARSE_COPY, (void **)&arp)) /* arp = buf */
		return AXON_DROP_SPOOF_ARP;
	if (arp->htype != bpf_htons(1) || arp->ptype != bpf_htons(ETH_P_IP) ||
	    arp->hlen != 6 || arp->plen != 4)
		return AXON_DROP_SPOOF_ARP;
	__builtin_memcpy(&spa, arp->spa, sizeof(spa));
	if (spa == 0 || srcguard_owns_v4(skb, spa))
		return 0;
	return AXON_DROP_SPOOF_ARP;
}

/* srcguard_nd: the ICMPv6 rule above. 0 or the drop reason. */
AXON_INLINE int srcguard_nd(struct __sk_buff *skb, const struct packet *pkt)
{
	struct srcguard_icmp6 buf, *icmp;
	struct { __u8 type, code; __be16 csum; } hdr, *h;
	struct packet l4 = {};

	if (pkt->ip6->nexthdr != AXON_IPPROTO_ICMPV6 && pkt->ip6->nexthdr != AXON_IPPROTO_HOPOPTS)
		return 0;
	/* the transport header behind a hop-by-hop header (or a fragment
	 * header; the kernel drops fragmented ND, RFC 6980) */
	if (parse_ip(skb, ETH_HLEN, 1, PARSE_L4, &l4, NULL) != PARSE_IPV6)
		return AXON_DROP_MALFORMED;
	if (l4.proto != AXON_IPPROTO_ICMPV6 || l4.frag == AXON_FRAG_LATER)
		return 0;
	/* no ICMPv6 header: the stack drops it */
	if (parse_hdr(skb, l4.l4_off, &hdr, sizeof(hdr), PARSE_COPY, (void **)&h))
		return 0;
	switch (h->type) {
	case SRCGUARD_ND_RA:
	case SRCGUARD_ND_REDIRECT:
		return AXON_DROP_SPOOF_ND;
	case SRCGUARD_ND_NA:
		/* shorter than an NA: the stack drops it too */
		if (parse_hdr(skb, l4.l4_off, &buf, sizeof(buf), PARSE_COPY, (void **)&icmp))
			return AXON_DROP_SPOOF_ND;
		if (ipv6_is_link_local(&icmp->target) || srcguard_owns_v6(skb, &icmp->target))
			return 0;
		return AXON_DROP_SPOOF_ND;
	}
	return 0;
}

/* srcguard_ip: the IPv4/IPv6 source rule and the ND rule above. 0 or the
 * drop reason. */
AXON_INLINE int srcguard_ip(struct __sk_buff *skb, const struct packet *pkt)
{
	const struct in6_addr *src;

	if (pkt->ip4)
		return srcguard_owns_v4(skb, pkt->ip4->saddr) ? 0 : AXON_DROP_SPOOF_SRC;
	src = &pkt->ip6->saddr;
	if (ipv6_is_link_local(src)) {
		if (!ipv6_is_local_scope(&pkt->ip6->daddr))
			return AXON_DROP_SPOOF_SRC;
	} else if (ipv6_is_unspecified(src)) {
		if (pkt->ip6->daddr.in6_u.u6_addr8[0] != 0xff)
			return AXON_DROP_SPOOF_SRC;
	} else if (!srcguard_owns_v6(skb, src)) {
		return AXON_DROP_SPOOF_SRC;
	}
	return srcguard_nd(skb, pkt);
}

/* srcguard_drop_reason: the drop vocabulary's name (lib/drop.h) of a
 * source guard verdict. */
AXON_INLINE enum axon_drop_reason srcguard_drop_reason(int reason)
{
	switch (reason) {
	case AXON_DROP_SPOOF_SRC:
		return AXON_DROP_REASON_SPOOF_SRC;
	case AXON_DROP_SPOOF_ARP:
		return AXON_DROP_REASON_SPOOF_ARP;
	case AXON_DROP_SPOOF_ND:
		return AXON_DROP_REASON_SPOOF_ND;
	case AXON_DROP_L2:
		return AXON_DROP_REASON_L2;
	default:
		return AXON_DROP_REASON_MALFORMED;
	}
}

/* srcguard_parse parses what a pod sent (parse_packet) and applies the
 * rules above. Returns 1 for an IPv4/IPv6 packet the pod may send, for the
 * caller to forward; 0 when *verdict is decided: for ARP the pod may send,
 * the reply's redirect when it asks for gateway (lib/arp.h; 0: no gateway
 * answered), else TC_ACT_OK (counted AXON_PASS_ARP_NON_IP); TC_ACT_SHOT for
 * a drop (counted by its reason). */
AXON_INLINE int srcguard_parse(struct __sk_buff *skb, struct packet *pkt, enum axon_dir dir,
			       __be32 gateway, int *verdict)
{
	struct arp_ipv4 arp;
	int reason, answer;

	*verdict = TC_ACT_SHOT;
	if (skb->vlan_present) {
		metrics_count(dir, AXON_DROP_L2);
		drop_packet(skb, AXON_PROG_POD_EGRESS, AXON_DROP_DIR_INGRESS, AXON_DROP_REASON_L2);
		return 0;
	}
	switch (parse_packet(skb, pkt)) {
	case PARSE_IPV4:
	case PARSE_IPV6:
		reason = srcguard_ip(skb, pkt);
		if (!reason)
			return 1;
		break;
	case PARSE_NON_IP:
		if (pkt->eth->h_proto != bpf_htons(ETH_P_ARP)) {
			reason = AXON_DROP_L2;
			break;
		}
		reason = srcguard_arp(skb, &arp);
		if (!reason) {
			answer = arp_answer_gateway(skb, &arp, gateway, dir);
			if (answer >= 0) {
				*verdict = answer;
				return 0;
			}
			metrics_count(dir, AXON_PASS_ARP_NON_IP);
			*verdict = TC_ACT_OK;
			return 0;
		}
		break;
	default:
		reason = AXON_DROP_MALFORMED;
	}
	metrics_count(dir, (enum axon_reason)reason);
	drop_packet(skb, AXON_PROG_POD_EGRESS, AXON_DROP_DIR_INGRESS, srcguard_drop_reason(reason));
	return 0;
}

#endif /* AXON_SRCGUARD_H */
