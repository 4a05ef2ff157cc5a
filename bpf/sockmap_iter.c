/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* sockmap_iter.c: the same-node TCP bypass's connection list (iter/sockmap).
 *
 * A map iterator over axon_sock_hash, run on demand by the agent (`axon bpf
 * sockmap list`): one struct sockmap_conn_rec per socket in the map, its key,
 * socket cookie, and the mode and byte counters that sk_msg.c keeps in the
 * socket's axon_sockmap_state. The counters live with the socket (no map
 * write on the write path beyond the state sk_msg already holds, nothing to
 * delete when the socket closes), and only an iterator reaches a socket's
 * storage without its file descriptor.
 *
 * Tracing program: kernel structs are declared here with only the fields
 * used, relocated by CO-RE against the running kernel's BTF.
 */
#include "lib/common.h"
#include "lib/sockmap.h"

char __license[] SEC("license") = "Dual BSD/GPL";

/* One record per socket in axon_sock_hash, written to the iterator's output
 * (internal/datapath/sockmap reads them as sockmapIterSockmapConnRec). */
struct sockmap_conn_rec {
	struct sockmap_key key;
	__u64 cookie;      /* socket cookie */
	__u32 mode;        /* enum axon_sockmap_mode; AXON_SM_MODE_UNKNOWN: no state */
	__u32 flags;       /* struct sockmap_state's flags (enum axon_sockmap_flag) */
	__u64 redir_msgs;  /* struct sockmap_state's counters */
	__u64 redir_bytes;
	__u64 pass_bytes;
};

/* The record's layout in BTF for bpf2go (see AXON_BTF_ANCHOR). */
AXON_BTF_ANCHOR(axon_sockmap_iter_btf, {
	struct sockmap_conn_rec rec;
});

/* Kernel types, only the fields used (CO-RE). */
struct seq_file;
struct sock;

struct bpf_iter_meta {
	struct seq_file *seq;
} __attribute__((preserve_access_index));

struct bpf_iter__sockmap {
	struct bpf_iter_meta *meta;
	void *key;
	struct sock *sk;
} __attribute__((preserve_access_index));

SEC("iter/sockmap")
int axon_sockmap_conns(struct bpf_iter__sockmap *ctx)
{
	struct sockmap_conn_rec rec = {};
	struct sockmap_state *st;
	struct sock *sk = ctx->sk;
	void *key = ctx->key;

	if (!key || !sk)
		return 0; /* the end of the walk */
	__builtin_memcpy(&rec.key, key, sizeof(rec.key));
	rec.cookie = bpf_get_socket_cookie(sk);
	rec.mode = AXON_SM_MODE_UNKNOWN;
	st = bpf_sk_storage_get(&axon_sockmap_state, sk, 0, 0);
	if (st) {
		rec.mode = st->mode;
		rec.flags = st->flags;
		rec.redir_msgs = st->redir_msgs;
		rec.redir_bytes = st->redir_bytes;
		rec.pass_bytes = st->pass_bytes;
	}
	bpf_seq_write(ctx->meta->seq, &rec, sizeof(rec));
	return 0;
}
