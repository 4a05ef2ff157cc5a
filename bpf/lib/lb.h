/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* lb.h: service load-balancing maps and backend selection, shared by the
 * socket LB hooks (sock_lb.c) and the pods' per-packet LB (pod_lb.c).
 *
 * Written by the agent only (internal/datapath/socklb.go). Layouts are ABI
 * with the Go side: keep the structs free of implicit padding.
 *
 * Addresses are always 16 bytes: IPv4 as v4-mapped IPv6 (::ffff:a.b.c.d), so
 * one map serves IPv4, IPv6 and v4-in-v6 sockets (a v6 socket connecting to
 * ::ffff:a.b.c.d looks up exactly the key of the IPv4 frontend). Ports are in
 * network byte order.
 */
#ifndef AXON_LB_H
#define AXON_LB_H

#include "common.h"
#include "backend.h"

/* Sizes. The service map holds one master + one entry per backend slot. */
#define AXON_LB_SVC_MAX 262144
#define AXON_LB_BACKEND_MAX 262144
#define AXON_LB_REV_MAX 65536
#define AXON_LB_SOCK_MAX 131072
#define AXON_LB_AFFINITY_MAX 65536
#define AXON_LB_LOCAL_MAX 256
#define AXON_LB_SKIP_MAX 65536

/* lb_svc_val.flags (master slot; FlagAffinity in internal/datapath/lbmap). */
enum axon_lb_flag {
	AXON_LB_F_AFFINITY = 0x1, /* sessionAffinity ClientIP: affinity_timeout is set */
};

/* axon_lb_btf: the enums user space mirrors in BTF (see AXON_BTF_ANCHOR):
 * lb.Scope and lb.BackendState (common.h), lbFlagAffinity. */
AXON_BTF_ANCHOR(axon_lb_btf, {
	enum axon_lb_scope scope;
	enum axon_lb_state state;
	enum axon_lb_flag flag;
});

/* Key of axon_lb_svc (24 bytes). slot 0 is the frontend's master entry,
 * slots 1..active+terminating+quarantined hold its backends in this order:
 * Active first, then Terminating, then Quarantined (never chosen, kept so the
 * agent can read the whole frontend back). For ScopeNodePort/HostPort, addr
 * is the zero address of the family (:: or ::ffff:0.0.0.0). */
struct lb_svc_key {
	__u8 addr[16];
	__be16 port;
	__u8 proto; /* IPPROTO_TCP / IPPROTO_UDP / IPPROTO_SCTP */
	__u8 scope; /* AXON_LB_SCOPE_* */
	__u16 slot;
	__u16 pad;
};

/* Value of axon_lb_svc (16 bytes).
 *  master (slot 0): id = frontend id; active/terminating/quarantined = slot
 *                   counts; flags; affinity_timeout in seconds.
 *  slot n > 0:      id = backend id (key of axon_lb_be); the rest is zero. */
struct lb_svc_val {
	__u32 id;
	__u16 active;
	__u16 terminating;
	__u16 quarantined;
	__u8 flags;
	__u8 pad;
	__u32 affinity_timeout;
};

/* Value of axon_lb_be (24 bytes), keyed by backend id (__u32). Backend ids
 * belong to one frontend (frontend_id), so a stale affinity entry can be
 * checked for membership without another map. */
struct lb_backend {
	__u8 addr[16];
	__be16 port;
	__u8 proto;
	__u8 state; /* AXON_LB_ACTIVE / TERMINATING / QUARANTINED */
	__u32 frontend_id;
};

/* Reverse translation of unconnected UDP for recvmsg (LRU, written by the
 * sendmsg hooks): {socket cookie, backend addr, backend port} -> the
 * frontend the socket addressed. Keyed by backend too, so one unconnected
 * UDP socket talking to several services gets each reply's source right.
 * Connected sockets keep theirs in axon_lb_sock (below). 32 bytes. */
struct lb_rev_key {
	__u64 cookie;
	__u8 addr[16];
	__be16 port;
	__u16 pad;
	__u32 pad2;
};

struct lb_rev_val {
	__u8 addr[16];
	__be16 port;
	__u16 pad;
	__u32 frontend_id;
};

/* Reverse translation of a connected socket (value of axon_lb_sock, keyed
 * by socket cookie; written by connect4/6, deleted by sock_release when the
 * socket is closed): the backend connect() translated the socket to and the
 * frontend it addressed (fe: frontend addr, port, id). The peer is compared
 * before use: a socket re-connected elsewhere keeps a stale value that
 * matches nothing. 40 bytes. */
struct lb_sk_rev {
	struct lb_rev_val fe;
	__u8 addr[16]; /* backend */
	__be16 port;
	__u16 pad;
	__u32 pad2;
};

/* Session affinity (LRU, written by the hooks): {netns cookie, frontend id}
 * -> {backend id, last use in ns of bpf_ktime_get_ns}. */
struct lb_aff_key {
	__u64 netns_cookie;
	__u32 frontend_id;
	__u32 pad;
};

struct lb_aff_val {
	__u32 backend_id;
	__u32 pad;
	__u64 last_used_ns;
};

/* axon_lb_svc: frontend slots (see struct lb_svc_key). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, AXON_LB_SVC_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct lb_svc_key);
	__type(value, struct lb_svc_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} axon_lb_svc SEC(".maps");

/* axon_lb_be: backend id -> backend. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, AXON_LB_BACKEND_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct lb_backend);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} axon_lb_be SEC(".maps");

/* axon_lb_rev: reverse translation (see struct lb_rev_key). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, AXON_LB_REV_MAX);
	__type(key, struct lb_rev_key);
	__type(value, struct lb_rev_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} axon_lb_rev SEC(".maps");

/* axon_lb_sock: connected sockets' reverse translation, socket cookie ->
 * struct lb_sk_rev. An entry lives exactly as long as its socket is open:
 * written at connect, deleted by the sock_release hook at close, so the
 * table holds the node's open translated sockets, not its connection
 * history, and a long-lived socket (a resolver's connected UDP socket that
 * no hook sees again) keeps its entry however many short connections churn
 * past it. LRU only as a safety net: should a release be missed (kernel
 * sockets skip the hook) or more than AXON_LB_SOCK_MAX translated sockets
 * be open at once, the least recently used entries go (those sockets then
 * show their backend to getpeername and are not aborted when it leaves)
 * instead of new sockets finding the table full.
 * Socket local storage would need no delete, but its allocation at connect
 * and kfree_rcu at close measured twice the cost of this insert + delete
 * (docs/socket-lb.md). Pinned: a restarted agent's programs read what the
 * old ones wrote on sockets that are still open. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, AXON_LB_SOCK_MAX);
	__type(key, __u64);
	__type(value, struct lb_sk_rev);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} axon_lb_sock SEC(".maps");

/* lb_sk_rev_frontend returns the frontend in sr (a socket's axon_lb_sock
 * entry; NULL when it has none) when the socket's peer addr:port is the
 * backend connect() translated it to, else NULL. */
AXON_INLINE struct lb_rev_val *lb_sk_rev_frontend(struct lb_sk_rev *sr, const __u8 *addr, __be16 port)
{
	if (sr && sr->port == port && __builtin_memcmp(sr->addr, addr, sizeof(sr->addr)) == 0)
		return &sr->fe;
	return NULL;
}

/* axon_lb_aff: session affinity (see struct lb_aff_key). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, AXON_LB_AFFINITY_MAX);
	__type(key, struct lb_aff_key);
	__type(value, struct lb_aff_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} axon_lb_aff SEC(".maps");

/* axon_lb_local: the node's own addresses (16 bytes, v4 mapped) -> 1, for
 * NodePort/HostPort matching. Loopback is matched without an entry. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, AXON_LB_LOCAL_MAX);
	__type(key, struct in6_addr);
	__type(value, __u8);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} axon_lb_local SEC(".maps");

/* axon_lb_skip: netns cookies (bpf_get_netns_cookie) whose sockets are never
 * translated -> 1. The agent writes the netns of every pod that opted out of
 * socket LB (annotation axon.io/socket-lb: disabled on the Pod or its
 * Namespace), so a sidecar mesh or a VM in the pod sees the ClusterIP. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, AXON_LB_SKIP_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u64);
	__type(value, __u8);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} axon_lb_skip SEC(".maps");

AXON_INLINE void lb_addr_v4(__u8 *addr, __be32 ip4)
{
	__u32 *w = (__u32 *)addr;

	w[0] = 0;
	w[1] = 0;
	w[2] = bpf_htonl(0x0000ffff);
	w[3] = ip4;
}

AXON_INLINE int lb_addr_is_v4(const __u8 *addr)
{
	const __u32 *w = (const __u32 *)addr;

	return w[0] == 0 && w[1] == 0 && w[2] == bpf_htonl(0x0000ffff);
}

AXON_INLINE int lb_addr_is_loopback(const __u8 *addr)
{
	const __u32 *w = (const __u32 *)addr;

	if (lb_addr_is_v4(addr))
		return addr[12] == 127;
	return w[0] == 0 && w[1] == 0 && w[2] == 0 && w[3] == bpf_htonl(1);
}

/* lb_lookup finds the master entry for a destination: the exact ClusterIP /
 * externalIP / LoadBalancer frontend first, then, for the node's own
 * addresses and loopback, the wildcard NodePort and HostPort frontends.
 * key is left holding the matched key (slot 0). */
AXON_INLINE struct lb_svc_val *lb_lookup(struct lb_svc_key *key)
{
	struct lb_svc_val *svc;
	__u8 orig[16];
	__u32 *w = (__u32 *)key->addr;

	key->scope = AXON_LB_SCOPE_CLUSTER;
	key->slot = 0;
	key->pad = 0;
	svc = bpf_map_lookup_elem(&axon_lb_svc, key);
	if (svc)
		return svc;
	if (!lb_addr_is_loopback(key->addr) &&
	    !bpf_map_lookup_elem(&axon_lb_local, key->addr))
		return NULL;
	__builtin_memcpy(orig, key->addr, sizeof(orig));
	if (lb_addr_is_v4(orig))
		w[3] = 0;
	else
		__builtin_memset(key->addr, 0, sizeof(key->addr));
	key->scope = AXON_LB_SCOPE_NODEPORT;
	svc = bpf_map_lookup_elem(&axon_lb_svc, key);
	if (svc)
		return svc;
	key->scope = AXON_LB_SCOPE_HOSTPORT;
	svc = bpf_map_lookup_elem(&axon_lb_svc, key);
	if (svc)
		return svc;
	__builtin_memcpy(key->addr, orig, sizeof(orig));
	return NULL;
}

/* lb_usable says whether backend b may take a new connection of frontend
 * svc (backend.h). */
AXON_INLINE int lb_usable(const struct lb_backend *b, const struct lb_svc_val *svc)
{
	return backend_usable(b, svc);
}

/* How often lb_select re-reads the master entry after a failed pick. */
#define AXON_LB_SELECT_TRIES 3

/* lb_pick copies a random Active backend, else a random Terminating one,
 * from the slots of svc into out. 0: none, or svc was stale. */
AXON_INLINE int lb_pick(struct lb_svc_key *key, const struct lb_svc_val *svc,
			struct lb_backend *out, __u32 *be_id)
{
	struct lb_svc_val *slot;
	struct lb_backend *b;
	__u32 n = svc->active, first = 1;

	if (n == 0) {
		n = svc->terminating;
		first = 1 + svc->active;
	}
	if (n == 0)
		return 0;
	key->slot = first + bpf_get_prandom_u32() % n;
	slot = bpf_map_lookup_elem(&axon_lb_svc, key);
	key->slot = 0;
	if (!slot)
		return 0;
	*be_id = slot->id;
	b = bpf_map_lookup_elem(&axon_lb_be, be_id);
	if (!b)
		return 0;
	__builtin_memcpy(out, b, sizeof(*out));
	return out->frontend_id == svc->id && out->state != AXON_LB_QUARANTINED;
}

/* lb_select chooses the backend of a new connection into out: the affine
 * one while its entry is fresh and the backend still usable, else a random
 * Active one, else a random Terminating one. key holds the matched master key
 * (slot 0), found its value. Returns the frontend id, 0 when none serves;
 * the chosen backend's id (axon_lb_be key) goes to *be_out unless be_out is
 * NULL (a constant NULL compiles the store away).
 *
 * The agent updates a frontend while the hooks run (slots, then the master,
 * then removals), and hash map elements are reused as soon as they are freed
 * (no RCU grace period for their memory), so values are copied to the stack
 * before use and a pick that fails (a just-removed slot, a reused element
 * that reads as zero backends) re-reads the master and tries again: only a
 * frontend that shows no usable backend every time is refused. */
AXON_INLINE __u32 lb_select(struct lb_svc_key *key, const struct lb_svc_val *found,
			    __u64 netns_cookie, struct lb_backend *out, __u32 *be_out)
{
	struct lb_aff_key akey = {};
	struct lb_aff_val aval = {};
	struct lb_svc_val svc;
	struct lb_svc_val *p;
	struct lb_aff_val *aff;
	struct lb_backend *b;
	__u32 be_id = 0;
	__u64 now;
	int i, ok = 0;

	__builtin_memcpy(&svc, found, sizeof(svc));
	if (svc.id != 0 && (svc.flags & AXON_LB_F_AFFINITY)) {
		akey.netns_cookie = netns_cookie;
		akey.frontend_id = svc.id;
		now = bpf_ktime_get_ns();
		aff = bpf_map_lookup_elem(&axon_lb_aff, &akey);
		if (aff && now - aff->last_used_ns <= (__u64)svc.affinity_timeout * 1000000000ULL) {
			be_id = aff->backend_id;
			b = bpf_map_lookup_elem(&axon_lb_be, &be_id);
			if (b) {
				__builtin_memcpy(out, b, sizeof(*out));
				if (lb_usable(out, &svc)) {
					aff->last_used_ns = now;
					if (be_out)
						*be_out = be_id;
					return svc.id;
				}
			}
		}
	}

	for (i = 0; i < AXON_LB_SELECT_TRIES; i++) {
		if (i > 0) {
			p = bpf_map_lookup_elem(&axon_lb_svc, key);
			if (!p)
				return 0; /* deleted meanwhile */
			__builtin_memcpy(&svc, p, sizeof(svc));
		}
		if (svc.id != 0 && lb_pick(key, &svc, out, &be_id)) {
			ok = 1;
			break;
		}
	}
	if (!ok)
		return 0;
	if (svc.flags & AXON_LB_F_AFFINITY) {
		akey.netns_cookie = netns_cookie;
		akey.frontend_id = svc.id;
		aval.backend_id = be_id;
		aval.last_used_ns = bpf_ktime_get_ns();
		bpf_map_update_elem(&axon_lb_aff, &akey, &aval, BPF_ANY);
	}
	if (be_out)
		*be_out = be_id;
	return svc.id;
}

#endif /* AXON_LB_H */
