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
 */
#ifndef AXON_NAT_H
#define AXON_NAT_H

#include "common.h"
#include "ct.h"

#define AXON_NP_NAT_MAX 131072

#define NP_NAT_SNAT 0x01
#define NP_NAT_LOCAL 0x02

/* How many source ports a new SNAT flow tries before giving up: the first
 * from the flow hash, then random ones (a bounded loop, not unrolled). */
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
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, AXON_NP_NAT_MAX);
	__type(key, struct np_tuple);
	__type(value, struct np_nat);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} axon_np_nat SEC(".maps");

/* SNAT source port range, host byte order, inclusive (NodePortOptions). The
 * default stays above Linux's ephemeral range (32768-60999) so node-local
 * connections never collide with translated ones. */
volatile const __u16 cfg_snat_port_min = 61000;
volatile const __u16 cfg_snat_port_max = 65535;

#endif /* AXON_NAT_H */
