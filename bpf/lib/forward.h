/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* forward.h: delivery to a pod on this node. */
#ifndef AXON_FORWARD_H
#define AXON_FORWARD_H

#include "common.h"
#include "eth_ip.h"
#include "endpoint.h"
#include "l3.h"
#include "metrics.h"
#include "edt.h" /* the Bandwidth Manager's ingress policer */

/* ttl_expired: TTL / hop limit <= 1 must go to the stack, which answers with
 * ICMP time exceeded. Counted as AXON_PASS_TTL. */
AXON_INLINE int ttl_expired(struct packet *pkt, enum axon_dir dir)
{
	int ttl = pkt->ip4 ? pkt->ip4->ttl : pkt->ip6->hop_limit;

	if (ttl <= 1) {
		metrics_count(dir, AXON_PASS_TTL);
		return 1;
	}
	return 0;
}

/* local_lookup returns the endpoint of a pod on this node owning the
 * packet's destination, or NULL. */
AXON_INLINE struct endpoint_info *local_lookup(struct packet *pkt)
{
	if (pkt->ip4)
		return endpoint_lookup_v4(pkt->ip4->daddr);
	return endpoint_lookup_v6(&pkt->ip6->daddr);
}

/* deliver_local rewrites the ethernet header for the pod (dst = pod MAC,
 * src = host-side MAC), decrements the TTL and hands the packet to the pod
 * netns through bpf_redirect_peer: the node's IP forwarding is bypassed. */
AXON_INLINE int deliver_local(struct packet *pkt, const struct endpoint_info *ep,
			      enum axon_dir dir)
{
	long rc;

	if (pkt->ip4)
		ipv4_dec_ttl(pkt->ip4);
	else
		ipv6_dec_hop_limit(pkt->ip6);
	eth_rewrite(pkt->eth, ep->pod_mac, ep->host_mac);
	rc = bpf_redirect_peer(ep->ifindex, 0);
	if (rc != TC_ACT_REDIRECT) {
		metrics_count(dir, AXON_REDIRECT_FAILED);
		return TC_ACT_OK;
	}
	metrics_count(dir, AXON_REDIRECT_PEER_LOCAL);
	return rc;
}

/* uplink_to_pod delivers a packet that came in on the uplink to the local
 * pod ep owns its destination: the destination pod's ingress-bandwidth
 * limit (Bandwidth Manager; bpf_redirect_peer skips the host-side device's egress
 * hook, so it is policed here), then deliver_local. Counted in the uplink
 * ingress row. The caller has checked the TTL. */
AXON_INLINE int uplink_to_pod(struct __sk_buff *skb, struct packet *pkt,
			      const struct endpoint_info *ep, enum axon_prog prog)
{
	if (bw_ingress_police(skb, pkt)) {
		drop_packet(skb, prog, AXON_DROP_DIR_INGRESS, AXON_DROP_REASON_BW_INGRESS);
		return TC_ACT_SHOT;
	}
	return deliver_local(pkt, ep, AXON_DIR_UPLINK_INGRESS);
}

/* parse_or_count parses the packet and counts the non-IP/malformed cases.
 * Returns 1 when pkt holds an IPv4 or IPv6 packet to act on. */
AXON_INLINE int parse_or_count(struct __sk_buff *skb, struct packet *pkt, enum axon_dir dir)
{
	switch (parse_packet(skb, pkt)) {
	case PARSE_IPV4:
	case PARSE_IPV6:
		return 1;
	case PARSE_NON_IP:
		metrics_count(dir, AXON_PASS_ARP_NON_IP);
		return 0;
	default:
		metrics_count(dir, AXON_PASS_MALFORMED);
		return 0;
	}
}

/* local_scope: destinations that only the stack may handle. */
AXON_INLINE int local_scope(struct packet *pkt, enum axon_dir dir)
{
	int local = pkt->ip4 ? ipv4_is_local_scope(pkt->ip4->daddr)
			     : ipv6_is_local_scope(&pkt->ip6->daddr);

	if (local)
		metrics_count(dir, AXON_PASS_HOST_BOUND);
	return local;
}

#endif /* AXON_FORWARD_H */
