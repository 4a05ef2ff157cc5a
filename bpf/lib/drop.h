/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* drop.h: drop counters and drop events, one vocabulary for every program
 * (enum axon_drop_reason, common.h).
 *
 * Every drop is counted in axon_drops (packets and bytes per CPU, by
 * direction and reason). An event (struct axon_drop_event) goes into the
 * ring buffer axon_drop_events only while a reader listens: the agent sets
 * axon_drop_listen[0] to the number of `axon monitor` streams. With nobody
 * listening a drop costs the counter update and one array read (inlined by
 * the verifier), no ring buffer reserve; a forwarded packet costs nothing.
 *
 * All maps are pinned by name: the objects of a node (podpath, nodeport,
 * bandwidth, socklb) share them through the node's pin directory. */
#ifndef AXON_DROP_H
#define AXON_DROP_H

#include "common.h"

/* Bytes of the packet an event carries from its Ethernet header on; user
 * space decodes addresses, protocol and ports from them. */
#define AXON_DROP_SAMPLE 128

/* Ring buffer size (a power of two, page multiple): ~1500 events. */
#define AXON_DROP_RING_BYTES (256 * 1024)

/* One drop counter: packets and their bytes (skb->len, or the XDP frame). */
struct axon_drop_count {
	__u64 packets;
	__u64 bytes;
};

/* axon_drops: PERCPU_ARRAY, index dir * AXON_DROP_REASON_MAX + reason
 * (enum axon_drop_dir x enum axon_drop_reason). Read by the agent at
 * scrape time (axon_drop_count_total, axon_drop_bytes_total). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, AXON_DROP_DIR_MAX * AXON_DROP_REASON_MAX);
	__type(key, __u32);
	__type(value, struct axon_drop_count);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} axon_drops SEC(".maps");

/* axon_drop_listen: ARRAY of one __u32, the number of readers of
 * axon_drop_events. Written by the agent only (0 when no `axon monitor`
 * streams); events are written only while it is non-zero. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} axon_drop_listen SEC(".maps");

/* Rows of axon_drop_ring_stats. */
enum axon_drop_ring_stat {
	AXON_DROP_RING_EMITTED = 0, /* events submitted to axon_drop_events */
	AXON_DROP_RING_LOST = 1,    /* events lost: the ring buffer was full (the reader is behind) */
	AXON_DROP_RING_MAX = 2,
};

/* axon_drop_ring_stats: PERCPU_ARRAY of __u64, index enum axon_drop_ring_stat. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, AXON_DROP_RING_MAX);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} axon_drop_ring_stats SEC(".maps");

/* One drop. Packet programs fill sample (cap_len bytes from the Ethernet
 * header); the socket LB, which has no packet, fills family, proto and the
 * addresses instead (cap_len 0). */
struct axon_drop_event {
	__u64 ts_ns;     /* bpf_ktime_get_ns() */
	__u32 ifindex;   /* device the packet was on; 0 for the socket LB */
	__u32 len;       /* packet length (bytes) */
	__u8 prog;       /* enum axon_prog */
	__u8 reason;     /* enum axon_drop_reason */
	__u8 dir;        /* enum axon_drop_dir */
	__u8 cap_len;    /* bytes of sample that are set */
	__u8 family;     /* socket LB: AXON_AF_INET / AXON_AF_INET6; else 0 */
	__u8 proto;      /* socket LB: AXON_IPPROTO_TCP / UDP */
	__be16 dport;    /* socket LB: the Service port */
	__u8 daddr[16];  /* socket LB: the Service address (IPv4 v4-mapped, ::ffff:a.b.c.d) */
	__u8 sample[AXON_DROP_SAMPLE];
};

/* axon_drop_events: the ring buffer of struct axon_drop_event, read by the
 * agent (internal/datapath/drops) while a client streams `axon monitor`. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, AXON_DROP_RING_BYTES);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} axon_drop_events SEC(".maps");

/* axon_drop_btf: the enums and the event layout in BTF (see
 * AXON_BTF_ANCHOR); internal/datapath/drops checks its tables against them. */
AXON_BTF_ANCHOR(axon_drop_btf, {
	enum axon_drop_reason reason;
	enum axon_drop_dir dir;
	enum axon_prog prog;
	enum axon_drop_ring_stat ring_stat;
	struct axon_drop_event event;
	struct axon_drop_count count;
});

AXON_INLINE void drop_ring_count(enum axon_drop_ring_stat s)
{
	__u32 idx = s;
	__u64 *v = bpf_map_lookup_elem(&axon_drop_ring_stats, &idx);

	if (v)
		*v += 1;
}

/* drop_count counts one dropped packet of len bytes. */
AXON_INLINE void drop_count(enum axon_drop_dir dir, enum axon_drop_reason reason, __u32 len)
{
	__u32 idx = (__u32)dir * AXON_DROP_REASON_MAX + (__u32)reason;
	struct axon_drop_count *c = bpf_map_lookup_elem(&axon_drops, &idx);

	if (c) {
		c->packets += 1; /* per-CPU slot: no atomics needed */
		c->bytes += len;
	}
}

/* drop_listening: whether anyone reads the events (an array read). */
AXON_INLINE int drop_listening(void)
{
	__u32 zero = 0, *n = bpf_map_lookup_elem(&axon_drop_listen, &zero);

	return n && *n;
}

/* drop_event_reserve reserves and fills an event's header, or returns NULL
 * (counted AXON_DROP_RING_LOST) when the ring buffer is full. Call only
 * when drop_listening(). */
AXON_INLINE struct axon_drop_event *drop_event_reserve(enum axon_prog prog, enum axon_drop_dir dir,
						       enum axon_drop_reason reason, __u32 ifindex, __u32 len)
{
	struct axon_drop_event *ev = bpf_ringbuf_reserve(&axon_drop_events, sizeof(*ev), 0);

	if (!ev) {
		drop_ring_count(AXON_DROP_RING_LOST);
		return NULL;
	}
	__builtin_memset(ev, 0, sizeof(*ev) - AXON_DROP_SAMPLE);
	ev->ts_ns = bpf_ktime_get_ns();
	ev->ifindex = ifindex;
	ev->len = len;
	ev->prog = prog;
	ev->reason = reason;
	ev->dir = dir;
	return ev;
}

AXON_INLINE void drop_event_submit(struct axon_drop_event *ev)
{
	bpf_ringbuf_submit(ev, 0);
	drop_ring_count(AXON_DROP_RING_EMITTED);
}

#ifdef AXON_CTX_H
/* drop_record counts a packet program's drop (meta: prog | dir << 8 |
 * reason << 16) and, while someone listens, writes its event with the
 * packet's first bytes. A global function: the verifier checks it once per
 * program, not at every drop site in every state that reaches one. */
__noinline int drop_record(axon_ctx_t *ctx, __u32 meta)
{
	/* one key for every lookup: the frame stays within 32 bytes, which
	 * the LB's deepest call chain (main, np_ingress_l4, this) needs to fit
	 * the 512-byte stack */
	__u32 dir = (meta >> 8) & 0xff, reason = (meta >> 16) & 0xff;
	__u32 key = dir * AXON_DROP_REASON_MAX + reason;
	__u32 len = ctx_len(ctx), n, *on;
	struct axon_drop_count *c;
	struct axon_drop_event *ev;
	__u64 *v;

	c = bpf_map_lookup_elem(&axon_drops, &key);
	if (c) {
		c->packets += 1; /* per-CPU slot: no atomics needed */
		c->bytes += len;
	}
	key = 0;
	on = bpf_map_lookup_elem(&axon_drop_listen, &key);
	if (!on || !*on)
		return 0;
	/* one NULL check of the reservation: the 6.1 verifier does not know that a
	 * pointer it has seen non-NULL cannot be NULL at a second check, and would
	 * follow that branch to the exit holding the reference */
	ev = bpf_ringbuf_reserve(&axon_drop_events, sizeof(*ev), 0);
	if (!ev) {
		key = AXON_DROP_RING_LOST;
		goto count;
	}
	__builtin_memset(ev, 0, sizeof(*ev) - AXON_DROP_SAMPLE);
	ev->ts_ns = bpf_ktime_get_ns();
	ev->ifindex = ctx_ifindex(ctx);
	ev->len = len;
	ev->prog = meta & 0xff;
	ev->reason = reason;
	ev->dir = dir;
	if (len) {
		/* [1, AXON_DROP_SAMPLE] in a form every verifier tracks */
		n = len >= AXON_DROP_SAMPLE ? AXON_DROP_SAMPLE : ((len - 1) & (AXON_DROP_SAMPLE - 1)) + 1;
#ifdef AXON_CTX_XDP
		if (bpf_xdp_load_bytes(ctx, 0, ev->sample, n) == 0)
			ev->cap_len = n;
#else
		if (bpf_skb_load_bytes(ctx, 0, ev->sample, n) == 0)
			ev->cap_len = n;
#endif
	}
	bpf_ringbuf_submit(ev, 0);
	key = AXON_DROP_RING_EMITTED;
count:
	v = bpf_map_lookup_elem(&axon_drop_ring_stats, &key);
	if (v)
		*v += 1;
	return 0;
}

/* drop_packet records a packet program's drop (drop_record). The caller
 * returns its drop verdict. */
AXON_INLINE void drop_packet(axon_ctx_t *ctx, enum axon_prog prog, enum axon_drop_dir dir,
			     enum axon_drop_reason reason)
{
	drop_record(ctx, (__u32)prog | (__u32)dir << 8 | (__u32)reason << 16);
}
#endif

#endif /* AXON_DROP_H */
