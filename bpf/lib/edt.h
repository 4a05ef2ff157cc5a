/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* edt.h: pod bandwidth enforcement (the Bandwidth Manager).
 *
 * Egress: Earliest Departure Time. At the uplink's tc egress every packet of
 * a limited pod gets a departure time in skb->tstamp (CLOCK_MONOTONIC):
 *
 *     departure = max(now, t_last);  t_last = departure + len * NSEC_PER_SEC / rate
 *
 * and the fq qdisc on the uplink holds the packet in its timing wheel until
 * then. No queue per pod, no lock shared by all CPUs, skb->sk stays attached
 * so TCP small queues push back on the socket. A packet whose departure time
 * is more than the horizon ahead of now is dropped here (fq would drop it
 * anyway) and counted.
 *
 * Ingress: there is no queue on the receive side to hold packets in, and
 * bpf_redirect_peer skips the host veth's egress hook, so traffic toward a
 * limited pod is policed by a token bucket right before it is redirected into
 * the pod (bw_ingress_police, called from uplink_ingress.c and pod_egress.c):
 * tokens = min(burst, tokens + elapsed * rate); a packet that finds fewer
 * tokens than its length is dropped. TCP reacts to the drops by slowing down.
 *
 * Identity: a pod's addresses (IPv4 v4-mapped, IPv6) map to one bandwidth id
 * (axon_bw_addr), so a dual-stack pod shares its limit across families; the
 * limit itself is per (id, direction) in axon_bw_state. Keyed by address, not
 * skb->mark: the mark is cleared when a packet changes netns.
 *
 * State updates are not atomic across CPUs (like Cilium's): two CPUs racing
 * on one pod may both take the same slot; the error is one packet's time. */
#ifndef AXON_EDT_H
#define AXON_EDT_H

#include "common.h"
#include "eth_ip.h"
#include "drop.h"

#define AXON_NSEC_PER_SEC 1000000000ULL

/* Single, untorn loads and stores of state shared between CPUs. */
#define READ_ONCE_U64(x) (*(volatile __u64 *)&(x))
#define WRITE_ONCE_U64(x, v) (*(volatile __u64 *)&(x) = (v))

/* Maximum number of pods with a bandwidth limit on one node. */
#define AXON_BW_MAX_PODS 16384

/* Directions of a limit (bw_state_key.dir; Egress/Ingress in
 * internal/datapath/bandwidth). */
enum axon_bw_dir {
	AXON_BW_EGRESS = 0,  /* from the pod, EDT at the uplink egress */
	AXON_BW_INGRESS = 1, /* toward the pod, token bucket before redirect */
};

/* Node-wide counters (axon_bw_stats index). Names: the members' without
 * AXON_BW_, lower case (bwStatNames in internal/datapath/bandwidth). */
enum axon_bw_stat {
	AXON_BW_EGRESS_PACED = 0,       /* egress: departure time set */
	AXON_BW_EGRESS_DROP_HORIZON = 1, /* egress: dropped, beyond the horizon */
	AXON_BW_EGRESS_UNLIMITED = 2,    /* egress: IP packet of a pod without limit (or not a pod) */
	AXON_BW_INGRESS_PASS = 3,        /* ingress: within the pod's bucket */
	AXON_BW_INGRESS_DROP = 4,        /* ingress: dropped, bucket empty */
	AXON_BW_EGRESS_CLOCK_RESET = 5,  /* egress: t_last beyond the horizon (clock or state went backwards), restarted at now */
	AXON_BW_EGRESS_DELIVERY_TIME = 6, /* egress: limited packet arrived with a mono delivery time (TCP pacing/BBR stamp kept across the netns switch) */
	AXON_BW_EGRESS_WITH_SOCKET = 7, /* egress: limited packet still carries its socket (skb->sk): TCP small queues see it */
	AXON_BW_EGRESS_POD_PACED = 8,   /* egress: the pod's own delivery time, not the limit, set the departure (its TCP paces below the limit) */
	AXON_BW_EGRESS_SMALL_BYPASS = 9, /* egress: small packet left without waiting behind the pod's backlog (charged to its clock) */
	AXON_BW_STAT_MAX = 10,
};

/* axon_bw_addr: pod address -> bandwidth id. IPv4 as ::ffff:a.b.c.d. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, AXON_BW_MAX_PODS * 2);
	__type(key, struct in6_addr);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} axon_bw_addr SEC(".maps");

/* Key of axon_bw_state (8 bytes, no padding holes: pad must be 0). */
struct bw_state_key {
	__u32 id;  /* from axon_bw_addr */
	__u8 dir;  /* enum axon_bw_dir */
	__u8 pad[3];
};

/* One limit. Layout is ABI with internal/datapath/bandwidth (56 bytes). The
 * agent writes rate/horizon/burst and leaves the time fields of an existing
 * entry alone when only the rate changes. */
struct bw_state {
	__u64 rate;    /* bytes per second; 0 = not limited (entry ignored) */
	__u64 t_last;  /* egress: departure time of the last packet; ingress: time of the last refill (ns, monotonic) */
	__u64 horizon; /* egress: drop when the departure time is more than this ahead of now (ns) */
	__u64 burst;   /* ingress: bucket depth (bytes); egress: catch-up window (ns, see edt_schedule) */
	__u64 tokens;  /* ingress: byte balance (signed: may be one packet in debt) */
	__u64 drops;   /* packets dropped for this limit (horizon or empty bucket) */
	__u64 bytes;   /* L2 bytes let through (egress: skb->wire_len of paced packets, every GSO segment's headers; ingress: skb->len passed): the pod's rate as the limit counts it */
	__u64 flags;   /* egress: AXON_BW_F_* (0 = defaults) */
};

/* bw_state.flags (egress). */
#define AXON_BW_F_IGNORE_POD_TSTAMP 1ULL /* do not honour the pod's own mono delivery time (TCP pacing) */
#define AXON_BW_F_NO_SMALL_BYPASS 2ULL   /* small packets wait behind the pod's backlog like the others (default: they do not, see edt_schedule) */

/* axon_bw_btf: enum axon_bw_dir and enum axon_bw_stat in BTF (see
 * AXON_BTF_ANCHOR): internal/datapath/bandwidth's Egress/Ingress and
 * bwStatNames. */
AXON_BTF_ANCHOR(axon_bw_btf, {
	enum axon_bw_dir dir;
	enum axon_bw_stat stat;
});

/* A packet of at most this many wire bytes is "small" (a pure ACK, a
 * request/response segment): see edt_schedule. */
#define AXON_EDT_SMALL_LEN 256
/* Small packets skip the pod's backlog only while its clock is at most this
 * far ahead of now (ns): a pod sending nothing but small packets above its
 * rate gets at most this much of its rate as a burst, then is paced. */
#define AXON_EDT_BYPASS_AHEAD (100ULL * 1000 * 1000)

/* axon_bw_state: (id, direction) -> limit and its running state. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, AXON_BW_MAX_PODS * 2);
	__type(key, struct bw_state_key);
	__type(value, struct bw_state);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} axon_bw_state SEC(".maps");

/* axon_bw_gate: [0] = 1 while some pod on this node has an ingress limit
 * (internal/datapath/bandwidth sets it after writing the first one and clears
 * it before removing the last). 0: bw_ingress_police returns at once, so
 * every packet into a pod does not pay a hash lookup of a 16-byte key
 * for a limit that nobody has. An ARRAY: the verifier inlines the lookup. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} axon_bw_gate SEC(".maps");

/* axon_bw_stats: per-CPU packet counters indexed by enum axon_bw_stat. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, AXON_BW_STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} axon_bw_stats SEC(".maps");

AXON_INLINE void bw_count(enum axon_bw_stat s)
{
	__u32 idx = s;
	__u64 *v = bpf_map_lookup_elem(&axon_bw_stats, &idx);

	if (v)
		*v += 1;
}

/* bw_lookup returns the limit of the pod owning addr in direction dir, or
 * NULL when the pod has none. */
AXON_INLINE struct bw_state *bw_lookup(const struct in6_addr *addr, enum axon_bw_dir dir)
{
	struct in6_addr a;
	struct bw_state_key k = {};
	struct bw_state *st;
	__u32 *id;

	__builtin_memcpy(&a, addr, sizeof(a));
	id = bpf_map_lookup_elem(&axon_bw_addr, &a);
	if (!id)
		return NULL;
	k.id = *id;
	k.dir = dir;
	st = bpf_map_lookup_elem(&axon_bw_state, &k);
	if (!st || st->rate == 0)
		return NULL;
	return st;
}

/* bw_addr_of fills a with the packet's source (src=1) or destination address
 * in the map's 16-byte form. */
AXON_INLINE void bw_addr_of(const struct packet *pkt, int src, struct in6_addr *a)
{
	if (pkt->ip4) {
		a->in6_u.u6_addr32[0] = 0;
		a->in6_u.u6_addr32[1] = 0;
		a->in6_u.u6_addr32[2] = bpf_htonl(0x0000ffff);
		a->in6_u.u6_addr32[3] = src ? pkt->ip4->saddr : pkt->ip4->daddr;
		return;
	}
	__builtin_memcpy(a, src ? &pkt->ip6->saddr : &pkt->ip6->daddr, sizeof(*a));
}

/* Largest packet (wire bytes) one EDT slot can be charged for: a BIG TCP
 * GSO packet of 192 KiB plus headers. */
#define AXON_EDT_MAX_PKT (256ULL << 10)

/* Result of edt_schedule. */
enum edt_verdict {
	EDT_PACED = 1, /* *tstamp set to the departure time */
	EDT_DROP = 2,  /* beyond the horizon */
};

/* edt_schedule computes the departure time of a len-byte packet for st at
 * time now, as a virtual link of st->rate: t_last is when the link is free
 * again. The packet departs at max(now, base, t_last) and occupies the link
 * for len * NSEC_PER_SEC / rate, so t_last moves to its start + that:
 *
 *     start = max(t_last, base, now - slack);  departure = max(start, now)
 *     t_last = start + len/rate
 *
 * Back to back, departures advance by len*8/bits per packet (the first version's
 * t_next = max(now, t_last) + len/rate, with the charge booked after the
 * packet, so an idle pod's first packet is not delayed). base is the
 * packet's own mono delivery time (TCP pacing, BBR; 0 when none): a packet
 * never leaves before it and is not delayed on top of it (stacking
 * max(base, t_last) + len/rate collapses TCP to 0.24x of the limit: TCP's
 * pacing rate follows its delivery rate). slack (st->burst for egress, ns)
 * lets a pod whose packets came late (a timer fired late, TCP small queues
 * waited for a TX completion) catch up on its schedule for at most that
 * long instead of losing the time; 0 = strict.
 *
 * small (a packet of at most AXON_EDT_SMALL_LEN wire bytes, unless the
 * limit has AXON_BW_F_NO_SMALL_BYPASS): the packet departs at max(now, base) instead of behind the
 * pod's backlog, and is still charged (t_last moves on by its time), as
 * long as the pod's clock is at most AXON_EDT_BYPASS_AHEAD ahead of now. A
 * request/response flow of a pod that also runs a bulk flow at its limit
 * then does not wait for the bulk flow's GSO packets (tens of ms each at
 * low rates).
 *
 * Time going backwards: t_last can only be ahead of now by up to the horizon
 * plus one packet's time (later packets are dropped without advancing it;
 * AXON_EDT_MAX_PKT bounds a packet, BIG TCP GSO included). A t_last further
 * ahead means the clock or the state went backwards (or the horizon was
 * lowered): pacing restarts at now instead of dropping everything until the
 * clock catches up (counted as egress_clock_reset). */
AXON_INLINE enum edt_verdict edt_schedule(struct bw_state *st, __u64 now, __u64 base,
					  __u64 len, int small, __u64 *tstamp)
{
	__u64 t_last = READ_ONCE_U64(st->t_last);
	__u64 horizon = st->horizon;
	__u64 slack = st->burst;
	__u64 delay = len * AXON_NSEC_PER_SEC / st->rate;
	__u64 start, depart;

	/* Counters are bumped where the decision is made (no flags carried to
	 * the end: that multiplies the verifier's paths). */
	if (t_last > now && t_last - now > horizon + AXON_EDT_MAX_PKT * AXON_NSEC_PER_SEC / st->rate) {
		t_last = now;
		bw_count(AXON_BW_EGRESS_CLOCK_RESET);
	}
	start = now > slack ? now - slack : 0;
	if (t_last > start)
		start = t_last;
	if (base > start) {
		start = base;
		if (base > now)
			bw_count(AXON_BW_EGRESS_POD_PACED);
	}
	depart = start > now ? start : now;
	if (small && start <= now + AXON_EDT_BYPASS_AHEAD) {
		/* A small packet does not queue behind the pod's backlog (its
		 * bulk flow's GSO packets): it leaves at its own time and is
		 * charged to the clock like any other, so the long-run rate
		 * holds and the bulk flow pays for it. */
		depart = base > now ? base : now;
		bw_count(AXON_BW_EGRESS_SMALL_BYPASS);
	}
	if (depart - now > horizon)
		return EDT_DROP;
	WRITE_ONCE_U64(st->t_last, start + delay);
	*tstamp = depart;
	return EDT_PACED;
}

/* tb_police runs the token bucket of st for a len-byte packet at time now.
 * Returns 1 when the packet may pass. The bucket may go into debt by one
 * packet: a packet passes whenever the balance is positive and its length
 * is then taken, so GRO aggregates (up to 64 KiB) are not starved by a
 * bucket that holds fewer bytes than them; the debt is paid back by time,
 * so the long-run rate is unchanged. Tokens are a signed balance. */
AXON_INLINE int tb_police(struct bw_state *st, __u64 now, __u64 len)
{
	__u64 last = READ_ONCE_U64(st->t_last);
	__s64 tokens = (__s64)READ_ONCE_U64(st->tokens);
	__s64 burst = (__s64)st->burst;

	if (now > last) {
		__u64 elapsed = now - last;

		/* cap elapsed first: elapsed * rate must not overflow */
		if (elapsed > AXON_NSEC_PER_SEC * 10)
			elapsed = AXON_NSEC_PER_SEC * 10;
		tokens += (__s64)(elapsed * st->rate / AXON_NSEC_PER_SEC);
		if (tokens > burst)
			tokens = burst;
	}
	/* now < last: the clock went backwards (or a racing CPU refilled
	 * later): keep the balance, take the new time. */
	WRITE_ONCE_U64(st->t_last, now);
	if (tokens <= 0) {
		WRITE_ONCE_U64(st->tokens, (__u64)tokens);
		return 0;
	}
	WRITE_ONCE_U64(st->tokens, (__u64)(tokens - (__s64)len));
	return 1;
}

/* bw_ingress_police is the ingress hook: call it right before a packet is
 * redirected into a local pod. Returns 1 when the packet must be dropped
 * (TC_ACT_SHOT), 0 to go on. On a node where no pod has an ingress limit
 * it costs one array read (axon_bw_gate); else pods without a limit cost
 * one hash lookup miss. */
AXON_INLINE int bw_ingress_police(struct __sk_buff *skb, const struct packet *pkt)
{
	struct in6_addr dst;
	struct bw_state *st;
	__u32 zero = 0, *on = bpf_map_lookup_elem(&axon_bw_gate, &zero);

	if (!on || !*on)
		return 0;
	bw_addr_of(pkt, 0, &dst);
	st = bw_lookup(&dst, AXON_BW_INGRESS);
	if (!st)
		return 0;
	if (tb_police(st, bpf_ktime_get_ns(), skb->len)) {
		__sync_fetch_and_add(&st->bytes, skb->len);
		bw_count(AXON_BW_INGRESS_PASS);
		return 0;
	}
	__sync_fetch_and_add(&st->drops, 1);
	bw_count(AXON_BW_INGRESS_DROP);
	return 1;
}

#endif /* AXON_EDT_H */
