/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* ct.h: connection tracking of the north-south load balancer (nodeport.h).
 *
 * One LRU hash keyed by the flow as the client sent it (client -> frontend).
 * A hit is a lookup only: the translation is in the value, the timestamp is
 * refreshed at most once per cfg_ct_refresh_ns (a plain store into the
 * value, no map update). The agent removes expired entries (timeouts by
 * protocol and state, nodeport.LB.GC in internal/datapath/nodeport); a full table evicts
 * the least recently used entry, counted as the difference between
 * NP_CT_NEW and the entries present (see nodeport.LB.CTStats).
 *
 * Timestamps are bpf_ktime_get_coarse_ns (CLOCK_MONOTONIC_COARSE): cheap,
 * tick resolution, the same clock the agent reads.
 */
#ifndef AXON_CT_H
#define AXON_CT_H

#include "common.h"

/* Default number of CT entries; nodeport.Options.CTMax overrides it at load. */
#define AXON_NP_CT_MAX 131072

/* np_ct.flags (npCT* in internal/datapath/nodeport). */
enum np_ct_flag {
	NP_CT_LOCAL = 0x01,   /* DNAT to a pod on this node; replies reverse-NATed at uplink egress */
	NP_CT_SNAT = 0x02,    /* remote backend, source NATed to the node (nat_port) */
	NP_CT_DSR = 0x04,     /* remote backend, IPIP-encapsulated; replies go direct */
	NP_CT_CLOSING = 0x08, /* TCP FIN or RST seen: short timeout, a new SYN re-selects */
};

/* np_tuple: one direction of a flow as seen in the packet (40 bytes).
 * Addresses are 16 bytes, IPv4 as ::ffff:a.b.c.d; ports network order. */
struct np_tuple {
	__u8 saddr[16];
	__u8 daddr[16];
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 pad[3];
};

/* np_ct: value of axon_np_ct (48 bytes): where the flow goes. */
struct np_ct {
	__u8 be_addr[16];  /* backend address */
	__be16 be_port;    /* backend port */
	__be16 nat_port;   /* SNAT source port (NP_CT_SNAT), else 0 */
	__u32 backend_id;  /* axon_np_be key at selection time */
	__u32 frontend_id; /* np_svc_val.id */
	__u8 flags;        /* NP_CT_* */
	__u8 pad[3];
	__u64 last_seen;   /* ns, bpf_ktime_get_coarse_ns, refreshed lazily */
	__u64 created;     /* ns, same clock */
};

/* axon_np_ct: client->frontend tuple -> translation. LRU: a full table
 * evicts the least recently used flow instead of failing. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, AXON_NP_CT_MAX);
	__type(key, struct np_tuple);
	__type(value, struct np_ct);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} axon_np_ct SEC(".maps");

/* cfg_ct_refresh_ns: a CT/NAT hit rewrites last_seen only when it is older
 * than this (default 1 s), so an established flow costs a lookup. */
volatile const __u64 cfg_ct_refresh_ns = 1000000000ULL;

AXON_INLINE __u64 np_now(void)
{
	return bpf_ktime_get_coarse_ns();
}

#endif /* AXON_CT_H */
