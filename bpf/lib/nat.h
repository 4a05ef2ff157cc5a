/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* nat.h: reverse translation state of the north-south load balancer.
 *
 * axon_np_nat is keyed by a reply as it is seen on the wire and says what
 * its addresses become:
 *   NP_NAT_SNAT  key backend:port -> snat_addr:nat_port (arrives at uplink
 *                ingress): rewrite to frontend:port -> client:port
 *   NP_NAT_LOCAL key local backend:port -> client:port (leaves through
 *                uplink egress): rewrite the source to frontend:port
 * Entries are created with the CT entry of a new flow and refreshed with it.
 *
 * An NP_NAT_SNAT entry is also the reservation of its SNAT port: a port is
 * free for another flow to the same backend:port only when no entry holds
 * it. The map is a plain hash, not an LRU: nothing but the agent's GC
 * (nodeport.LB.GC) removes an entry, and GC keeps a closed TCP flow's entry
 * for SNATTimeWait (default 65 s) after its last packet, longer than the
 * backend's TIME_WAIT (60 s on Linux), so a new flow never lands on a
 * 4-tuple the backend still holds for an older one. A full map fails the
 * insert instead of evicting a flow that is still in use: a new SNAT flow
 * is dropped (NP_SNAT_NO_PORT), a new flow to a local backend too
 * (NP_NAT_FULL); the client retransmits its SYN. Established flows go on.
 */
#ifndef AXON_NAT_H
#define AXON_NAT_H

#include "common.h"
#include "ct.h"

#define AXON_NP_NAT_MAX 131072

/* np_nat.flags (npNAT* in internal/datapath/nodeport). */
enum np_nat_flag {
	NP_NAT_SNAT = 0x01,  /* a reply of an SNAT flow (the key above) */
	NP_NAT_LOCAL = 0x02, /* a reply of a local backend (the key above) */
	NP_NAT_DSR = 0x04,   /* with NP_NAT_LOCAL: the flow came encapsulated from
			      * another node's LB (DSR): its SYN-ACK's MSS is
			      * clamped (np_dsr_clamp_mss) so the client's
			      * segments still fit the uplink MTU with the outer
			      * header added */
	NP_NAT_UNREPLIED = 0x08, /* the flow is in axon_np_ct_new: the first reply
				  * through this entry moves it to axon_np_ct
				  * (np_ct_promote) and clears the flag; GC frees
				  * such an entry (its SNAT port) soon after its
				  * flow is gone, and a new flow may take over its
				  * port once the flow was evicted (np_nat_stale) */
};

/* How many source ports a new SNAT flow tries before giving up (a bounded
 * loop, not unrolled): the previous port of the same client tuple, the
 * client's own port when it is inside the range, the flow hash, then
 * consecutive ports from a random start. */
#define NP_SNAT_TRIES 32

/* np_nat: value of axon_np_nat (48 bytes). */
struct np_nat {
	__u8 saddr[16];    /* new source: the frontend address the client used */
	__u8 daddr[16];    /* new destination: the client */
	__be16 sport;      /* frontend port */
	__be16 dport;      /* client port */
	__u32 frontend_id;
	__u8 flags;        /* NP_NAT_* */
	__u8 pad[7];
	__u64 last_seen;   /* ns, bpf_ktime_get_coarse_ns */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, AXON_NP_NAT_MAX);
	__type(key, struct np_tuple);
	__type(value, struct np_nat);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} axon_np_nat SEC(".maps");

/* SNAT source port range, host byte order, inclusive (nodeport.Options
 * SNATPortMin/Max). The default 1024-29999 (28 976 ports per backend
 * address:port and node address) stays clear of Linux's ephemeral range
 * (32768-60999: the node's own connections to the same backend must never
 * meet a translated flow's reply key) and of the NodePort range
 * (30000-32767: a reply to such a port would be taken for a new NodePort
 * flow). */
volatile const __u16 cfg_snat_port_min = 1024;
volatile const __u16 cfg_snat_port_max = 29999;

/* np_nat_mine: the SNAT entry v is the reservation of the same client
 * tuple (client -> frontend) as t: a new flow of that tuple (the client
 * reused its port) may take it over, as conntrack keeps a tuple's mapping;
 * the backend then sees the same 4-tuple sequence as without NAT. */
AXON_INLINE int np_nat_mine(const struct np_nat *v, const struct np_tuple *t)
{
	const __u32 *a = (const __u32 *)v->daddr, *b = (const __u32 *)t->saddr;
	const __u32 *c = (const __u32 *)v->saddr, *d = (const __u32 *)t->daddr;

	if (!(v->flags & NP_NAT_SNAT) || v->dport != t->sport || v->sport != t->dport)
		return 0;
	return ((a[0] ^ b[0]) | (a[1] ^ b[1]) | (a[2] ^ b[2]) | (a[3] ^ b[3]) |
		(c[0] ^ d[0]) | (c[1] ^ d[1]) | (c[2] ^ d[2]) | (c[3] ^ d[3])) == 0;
}

/* np_nat_ct_key is the CT key (client -> frontend) of the flow whose
 * reverse entry is v (proto: its protocol). */
AXON_INLINE void np_nat_ct_key(const struct np_nat *v, __u8 proto, struct np_tuple *k)
{
	__builtin_memset(k, 0, sizeof(*k));
	__builtin_memcpy(k->saddr, v->daddr, 16);
	__builtin_memcpy(k->daddr, v->saddr, 16);
	k->sport = v->dport;
	k->dport = v->sport;
	k->proto = proto;
}

#endif /* AXON_NAT_H */
