/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* pod_egress.c: every packet leaving the pod. Attached to the tc ingress of
 * a pod's host-side veth, or (cfg_netkit = 1) to the peer of a netkit pair
 * (BPF_NETKIT_PEER), where it runs in the pod's own transmit path with
 * skb->dev already the host-side primary: no backlog queue on the way out.
 * Local pod -> bpf_redirect_peer (veth) / bpf_redirect to the pod's
 * host-side device (netkit: redirect_peer only works at tc ingress);
 * routable -> FIB + bpf_redirect / bpf_redirect_neigh; else -> the stack.
 * First of all, a packet whose source the pod does not own is dropped
 * (source address validation, lib/srcguard.h). */
#include "lib/common.h"
#include "lib/eth_ip.h"
#include "lib/endpoint.h"
#include "lib/metrics.h"
#include "lib/forward.h"
#include "lib/fib.h"
#include "lib/edt.h" /* the Bandwidth Manager's ingress policer */
#include "lib/srcguard.h"

/* Load-time configuration (set by the loader from feature probes; the
 * verifier prunes the disabled branches, so a kernel without a helper still
 * loads the program). */
volatile const __u8 cfg_enable_fib = 1;   /* 0: non-local traffic goes to the stack */
volatile const __u8 cfg_enable_neigh = 1; /* 0: NO_NEIGH goes to the stack */
volatile const __u8 cfg_netkit = 0;       /* 1: runs on a netkit peer (xmit path), not at tc ingress */
volatile const __u8 cfg_fib_cache = 0;    /* 1: IPv4 routes cached under rt_genid (lib/fib_cache.h) */
/* The pods' IPv4 gateway (axon-cni's 169.254.1.1, network byte order): an
 * ARP request for it from the pod is answered here (lib/arp.h). 0: passed
 * to the stack like any ARP. */
volatile const __be32 cfg_gateway_v4 = 0;

/* deliver_local_xmit: local delivery from a netkit peer program. The skb is
 * in a device's transmit path, where bpf_redirect_peer is refused, so it is
 * sent out of the target pod's host-side device instead (a veth or netkit
 * primary hands it to the pod). Same rewrite and counter as deliver_local. */
AXON_INLINE int deliver_local_xmit(struct packet *pkt, const struct endpoint_info *ep,
				   enum axon_dir dir)
{
	if (pkt->ip4)
		ipv4_dec_ttl(pkt->ip4);
	else
		ipv6_dec_hop_limit(pkt->ip6);
	eth_rewrite(pkt->eth, ep->pod_mac, ep->host_mac);
	metrics_count(dir, AXON_REDIRECT_PEER_LOCAL);
	return bpf_redirect(ep->ifindex, 0);
}

SEC("tc")
int axon_pod_egress(struct __sk_buff *skb)
{
	const enum axon_dir dir = AXON_DIR_POD_EGRESS;
	struct packet pkt = {};
	struct endpoint_info *ep;
	int verdict;

	/* only what the pod may send as itself goes on (lib/srcguard.h) */
	if (!srcguard_parse(skb, &pkt, dir, cfg_gateway_v4, &verdict))
		return verdict;
	if (local_scope(&pkt, dir))
		return TC_ACT_OK;
	if (ttl_expired(&pkt, dir))
		return TC_ACT_OK;

	ep = local_lookup(&pkt);
	if (ep) {
		/* the Bandwidth Manager: the destination pod's ingress limit */
		if (bw_ingress_police(skb, &pkt)) {
			drop_packet(skb, AXON_PROG_POD_EGRESS, AXON_DROP_DIR_INGRESS, AXON_DROP_REASON_BW_INGRESS);
			return TC_ACT_SHOT;
		}
		if (cfg_netkit)
			return deliver_local_xmit(&pkt, ep, dir);
		return deliver_local(&pkt, ep, dir);
	}

	if (!cfg_enable_fib) {
		metrics_count(dir, AXON_PASS_NO_ROUTE);
		return TC_ACT_OK;
	}
	return fib_forward(skb, &pkt, dir, cfg_enable_neigh, cfg_fib_cache);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
