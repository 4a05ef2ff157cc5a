/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* sk_msg.c: the same-node TCP bypass, part 2 (sk_msg verdict on
 * axon_sock_hash).
 *
 * Runs on every write (sendmsg, sendfile/splice) of a socket in
 * axon_sock_hash. Each socket has a sticky mode (axon_sockmap_state):
 *  undecided  try bpf_msg_redirect_hash(BPF_F_INGRESS) to the peer's key
 *             (computed by sockops.c): success -> bypass, miss -> stack.
 *  bypass     keep redirecting; a miss (the peer closed) -> stack.
 *  stack      SK_PASS: the bytes go through TCP, always.
 * A socket that ever sent through TCP never redirects again: redirected bytes
 * land in the peer's psock queue, which tcp_bpf_recvmsg reads before the TCP
 * receive queue, so stack -> bypass would reorder. bypass -> stack is ordered
 * (the older bytes are in the psock queue, read first).
 * bpf_msg_redirect_hash returns SK_DROP on a miss, which would fail the
 * write with EACCES: it is never returned; a miss is SK_PASS.
 */
#include "lib/common.h"
#include "lib/sockmap.h"

char __license[] SEC("license") = "Dual BSD/GPL";

SEC("sk_msg")
int axon_sk_msg(struct sk_msg_md *msg)
{
	struct sockmap_state *st;
	struct bpf_sock *sk = msg->sk;
	__u64 size = msg->size;

	if (!sk)
		goto pass_no_peer;
	st = bpf_sk_storage_get(&axon_sockmap_state, sk, 0, 0);
	if (!st)
		goto pass_no_peer; /* inserted by a loader whose state map is gone: stay on TCP */
	if (st->mode == AXON_SM_MODE_STACK) {
		st->pass_bytes += size;
		sockmap_count(AXON_SM_PASS_STICKY, 1);
		sockmap_count(AXON_SM_PASS_BYTES, size);
		return SK_PASS;
	}
	if (bpf_msg_redirect_hash(msg, &axon_sock_hash, &st->peer, BPF_F_INGRESS) == SK_PASS) {
		st->mode = AXON_SM_MODE_BYPASS;
		st->redir_msgs++;
		st->redir_bytes += size;
		sockmap_count(AXON_SM_REDIRECT_MSGS, 1);
		sockmap_count(AXON_SM_REDIRECT_BYTES, size);
		return SK_PASS;
	}
	st->mode = AXON_SM_MODE_STACK;
	st->pass_bytes += size;
pass_no_peer:
	sockmap_count(AXON_SM_PASS_NO_PEER, 1);
	sockmap_count(AXON_SM_PASS_BYTES, size);
	return SK_PASS;
}
