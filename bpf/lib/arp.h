/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* arp.h: the Ethernet/IPv4 ARP message and the answer to a pod's ARP
 * request for its gateway.
 *
 * A pod routes through a gateway address that exists nowhere (axon-cni's
 * 169.254.1.1, given to axon_pod_egress as cfg_gateway_v4): axon-cni gives
 * the pod a PERMANENT neighbour entry mapping it to the host-side device's
 * MAC, so an ordinary pod never asks. Something that keeps its own ARP
 * cache does: a VM guest behind the pod's bridge (KubeVirt's bridge
 * binding), or a pod whose entry was flushed. The node's stack does not
 * answer for an address it does not have, so pod_egress answers: the
 * request, once the source guard has shown the sender address is the pod's,
 * becomes the reply in place and goes back out of the device it came from,
 * to the pod. Cilium answers the same way at the same hook. */
#ifndef AXON_ARP_H
#define AXON_ARP_H

#include "common.h"
#include "eth_ip.h"
#include "endpoint.h"
#include "metrics.h"

#define ARP_OP_REQUEST 1
#define ARP_OP_REPLY 2

/* struct arp_ipv4: an Ethernet/IPv4 ARP message (RFC 826), 28 bytes. */
struct arp_ipv4 {
	__be16 htype;   /* 1: Ethernet */
	__be16 ptype;   /* ETH_P_IP */
	__u8 hlen;      /* 6 */
	__u8 plen;      /* 4 */
	__be16 op;
	__u8 sha[6];    /* sender MAC */
	__u8 spa[4];    /* sender IPv4 address: what the message claims */
	__u8 tha[6];
	__u8 tpa[4];
} __attribute__((packed));

/* struct arp_frame: the 42 bytes an ARP reply rewrites. */
struct arp_frame {
	struct ethhdr eth;
	struct arp_ipv4 arp;
} __attribute__((packed));

/* arp_answer_gateway: when req (validated by the source guard: its sender
 * address is the pod's behind skb->ifindex) asks for gateway, rewrites the
 * frame into the reply (the gateway at the host-side device's MAC, to the
 * asker) and returns the redirect that sends it back to the pod, counted
 * AXON_REDIRECT_ARP_REPLY. Returns -1 for anything else (the caller passes
 * it on as before). gateway 0: never answers. */
AXON_INLINE int arp_answer_gateway(struct __sk_buff *skb, const struct arp_ipv4 *req,
				   __be32 gateway, enum axon_dir dir)
{
	const struct endpoint_info *ep;
	struct arp_frame r;
	__be32 spa, tpa;

	__builtin_memcpy(&spa, req->spa, sizeof(spa));
	__builtin_memcpy(&tpa, req->tpa, sizeof(tpa));
	if (!gateway || req->op != bpf_htons(ARP_OP_REQUEST) || tpa != gateway || spa == 0)
		return -1;
	ep = endpoint_lookup_v4(spa);
	if (!ep || ep->ifindex != skb->ifindex)
		return -1;
	__builtin_memcpy(r.eth.h_dest, req->sha, ETH_ALEN);
	__builtin_memcpy(r.eth.h_source, ep->host_mac, ETH_ALEN);
	r.eth.h_proto = bpf_htons(ETH_P_ARP);
	r.arp.htype = req->htype;
	r.arp.ptype = req->ptype;
	r.arp.hlen = req->hlen;
	r.arp.plen = req->plen;
	r.arp.op = bpf_htons(ARP_OP_REPLY);
	__builtin_memcpy(r.arp.sha, ep->host_mac, ETH_ALEN);
	__builtin_memcpy(r.arp.spa, &gateway, sizeof(gateway));
	__builtin_memcpy(r.arp.tha, req->sha, ETH_ALEN);
	__builtin_memcpy(r.arp.tpa, &spa, sizeof(spa));
	if (bpf_skb_store_bytes(skb, 0, &r, sizeof(r), 0))
		return -1;
	metrics_count(dir, AXON_REDIRECT_ARP_REPLY);
	return bpf_redirect(ep->ifindex, 0);
}

#endif /* AXON_ARP_H */
