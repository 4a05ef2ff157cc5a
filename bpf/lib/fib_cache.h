/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* fib_cache.h: a per-CPU cache of IPv4 FIB routes, invalidated by the
 * kernel's own route generation (net->ipv4.rt_genid).
 *
 * Why: in place, bpf_fib_lookup is ~215 ns of the ~400 ns axon_pod_egress
 * spends on a packet to another node (docs/netkit-bigtcp.md). A cached route
 * costs one array slot, one compare and three pointer loads.
 *
 * Why it is never stale: the kernel bumps rt_genid (rt_cache_flush) on every
 * IPv4 route, rule, nexthop, address, device up/down/carrier/MTU change and
 * forwarding sysctl change of the netns; that is how its own socket and
 * input-route caches are invalidated. An entry is used only while the netns'
 * rt_genid still equals the value read before its lookup. Only the route is
 * cached (egress device, next hop, MTU): the neighbour is resolved by the
 * kernel for every packet (bpf_redirect_neigh), so a changed MAC is seen at
 * once.
 *
 * The key is everything bpf_fib_lookup was given that a route can depend
 * on: incoming ifindex, source, destination, TOS and protocol (fib rules,
 * multipath hashing). The packet mark is not passed to bpf_fib_lookup
 * either, so it is not part of the key.
 *
 * rt_genid is read through bpf_cast_to_kern_ctx (kfunc, Linux 6.3+) and
 * CO-RE: skb->dev->nd_net.net->ipv4.rt_genid. The kfunc is weak: on a kernel
 * without it the loader leaves cfg_fib_cache 0 and the verifier prunes the
 * cache (internal/datapath/features.go, FibCache). IPv6 is not cached: its
 * routes keep per-node serial numbers (fib6_sernum), and it keeps the
 * per-packet lookup.
 *
 * The north-south LB (nodeport.h, tc and XDP) keeps the next hop's MACs in
 * the same entries (dmac, smac): XDP cannot resolve neighbours, so a route
 * alone is not enough there, and with the MACs neither hook calls
 * bpf_fib_lookup for a known next hop. The neighbour is not covered by
 * rt_genid (a changed MAC or a failed neighbour bumps nothing), so the LB
 * also keys its entries by a neighbour generation that user space bumps on
 * every IPv4 neighbour change of the netns (nodeport.LB's neighbour watch,
 * axon_np_neigh_gen); generation 0 means nobody watches: no cache. */
#ifndef AXON_FIB_CACHE_H
#define AXON_FIB_CACHE_H

#include "common.h"

/* Kernel types, only the members read (CO-RE relocates the offsets against
 * the running kernel's BTF; the ___axon suffix is dropped for matching). */
typedef struct {
	int counter;
} atomic_t___axon;

struct netns_ipv4___axon {
	atomic_t___axon rt_genid;
} __attribute__((preserve_access_index));

struct net___axon {
	struct netns_ipv4___axon ipv4;
} __attribute__((preserve_access_index));

typedef struct {
	struct net___axon *net;
} possible_net_t___axon;

struct net_device___axon {
	possible_net_t___axon nd_net;
} __attribute__((preserve_access_index));

struct sk_buff___axon {
	struct net_device___axon *dev;
} __attribute__((preserve_access_index));

/* XDP's kernel context (bpf_cast_to_kern_ctx of an xdp_md): the device
 * the frame arrived on, whose netns bpf_fib_lookup looks up in. */
struct xdp_rxq_info___axon {
	struct net_device___axon *dev;
} __attribute__((preserve_access_index));

struct xdp_buff___axon {
	struct xdp_rxq_info___axon *rxq;
} __attribute__((preserve_access_index));

extern void *bpf_cast_to_kern_ctx(void *obj) __ksym __weak;

/* Slots per CPU. A slot is picked by a hash of the key; a colliding flow
 * replaces it (the next packet of the other flow looks its route up again). */
#define AXON_FIB_CACHE_SLOTS 256

/* fib_cache_entry: one cached IPv4 route. key fields first. */
struct fib_cache_entry {
	__u32 ifindex; /* key: incoming device (bpf_fib_lookup's ifindex) */
	__be32 saddr;  /* key */
	__be32 daddr;  /* key */
	__u8 tos;      /* key */
	__u8 proto;    /* key: l4_protocol */
	__u16 mtu;     /* result: MTU of the egress device (mtu_result) */
	__u32 genid;   /* rt_genid read before the lookup that filled the slot */
	__u32 oif;     /* result: egress ifindex */
	__be32 nh;     /* result: next hop, the gateway or daddr if on-link */
	__u32 valid;   /* 1 once filled */
	/* the LB only (nodeport.h np_fib): a lookup that returned SUCCESS */
	__u8 dmac[6];  /* result: the next hop's MAC */
	__u8 smac[6];  /* result: the egress device's MAC */
	__u32 neigh_gen; /* the LB's neighbour generation before the lookup */
};

/* axon_fib_cache: PERCPU_ARRAY of AXON_FIB_CACHE_SLOTS fib_cache_entry.
 * Private to the program that loaded it (not pinned): a reload starts
 * empty. User space only reads it (Datapath.FibCache); nothing writes it. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, AXON_FIB_CACHE_SLOTS);
	__type(key, __u32);
	__type(value, struct fib_cache_entry);
} axon_fib_cache SEC(".maps");

/* fib_cache_genid reads the IPv4 route generation of the skb's netns (the
 * one bpf_fib_lookup looks up in). 0 if a pointer on the way is NULL. */
AXON_INLINE int fib_cache_dev_genid(struct net_device___axon *dev, __u32 *genid)
{
	struct net___axon *net;

	if (!dev)
		return 0;
	net = dev->nd_net.net;
	if (!net)
		return 0;
	*genid = (__u32)net->ipv4.rt_genid.counter;
	return 1;
}

AXON_INLINE int fib_cache_genid(struct __sk_buff *skb, __u32 *genid)
{
	struct sk_buff___axon *kskb = bpf_cast_to_kern_ctx(skb);

	return fib_cache_dev_genid(kskb->dev, genid);
}

/* fib_cache_genid_xdp: fib_cache_genid for an XDP frame (the netns of the
 * device it arrived on, where bpf_fib_lookup looks up at XDP). */
AXON_INLINE int fib_cache_genid_xdp(struct xdp_md *ctx, __u32 *genid)
{
	struct xdp_buff___axon *xdp = bpf_cast_to_kern_ctx(ctx);
	struct xdp_rxq_info___axon *rxq = xdp->rxq;

	if (!rxq)
		return 0;
	return fib_cache_dev_genid(rxq->dev, genid);
}

AXON_INLINE __u32 fib_cache_slot(__u32 ifindex, __be32 saddr, __be32 daddr)
{
	__u32 h = (__u32)daddr * 2654435761u; /* Knuth's multiplicative hash */

	h ^= ((__u32)saddr * 2246822519u) ^ ifindex;
	return (h >> 16) & (AXON_FIB_CACHE_SLOTS - 1);
}

AXON_INLINE int fib_cache_match_key(const struct fib_cache_entry *e, __u32 ifindex, __be32 saddr,
				    __be32 daddr, __u8 tos, __u8 proto, __u32 genid)
{
	return e->valid && e->genid == genid && e->ifindex == ifindex &&
	       e->daddr == daddr && e->saddr == saddr && e->tos == tos && e->proto == proto;
}

AXON_INLINE int fib_cache_match(const struct fib_cache_entry *e, __u32 ifindex,
				const struct iphdr *ip4, __u32 genid)
{
	return fib_cache_match_key(e, ifindex, ip4->saddr, ip4->daddr, ip4->tos, ip4->protocol, genid);
}

/* fib_cache_get returns the slot of this packet's key, or NULL. *hit says
 * whether it holds a valid route for the packet under genid. A non-GSO
 * packet longer than the cached MTU is a miss: the lookup answers
 * FRAG_NEEDED for it, as it does uncached. */
AXON_INLINE struct fib_cache_entry *fib_cache_get(struct __sk_buff *skb, __u32 ifindex,
						  const struct iphdr *ip4,
						  __u32 genid, int *hit)
{
	__u32 slot = fib_cache_slot(ifindex, ip4->saddr, ip4->daddr);
	struct fib_cache_entry *e = bpf_map_lookup_elem(&axon_fib_cache, &slot);

	*hit = 0;
	if (!e)
		return NULL;
	if (fib_cache_match(e, ifindex, ip4, genid) &&
	    (skb->gso_size || skb->len <= (__u32)e->mtu + ETH_HLEN + 4 /* VLAN, as is_skb_forwardable */))
		*hit = 1;
	return e;
}

/* fib_cache_put fills slot e after a lookup that returned SUCCESS or
 * NO_NEIGH with an IPv4 next hop. */
AXON_INLINE void fib_cache_put_key(struct fib_cache_entry *e, __u32 ifindex, __be32 saddr,
				   __be32 daddr, __u8 tos, __u8 proto, __u32 genid,
				   __u32 oif, __be32 nh, __u16 mtu)
{
	e->valid = 0;
	e->ifindex = ifindex;
	e->saddr = saddr;
	e->daddr = daddr;
	e->tos = tos;
	e->proto = proto;
	e->genid = genid;
	e->oif = oif;
	e->nh = nh;
	e->mtu = mtu;
	e->valid = 1;
}

AXON_INLINE void fib_cache_put(struct fib_cache_entry *e, __u32 ifindex,
			       const struct iphdr *ip4, __u32 genid,
			       __u32 oif, __be32 nh, __u16 mtu)
{
	fib_cache_put_key(e, ifindex, ip4->saddr, ip4->daddr, ip4->tos, ip4->protocol, genid, oif, nh, mtu);
}

#endif /* AXON_FIB_CACHE_H */
