/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* ct.h: connection tracking of the north-south load balancer (nodeport.h).
 *
 * Two LRU hashes keyed by the flow as the client sent it (client ->
 * frontend), with the same value:
 *   axon_np_ct_new  flows not answered yet ("unreplied"): every new flow
 *                   starts here (only a TCP SYN without ACK, or any UDP
 *                   datagram, opens one)
 *   axon_np_ct      established flows, moved here (np_ct_promote):
 *                   UDP by the first reply (a local backend's at the uplink
 *                   egress, an SNAT backend's at its reverse NAT); TCP by
 *                   the client's first packet without SYN (its ACK) after
 *                   such a reply (NP_CT_REPLIED), as Linux's conntrack
 *                   marks a flow assured only once the handshake completed:
 *                   a backend answering spoofed SYNs does not make them
 *                   established. DSR replies never pass this node: the
 *                   client's first packet without SYN (it got the SYN-ACK),
 *                   or a UDP flow's second datagram, stands for both
 * A flood of new flows (SYNs from spoofed sources) fills and evicts only
 * axon_np_ct_new; established flows keep their entries. A packet looks in
 * axon_np_ct first (an established flow costs one lookup, as before), in
 * axon_np_ct_new only once its frontend matched.
 *
 * A hit is a lookup only: the translation is in the value, the timestamp is
 * refreshed at most once per cfg_ct_refresh_ns (a plain store into the
 * value, no map update). The agent removes expired entries (timeouts by
 * protocol and state, unreplied ones after a short timeout: nodeport.LB.GC
 * in internal/datapath/nodeport); a full table evicts its least recently
 * used entry, counted as the difference between NP_CT_NEW and the entries
 * present (see nodeport.LB.CTStats).
 *
 * Timestamps are bpf_ktime_get_coarse_ns (CLOCK_MONOTONIC_COARSE): tick
 * resolution, the same clock the agent reads, read once per tick and CPU
 * (np_now).
 */
#ifndef AXON_CT_H
#define AXON_CT_H

#include "common.h"
#include "l4.h"

/* Default number of CT entries; nodeport.Options.CTMax overrides it at load. */
#define AXON_NP_CT_MAX 131072
/* Default number of unreplied flows (axon_np_ct_new);
 * nodeport.Options.CTUnrepliedMax overrides it at load. Kept well below
 * the SNAT port range of one backend (28 976) so that a flood cannot hold
 * every port of a backend (see np_nat_stale in nodeport.h). */
#define AXON_NP_CT_NEW_MAX 8192

/* np_ct.flags (npCT* in internal/datapath/nodeport). */
enum np_ct_flag {
	NP_CT_LOCAL = 0x01,   /* DNAT to a pod on this node; replies reverse-NATed at uplink egress */
	NP_CT_SNAT = 0x02,    /* remote backend, source NATed to the node (nat_port) */
	NP_CT_DSR = 0x04,     /* remote backend, IPIP-encapsulated; replies go direct */
	NP_CT_CLOSING = 0x08, /* TCP FIN or RST seen: short timeout, a new SYN re-selects */
	NP_CT_REPLIED = 0x10, /* axon_np_ct_new, TCP: the backend answered (SYN-ACK); the
			       * client's next packet (its ACK) makes the flow established */
	NP_CT_XDP = 0x20,     /* with NP_CT_LOCAL: the flow's last packet was DNATed at XDP,
			       * so tc next sees it addressed to the pod; tc then does not
			       * take it for a direct flow (np_direct_reuse) */
};

/* np_nh: the next hop of a flow's forwarded packets (IPv4 SNAT and DSR),
 * kept in its CT entry: a hit checks it inline (np_ct_nh_get in
 * nodeport.h) instead of calling the per-CPU cache's probe, and a call and
 * its return are ~10 ns where returns are mitigated (docs/north-south-lb.md).
 * Written by np_ct_nh_fill. The same validity as the per-CPU next-hop cache
 * (fib_cache.h): filled by a packet from device iif under the netns' route
 * generation rt_gen and the LB's neighbour generation neigh_gen, used while
 * both are current and the packet came from iif. The route's other inputs
 * are the flow's: the backend (fixed) and the SNAT source (the frontend's
 * address or the load-time node address). Entries outlive the LB that
 * filled them (pinned): each LB starts its neighbour generations at a
 * random value (nodeport.neighWatch), so a new LB, which may have another
 * node address or may have missed neighbour changes, does not take them. */
struct np_nh {
	__u8 dmac[6];    /* the next hop's MAC */
	__u8 smac[6];    /* the egress device's MAC */
	__u32 oif;       /* egress device */
	__u32 iif;       /* the device the filling packet came from */
	__u32 rt_gen;    /* rt_genid when filled */
	__u32 neigh_gen; /* axon_np_neigh_gen when filled; 0: empty */
	__u32 pad;
};

/* np_ct: value of axon_np_ct (80 bytes): where the flow goes. Grown only
 * at its end: an agent upgrade copies the pinned entries of an older,
 * shorter layout into the new maps (nodeport.npGrownMigration), the new
 * fields zero. */
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
	struct np_nh nh;   /* cached next hop (IPv4 SNAT and DSR), nh.neigh_gen 0: none */
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

/* axon_np_ct_new: client->frontend tuple -> translation of a flow not
 * answered yet (see above). Its own LRU: a flood evicts only its kind. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, AXON_NP_CT_NEW_MAX);
	__type(key, struct np_tuple);
	__type(value, struct np_ct);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} axon_np_ct_new SEC(".maps");

/* cfg_ct_refresh_ns: a CT/NAT hit rewrites last_seen only when it is older
 * than this (default 1 s), so an established flow costs a lookup. */
volatile const __u64 cfg_ct_refresh_ns = 1000000000ULL;

/* np_ct_any looks k up in both tables, the established one first: for
 * paths that are not per-packet (ICMP errors, DSR requests), where an
 * unanswered flow counts too (an error may be about its first packet). */
AXON_INLINE struct np_ct *np_ct_any(const struct np_tuple *k)
{
	struct np_ct *v = bpf_map_lookup_elem(&axon_np_ct, k);

	return v ? v : bpf_map_lookup_elem(&axon_np_ct_new, k);
}

/* np_clock: this CPU's last reading of the coarse clock (np_now). */
struct np_clock {
	__u64 jiffies; /* bpf_jiffies64 when read */
	__u64 now;     /* bpf_ktime_get_coarse_ns then */
};

/* axon_np_clock: PERCPU_ARRAY[1] of np_clock. A cache private to each
 * program object (not pinned, not shared, never read by user space). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct np_clock);
} axon_np_clock SEC(".maps");

/* np_now: CLOCK_MONOTONIC_COARSE in ns (bpf_ktime_get_coarse_ns), the
 * clock the agent reads. That clock only moves on a tick, and jiffies moves
 * on the same tick: this CPU's last reading is used again while jiffies is
 * unchanged. bpf_jiffies64 is one load (64-bit JITs inline it), the clock a
 * helper call and the timekeeper's seqcount: ~15 ns of a conntrack hit
 * (docs/north-south-lb.md). A reading between a tick's jiffies update and
 * its clock update keeps the time of the tick before for that tick: one
 * tick behind at most, the coarse clock's own resolution. */
AXON_INLINE __u64 np_now(void)
{
	__u32 zero = 0;
	struct np_clock *c = bpf_map_lookup_elem(&axon_np_clock, &zero);
	__u64 j = bpf_jiffies64();

	if (!c)
		return bpf_ktime_get_coarse_ns();
	if (c->jiffies != j || !c->now) {
		c->now = bpf_ktime_get_coarse_ns();
		c->jiffies = j;
	}
	return c->now;
}

#endif /* AXON_CT_H */
