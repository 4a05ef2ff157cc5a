/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* sock_lb.c: socket-layer service load balancing (cgroup v2 sock_addr hooks).
 *
 * Attached to the agent's cgroup root; every socket of a process below it:
 *  connect4/6  TCP/UDP/SCTP connect to a frontend -> a backend (forward
 *              translation of the sockaddr; no per-packet NAT), records the
 *              reverse entry under the socket's cookie (axon_lb_sock); no
 *              usable backend -> ECONNREFUSED.
 *  sendmsg4/6  unconnected UDP sendto a frontend: the same per datagram.
 *  recvmsg4/6  UDP recvfrom: a reply from the backend shows the frontend as
 *              its source (the socket's entry; for unconnected sockets the
 *              LRU entry sendmsg recorded).
 *  getpeername4/6  a connected socket shows the frontend as its peer.
 *  bind4/6     a NodePort's port cannot be bound (EADDRINUSE).
 *  sock_release  a closed socket's axon_lb_sock entry is deleted.
 * Sockets of an opted-out netns (axon_lb_skip) or, in hostns-only mode, of
 * any netns but the host's are not translated (bind is still checked).
 * v4-in-v6 (a v6 socket addressing ::ffff:a.b.c.d) uses the IPv4 frontends,
 * because every address is stored v4 mapped (lib/lb.h).
 * Rejections return 0 after bpf_set_retval(-errno) (kernel >= 5.18), so the
 * syscall fails with that errno instead of EPERM.
 */
#include "lib/common.h"
#include "lib/lb.h"
#include "lib/drop.h"


#define SYS_PROCEED 1
#define SYS_REJECT 0

char __license[] SEC("license") = "Dual BSD/GPL";

/* Load-time configuration, set by internal/datapath/socklb (Config) before
 * the programs load.
 *  cfg_hostns_only        1: translate only sockets of the host netns (the
 *                         agent's, cfg_host_netns_cookie); pods' sockets go
 *                         to the stack untranslated (--socket-lb-mode
 *                         hostns-only).
 *  cfg_host_netns_cookie  netns cookie of the agent's netns. */
volatile const __u8 cfg_hostns_only = 0;
volatile const __u64 cfg_host_netns_cookie = 0;

/* lb_skip_netns says whether sockets of netns cookie nsc stay untranslated:
 * hostns-only mode and a foreign netns, or a netns that opted out. */
AXON_INLINE int lb_skip_netns(__u64 nsc)
{
	if (cfg_hostns_only && nsc != cfg_host_netns_cookie)
		return 1;
	return bpf_map_lookup_elem(&axon_lb_skip, &nsc) != NULL;
}

AXON_INLINE int lb_proto_ok(__u32 proto)
{
	return proto == AXON_IPPROTO_TCP || proto == AXON_IPPROTO_UDP || proto == AXON_IPPROTO_SCTP;
}

AXON_INLINE void ctx_get_addr(struct bpf_sock_addr *ctx, __u8 *addr, int v6)
{
	__u32 *w = (__u32 *)addr;

	if (!v6) {
		lb_addr_v4(addr, ctx->user_ip4);
		return;
	}
	w[0] = ctx->user_ip6[0];
	w[1] = ctx->user_ip6[1];
	w[2] = ctx->user_ip6[2];
	w[3] = ctx->user_ip6[3];
}

AXON_INLINE void ctx_set_addr(struct bpf_sock_addr *ctx, const __u8 *addr, __be16 port, int v6)
{
	const __u32 *w = (const __u32 *)addr;

	if (!v6) {
		ctx->user_ip4 = w[3];
	} else {
		ctx->user_ip6[0] = w[0];
		ctx->user_ip6[1] = w[1];
		ctx->user_ip6[2] = w[2];
		ctx->user_ip6[3] = w[3];
	}
	ctx->user_port = (__u32)port;
}

/* sock_drop_event writes the event of a refused connect/sendmsg: the
 * Service's address (a_hi, a_lo: the 16 bytes of lb_svc_key.addr), port
 * and protocol (meta: port | proto << 16 | family << 24). A global
 * function with scalar arguments: verified once, called only while someone
 * listens. */
__noinline int sock_drop_event(__u64 a_hi, __u64 a_lo, __u32 meta)
{
	struct axon_drop_event *ev;

	ev = drop_event_reserve(AXON_PROG_SOCK_LB, AXON_DROP_DIR_EGRESS, AXON_DROP_REASON_NO_BACKEND, 0, 0);
	if (!ev)
		return 0;
	ev->dport = (__be16)(meta & 0xffff);
	ev->proto = (meta >> 16) & 0xff;
	ev->family = meta >> 24;
	__builtin_memcpy(ev->daddr, &a_hi, 8);
	__builtin_memcpy(ev->daddr + 8, &a_lo, 8);
	drop_event_submit(ev);
	return 0;
}

/* sock_refused counts a connect/sendmsg to a frontend without a usable
 * backend as a drop (drop_no_backend, egress) and, while `axon monitor`
 * listens, sends its event. */
AXON_INLINE void sock_refused(const struct lb_svc_key *key, int v6)
{
	__u64 a[2];

	drop_count(AXON_DROP_DIR_EGRESS, AXON_DROP_REASON_NO_BACKEND, 0);
	if (!drop_listening())
		return;
	__builtin_memcpy(a, key->addr, sizeof(a));
	sock_drop_event(a[0], a[1], (__u32)key->port | (__u32)key->proto << 16 |
				    (__u32)(v6 ? AXON_AF_INET6 : AXON_AF_INET) << 24);
}

/* sock_fwd translates ctx's destination when it is a frontend. connect is
 * 1 in the connect hooks: the reverse entry goes to axon_lb_sock under the
 * socket's cookie (overwritten when the socket is re-pointed); sendmsg
 * keeps one axon_lb_rev entry per {socket, backend}. */
AXON_INLINE int sock_fwd(struct bpf_sock_addr *ctx, int v6, int connect)
{
	struct lb_svc_key key = {};
	struct lb_rev_key rk = {};
	struct lb_rev_val rv = {};
	struct lb_rev_val *old;
	struct lb_sk_rev sr = {};
	struct lb_svc_val *svc;
	struct lb_backend b;
	__u32 proto = ctx->protocol, fe_id;
	__u64 nsc;

	if (!lb_proto_ok(proto))
		return SYS_PROCEED;
	nsc = bpf_get_netns_cookie(ctx);
	if (lb_skip_netns(nsc))
		return SYS_PROCEED;
	ctx_get_addr(ctx, key.addr, v6);
	key.port = (__be16)ctx->user_port;
	key.proto = proto;
	__builtin_memcpy(rv.addr, key.addr, sizeof(rv.addr));
	rv.port = key.port;

	svc = lb_lookup(&key);
	if (!svc)
		return SYS_PROCEED;
	fe_id = lb_select(&key, svc, nsc, &b, NULL);
	if (!fe_id) {
		sock_refused(&key, v6);
		bpf_set_retval(-AXON_ECONNREFUSED);
		return SYS_REJECT;
	}
	/* an IPv4 socket can only reach an IPv4 backend (the agent never mixes) */
	if (!v6 && !lb_addr_is_v4(b.addr))
		return SYS_PROCEED;

	rv.frontend_id = fe_id;
	if (connect) {
		/* Should the insert fail, the socket is still translated; only
		 * getpeername/recvfrom then show the backend, and the socket is
		 * not aborted when that backend goes. */
		sr.fe = rv;
		__builtin_memcpy(sr.addr, b.addr, sizeof(sr.addr));
		sr.port = b.port;
		rk.cookie = bpf_get_socket_cookie(ctx);
		bpf_map_update_elem(&axon_lb_sock, &rk.cookie, &sr, BPF_ANY);
	} else {
		rk.cookie = bpf_get_socket_cookie(ctx);
		__builtin_memcpy(rk.addr, b.addr, sizeof(rk.addr));
		rk.port = b.port;
		/* lookup first: an unconnected UDP socket re-sends to the same pair */
		old = bpf_map_lookup_elem(&axon_lb_rev, &rk);
		if (!old || __builtin_memcmp(old, &rv, sizeof(rv)) != 0)
			bpf_map_update_elem(&axon_lb_rev, &rk, &rv, BPF_ANY);
	}

	ctx_set_addr(ctx, b.addr, b.port, v6);
	return SYS_PROCEED;
}

/* sock_rev shows the frontend instead of the backend: the socket's
 * axon_lb_sock entry when the peer is the backend connect() chose
 * (getpeername, and recvfrom on a connected socket), else, for recvmsg
 * only, the axon_lb_rev entry of {cookie, peer} that sendmsg wrote
 * (unconnected UDP; a connected socket has none there). */
AXON_INLINE int sock_rev(struct bpf_sock_addr *ctx, int v6, int recvmsg)
{
	struct lb_rev_key rk = {};
	struct lb_rev_val *rv;

	ctx_get_addr(ctx, rk.addr, v6);
	rk.port = (__be16)ctx->user_port;
	rk.cookie = bpf_get_socket_cookie(ctx);
	rv = lb_sk_rev_frontend(bpf_map_lookup_elem(&axon_lb_sock, &rk.cookie), rk.addr, rk.port);
	if (!rv) {
		if (!recvmsg)
			return SYS_PROCEED;
		rv = bpf_map_lookup_elem(&axon_lb_rev, &rk);
		if (!rv)
			return SYS_PROCEED;
	}
	if (!v6 && !lb_addr_is_v4(rv->addr))
		return SYS_PROCEED;
	ctx_set_addr(ctx, rv->addr, rv->port, v6);
	return SYS_PROCEED;
}

AXON_INLINE int nodeport_taken(__be16 port, __u8 proto, int v4)
{
	struct lb_svc_key key = {};

	if (v4)
		lb_addr_v4(key.addr, 0);
	key.port = port;
	key.proto = proto;
	key.scope = AXON_LB_SCOPE_NODEPORT;
	return bpf_map_lookup_elem(&axon_lb_svc, &key) != NULL;
}

/* sock_bind refuses binding a port that a NodePort frontend owns. */
AXON_INLINE int sock_bind(struct bpf_sock_addr *ctx, int v6)
{
	__be16 port = (__be16)ctx->user_port;
	__u32 proto = ctx->protocol;

	if (port == 0 || !lb_proto_ok(proto))
		return SYS_PROCEED;
	/* a v6 socket may also carry v4 (dual stack): check both families */
	if (nodeport_taken(port, proto, 1) || (v6 && nodeport_taken(port, proto, 0))) {
		bpf_set_retval(-AXON_EADDRINUSE);
		return SYS_REJECT;
	}
	return SYS_PROCEED;
}

SEC("cgroup/connect4")
int axon_sock_connect4(struct bpf_sock_addr *ctx) { return sock_fwd(ctx, 0, 1); }

SEC("cgroup/connect6")
int axon_sock_connect6(struct bpf_sock_addr *ctx) { return sock_fwd(ctx, 1, 1); }

SEC("cgroup/sendmsg4")
int axon_sock_sendmsg4(struct bpf_sock_addr *ctx) { return sock_fwd(ctx, 0, 0); }

SEC("cgroup/sendmsg6")
int axon_sock_sendmsg6(struct bpf_sock_addr *ctx) { return sock_fwd(ctx, 1, 0); }

SEC("cgroup/recvmsg4")
int axon_sock_recvmsg4(struct bpf_sock_addr *ctx) { return sock_rev(ctx, 0, 1); }

SEC("cgroup/recvmsg6")
int axon_sock_recvmsg6(struct bpf_sock_addr *ctx) { return sock_rev(ctx, 1, 1); }

SEC("cgroup/getpeername4")
int axon_sock_getpeername4(struct bpf_sock_addr *ctx) { return sock_rev(ctx, 0, 0); }

SEC("cgroup/getpeername6")
int axon_sock_getpeername6(struct bpf_sock_addr *ctx) { return sock_rev(ctx, 1, 0); }

SEC("cgroup/bind4")
int axon_sock_bind4(struct bpf_sock_addr *ctx) { return sock_bind(ctx, 0); }

SEC("cgroup/bind6")
int axon_sock_bind6(struct bpf_sock_addr *ctx) { return sock_bind(ctx, 1); }

/* A closed socket's reverse entry goes with it (see axon_lb_sock). Runs for
 * every socket of the cgroup that is closed: a lookup first, because most
 * were never translated and a miss takes no lock. */
SEC("cgroup/sock_release")
int axon_sock_release(struct bpf_sock *ctx)
{
	__u64 cookie;

	if (!lb_proto_ok(ctx->protocol))
		return SYS_PROCEED;
	cookie = bpf_get_socket_cookie(ctx);
	if (bpf_map_lookup_elem(&axon_lb_sock, &cookie))
		bpf_map_delete_elem(&axon_lb_sock, &cookie);
	return SYS_PROCEED;
}
