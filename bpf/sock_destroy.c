/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* sock_destroy.c: abort sockets pinned to a backend that went away.
 *
 * A connected socket (a DNS resolver's UDP socket above all) keeps the
 * backend that connect() translated it to, even after the backend is gone.
 * When the agent removes backends it fills axon_lb_gone and runs these
 * socket iterators in the node's netns and in every pod netns of the node
 * (a tcp/udp iterator walks the sockets of the netns it was opened in). A
 * socket is aborted with bpf_sock_destroy (kfunc, kernel >= 6.5) only when
 *  - its socket LB reverse entry (axon_lb_sock, written by this node's
 *    connect hook; axon_lb_rev for a socket connected under an agent from
 *    before that map) says it was translated to that peer, and
 *  - {frontend id of that entry, peer} is in axon_lb_gone with this
 *    protocol's bit set.
 * The application then gets ECONNABORTED on its next send/recv and
 * reconnects, through the socket LB, to a live backend.
 *
 * Tracing programs: kernel structs are declared here with only the fields
 * used, relocated by CO-RE against the running kernel's BTF.
 */
#include "lib/common.h"
#include "lib/lb.h"

char __license[] SEC("license") = "Dual BSD/GPL";

/* Value bits of axon_lb_gone: which protocols' sockets to abort (goneUDP,
 * goneTCP in internal/datapath/socklb; in BTF through axon_gone_btf, see
 * AXON_BTF_ANCHOR). */
enum axon_gone {
	AXON_GONE_UDP = 0x1,
	AXON_GONE_TCP = 0x2,
};

AXON_BTF_ANCHOR(axon_gone_btf, {
	enum axon_gone gone;
});

/* Key of axon_lb_gone (24 bytes): a backend removed from one frontend. */
struct lb_gone_key {
	__u32 frontend_id;
	__be16 port;
	__u16 pad;
	__u8 addr[16]; /* v4 mapped, as everywhere in lib/lb.h */
};

/* axon_lb_gone: removed backends -> AXON_GONE_* bits (which protocols'
 * sockets to abort). Filled by the agent right before an iteration and
 * emptied after it; not pinned (only this object uses it). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct lb_gone_key);
	__type(value, __u8);
} axon_lb_gone SEC(".maps");

/* One record per aborted socket, written to the iterator's output. */
struct sd_record {
	__u64 cookie;
	__u32 frontend_id;
	__s32 ret; /* bpf_sock_destroy's return: 0 or -errno */
	__u8 addr[16];
	__be16 port;
	__u8 proto;
	__u8 pad[5];
};

/* Kernel types, only the fields used (CO-RE). */
struct seq_file;

struct bpf_iter_meta {
	struct seq_file *seq;
} __attribute__((preserve_access_index));

struct sock_common {
	__be32 skc_daddr;
	__be16 skc_dport;
	unsigned short skc_family;
	volatile unsigned char skc_state;
	struct in6_addr skc_v6_daddr;
} __attribute__((preserve_access_index));

struct udp_sock;

struct bpf_iter__tcp {
	struct bpf_iter_meta *meta;
	struct sock_common *sk_common;
} __attribute__((preserve_access_index));

struct bpf_iter__udp {
	struct bpf_iter_meta *meta;
	struct udp_sock *udp_sk;
} __attribute__((preserve_access_index));

extern int bpf_sock_destroy(struct sock_common *sk) __ksym;

/* sd_visit aborts skc when it is a translated socket of a gone backend. */
AXON_INLINE int sd_visit(struct seq_file *seq, struct sock_common *skc, __u8 proto, __u8 bit)
{
	struct lb_rev_key rk = {};
	struct lb_gone_key gk = {};
	struct sd_record rec = {};
	struct lb_rev_val *rv;
	int from_lru = 0;
	__u8 *mask;
	__u16 family = skc->skc_family;

	if (family == AXON_AF_INET) {
		lb_addr_v4(rk.addr, skc->skc_daddr);
	} else if (family == AXON_AF_INET6) {
		if (bpf_probe_read_kernel(rk.addr, sizeof(rk.addr), &skc->skc_v6_daddr))
			return 0;
	} else {
		return 0;
	}
	rk.port = skc->skc_dport;
	if (rk.port == 0)
		return 0; /* not connected */
	rk.cookie = bpf_get_socket_cookie(skc);
	rv = lb_sk_rev_frontend(bpf_map_lookup_elem(&axon_lb_sock, &rk.cookie), rk.addr, rk.port);
	if (!rv) {
		/* connected under an agent from before axon_lb_sock */
		rv = bpf_map_lookup_elem(&axon_lb_rev, &rk);
		from_lru = 1;
	}
	if (!rv)
		return 0; /* not translated by this node's socket LB */
	gk.frontend_id = rv->frontend_id;
	gk.port = rk.port;
	__builtin_memcpy(gk.addr, rk.addr, sizeof(gk.addr));
	mask = bpf_map_lookup_elem(&axon_lb_gone, &gk);
	if (!mask || !(*mask & bit))
		return 0;

	rec.cookie = rk.cookie;
	rec.frontend_id = gk.frontend_id;
	__builtin_memcpy(rec.addr, rk.addr, sizeof(rec.addr));
	rec.port = rk.port;
	rec.proto = proto;
	rec.ret = bpf_sock_destroy(skc);
	if (rec.ret == 0 && from_lru)
		bpf_map_delete_elem(&axon_lb_rev, &rk);
	bpf_seq_write(seq, &rec, sizeof(rec));
	return 0;
}

SEC("iter/tcp")
int axon_sock_destroy_tcp(struct bpf_iter__tcp *ctx)
{
	struct sock_common *skc = ctx->sk_common;
	unsigned char state;

	if (!skc)
		return 0;
	state = skc->skc_state;
	if (state == AXON_TCP_TIME_WAIT || state == AXON_TCP_LISTEN || state == AXON_TCP_NEW_SYN_RECV)
		return 0;
	return sd_visit(ctx->meta->seq, skc, 6, AXON_GONE_TCP);
}

SEC("iter/udp")
int axon_sock_destroy_udp(struct bpf_iter__udp *ctx)
{
	struct sock_common *skc = (struct sock_common *)ctx->udp_sk;

	if (!skc)
		return 0;
	/* a udp_sock starts with its struct sock */
	return sd_visit(ctx->meta->seq, skc, 17, AXON_GONE_UDP);
}
