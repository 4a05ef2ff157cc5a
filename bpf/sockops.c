/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* sockops.c: the same-node TCP bypass, part 1 (cgroup sock_ops).
 *
 * Attached to the agent's cgroup root. When a TCP socket becomes established
 * (BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB on the connecting side,
 * BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB on the accepted side) the admission
 * rule of lib/sockmap.h decides whether it enters axon_sock_hash; an admitted
 * socket gets its state (the peer's key, mode undecided) in
 * axon_sockmap_state and its entry in axon_sockmap_quiet first, then is
 * inserted with BPF_NOEXIST, then into axon_sock_alias under its alias keys
 * (lib/sockmap.h: how a netfilter REDIRECTed connection's two sockets find
 * each other); its role (client: connected, server: accepted) goes into the
 * state's flags. From then on sk_msg.c sees its writes. Every outcome is
 * counted.
 *
 * An inserted socket gets two callbacks (its only callback flags; no socket
 * options are touched): BPF_SOCK_OPS_HDR_OPT_LEN_CB on every segment it
 * transmits, where it may leave the map (sockmap_try_leave, lib/sockmap.h;
 * this one is switched off when it left), and BPF_SOCK_OPS_STATE_CB, where
 * TCP_CLOSE removes its axon_sockmap_quiet entries. Returns 1 always.
 */
#include "lib/common.h"
#include "lib/sockmap.h"

char __license[] SEC("license") = "Dual BSD/GPL";

/* sockmap_closed: STATE_CB to TCP_CLOSE of a socket inserted here (in the
 * map, or left it): it can no longer write, so its axon_sockmap_quiet
 * entries go (its exact key's and its alias keys', by its cookie: its peer
 * reads them as gone), with the placeholder under its exact peer's key if
 * that peer never entered, and its mode becomes stack (a write after a reset
 * never redirects). */
AXON_INLINE void sockmap_closed(struct bpf_sock_ops *skops)
{
	struct sockmap_key self = {}, peer = {};
	struct sockmap_quiet *q;
	struct sockmap_state *st;
	struct bpf_sock *sk = skops->sk;
	__u64 cookie;

	if (!sk)
		return;
	st = bpf_sk_storage_get(&axon_sockmap_state, sk, 0, 0);
	if (!st)
		return;
	st->mode = AXON_SM_MODE_STACK;
	cookie = bpf_get_socket_cookie(skops);
	if (sockmap_own_key(skops, &self, cookie) != 0)
		return;
	sockmap_alias_all(skops, &self, bpf_get_netns_cookie(skops), st->flags, AXON_SM_ALIAS_FORGET, cookie);
	bpf_map_delete_elem(&axon_sockmap_quiet, &self);
	sockmap_peer_key(&peer, &self);
	q = bpf_map_lookup_elem(&axon_sockmap_quiet, &peer);
	if (q && q->cookie == 0)
		bpf_map_delete_elem(&axon_sockmap_quiet, &peer);
}

SEC("sockops")
int axon_sockops(struct bpf_sock_ops *skops)
{
	struct sockmap_key key = {};
	struct sockmap_state *st;
	enum axon_sockmap_counter verdict;
	struct sockmap_quiet live = {.state = AXON_SM_LIVE};
	struct bpf_sock *sk;
	__u32 op = skops->op;
	__u64 netns;

	if (op == BPF_SOCK_OPS_HDR_OPT_LEN_CB) {
		sockmap_try_leave(skops); /* reserves no option space */
		return 1;
	}
	if (op == BPF_SOCK_OPS_STATE_CB) {
		if (skops->args[1] == BPF_TCP_CLOSE)
			sockmap_closed(skops);
		return 1;
	}
	if (op != BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB && op != BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB)
		return 1;
	if (sockmap_key_of(&key, skops) < 0)
		return 1;
	netns = bpf_get_netns_cookie(skops);
	verdict = sockmap_admit(&key, netns);
	if (verdict != AXON_SM_ADMIT_POD && verdict != AXON_SM_ADMIT_LOOPBACK &&
	    verdict != AXON_SM_ADMIT_INTRAPOD) {
		sockmap_count(verdict, 1);
		return 1;
	}
	sk = skops->sk;
	if (!sk)
		return 1;
	st = bpf_sk_storage_get(&axon_sockmap_state, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!st) {
		sockmap_count(AXON_SM_INSERT_FAILED, 1);
		return 1;
	}
	st->mode = AXON_SM_MODE_UNDECIDED;
	st->flags = 0;
	sockmap_peer_key(&st->peer, &key);
	/* the entries first: a socket in the map without one would read as
	 * gone to its peer, which could then leave while this one redirects;
	 * and the peer's placeholder (cookie 0, live) until the peer enters
	 * itself, so that this socket does not leave before it could use the
	 * bypass (its first segments go out before the peer is established) */
	if (sockmap_can_leave()) {
		if (bpf_map_update_elem(&axon_sockmap_quiet, &st->peer, &live, BPF_NOEXIST) != 0) {
			/* the peer's entry exists (it entered first), or the map is
			 * full: then this socket may leave before its peer enters,
			 * which is safe (nothing can redirect into a socket that is
			 * not in the map) but gives the connection no bypass */
		}
		live.cookie = bpf_get_socket_cookie(skops);
		if (bpf_map_update_elem(&axon_sockmap_quiet, &key, &live, BPF_ANY) != 0) {
			sockmap_count(AXON_SM_INSERT_FAILED, 1);
			return 1;
		}
	}
	if (bpf_sock_hash_update(skops, &axon_sock_hash, &key, BPF_NOEXIST) != 0) {
		if (sockmap_can_leave())
			bpf_map_delete_elem(&axon_sockmap_quiet, &key);
		sockmap_count(AXON_SM_INSERT_FAILED, 1);
		return 1;
	}
	if (sockmap_can_leave())
		bpf_sock_ops_cb_flags_set(skops, BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG | BPF_SOCK_OPS_STATE_CB_FLAG);
	sockmap_count(verdict, 1);
	/* then the alias keys (sidecar pairing), with the role they record */
	st->flags = sockmap_alias_insert_all(skops, &key, netns, op == BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB, live.cookie);
	return 1;
}
