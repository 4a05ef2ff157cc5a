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
 * Nothing else: host sockets, sockets to other nodes, pods the agent did not
 * admit (opted out, bandwidth limited).
 */
#ifndef AXON_SOCKMAP_H
#define AXON_SOCKMAP_H

#include "common.h"

/* Default max_entries of axon_sock_hash (internal/datapath/sockmap Config
 * sets it at load time): one entry per bypassed socket, two per connection. */
#define AXON_SOCKMAP_MAX 65536
/* Capacity of axon_sockmap_pods and axon_sockmap_netns. */
#define AXON_SOCKMAP_PODS_MAX AXON_MAX_ENDPOINTS

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
 * when the socket enters axon_sock_hash, read and written by sk_msg (under
 * the socket lock: no atomics needed). */
struct sockmap_state {
	__u32 mode;       /* enum axon_sockmap_mode */
	__u32 _pad;
	__u64 redir_msgs;  /* writes redirected into the peer */
	__u64 redir_bytes; /* their bytes */
	__u64 pass_bytes;  /* bytes of writes that went through TCP */
	struct sockmap_key peer; /* the peer socket's key, computed once by sockops */
};

/* axon_sock_hash: the bypassed sockets, key -> socket (the value written is
 * the socket; a lookup from user space reads its cookie). The kernel removes
 * a socket when it closes; nobody else deletes keys (that would drop data
 * queued on the socket). max_entries set at load time. Pinned. */
struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, AXON_SOCKMAP_MAX);
	__type(key, struct sockmap_key);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} axon_sock_hash SEC(".maps");

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

/* sockmap_admit applies the admission rule to the socket of key living in
 * netns cookie netns. It sets key->netns and returns AXON_SM_ADMIT_POD or
 * AXON_SM_ADMIT_LOOPBACK for a socket that may enter, else the reason it
 * may not (an AXON_SM_SKIP_* counter). */
AXON_INLINE enum axon_sockmap_counter sockmap_admit(struct sockmap_key *key, __u64 netns)
{
	struct sockmap_pod *pod;

	if (sockmap_is_loopback(key->local) && sockmap_is_loopback(key->remote)) {
		if (!bpf_map_lookup_elem(&axon_sockmap_netns, &netns))
			return AXON_SM_SKIP_NOT_ENABLED;
		key->netns = netns;
		return AXON_SM_ADMIT_LOOPBACK;
	}
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

#endif /* AXON_SOCKMAP_H */
