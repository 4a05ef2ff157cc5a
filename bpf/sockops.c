/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* sockops.c: the same-node TCP bypass, part 1 (cgroup sock_ops).
 *
 * Attached to the agent's cgroup root. When a TCP socket becomes established
 * (BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB on the connecting side,
 * BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB on the accepted side) the admission
 * rule of lib/sockmap.h decides whether it enters axon_sock_hash; an admitted
 * socket gets its state (the peer's key, mode undecided) in
 * axon_sockmap_state first, then is inserted with BPF_NOEXIST, then into
 * axon_sock_alias under its alias keys (lib/sockmap.h: how a netfilter
 * REDIRECTed connection's two sockets find each other); its role (client:
 * connected, server: accepted) goes into the state's flags. From then on
 * sk_msg.c sees its writes. Every outcome is counted. Returns 1 always and
 * touches nothing else (no callback flags, no socket options).
 */
#include "lib/common.h"
#include "lib/sockmap.h"

char __license[] SEC("license") = "Dual BSD/GPL";

SEC("sockops")
int axon_sockops(struct bpf_sock_ops *skops)
{
	struct sockmap_key key = {};
	struct sockmap_state *st;
	enum axon_sockmap_counter verdict;
	struct bpf_sock *sk;
	__u32 op = skops->op;
	__u64 netns;

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
	if (bpf_sock_hash_update(skops, &axon_sock_hash, &key, BPF_NOEXIST) != 0) {
		sockmap_count(AXON_SM_INSERT_FAILED, 1);
		return 1;
	}
	sockmap_count(verdict, 1);
	/* then the alias keys (sidecar pairing), with the role they record */
	st->flags = sockmap_alias_insert_all(skops, &key, netns, op == BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB);
	return 1;
}
