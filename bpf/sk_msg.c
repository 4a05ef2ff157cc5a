/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* sk_msg.c: the same-node TCP bypass, part 2 (sk_msg verdict on
 * axon_sock_hash).
 *
 * Runs on every write (sendmsg, sendfile/splice) of a socket in
 * axon_sock_hash. Each socket has a sticky mode (axon_sockmap_state):
 *  undecided  try bpf_msg_redirect_hash(BPF_F_INGRESS) to the peer's key
 *             (computed by sockops.c), then to its alias keys (a sidecar's
 *             REDIRECTed connection, lib/sockmap.h): success -> bypass (the
 *             key that worked is the peer key from then on), miss -> stack.
 *  bypass     keep redirecting; a miss (the peer closed), the back-pressure
 *             bound or the small-write rule (below) -> stack.
 *  stack      SK_PASS: the bytes go through TCP, always.
 * A socket that ever sent through TCP never redirects again: redirected bytes
 * land in the peer's psock queue, which tcp_bpf_recvmsg reads before the TCP
 * receive queue, so stack -> bypass would reorder. bypass -> stack is ordered
 * (the older bytes are in the psock queue, read first).
 * bpf_msg_redirect_hash returns SK_DROP on a miss, which would fail the
 * write with EACCES: it is never returned; a miss is SK_PASS.
 * A socket in stack mode publishes when it is quiet (no redirect of its own
 * in flight, none to come) and vouches for its sendmsg, so that sockops can
 * take it out of the map (the mode machine, lib/sockmap.h): plain TCP.
 *
 * Back-pressure: a psock queue has no limit of its own (tcp_rmem is not
 * applied to redirected bytes), so a writer whose peer stops reading would
 * queue kernel memory without end. After each redirect the program reads the
 * peer's unread bypass bytes (psock->msg_tot_len, CO-RE) and its sk_rcvbuf;
 * above both it and cfg_backlog_max the socket switches to the stack for
 * good (ordered, see above) and TCP's flow control stops the writer. A
 * kernel without msg_tot_len (before 6.6.128 / 6.12.75 / 6.18.14, e.g. 6.1)
 * cannot tell: the self-test's back-pressure check fails there and the
 * bypass stays off.
 *
 * axon_sk_skb_pass: the no-op stream verdict (SK_PASS) the loader attaches
 * to axon_sock_hash on kernels whose FIONREAD of a socket in a SOCKHASH
 * counts only the psock queue (6.6.128+, 6.12.75+, 6.18.14+ until the fix):
 * without it, bytes that reach such a socket through TCP (its peer is in
 * stack mode) are readable while FIONREAD says 0. With it those bytes are
 * moved into the psock queue, where FIONREAD counts them (the self-test
 * decides, internal/datapath/sockmap/selftest.go).
 */
#include "lib/common.h"
#include "lib/sockmap.h"
#include <bpf/bpf_core_read.h>

char __license[] SEC("license") = "Dual BSD/GPL";

/* cfg_backlog_max: the back-pressure bound is the larger of the peer's
 * sk_rcvbuf and this many unread redirected bytes (load-time constant).
 * sk_rcvbuf alone (128 KiB by default; nothing autotunes it for the bypass)
 * is of the order of what TCP allows in flight; 4 MiB is of the order of
 * TCP's largest autotuned receive buffer (tcp_rmem max, 6 MiB by default).
 * A writer that outruns its reader for longer reaches it in any case: bulk
 * transfers then continue on the stack (qperf 16 KB: 0.8x the stack instead
 * of 1.6x unbounded, on a loaded 2-core host). */
volatile const __u32 cfg_backlog_max = 4 << 20;

/* cfg_small_write, cfg_small_streak: the small-write rule (load-time
 * constants). A bypassed write costs the writer the peer's socket lock, and
 * it sleeps while the reader holds it; TCP hands the segment to softirq and
 * never waits, so a stream of small writes is faster on TCP (qperf tcp_bw,
 * 1-64 B: 0.25-0.5x the stack bypassed), while small request/response
 * writes are faster bypassed (latency). The program tells them apart after
 * each redirect by what the peer has not read yet: in request/response the
 * peer has read everything before the next write, in a stream it lags. A
 * write below cfg_small_write bytes that finds the peer with unread
 * redirected bytes extends the streak, any other write ends it; at
 * cfg_small_streak writes in a row the socket moves to the stack for good
 * (counter switch_stack; ordered, see above), and the mode machine
 * (lib/sockmap.h) then takes the pair out of the map, back to full TCP
 * speed. Not for a socket paired by alias key (a sidecar's REDIRECTed
 * connection, AXON_SM_F_PEER_ALIAS): through the sidecar chain a bypassed
 * small-write stream was faster than the chain without the bypass (64 B
 * tcp_bw: 1.1x bypassed; 0.64x switched, when such pairs could not leave the
 * map yet; switched and left is not measured). cfg_small_streak 0 turns the
 * rule off. */
volatile const __u32 cfg_small_write = 256;
volatile const __u32 cfg_small_streak = 64;

/* cfg_resume_probe: a measurement switch, 0 as loaded by the agent (the
 * verifier then drops every probe branch: no cost). Set only by
 * TestResumeDutyCycle (internal/datapath/sockmap), which asks how often a
 * writer switched to the stack by back-pressure finds, at a sendmsg entry,
 * the condition under which it could resume the redirect without
 * reordering (docs/sockmap.md, "Why a back-pressure-switched writer does not
 * resume"). With it set, a writer keeps its reader's struct sock at the
 * back-pressure switch in axon_sockmap_resume_probe, never becomes quiet
 * (AXON_SM_F_HOLD: it stays in the map on the stack path, as a resumable
 * writer would have to, and so does its reader),
 * and counts its stack-mode sendmsg entries by what it finds. The reader is
 * read without its lock and through a kept pointer (probe reads only: safe,
 * but a measurement's shortcut, not a design): a fresh unlocked read finds
 * the condition at least as often as a record the reader published. */
volatile const __u32 cfg_resume_probe = 0;

/* tcp_sock___sm: the sequence numbers of struct tcp_sock the probe reads
 * (struct sock is its first member: a struct sock pointer is one). */
struct tcp_sock___sm {
	__u32 copied_seq; /* the reader: next byte the application reads from TCP */
	__u32 snd_una;    /* the writer: first byte not acknowledged */
	__u32 write_seq;  /* the writer: next byte written into TCP */
} __attribute__((preserve_access_index));

/* sockmap_resume_probe: value of axon_sockmap_resume_probe, one writer. */
struct sockmap_resume_probe {
	__u64 peer;        /* the reader's struct sock, kept at the back-pressure switch */
	__u64 switches;    /* back-pressure switches of this writer (1) */
	__u64 entries;     /* its sendmsg entries in stack mode since */
	__u64 caught_up;   /* ... where R.copied_seq == W.write_seq (R read every byte W sent through TCP) */
	__u64 skb_idle;    /* ... and R's ingress_skb empty (the condition with the stream verdict) */
	__u64 idle;        /* ... and ingress_msg empty too (the condition without it) */
	__u64 sendq_empty; /* entries where W.snd_una == W.write_seq (W's TCP send queue acknowledged) */
	__u64 gap_sum;     /* sum over entries of W.write_seq - R.copied_seq */
	__u64 gap_min;     /* its smallest value (0 when caught_up > 0) */
	__u64 seq_switch;  /* W.write_seq at the switch */
	__u64 first_entry; /* entries up to and with the first where idle held (0: never) */
	__u64 first_bytes; /* bytes W wrote through TCP from the switch to that entry */
	__u64 idle_tot_max; /* the largest R psock->msg_tot_len seen where idle held (the back-pressure bound reads it) */
};

/* axon_sockmap_resume_probe: the writer's struct sock -> struct
 * sockmap_resume_probe; written only with cfg_resume_probe. max_entries 1
 * as compiled (the map is created with every load; the test raises it). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1);
	__type(key, __u64);
	__type(value, struct sockmap_resume_probe);
} axon_sockmap_resume_probe SEC(".maps");

/* resume_probe_kern: the writing socket's struct sock (0 without the kfunc). */
AXON_INLINE struct sock___sm *resume_probe_kern(struct sk_msg_md *msg, int redir)
{
	struct sock___sm *sk = 0;
	struct sk_msg___sm *km;

	if (!bpf_core_field_exists(((struct sk_psock___sm *)0)->msg_tot_len))
		return 0;
	km = bpf_cast_to_kern_ctx(msg);
	if (redir)
		bpf_core_read(&sk, sizeof(sk), &km->sk_redir);
	else
		bpf_core_read(&sk, sizeof(sk), &km->sk);
	return sk;
}

/* resume_probe_switch: cfg_resume_probe, the back-pressure switch of the
 * writer of msg (its redirect target is still in msg). */
AXON_INLINE void resume_probe_switch(struct sk_msg_md *msg)
{
	struct sockmap_resume_probe init = {.gap_min = ~0ULL}, *p;
	__u64 w = (__u64)resume_probe_kern(msg, 0);
	__u32 seq = 0;

	init.peer = (__u64)resume_probe_kern(msg, 1);
	if (!w || !init.peer)
		return;
	bpf_core_read(&seq, sizeof(seq), &((struct tcp_sock___sm *)w)->write_seq);
	init.seq_switch = seq;
	bpf_map_update_elem(&axon_sockmap_resume_probe, &w, &init, BPF_NOEXIST);
	p = bpf_map_lookup_elem(&axon_sockmap_resume_probe, &w);
	if (p)
		p->switches++;
}

/* resume_probe_entry: cfg_resume_probe, a stack-mode write: counted when
 * the writer was switched by back-pressure. */
AXON_INLINE void resume_probe_entry(struct sk_msg_md *msg)
{
	struct tcp_sock___sm *w = (void *)resume_probe_kern(msg, 0), *r;
	struct sk_psock___sm *psock;
	struct sockmap_resume_probe *p;
	__u32 wseq = 0, una = 0, rseq = 0, gap, qlen = 1;
	__u64 key = (__u64)w;
	void *next = 0;

	if (!w)
		return;
	p = bpf_map_lookup_elem(&axon_sockmap_resume_probe, &key);
	if (!p)
		return;
	r = (void *)p->peer;
	bpf_core_read(&wseq, sizeof(wseq), &w->write_seq);
	bpf_core_read(&una, sizeof(una), &w->snd_una);
	bpf_core_read(&rseq, sizeof(rseq), &r->copied_seq);
	psock = sockmap_psock((struct sock___sm *)r);
	p->entries++;
	if (una == wseq)
		p->sendq_empty++;
	gap = wseq - rseq;
	p->gap_sum += gap;
	if (gap < p->gap_min)
		p->gap_min = gap;
	if (gap != 0 || !psock)
		return;
	p->caught_up++;
	bpf_core_read(&qlen, sizeof(qlen), &psock->ingress_skb.qlen);
	if (qlen)
		return;
	p->skb_idle++;
	bpf_core_read(&next, sizeof(next), &psock->ingress_msg.next);
	if (next != (void *)&psock->ingress_msg)
		return;
	p->idle++;
	bpf_core_read(&qlen, sizeof(qlen), &psock->msg_tot_len);
	if (qlen > p->idle_tot_max)
		p->idle_tot_max = qlen;
	if (!p->first_entry) {
		p->first_entry = p->entries;
		p->first_bytes = (__u32)(wseq - (__u32)p->seq_switch);
	}
}

/* sockmap_writer_holders: sockmap_psock_holders of the writing socket's
 * psock (1 when only this sendmsg holds it besides the map links), many
 * when it cannot be read (or on a kernel where nothing leaves the map). */
AXON_INLINE int sockmap_writer_holders(struct sk_msg_md *msg)
{
	struct sk_psock___sm *psock = 0;
	struct sock___sm *sk = 0;
	struct sk_msg___sm *km;

	/* a kernel without msg_tot_len (6.1) never leaves the map (lib/sockmap.h
	 * sockmap_try_leave), nor has bpf_cast_to_kern_ctx (6.3+): the verifier
	 * drops the kfunc call with this branch */
	if (!bpf_core_field_exists(psock->msg_tot_len))
		return 1 << 20;
	km = bpf_cast_to_kern_ctx(msg);
	bpf_core_read(&sk, sizeof(sk), &km->sk);
	psock = sockmap_psock(sk);
	return psock ? sockmap_psock_holders(psock) : 1 << 20;
}

/* redirect_target: after a successful bpf_msg_redirect_hash, the target's
 * (the peer's, msg->sk_redir) unread redirected bytes (psock->msg_tot_len,
 * before this write lands) and sk_rcvbuf. The peer's sock is only reachable
 * here (a SOCKHASH lookup takes a reference sk_msg cannot release), so the
 * checks follow the redirect and take effect from the next write. Returns 0,
 * or -1 on a kernel without msg_tot_len (the verifier drops the kfunc call
 * with the branch) or without a peer psock. Reads are probe reads: the peer
 * cannot go away while this write holds it. */
AXON_INLINE int redirect_target(struct sk_msg_md *msg, __u32 *unread, int *rcvbuf)
{
	struct sk_psock___sm *psock = 0;
	struct sock___sm *peer = 0;
	struct sk_msg___sm *km;

	if (!bpf_core_field_exists(psock->msg_tot_len))
		return -1;
	km = bpf_cast_to_kern_ctx(msg);
	bpf_core_read(&peer, sizeof(peer), &km->sk_redir);
	psock = sockmap_psock(peer);
	if (!psock)
		return -1;
	bpf_core_read(rcvbuf, sizeof(*rcvbuf), &peer->sk_rcvbuf);
	bpf_core_read(unread, sizeof(*unread), &psock->msg_tot_len);
	return 0;
}

/* redirect_target_backlogged: 1 when the peer holds more unread redirected
 * bytes than its sk_rcvbuf and cfg_backlog_max (the back-pressure bound;
 * it holds up to one write). */
AXON_INLINE int redirect_target_backlogged(__u32 unread, int rcvbuf)
{
	return unread > cfg_backlog_max && rcvbuf > 0 && unread > (__u32)rcvbuf;
}

/* small_write_streak: the small-write rule's step for a redirected write of
 * size bytes that found unread bytes at the peer; 1 when the streak reached
 * cfg_small_streak. Always 0 for a socket paired by alias key (see
 * cfg_small_streak). */
AXON_INLINE int small_write_streak(struct sockmap_state *st, __u64 size, __u32 unread)
{
	__u32 n = (st->flags & AXON_SM_F_STREAK) >> AXON_SM_STREAK_SHIFT;

	if (cfg_small_streak == 0 || (st->flags & AXON_SM_F_PEER_ALIAS) || size >= cfg_small_write || unread == 0)
		n = 0;
	else if (n < 0xff)
		n++;
	st->flags = (st->flags & ~AXON_SM_F_STREAK) | (n << AXON_SM_STREAK_SHIFT);
	return cfg_small_streak && n >= cfg_small_streak;
}

SEC("sk_msg")
int axon_sk_msg(struct sk_msg_md *msg)
{
	struct sockmap_state *st;
	struct bpf_sock *sk = msg->sk;
	__u64 size = msg->size;
	__u32 unread = 0;
	int rcvbuf = 0;

	if (!sk)
		goto pass_no_peer;
	st = bpf_sk_storage_get(&axon_sockmap_state, sk, 0, 0);
	if (!st)
		goto pass_no_peer; /* inserted by a loader whose state map is gone: stay on TCP */
	if (st->mode == AXON_SM_MODE_STACK) {
		if (cfg_resume_probe)
			resume_probe_entry(msg);
		sockmap_note_stack(st, sockmap_writer_holders(msg));
		st->pass_bytes += size;
		sockmap_count(AXON_SM_PASS_STICKY, 1);
		sockmap_count(AXON_SM_PASS_BYTES, size);
		return SK_PASS;
	}
	/* the peer key (exact, or the alias key that worked); on the first
	 * write a miss of the exact key tries the alias keys (sidecars) */
	if (sockmap_redirect_peer(msg, st) == SK_PASS ||
	    (st->mode == AXON_SM_MODE_UNDECIDED && sockmap_alias_redirect(msg, st) == SK_PASS)) {
		st->mode = AXON_SM_MODE_BYPASS;
		st->redir_msgs++;
		st->redir_bytes += size;
		sockmap_count(AXON_SM_REDIRECT_MSGS, 1);
		sockmap_count(AXON_SM_REDIRECT_BYTES, size);
		if (redirect_target(msg, &unread, &rcvbuf) != 0)
			return SK_PASS;
		if (redirect_target_backlogged(unread, rcvbuf)) {
			st->mode = AXON_SM_MODE_STACK;
			sockmap_count(AXON_SM_BACKPRESSURE, 1);
			if (cfg_resume_probe) {
				st->flags |= AXON_SM_F_HOLD;
				resume_probe_switch(msg);
			}
		} else if (small_write_streak(st, size, unread)) {
			st->mode = AXON_SM_MODE_STACK;
			sockmap_count(AXON_SM_SWITCH_STACK, 1);
		}
		return SK_PASS;
	}
	st->mode = AXON_SM_MODE_STACK;
	st->pass_bytes += size;
	sockmap_note_stack(st, sockmap_writer_holders(msg)); /* this write redirected nothing */
pass_no_peer:
	sockmap_count(AXON_SM_PASS_NO_PEER, 1);
	sockmap_count(AXON_SM_PASS_BYTES, size);
	return SK_PASS;
}

SEC("sk_skb/stream_verdict")
int axon_sk_skb_pass(struct __sk_buff *skb)
{
	return SK_PASS;
}
