/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* sockmap.h: the same-node TCP bypass ("sockmap"): the key, the maps and
 * the admission rule shared by sockops.c (puts established sockets into
 * axon_sock_hash) and sk_msg.c (moves each write into the peer socket).
 *
 * Who enters (both ends must qualify; the rule is symmetric, so a socket
 * enters only when its peer will enter too):
 *  pod <-> pod   the local address is an admitted pod's (axon_sockmap_pods)
 *                and the socket lives in that pod's netns (a netns that
 *                configured another pod's address is never joined), and the
 *                remote address is an admitted pod's. Key netns = 0: pod
 *                addresses are unique on the node.
 *  loopback      both addresses loopback (127/8, ::1, ::ffff:127/8) and the
 *                socket's netns is in axon_sockmap_netns. Key netns = the
 *                socket's netns cookie (both ends share it).
 *  intra-pod     one address loopback, the other an address of the pod that
 *                owns this netns (axon_sockmap_pods entry whose netns is the
 *                socket's), the netns in axon_sockmap_netns: a sidecar's
 *                127.0.0.6 -> podIP:8080, or the socket a netfilter REDIRECT
 *                in the pod's OUTPUT chain hands a local proxy
 *                (127.0.0.1:15001 <- podIP:x). Key netns = the netns cookie.
 * Nothing else: host sockets, sockets to other nodes, pods the agent did not
 * admit (opted out, bandwidth limited).
 *
 * Sidecars (netfilter REDIRECT): a REDIRECTed connection's two sockets do
 * not carry reversed tuples (the client sees podA:x -> podB:8080, the proxy
 * 127.0.0.1:15001 <- podA:x or podB:15006 <- podA:x), so the exact peer key
 * misses. Every admitted socket is therefore also inserted into
 * axon_sock_alias under ALIAS KEYS naming its connection's client endpoint,
 * and a socket whose first write misses the exact key redirects to the alias
 * key of the opposite role (sockmap_alias_redirect). An alias key is a
 * struct sockmap_key:
 *   local      the client's address      lport   the client's port
 *   netns      the client's netns cookie rport   AXON_SM_ALIAS_PORT | role
 *   remote[0], remote[1]  the SERVER's netns cookie (low, high 32 bits)
 *   remote[2], remote[3]  0
 * (rport > 65535 never names a real port: an alias key is never an exact one.)
 * Who may claim which key, and why a pod cannot take another pod's
 * connection:
 *  client role  inserted by the active opener for its own local endpoint and
 *               its own netns cookie (bpf_get_netns_cookie: not forgeable),
 *               with server netns = its own netns (a proxy in the same pod:
 *               the outbound sidecar) and, when its destination address is an
 *               admitted pod's, that pod's netns (the destination's inbound
 *               sidecar). Only sockets of netns N hold client keys of N, and
 *               admission already requires their local address to be
 *               loopback or N's own pod address.
 *  server role  inserted by the passive side for its remote endpoint: client
 *               netns = its own when the remote is loopback, else the netns
 *               owning the remote address (axon_sockmap_pods); server netns =
 *               its own cookie. A pod D that forges pod A's address in its
 *               own netns to accept a connection "from podA:x" claims
 *               (podA:x, A, server, D); A's sockets only ever look up server
 *               netns A or the netns of the pod they connect to, so D gets
 *               A's bytes only from a connection A opened to D itself.
 * Collisions: two sockets claiming one alias key (port reuse to two
 * destinations) are never paired with either peer: the second insert
 * (BPF_NOEXIST) fails, the key is poisoned in axon_sockmap_alias_poison, the
 * first socket's alias entry is deleted (its exact entry stays, so no queued
 * byte is lost), and no write ever redirects through a poisoned key
 * (counters alias_collision, alias_poisoned). The kernel removes a socket's
 * alias keys with its other entries when it closes.
 */
#ifndef AXON_SOCKMAP_H
#define AXON_SOCKMAP_H

#include "common.h"
#include <bpf/bpf_core_read.h>

/* Default max_entries of axon_sock_hash (internal/datapath/sockmap Config
 * sets it at load time): one entry per bypassed socket, two per connection. */
#define AXON_SOCKMAP_MAX 65536
/* Capacity of axon_sockmap_pods and axon_sockmap_netns. */
#define AXON_SOCKMAP_PODS_MAX AXON_MAX_ENDPOINTS
/* Default max_entries of axon_sock_alias (Config sets it at load time to
 * twice axon_sock_hash's): up to two alias keys per bypassed socket. */
#define AXON_SOCKMAP_ALIAS_MAX (2 * AXON_SOCKMAP_MAX)
/* Capacity of axon_sockmap_alias_poison (LRU: the oldest poisoned keys are
 * forgotten first; a forgotten key only lets a later connection pair again). */
#define AXON_SOCKMAP_POISON_MAX 4096

/* Alias keys (see the header comment): rport = AXON_SM_ALIAS_PORT | role. */
#define AXON_SM_ALIAS_PORT 0x10000
#define AXON_SM_ROLE_CLIENT 1 /* the active opener (connect) */
#define AXON_SM_ROLE_SERVER 2 /* the passive side (accept) */

/* struct sockmap_state.flags bits (an enum for BTF: internal/datapath/sockmap
 * mirrors them, TestEnumsMatchBTF). */
enum axon_sockmap_flag {
	AXON_SM_F_CLIENT = 0x1,     /* sockops: the socket is the active opener (alias role client) */
	AXON_SM_F_SERVER = 0x2,     /* sockops: the socket is the passive side (alias role server) */
	AXON_SM_F_PEER_ALIAS = 0x4, /* sk_msg: peer is an alias key of axon_sock_alias, not an exact key */
	/* the mode machine (below) */
	AXON_SM_F_QUIET = 0x100,    /* never redirects again, none in flight; published in axon_sockmap_quiet */
	AXON_SM_F_LEFT = 0x200,     /* sockops: deleted from axon_sock_hash (sockmap_try_leave) */
	AXON_SM_F_VOUCH = 0x400,    /* sk_msg: this sendmsg is the only other psock holder; consumed by the next sockops callback */
	AXON_SM_F_PUBLISHED = 0x800, /* sockops: QUIET is in every axon_sockmap_quiet entry of the socket (exact and alias keys) */
	AXON_SM_F_HOLD = 0x1000,    /* sk_msg: never made quiet, stays in the map (set only by the resume probe, sk_msg.c cfg_resume_probe) */
	AXON_SM_F_STREAK = 0xff0000, /* sk_msg: the small-write streak, a count in these bits (sk_msg.c) */
};

/* -EEXIST of a BPF_NOEXIST update whose key is taken. */
#define AXON_SM_EEXIST 17

/* sockmap_key: one socket of axon_sock_hash. Addresses as IPv6, IPv4 as
 * ::ffff:a.b.c.d (network byte order), so an AF_INET socket and an AF_INET6
 * socket with a v4-mapped address key the same way; ports in host byte order;
 * netns: the socket's netns cookie for loopback pairs, 0 for pod <-> pod. */
struct sockmap_key {
	__u32 local[4];
	__u32 remote[4];
	__u32 lport;
	__u32 rport;
	__u64 netns;
};

/* sockmap_pod: value of axon_sockmap_pods: the netns cookie of the pod that
 * owns the address. */
struct sockmap_pod {
	__u64 netns;
};

/* sockmap_state: per-socket state in axon_sockmap_state, created by sockops
 * when the socket enters axon_sock_hash, read and written by sk_msg and by
 * sockops' leave check (both under the socket lock: no atomics needed). */
struct sockmap_state {
	__u32 mode;       /* enum axon_sockmap_mode */
	__u32 flags;      /* AXON_SM_F_* (0 in state written before flags existed) */
	__u64 redir_msgs;  /* writes redirected into the peer */
	__u64 redir_bytes; /* their bytes */
	__u64 pass_bytes;  /* bytes of writes that went through TCP */
	struct sockmap_key peer; /* the peer's key: computed by sockops (exact), replaced
				  * by the alias key that worked (AXON_SM_F_PEER_ALIAS) */
};

/* axon_sock_hash: the bypassed sockets, key -> socket (the value written is
 * the socket; a lookup from user space reads its cookie). The kernel removes
 * a socket when it closes; sockops removes a socket that leaves the bypass
 * (sockmap_try_leave: only with its queue empty and nothing left that could
 * redirect into it; any other delete would drop data queued on the socket).
 * max_entries set at load time. Pinned. */
struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, AXON_SOCKMAP_MAX);
	__type(key, struct sockmap_key);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} axon_sock_hash SEC(".maps");

/* axon_sock_alias: the bypassed sockets again, under their alias keys (see
 * the header comment), key -> socket. No program is attached to it: the
 * kernel refuses a socket in a second map with an sk_msg program (EBUSY),
 * and a socket cannot enter axon_sock_hash twice for the same reason.
 * Inserted by sockops after the exact key, read by sk_msg's redirect only;
 * the kernel removes a socket's keys when it closes; sockops deletes a key
 * that two sockets claim (the socket stays in axon_sock_hash). max_entries
 * set at load time. Pinned. */
struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, AXON_SOCKMAP_ALIAS_MAX);
	__type(key, struct sockmap_key);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} axon_sock_alias SEC(".maps");

/* axon_sockmap_alias_poison: alias key -> 1: keys two sockets claimed at
 * once. Never inserted into axon_sock_alias again, never redirected
 * through. Written by sockops only. Pinned. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, AXON_SOCKMAP_POISON_MAX);
	__type(key, struct sockmap_key);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} axon_sockmap_alias_poison SEC(".maps");

/* axon_sockmap_pods: 16-byte pod address (IPv4 v4-mapped) -> struct
 * sockmap_pod: the local pods admitted to the bypass and the netns that owns
 * each address. Written only by the agent (sockmap.Bypass). Pinned. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, AXON_SOCKMAP_PODS_MAX);
	__type(key, __u32[4]);
	__type(value, struct sockmap_pod);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} axon_sockmap_pods SEC(".maps");

/* axon_sockmap_netns: netns cookie -> 0 (reserved): pod netns whose loopback
 * connections (app <-> sidecar) are admitted. Written only by the agent.
 * Pinned. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, AXON_SOCKMAP_PODS_MAX);
	__type(key, __u64);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} axon_sockmap_netns SEC(".maps");

/* axon_sockmap_state: socket storage, struct sockmap_state. Pinned: a
 * socket's psock keeps the sk_msg program it was linked with, and with it
 * that program's state map; one pinned map keeps every socket's state in one
 * place across agent restarts (the connection list reads it, sockets of an
 * earlier load keep their mode). */
struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct sockmap_state);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} axon_sockmap_state SEC(".maps");

/* axon_sockmap_metrics: PERCPU_ARRAY of __u64, index enum
 * axon_sockmap_counter (lib/common.h). Pinned so counters survive restarts. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, AXON_SM_MAX);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} axon_sockmap_metrics SEC(".maps");

/* axon_sockmap_btf: the bypass's enums in BTF (see AXON_BTF_ANCHOR):
 * internal/datapath/sockmap's metricNames and mode constants. */
AXON_BTF_ANCHOR(axon_sockmap_btf, {
	enum axon_sockmap_counter counter;
	enum axon_sockmap_mode mode;
	enum axon_sockmap_flag flag;
});

/* sockmap_count adds n to counter c. Atomic: sk_msg runs in process context
 * with only migration disabled, so two tasks on one CPU can interleave. */
AXON_INLINE void sockmap_count(enum axon_sockmap_counter c, __u64 n)
{
	__u32 idx = c;
	__u64 *v = bpf_map_lookup_elem(&axon_sockmap_metrics, &idx);

	if (v)
		__sync_fetch_and_add(v, n);
}

/* sockmap_key_of fills key from a struct bpf_sock_ops or struct sk_msg_md
 * (same field names): addresses v4-mapped, ports in host order (local_port
 * is in host order; remote_port in network order in the upper 16 bits of
 * the 32-bit field on little endian, so bpf_ntohl). netns is left 0. The
 * fields are read straight into locals (no pointer into the context: the
 * verifier refuses a load through a modified context pointer). Returns 0,
 * or -1 for a family other than AF_INET/AF_INET6. */
#define sockmap_key_of(key, ctx)                                               \
	({                                                                         \
		int __ret = 0;                                                         \
		__u32 __fam = (ctx)->family;                                           \
		__u32 __l4 = (ctx)->local_ip4;                                         \
		__u32 __r4 = (ctx)->remote_ip4;                                        \
		(key)->lport = (ctx)->local_port;                                      \
		(key)->rport = bpf_ntohl((ctx)->remote_port);                          \
		if (__fam == AXON_AF_INET) {                                           \
			(key)->local[2] = bpf_htonl(0xffff);                               \
			(key)->local[3] = __l4;                                            \
			(key)->remote[2] = bpf_htonl(0xffff);                              \
			(key)->remote[3] = __r4;                                           \
		} else if (__fam == AXON_AF_INET6) {                                   \
			(key)->local[0] = (ctx)->local_ip6[0];                             \
			(key)->local[1] = (ctx)->local_ip6[1];                             \
			(key)->local[2] = (ctx)->local_ip6[2];                             \
			(key)->local[3] = (ctx)->local_ip6[3];                             \
			(key)->remote[0] = (ctx)->remote_ip6[0];                           \
			(key)->remote[1] = (ctx)->remote_ip6[1];                           \
			(key)->remote[2] = (ctx)->remote_ip6[2];                           \
			(key)->remote[3] = (ctx)->remote_ip6[3];                           \
		} else {                                                               \
			__ret = -1;                                                        \
		}                                                                      \
		__ret;                                                                 \
	})

/* sockmap_is_loopback: a is 127/8 (v4-mapped) or ::1. */
AXON_INLINE int sockmap_is_loopback(const __u32 *a)
{
	if (a[0] != 0 || a[1] != 0)
		return 0;
	if (a[2] == bpf_htonl(0xffff))
		return (a[3] & bpf_htonl(0xff000000)) == bpf_htonl(0x7f000000);
	return a[2] == 0 && a[3] == bpf_htonl(1);
}

/* sockmap_admit_intrapod: the rule for a socket with a loopback end (lo_local,
 * lo_remote): both loopback, or the other end an address of the pod owning
 * netns (not merely some admitted pod's: 127.0.0.1 -> another pod's address
 * configured in this netns is refused), and netns admitted. Key netns =
 * netns: the pair lives in one netns. */
AXON_INLINE enum axon_sockmap_counter sockmap_admit_intrapod(struct sockmap_key *key, __u64 netns,
							     int lo_local, int lo_remote)
{
	struct sockmap_pod *pod;

	if (!bpf_map_lookup_elem(&axon_sockmap_netns, &netns))
		return AXON_SM_SKIP_NOT_ENABLED;
	key->netns = netns;
	if (lo_local && lo_remote)
		return AXON_SM_ADMIT_LOOPBACK;
	pod = bpf_map_lookup_elem(&axon_sockmap_pods, lo_local ? key->remote : key->local);
	if (!pod)
		return AXON_SM_SKIP_NOT_POD;
	if (pod->netns != netns)
		return AXON_SM_SKIP_NETNS_MISMATCH;
	return AXON_SM_ADMIT_INTRAPOD;
}

/* sockmap_admit applies the admission rule to the socket of key living in
 * netns cookie netns. It sets key->netns and returns AXON_SM_ADMIT_POD,
 * AXON_SM_ADMIT_LOOPBACK or AXON_SM_ADMIT_INTRAPOD for a socket that may
 * enter, else the reason it may not (an AXON_SM_SKIP_* counter). */
AXON_INLINE enum axon_sockmap_counter sockmap_admit(struct sockmap_key *key, __u64 netns)
{
	int lo_local = sockmap_is_loopback(key->local);
	int lo_remote = sockmap_is_loopback(key->remote);
	struct sockmap_pod *pod;

	if (lo_local || lo_remote)
		return sockmap_admit_intrapod(key, netns, lo_local, lo_remote);
	pod = bpf_map_lookup_elem(&axon_sockmap_pods, key->local);
	if (!pod)
		return AXON_SM_SKIP_NOT_POD;
	if (pod->netns != netns)
		return AXON_SM_SKIP_NETNS_MISMATCH;
	if (!bpf_map_lookup_elem(&axon_sockmap_pods, key->remote))
		return AXON_SM_SKIP_NOT_POD;
	key->netns = 0;
	return AXON_SM_ADMIT_POD;
}

/* sockmap_peer_key: the key under which the peer of key's socket is stored:
 * addresses and ports swapped, the same netns field. */
AXON_INLINE void sockmap_peer_key(struct sockmap_key *peer, const struct sockmap_key *key)
{
	peer->local[0] = key->remote[0];
	peer->local[1] = key->remote[1];
	peer->local[2] = key->remote[2];
	peer->local[3] = key->remote[3];
	peer->remote[0] = key->local[0];
	peer->remote[1] = key->local[1];
	peer->remote[2] = key->local[2];
	peer->remote[3] = key->local[3];
	peer->lport = key->rport;
	peer->rport = key->lport;
	peer->netns = key->netns;
}

/* sockmap_alias_server_netns sets the server netns of alias key k. */
AXON_INLINE void sockmap_alias_server_netns(struct sockmap_key *k, __u64 server_netns)
{
	k->remote[0] = (__u32)server_netns;
	k->remote[1] = (__u32)(server_netns >> 32);
}

/* sockmap_alias_key fills k with the alias key of the client endpoint
 * client:cport of netns client_netns, for role (AXON_SM_ROLE_*), as the
 * socket of server netns server_netns claims it (layout: header comment). */
AXON_INLINE void sockmap_alias_key(struct sockmap_key *k, const __u32 *client, __u32 cport,
				   __u64 client_netns, __u32 role, __u64 server_netns)
{
	k->local[0] = client[0];
	k->local[1] = client[1];
	k->local[2] = client[2];
	k->local[3] = client[3];
	sockmap_alias_server_netns(k, server_netns);
	k->remote[2] = 0;
	k->remote[3] = 0;
	k->lport = cport;
	k->rport = AXON_SM_ALIAS_PORT | role;
	k->netns = client_netns;
}

/* sockmap_netns_of: the netns cookie that owns address addr as seen from
 * netns own: own for loopback, else the admitted pod's (axon_sockmap_pods),
 * 0 when no admitted pod has it. */
AXON_INLINE __u64 sockmap_netns_of(const __u32 *addr, __u64 own)
{
	struct sockmap_pod *pod;

	if (sockmap_is_loopback(addr))
		return own;
	pod = bpf_map_lookup_elem(&axon_sockmap_pods, addr);
	return pod ? pod->netns : 0;
}

/* sockmap_quiet: value of axon_sockmap_quiet. */
struct sockmap_quiet {
	__u32 state;  /* AXON_SM_LIVE or AXON_SM_QUIET */
	__u32 _pad;
	__u64 cookie; /* the socket's cookie (0: a placeholder for a peer that has not entered yet): TCP_CLOSE deletes only its own entries */
};
#define AXON_SM_LIVE 0  /* may still redirect into its peer */
#define AXON_SM_QUIET 1 /* never redirects again, no redirect of it in flight */

/* axon_sockmap_quiet: each key of a socket that entered axon_sock_hash (its
 * exact key, and each alias key it holds in axon_sock_alias) -> struct
 * sockmap_quiet, what its peer reads to decide whether it may leave (a
 * socket reaches its peer's sk_storage only through a SOCKHASH lookup, whose
 * reference neither sk_msg nor sockops can release). Absent: no socket with
 * that key ever entered, or it closed. sockops creates the exact entry
 * (LIVE) before the socket enters axon_sock_hash (no entry, no insert), each
 * alias entry before the alias key enters axon_sock_alias (no entry, no alias
 * key), and a placeholder (LIVE, cookie 0) for its exact peer until the peer
 * enters; the entries stay when the socket leaves the map (QUIET) and go at
 * TCP_CLOSE (with the peer's placeholder if the peer never entered); sk_msg
 * (the exact entry) and sockops (every entry, sockmap_publish_quiet) set
 * QUIET, only ever on an existing entry of the socket's own cookie. A plain
 * HASH, not an LRU: an evicted live entry would read as absent and let the
 * peer leave while this socket still redirects. max_entries: four per
 * socket of axon_sock_hash (its exact key, two alias keys, a placeholder;
 * set at load time, or the pinned map's). Pinned. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, AXON_SOCKMAP_MAX);
	__type(key, struct sockmap_key);
	__type(value, struct sockmap_quiet);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} axon_sockmap_quiet SEC(".maps");

/* Kernel types, only the members read (CO-RE relocates the offsets against
 * the running kernel's BTF; the ___sm suffix is dropped for matching;
 * sock_splice.c declares its own ___axon ones). */
struct socket_lock___sm {
	int owned; /* a syscall owns the socket (lock_sock) */
} __attribute__((preserve_access_index));

struct sock___sm {
	struct socket_lock___sm sk_lock;
	int sk_rcvbuf;
	void *sk_user_data;
} __attribute__((preserve_access_index));

struct sk_buff_head___sm {
	__u32 qlen;
} __attribute__((preserve_access_index));

struct list_head___sm {
	struct list_head___sm *next;
} __attribute__((preserve_access_index));

struct refcount_struct___sm {
	int refs; /* atomic_t: read whole */
};

struct sk_psock___sm {
	__u32 msg_tot_len;
	struct list_head___sm link; /* one sk_psock_link per map the socket is in */
	struct list_head___sm ingress_msg;
	struct sk_buff_head___sm ingress_skb;
	struct refcount_struct___sm refcnt;
} __attribute__((preserve_access_index));

struct sk_msg___sm {
	struct sock___sm *sk;
	struct sock___sm *sk_redir;
} __attribute__((preserve_access_index));

struct bpf_sock_ops_kern___sm {
	struct sock___sm *sk;
} __attribute__((preserve_access_index));

extern void *bpf_cast_to_kern_ctx(void *obj) __ksym __weak;

/* The low bits of sk_user_data are flags (SK_USER_DATA_NOCOPY, _BPF,
 * _PSOCK); the rest is the psock. */
#define AXON_SK_USER_DATA_PTRMASK (~7UL)

/* sockmap_can_leave: 1 where sockets may leave the map (the mode machine):
 * the kernel's psock has msg_tot_len (6.6.128+, 6.12.75+, 6.18.14+), which
 * tells an empty psock queue, and so also bpf_cast_to_kern_ctx (6.3+). A
 * CO-RE constant: elsewhere (Debian's 6.1) no socket leaves, sockops keeps
 * no axon_sockmap_quiet entries and asks for no per-segment callbacks, and
 * the bypass stays off anyway (the self-test's back-pressure check). */
#define sockmap_can_leave() bpf_core_field_exists(((struct sk_psock___sm *)0)->msg_tot_len)

/* sockmap_alias_poisoned: 1 (counted alias_poisoned) when two sockets once
 * claimed alias key ak at the same time, else 0. */
AXON_INLINE int sockmap_alias_poisoned(const struct sockmap_key *ak)
{
	if (!bpf_map_lookup_elem(&axon_sockmap_alias_poison, ak))
		return 0;
	sockmap_count(AXON_SM_ALIAS_POISONED, 1);
	return 1;
}

/* sockmap_alias_poison (sockops): two sockets claimed alias key ak: it is
 * poisoned and the holder's axon_sock_alias entry deleted (the holder keeps
 * its exact entry, its queued bytes and its axon_sockmap_quiet entry under
 * ak, which a socket that paired with it through ak before still reads), so
 * no one is paired through ak again. */
AXON_INLINE void sockmap_alias_poison(struct sockmap_key *ak)
{
	__u64 one = 1;

	bpf_map_update_elem(&axon_sockmap_alias_poison, ak, &one, BPF_ANY);
	bpf_map_delete_elem(&axon_sock_alias, ak);
	sockmap_count(AXON_SM_ALIAS_COLLISION, 1);
}

/* sockmap_alias_insert (sockops) puts the socket of skops (cookie) into
 * axon_sock_alias under ak with BPF_NOEXIST, unless ak is poisoned; where
 * sockets may leave the map, its axon_sockmap_quiet entry under ak (live)
 * first: a socket that pairs with it through ak reads that entry to know
 * when nothing comes from it any more. A key another socket holds (in
 * axon_sock_alias, or its quiet entry) is a collision: sockmap_alias_poison. */
AXON_INLINE void sockmap_alias_insert(struct bpf_sock_ops *skops, struct sockmap_key *ak, __u64 cookie)
{
	struct sockmap_quiet live = {.state = AXON_SM_LIVE, .cookie = cookie};
	long err;

	if (sockmap_alias_poisoned(ak))
		return;
	if (sockmap_can_leave()) {
		err = bpf_map_update_elem(&axon_sockmap_quiet, ak, &live, BPF_NOEXIST);
		if ((int)err == -AXON_SM_EEXIST) {
			sockmap_alias_poison(ak);
			return;
		}
		if (err != 0) {
			sockmap_count(AXON_SM_INSERT_FAILED, 1);
			return;
		}
	}
	/* (int): before 6.4 only the low 32 bits of the result are defined
	 * (see np_snat_insert in lib/nodeport.h) */
	err = bpf_sock_hash_update(skops, &axon_sock_alias, ak, BPF_NOEXIST);
	if ((int)err == 0)
		return;
	if (sockmap_can_leave())
		bpf_map_delete_elem(&axon_sockmap_quiet, ak);
	if ((int)err != -AXON_SM_EEXIST) {
		sockmap_count(AXON_SM_INSERT_FAILED, 1);
		return;
	}
	sockmap_alias_poison(ak);
}

/* What sockmap_alias_each does with each alias key of a socket (a constant
 * at every call: the other branches fold away). */
#define AXON_SM_ALIAS_INSERT 0 /* sockmap_alias_insert */
#define AXON_SM_ALIAS_UNLINK 1 /* delete it from axon_sock_alias */
#define AXON_SM_ALIAS_QUIET 2  /* its axon_sockmap_quiet entry, if the socket's own: QUIET */
#define AXON_SM_ALIAS_FORGET 3 /* its axon_sockmap_quiet entry, if the socket's own: deleted */

/* sockmap_alias_apply (sockops): op on alias key ak of the socket of skops
 * (cookie). */
AXON_INLINE void sockmap_alias_apply(struct bpf_sock_ops *skops, struct sockmap_key *ak, int op, __u64 cookie)
{
	struct sockmap_quiet *v;

	if (op == AXON_SM_ALIAS_INSERT) {
		sockmap_alias_insert(skops, ak, cookie);
		return;
	}
	if (op == AXON_SM_ALIAS_UNLINK) {
		bpf_map_delete_elem(&axon_sock_alias, ak);
		return;
	}
	v = bpf_map_lookup_elem(&axon_sockmap_quiet, ak);
	if (!v || v->cookie != cookie)
		return;
	if (op == AXON_SM_ALIAS_QUIET)
		v->state = AXON_SM_QUIET;
	else
		bpf_map_delete_elem(&axon_sockmap_quiet, ak);
}

/* sockmap_alias_each (sockops): the alias keys of an admitted socket whose
 * exact key is key, in netns; client: the socket connected (active opener),
 * else it was accepted. Each key gets op (AXON_SM_ALIAS_*): one list of keys
 * for inserting them, unlinking them when the socket leaves and its quiet
 * entries, so each step takes exactly the keys it was given. */
AXON_INLINE void sockmap_alias_each(struct bpf_sock_ops *skops, const struct sockmap_key *key,
				    __u64 netns, int client, int op, __u64 cookie)
{
	struct sockmap_key ak = {};
	__u64 other = sockmap_netns_of(key->remote, netns);

	if (client) {
		/* servers in this netns (outbound sidecar) and, for a pod
		 * destination in another netns, there (inbound sidecar) */
		sockmap_alias_key(&ak, key->local, key->lport, netns, AXON_SM_ROLE_CLIENT, netns);
		sockmap_alias_apply(skops, &ak, op, cookie);
		if (!other || other == netns)
			return;
		sockmap_alias_server_netns(&ak, other);
	} else if (other) { /* the client's netns: own for loopback, the pod's */
		sockmap_alias_key(&ak, key->remote, key->rport, other, AXON_SM_ROLE_SERVER, netns);
	} else {
		return;
	}
	sockmap_alias_apply(skops, &ak, op, cookie);
}

/* sockmap_alias_insert_all (sockops): the alias keys of an admitted socket
 * whose exact key is key (already in axon_sock_hash), in netns; active: the
 * socket connected (client), else it was accepted (server). Returns the
 * role's AXON_SM_F_* flag for the socket's state. */
AXON_INLINE __u32 sockmap_alias_insert_all(struct bpf_sock_ops *skops, const struct sockmap_key *key,
					   __u64 netns, int active, __u64 cookie)
{
	sockmap_alias_each(skops, key, netns, active, AXON_SM_ALIAS_INSERT, cookie);
	return active ? AXON_SM_F_CLIENT : AXON_SM_F_SERVER;
}

/* sockmap_alias_all (sockops): op (AXON_SM_ALIAS_UNLINK, _QUIET, _FORGET) on
 * the alias keys that sockmap_alias_insert_all gave the socket of exact key
 * key in netns, by its role in flags (recomputed: a pod withdrawn since then
 * leaves the key to its destination's netns behind: the socket stays in
 * axon_sock_alias, out of axon_sock_hash but not plain TCP, until it closes,
 * and that key's quiet entry stays, so the key is poisoned for the next
 * socket that claims it). */
AXON_INLINE void sockmap_alias_all(struct bpf_sock_ops *skops, const struct sockmap_key *key,
				   __u64 netns, __u32 flags, int op, __u64 cookie)
{
	if (flags & (AXON_SM_F_CLIENT | AXON_SM_F_SERVER))
		sockmap_alias_each(skops, key, netns, flags & AXON_SM_F_CLIENT, op, cookie);
}

/* sockmap_redirect_peer (sk_msg) redirects msg to the socket's peer key
 * st->peer: in axon_sock_alias when it is an alias key (never through a
 * poisoned one), else in axon_sock_hash. Returns SK_PASS when redirected
 * (bpf_msg_redirect_hash's SK_DROP on a miss is for the caller to handle). */
AXON_INLINE long sockmap_redirect_peer(struct sk_msg_md *msg, struct sockmap_state *st)
{
	if (st->flags & AXON_SM_F_PEER_ALIAS) {
		if (sockmap_alias_poisoned(&st->peer))
			return SK_DROP;
		return bpf_msg_redirect_hash(msg, &axon_sock_alias, &st->peer, BPF_F_INGRESS);
	}
	return bpf_msg_redirect_hash(msg, &axon_sock_hash, &st->peer, BPF_F_INGRESS);
}

/* sockmap_alias_try redirects msg to alias key ak unless it is poisoned; on
 * success ak becomes the socket's peer key (later writes: one lookup). */
AXON_INLINE long sockmap_alias_try(struct sk_msg_md *msg, struct sockmap_state *st, struct sockmap_key *ak)
{
	if (sockmap_alias_poisoned(ak))
		return SK_DROP;
	if (bpf_msg_redirect_hash(msg, &axon_sock_alias, ak, BPF_F_INGRESS) != SK_PASS)
		return SK_DROP;
	__builtin_memcpy(&st->peer, ak, sizeof(*ak));
	st->flags |= AXON_SM_F_PEER_ALIAS;
	sockmap_count(AXON_SM_ALIAS_PAIRED, 1);
	return SK_PASS;
}

/* sockmap_alias_redirect (sk_msg): for a socket whose exact peer key missed
 * on its first write, the redirect to the alias key of the opposite role
 * (header comment). st->peer is still the exact peer key, the tuple reversed:
 * peer.remote:rport is this socket's local end, peer.local:lport its remote
 * end. A client tries the servers of its own netns, then of the netns owning
 * its destination; a server the client that its remote end names. Returns
 * SK_PASS when redirected. */
AXON_INLINE long sockmap_alias_redirect(struct sk_msg_md *msg, struct sockmap_state *st)
{
	struct sockmap_key ak = {};
	__u64 own, other;

	if (st->flags & AXON_SM_F_PEER_ALIAS)
		return SK_DROP;
	own = bpf_get_netns_cookie(msg);
	other = sockmap_netns_of(st->peer.local, own);
	if (st->flags & AXON_SM_F_CLIENT) {
		sockmap_alias_key(&ak, st->peer.remote, st->peer.rport, own, AXON_SM_ROLE_SERVER, own);
		if (sockmap_alias_try(msg, st, &ak) == SK_PASS)
			return SK_PASS;
		if (!other || other == own)
			return SK_DROP;
		sockmap_alias_server_netns(&ak, other);
		return sockmap_alias_try(msg, st, &ak);
	}
	if ((st->flags & AXON_SM_F_SERVER) && other) {
		sockmap_alias_key(&ak, st->peer.local, st->peer.lport, other, AXON_SM_ROLE_CLIENT, own);
		return sockmap_alias_try(msg, st, &ak);
	}
	return SK_DROP;
}

/* ---- The mode machine: leaving the map --------------------------------
 *
 * A socket in stack mode still pays for being in axon_sock_hash: its writes
 * go through tcp_bpf_sendmsg (a copy into an sk_msg, then page frags pushed
 * into TCP) and, with the stream verdict, every TCP segment it receives is
 * turned into an sk_msg. Deleting it from the map gives it plain TCP back,
 * but a delete drops whatever its psock queue holds, and a redirect into it
 * that is in flight (the writer chose it and released its own lock, and has
 * not yet queued into it) is lost when the psock goes. A socket S therefore
 * leaves only when, under its own socket lock (sockops callbacks run with it
 * held: owned by a syscall, or bh-locked in softirq, so no bpf_tcp_ingress
 * into S can run meanwhile):
 *  - S is quiet: it never redirects again and no redirect of its own is in
 *    flight (so its peer may leave too once S's entry is gone);
 *  - its peer is quiet, or not in the map (its axon_sockmap_quiet entry is
 *    absent): nothing can be redirected into S any more;
 *  - its psock queues are empty (ingress_skb, read first, then ingress_msg);
 *  - nothing but its map links holds its psock (sockmap_psock_holders 0),
 *    or one holder: the sendmsg that runs the callback when the sk_msg
 *    program vouched for it, or the syscall that owns the socket (a reader
 *    in tcp_bpf_recvmsg sending its window update, which returns what it
 *    read and does not wait again). A reader waiting inside
 *    tcp_bpf_recvmsg would otherwise keep the psock, wake up with the
 *    bytes in the TCP queue and return EAGAIN. Residual race: a reader
 *    that enters recvmsg during the check, or waits in it while another
 *    thread's setsockopt-like syscall owns the socket and sends a segment,
 *    gets one EAGAIN (no byte is lost: they are in the TCP queue).
 * Quiet: mode stack (sticky, so no later run redirects) and either it never
 * redirected (a run that redirects sets bypass first, under the lock) or
 * nothing but its links holds its psock, save the sendmsg running sk_msg
 * (every sendmsg holds it, across the redirect it makes with its own lock
 * released). Leaving deletes the socket's alias keys (axon_sock_alias) with
 * its exact key. A socket paired by alias key (a sidecar's REDIRECTed
 * connection) finds its peer's state under that alias key: every socket
 * keeps an axon_sockmap_quiet entry under each of its keys, exact and alias,
 * until it closes; one that never paired adopts the alias peer its first
 * write would have found (sockmap_adopt_alias_peer). A socket that never
 * wrote is made stack (and so quiet) once its peer is quiet: the connection
 * leaves whole. The check runs on every segment the socket transmits
 * (sockops' BPF_SOCK_OPS_HDR_OPT_LEN_CB, enabled by
 * BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG at insert; a bypassed socket transmits
 * next to nothing), and that callback is switched off when it left.
 */

/* The small-write streak's place in struct sockmap_state.flags
 * (AXON_SM_F_STREAK). */
#define AXON_SM_STREAK_SHIFT 16

/* sockmap_psock: the psock of kernel socket sk, 0 if none. Probe reads:
 * the caller holds sk (its own socket, or the redirect target this write
 * holds). */
AXON_INLINE struct sk_psock___sm *sockmap_psock(struct sock___sm *sk)
{
	void *ud = 0;

	if (!sk)
		return 0;
	bpf_core_read(&ud, sizeof(ud), &sk->sk_user_data);
	return (void *)((unsigned long)ud & AXON_SK_USER_DATA_PTRMASK);
}

/* sockmap_psock_refs: the psock's reference count (one per map link, one
 * per syscall or redirect using it). */
AXON_INLINE int sockmap_psock_refs(struct sk_psock___sm *psock)
{
	struct refcount_struct___sm r = {};

	bpf_core_read(&r, sizeof(r), &psock->refcnt);
	return r.refs;
}

/* sockmap_psock_holders: how many references to psock something other
 * than its map links holds (a syscall inside tcp_bpf_sendmsg/recvmsg, a
 * redirect into it): the refcount minus the links (one per map entry:
 * axon_sock_hash and up to two alias keys in axon_sock_alias). The count is
 * read first, so a link removed meanwhile (an alias collision elsewhere, its
 * link unlinked before its reference is put) can only make the result too
 * high; links are added only when the socket enters, before any of this.
 * More than 4 links read as many holders. */
AXON_INLINE int sockmap_psock_holders(struct sk_psock___sm *psock)
{
	struct list_head___sm *head = &psock->link, *pos = 0;
	int refs = sockmap_psock_refs(psock), links = 0;

	bpf_core_read(&pos, sizeof(pos), &head->next);
	for (int i = 0; i < 4 && pos && pos != head; i++) {
		links++;
		bpf_core_read(&pos, sizeof(pos), &pos->next);
	}
	if (pos != head)
		return 1 << 20;
	return refs - links;
}

/* sockmap_psock_idle: 1 when the psock holds no unread bytes: ingress_skb
 * (the stream verdict's backlog, whose worker dequeues an skb only after
 * queueing its bytes on ingress_msg) read first, then ingress_msg. */
AXON_INLINE int sockmap_psock_idle(struct sk_psock___sm *psock)
{
	struct list_head___sm *next = 0;
	__u32 qlen = 1;

	bpf_core_read(&qlen, sizeof(qlen), &psock->ingress_skb.qlen);
	if (qlen)
		return 0;
	bpf_core_read(&next, sizeof(next), &psock->ingress_msg.next);
	return next == (void *)&psock->ingress_msg;
}

/* sockmap_self_key: the key of the socket whose state is st (its peer's key
 * reversed: both ends' keys are each other's reverse). Returns 0, or -1 when
 * st->peer is an alias key (its own exact key is not known from st then:
 * sockops finds it with sockmap_own_key). */
AXON_INLINE int sockmap_self_key(struct sockmap_key *self, const struct sockmap_state *st)
{
	if (st->flags & AXON_SM_F_PEER_ALIAS)
		return -1;
	sockmap_peer_key(self, &st->peer);
	return 0;
}

/* sockmap_own_key (sockops): the exact key sockops gave this socket, told by
 * its axon_sockmap_quiet entry's cookie: the tuple with netns 0 (pod <->
 * pod) or with the socket's netns cookie (loopback, intra-pod). Not from the
 * state's peer key, which an alias pairing replaces. Returns 0, or -1 when
 * neither holds its entry. */
AXON_INLINE int sockmap_own_key(struct bpf_sock_ops *skops, struct sockmap_key *self, __u64 cookie)
{
	struct sockmap_quiet *q;

	if (sockmap_key_of(self, skops) < 0)
		return -1;
	self->netns = 0;
	q = bpf_map_lookup_elem(&axon_sockmap_quiet, self);
	if (q && q->cookie == cookie)
		return 0;
	self->netns = bpf_get_netns_cookie(skops);
	q = bpf_map_lookup_elem(&axon_sockmap_quiet, self);
	if (q && q->cookie == cookie)
		return 0;
	return -1;
}

/* sockmap_alias_candidate: what the axon_sockmap_quiet entry under alias key
 * ak says of the socket that holds it: 0 none (no socket claimed ak, or it
 * closed), 1 quiet, -1 live or unusable (a placeholder, or ak poisoned: two
 * sockets claimed it, so its entry may not be the peer's). */
AXON_INLINE int sockmap_alias_candidate(const struct sockmap_key *ak)
{
	struct sockmap_quiet *v = bpf_map_lookup_elem(&axon_sockmap_quiet, ak);

	if (!v)
		return 0;
	if (bpf_map_lookup_elem(&axon_sockmap_alias_poison, ak))
		return -1;
	return v->cookie != 0 && v->state == AXON_SM_QUIET ? 1 : -1;
}

/* sockmap_alias_tally counts alias key ak as a candidate peer
 * (sockmap_alias_candidate): held by a quiet socket -> *n + 1 and ak copied
 * to found. Returns -1 when ak is held by a live socket (no adoption). */
AXON_INLINE int sockmap_alias_tally(const struct sockmap_key *ak, struct sockmap_key *found, int *n)
{
	int r = sockmap_alias_candidate(ak);

	if (r > 0) {
		__builtin_memcpy(found, ak, sizeof(*ak));
		(*n)++;
	}
	return r < 0 ? -1 : 0;
}

/* sockmap_adopt_alias_peer (sockops): for a socket that never paired (its
 * exact peer never entered: the placeholder), the alias keys its own first
 * write would have redirected to (sockmap_alias_redirect's; st->peer is
 * still the exact peer key). When exactly one of them is held, by a quiet
 * socket, and none by a live one, that socket is its peer (a REDIRECTed
 * connection whose other end paired with this one through its alias key, or
 * went to the stack), and nothing else can redirect into this socket: the
 * exact peer key names the tuple reversed, which TCP does not let a second
 * socket establish while this connection lives, and an alias key only the
 * one socket that claimed it first can be reached through (a second claim
 * poisons it). It becomes the peer key (AXON_SM_F_PEER_ALIAS), so that
 * later checks read that socket's entry. Returns 1 when adopted. */
AXON_INLINE int sockmap_adopt_alias_peer(struct bpf_sock_ops *skops, struct sockmap_state *st)
{
	struct sockmap_key ak = {}, found = {};
	__u64 own = bpf_get_netns_cookie(skops);
	__u64 other = sockmap_netns_of(st->peer.local, own);
	int n = 0;

	if (st->flags & AXON_SM_F_CLIENT) {
		sockmap_alias_key(&ak, st->peer.remote, st->peer.rport, own, AXON_SM_ROLE_SERVER, own);
		if (sockmap_alias_tally(&ak, &found, &n))
			return 0;
		if (other && other != own) {
			sockmap_alias_server_netns(&ak, other);
			if (sockmap_alias_tally(&ak, &found, &n))
				return 0;
		}
	} else if ((st->flags & AXON_SM_F_SERVER) && other) {
		sockmap_alias_key(&ak, st->peer.local, st->peer.lport, other, AXON_SM_ROLE_CLIENT, own);
		if (sockmap_alias_tally(&ak, &found, &n))
			return 0;
	}
	if (n != 1)
		return 0;
	__builtin_memcpy(&st->peer, &found, sizeof(found));
	st->flags |= AXON_SM_F_PEER_ALIAS;
	return 1;
}

/* sockmap_peer_done (sockops): 1 when st's peer cannot redirect into this
 * socket any more: its axon_sockmap_quiet entry under st->peer is QUIET, or
 * absent (the peer closed: a socket's entries are made before it can be
 * redirected to and stay until it closes). A live placeholder there means
 * the exact peer never entered: then the socket's alias peer, if one is
 * quiet, is adopted (sockmap_adopt_alias_peer). */
AXON_INLINE int sockmap_peer_done(struct bpf_sock_ops *skops, struct sockmap_state *st)
{
	struct sockmap_quiet *v = bpf_map_lookup_elem(&axon_sockmap_quiet, &st->peer);

	if (!v || v->state == AXON_SM_QUIET)
		return 1;
	if (v->cookie != 0 || (st->flags & AXON_SM_F_PEER_ALIAS))
		return 0;
	return sockmap_adopt_alias_peer(skops, st);
}

/* sockmap_set_quiet marks st's socket quiet, in its state and, when st->peer
 * is an exact key, in its exact axon_sockmap_quiet entry (an existing entry
 * only: a socket inserted by a loader without the mode machine has none, and
 * gets none); sockops publishes every entry (sockmap_publish_quiet). A plain
 * store: the peer reads it under its own lock, and only ever acts on QUIET,
 * which is final. */
AXON_INLINE void sockmap_set_quiet(struct sockmap_state *st)
{
	struct sockmap_key self = {};
	struct sockmap_quiet *v;

	st->flags |= AXON_SM_F_QUIET;
	if (sockmap_self_key(&self, st) != 0)
		return;
	/* the entry under a live socket's key is its own (keys are unique
	 * among live sockets; sockops overwrote any stale one at insert) */
	v = bpf_map_lookup_elem(&axon_sockmap_quiet, &self);
	if (v)
		v->state = AXON_SM_QUIET;
}

/* sockmap_publish_quiet (sockops): once per quiet socket, QUIET into each of
 * its own axon_sockmap_quiet entries (exact key self, and its alias keys),
 * which its peer may read under either (AXON_SM_F_PUBLISHED). */
AXON_INLINE void sockmap_publish_quiet(struct bpf_sock_ops *skops, struct sockmap_state *st,
				       const struct sockmap_key *self, __u64 cookie)
{
	struct sockmap_quiet *v;

	v = bpf_map_lookup_elem(&axon_sockmap_quiet, self);
	if (v && v->cookie == cookie)
		v->state = AXON_SM_QUIET;
	sockmap_alias_all(skops, self, bpf_get_netns_cookie(skops), st->flags, AXON_SM_ALIAS_QUIET, cookie);
	st->flags |= AXON_SM_F_PUBLISHED;
}

/* sockmap_note_stack: sk_msg, a write of a socket in stack mode; holders:
 * sockmap_psock_holders of the writer's psock (1 when only this sendmsg
 * holds it). Marks the socket quiet when it may be, and vouches for this
 * sendmsg (AXON_SM_F_VOUCH) so that the sockops callback of the segment it
 * sends (same lock, same sendmsg) may count it as the one holder. */
AXON_INLINE void sockmap_note_stack(struct sockmap_state *st, int holders)
{
	if (holders == 1)
		st->flags |= AXON_SM_F_VOUCH;
	if (!(st->flags & (AXON_SM_F_QUIET | AXON_SM_F_HOLD)) && (st->redir_msgs == 0 || holders == 1))
		sockmap_set_quiet(st);
}

/* sockmap_try_leave: sockops, a callback of a socket of axon_sock_hash with
 * the socket lock held (BPF_SOCK_OPS_HDR_OPT_LEN_CB). Makes the socket quiet
 * when it may be (and publishes it under all its keys), and deletes it from
 * axon_sock_hash and axon_sock_alias when the rule above holds (counter
 * AXON_SM_LEFT); then it is plain TCP: its mode stays stack, its
 * axon_sockmap_quiet entries stay (QUIET) until it closes, and only its
 * state callback stays on (TCP_CLOSE deletes those entries). */
AXON_INLINE void sockmap_try_leave(struct bpf_sock_ops *skops)
{
	struct bpf_sock_ops_kern___sm *kops;
	struct sk_psock___sm *psock;
	struct sockmap_key self = {};
	struct sock___sm *ksk = 0;
	struct sockmap_state *st;
	struct bpf_sock *sk = skops->sk;
	int allowed = 0, holders, done, owned = 0;
	__u64 cookie;

	if (!sockmap_can_leave())
		return; /* the verifier drops the kfunc call below with this branch */
	if (!sk)
		return;
	st = bpf_sk_storage_get(&axon_sockmap_state, sk, 0, 0);
	if (!st || (st->flags & (AXON_SM_F_LEFT | AXON_SM_F_HOLD)))
		return; /* left; or held: stays in the map */
	if (st->flags & AXON_SM_F_VOUCH) {
		st->flags &= ~AXON_SM_F_VOUCH;
		allowed = 1; /* the vouching sendmsg */
	}
	kops = bpf_cast_to_kern_ctx(skops);
	bpf_core_read(&ksk, sizeof(ksk), &kops->sk);
	psock = sockmap_psock(ksk);
	if (!psock)
		return;
	holders = sockmap_psock_holders(psock);
	done = sockmap_peer_done(skops, st);
	/* quiet needs the strict count: a sendmsg that released its lock to
	 * redirect holds the psock while another syscall owns the socket */
	if (!(st->flags & AXON_SM_F_QUIET)) {
		if (st->mode == AXON_SM_MODE_UNDECIDED && done)
			st->mode = AXON_SM_MODE_STACK; /* never wrote: no redirect of it anywhere */
		if (st->mode == AXON_SM_MODE_STACK && (st->redir_msgs == 0 || holders <= allowed))
			sockmap_set_quiet(st);
	}
	if (!(st->flags & AXON_SM_F_QUIET))
		return;
	cookie = bpf_get_socket_cookie(skops);
	if (sockmap_own_key(skops, &self, cookie) != 0)
		return; /* inserted by a loader without the mode machine's entries */
	if (!(st->flags & AXON_SM_F_PUBLISHED))
		sockmap_publish_quiet(skops, st, &self, cookie);
	if (!done || !sockmap_psock_idle(psock))
		return;
	bpf_core_read(&owned, sizeof(owned), &ksk->sk_lock.owned);
	if (holders > allowed && !(holders == 1 && owned))
		return;
	if (bpf_map_delete_elem(&axon_sock_hash, &self) != 0)
		return;
	/* and out of axon_sock_alias, whose links keep the psock too */
	sockmap_alias_all(skops, &self, bpf_get_netns_cookie(skops), st->flags, AXON_SM_ALIAS_UNLINK, cookie);
	st->mode = AXON_SM_MODE_STACK;
	st->flags |= AXON_SM_F_LEFT;
	bpf_sock_ops_cb_flags_set(skops, BPF_SOCK_OPS_STATE_CB_FLAG);
	sockmap_count(AXON_SM_LEFT, 1);
}

#endif /* AXON_SOCKMAP_H */
