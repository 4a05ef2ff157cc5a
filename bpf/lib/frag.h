/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* frag.h: IP fragments through the north-south load balancer (included by
 * nodeport.h after np_parse_ports; the hooks there are marked "frag.h").
 *
 * Only the first fragment of a datagram (IPv4: offset 0 and MF; IPv6: a
 * fragment header with offset 0) carries the TCP/UDP header, so only it can
 * be matched to a flow by its ports. As in Cilium's ipv4/ipv6 fragment
 * tracking:
 *   first fragment      its ports are recorded in axon_np_frag under the key
 *                       the receiver reassembles by (source, destination, IP
 *                       identification, protocol); then it goes through the
 *                       LB like any packet (CT, frontend + backend pick,
 *                       reverse NAT, egress) and is translated in full: the
 *                       TCP/UDP checksum covers the whole datagram, but only
 *                       the pseudo header and the ports change and both are
 *                       in this fragment, so the incremental update is right.
 *   non-first fragment  its ports come from axon_np_frag; it then takes the
 *                       same CT / reverse-NAT lookups and gets the same
 *                       translation of the IP header only (addresses, IPv4
 *                       header checksum, TTL; DSR: encapsulated like the
 *                       first): np_rewrite leaves its payload alone.
 *                       Not found (the first fragment was reordered behind
 *                       it, lost, evicted, or recorded longer ago than
 *                       cfg_frag_timeout_ns): counted NP_FRAG_NOT_FOUND and
 *                       passed on untouched, never dropped.
 * Every TCP/UDP first fragment a hook sees is recorded, not only those of a
 * service: the later fragments need their ports before the LB can tell
 * whether they belong to a flow, and "not found" then means only "the first
 * fragment was not seen". Cost: one LRU update per fragmented datagram
 * (fragmented traffic only) and one lookup per later fragment. Fragments of
 * other protocols (ICMP, SCTP, ...) continue untouched (NP_FRAGMENT).
 * The entry is not deleted with the last fragment (fragments may arrive in
 * any order); the LRU and the timeout retire it. A new first fragment with
 * the same key overwrites it (IP id reuse: the newest datagram wins).
 * IPv6: the fragment header must follow the fixed header directly (no
 * other extension header before it), as Linux and every common stack send
 * it; anything else continues untouched.
 */
#ifndef AXON_FRAG_H
#define AXON_FRAG_H

#include "common.h"
#include "ctx.h"
#include "ct.h"

/* Default size of axon_np_frag: datagrams whose fragments are in flight at
 * the same time (between the first and the last fragment crossing the
 * node), as Cilium's bpf-fragments-map-max. nodeport.Options.FragMax
 * overrides it at load. */
#define AXON_NP_FRAG_MAX 8192

/* np_frag_key: one datagram, as the receiver reassembles it (40 bytes).
 * Addresses as in np_tuple (IPv4 as ::ffff:a.b.c.d). */
struct np_frag_key {
	__u8 saddr[16];
	__u8 daddr[16];
	__be32 id; /* IPv4: the 16-bit identification, zero-extended; IPv6: the 32-bit one */
	__u8 proto; /* TCP or UDP (the upper-layer protocol, not 44) */
	__u8 pad[3];
};

/* np_frag_val: what the later fragments need to find their flow (16 bytes). */
struct np_frag_val {
	__be16 sport; /* L4 ports of the first fragment, as in the packet */
	__be16 dport;
	__u32 pad;
	__u64 seen; /* ns, bpf_ktime_get_coarse_ns, when the first fragment passed */
};

/* axon_np_frag: datagram -> L4 ports of its first fragment. LRU because the
 * datapath never learns when a datagram is complete (the last fragment may
 * come first, a fragment may be lost): old datagrams are evicted by newer
 * ones instead of filling the table, with no agent GC needed. Pinned and
 * shared by the tc and XDP programs (a first fragment seen at XDP serves
 * the later ones that XDP passes up to tc). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, AXON_NP_FRAG_MAX);
	__type(key, struct np_frag_key);
	__type(value, struct np_frag_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} axon_np_frag SEC(".maps");

/* cfg_frag_timeout_ns: a recorded first fragment serves later fragments for
 * this long (nodeport.Options.FragTimeout, default 1 s; a datagram's fragments travel back to back, and
 * Linux reuses an IPv4 id for the same peers only after 65536 datagrams). */
volatile const __u64 cfg_frag_timeout_ns = 1000000000ULL;

/* np_frag_key_of fills the axon_np_frag key of fragment p. */
AXON_INLINE void np_frag_key_of(const struct np_pkt *p, struct np_frag_key *k)
{
	__builtin_memcpy(k->saddr, p->t.saddr, 16);
	__builtin_memcpy(k->daddr, p->t.daddr, 16);
	k->id = p->frag_id;
	k->proto = p->t.proto;
}

/* np_frag_recorded fills in the ports of a later fragment from its first
 * fragment's entry. 0: found (and not older than cfg_frag_timeout_ns). */
AXON_INLINE int np_frag_recorded(struct np_pkt *p, __u64 now)
{
	struct np_frag_key k = {};
	struct np_frag_val *vp;

	np_frag_key_of(p, &k);
	vp = bpf_map_lookup_elem(&axon_np_frag, &k);
	if (!vp || now - vp->seen > cfg_frag_timeout_ns)
		return -1;
	p->t.sport = vp->sport;
	p->t.dport = vp->dport;
	return 0;
}

/* np_frag_ports reads the ports of a TCP/UDP fragment without recording
 * anything: from its L4 header (first fragment) or from axon_np_frag
 * (later ones). np_dsr_accept uses it on the inner packet of a DSR request;
 * np_frag_track records the first fragment once it is decapsulated. 0: the
 * ports are in p. Not inlined: the key stays off the caller's frame. */
static __noinline int np_frag_ports(axon_ctx_t *ctx, struct np_pkt *p)
{
	if (p->t.proto != AXON_IPPROTO_TCP && p->t.proto != AXON_IPPROTO_UDP)
		return -1;
	if (p->frag == AXON_FRAG_FIRST)
		return np_parse_ports(ctx, p);
	return np_frag_recorded(p, np_now());
}

/* np_frag_track runs for every fragment (p->frag != 0) before the LB looks
 * at its ports. 0: go on (ports of a first fragment parsed and recorded, or
 * of a later fragment filled in from axon_np_frag); 1: continue untouched
 * (counted). Not inlined: its key stays off the callers' frames. */
static __noinline int np_frag_track(axon_ctx_t *ctx, struct np_pkt *p, enum np_hook hook)
{
	struct np_frag_key k = {};
	struct np_frag_val v = {};
	__u64 now;

	if (p->t.proto != AXON_IPPROTO_TCP && p->t.proto != AXON_IPPROTO_UDP) {
		np_count(hook, NP_FRAGMENT);
		return 1;
	}
	np_frag_key_of(p, &k);
	now = np_now();
	if (p->frag == AXON_FRAG_FIRST) {
		/* offset 0 but the L4 header is cut short: nothing to record */
		if (np_parse_ports(ctx, p)) {
			np_count(hook, NP_MALFORMED);
			return 1;
		}
		if (cfg_dry_run)
			return 0;
		v.sport = p->t.sport;
		v.dport = p->t.dport;
		v.seen = now;
		if (bpf_map_update_elem(&axon_np_frag, &k, &v, BPF_ANY) == 0)
			np_count(hook, NP_FRAG_TRACKED);
		return 0;
	}
	if (np_frag_recorded(p, now)) {
		np_count(hook, NP_FRAG_NOT_FOUND);
		return 1;
	}
	return 0;
}

#endif /* AXON_FRAG_H */
