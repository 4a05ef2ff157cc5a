/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* pod_lb.c: a pod's own per-packet Service load balancer, for the pods whose
 * sockets the socket LB leaves alone (axon.io/socket-lb: disabled, or
 * --socket-lb-mode hostns-only): without it their packets to a ClusterIP
 * would leave the pod untranslated and find nothing on the node. Both
 * programs run inside the pod's netns, on its interface, so they see every
 * packet of the pod and nothing else, whatever path the node takes:
 *
 *   axon_podlb_egress (tc egress: what the pod sends): a TCP SYN or UDP
 *     datagram to a frontend of scope cluster (ClusterIP, externalIP,
 *     LoadBalancer IP: axon_lb_svc, the socket LB's maps, written by its
 *     writer) gets a backend (lb_select: session affinity keyed by the pod's
 *     netns cookie, as the socket LB keys it, then a random Active backend,
 *     else a Terminating one), two entries in axon_podlb_ct (forward:
 *     client -> frontend = backend; reverse: backend -> client = frontend)
 *     and its destination rewritten. Later packets of the flow are rewritten
 *     from the forward entry; a SYN or UDP datagram whose backend is gone or
 *     unusable chooses again, and one whose reverse entry the LRU evicted
 *     (its replies idle) writes it again. No usable backend: dropped (no_backend), as
 *     the socket LB refuses the connect.
 *   axon_podlb_ingress (tc ingress: what the pod receives): a packet whose
 *     tuple has a reverse entry gets the frontend back as its source, so the
 *     pod's socket sees the address it connected to.
 *
 * axon_podlb_ct is the pod's own (one LRU per pod, pinned in the pod's pin
 * dir): a pod that opens flows without end only evicts its own. Fragments and
 * ICMP errors about translated flows pass untranslated (counted).
 * One instance per pod (cfg_netns_cookie is the pod's), loaded by
 * internal/datapath/podlb. */
#include "lib/common.h"
#include "lib/ctx.h"
#include "lib/eth_ip.h"
#include "lib/l4.h"
#include "lib/lb.h"
#include "lib/drop.h"

/* Load-time configuration (internal/datapath/podlb). */
volatile const __u64 cfg_netns_cookie = 0; /* the pod's netns cookie: its session affinity key */

/* Default number of axon_podlb_ct entries (two per flow); podlb.Config.CTSize
 * overrides it at load. */
#define AXON_PODLB_CT_MAX 8192

/* podlb_ct.flags */
enum podlb_ct_flag {
	PODLB_CT_FWD = 0x1, /* key client -> frontend: addr/port are the backend */
	PODLB_CT_REV = 0x2, /* key backend -> client: addr/port are the frontend */
};

/* Value of axon_podlb_ct (32 bytes). */
struct podlb_ct {
	__u8 addr[16];     /* FWD: backend; REV: frontend */
	__be16 port;       /* FWD: backend port; REV: frontend port */
	__u8 flags;        /* PODLB_CT_* */
	__u8 pad;
	__u32 frontend_id; /* lb_svc_val.id at selection */
	__u32 backend_id;  /* axon_lb_be key at selection (FWD) */
	__u32 pad2;
};

/* axon_podlb_ct: the pod's translated flows, both directions (np_tuple as
 * in the packet -> struct podlb_ct). Not pinned by name: the loader pins it
 * in the pod's own dir. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, AXON_PODLB_CT_MAX);
	__type(key, struct np_tuple);
	__type(value, struct podlb_ct);
} axon_podlb_ct SEC(".maps");

/* axon_podlb_stats: per-CPU counters, enum axon_podlb_counter. Not pinned by
 * name: the loader pins it in the pod's own dir. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, AXON_PODLB_MAX);
	__type(key, __u32);
	__type(value, __u64);
} axon_podlb_stats SEC(".maps");

/* axon_podlb_btf: the enums user space mirrors (AXON_BTF_ANCHOR). */
AXON_BTF_ANCHOR(axon_podlb_btf, {
	enum axon_podlb_counter counter;
	enum podlb_ct_flag flag;
	struct podlb_ct ct;
});

AXON_INLINE void podlb_count(enum axon_podlb_counter c)
{
	__u32 idx = c;
	__u64 *v = bpf_map_lookup_elem(&axon_podlb_stats, &idx);

	if (v)
		*v += 1;
}

AXON_INLINE int podlb_drop(struct __sk_buff *skb, enum axon_podlb_counter c, enum axon_drop_dir dir,
			   enum axon_drop_reason r)
{
	podlb_count(c);
	drop_packet(skb, AXON_PROG_POD_LB, dir, r);
	return TC_ACT_SHOT;
}

/* podlb_reverse_key is the tuple of the replies of flow t once translated
 * to ct's backend: backend -> client. */
AXON_INLINE void podlb_reverse_key(const struct np_tuple *t, const struct podlb_ct *fwd, struct np_tuple *rk)
{
	__builtin_memset(rk, 0, sizeof(*rk));
	__builtin_memcpy(rk->saddr, fwd->addr, 16);
	__builtin_memcpy(rk->daddr, t->saddr, 16);
	rk->sport = fwd->port;
	rk->dport = t->sport;
	rk->proto = t->proto;
}

/* podlb_backend_ok: the backend a flow was given still serves its
 * frontend and may take a new connection (a SYN or UDP datagram). */
AXON_INLINE int podlb_backend_ok(const struct podlb_ct *fwd, const struct lb_svc_val *svc)
{
	struct lb_backend *b;
	__u32 id = fwd->backend_id;

	b = bpf_map_lookup_elem(&axon_lb_be, &id);
	return b && b->frontend_id == fwd->frontend_id && lb_usable(b, svc);
}

/* podlb_new_flow chooses a backend for t (frontend key in key, its master
 * entry svc) and writes both entries. 0: written, into fwd; else the
 * counter of the failure. */
static __noinline int podlb_new_flow(const struct np_tuple *t, struct lb_svc_key *key,
				     const struct lb_svc_val *svc, struct podlb_ct *fwd)
{
	struct lb_backend be = {};
	struct podlb_ct rev = {};
	struct np_tuple rk;
	__u32 fid, be_id = 0;

	fid = lb_select(key, svc, cfg_netns_cookie, &be, &be_id);
	if (!fid)
		return AXON_PODLB_NO_BACKEND;
	__builtin_memset(fwd, 0, sizeof(*fwd));
	__builtin_memcpy(fwd->addr, be.addr, 16);
	fwd->port = be.port;
	fwd->flags = PODLB_CT_FWD;
	fwd->frontend_id = fid;
	fwd->backend_id = be_id;
	__builtin_memcpy(rev.addr, t->daddr, 16);
	rev.port = t->dport;
	rev.flags = PODLB_CT_REV;
	rev.frontend_id = fid;
	podlb_reverse_key(t, fwd, &rk);
	if (bpf_map_update_elem(&axon_podlb_ct, &rk, &rev, BPF_ANY))
		return AXON_PODLB_CT_FAIL;
	if (bpf_map_update_elem(&axon_podlb_ct, t, fwd, BPF_ANY))
		return AXON_PODLB_CT_FAIL;
	return 0;
}

/* podlb_keep_reverse writes flow t's reverse entry again when the LRU
 * evicted it while its forward entry stayed (a flow whose replies were idle):
 * checked at a SYN or UDP datagram of a known flow, so a retried SYN or the
 * next datagram repairs the flow. */
static __noinline void podlb_keep_reverse(const struct np_tuple *t, const struct podlb_ct *fwd)
{
	struct podlb_ct rev = {};
	struct np_tuple rk;

	podlb_reverse_key(t, fwd, &rk);
	if (bpf_map_lookup_elem(&axon_podlb_ct, &rk))
		return;
	__builtin_memcpy(rev.addr, t->daddr, 16);
	rev.port = t->dport;
	rev.flags = PODLB_CT_REV;
	rev.frontend_id = fwd->frontend_id;
	if (bpf_map_update_elem(&axon_podlb_ct, &rk, &rev, BPF_ANY) == 0)
		podlb_count(AXON_PODLB_REV_RESTORED);
}

SEC("tc")
int axon_podlb_egress(struct __sk_buff *skb)
{
	struct np_pkt p = {};
	struct lb_svc_key key = {};
	struct lb_svc_val *svc;
	struct podlb_ct *fwd, nf;
	struct np_tuple n, rk;
	int r;

	if (np_parse_l3(skb, &p))
		return TC_ACT_OK; /* not IP, or malformed: the stack decides */
	if (p.t.proto != AXON_IPPROTO_TCP && p.t.proto != AXON_IPPROTO_UDP)
		return TC_ACT_OK;
	if (np_parse_ports(skb, &p))
		return TC_ACT_OK;
	__builtin_memcpy(key.addr, p.t.daddr, 16);
	key.port = p.t.dport;
	key.proto = p.t.proto;
	key.scope = AXON_LB_SCOPE_CLUSTER;
	svc = bpf_map_lookup_elem(&axon_lb_svc, &key);
	if (!svc) {
		/* a direct flow; a new TCP connection must not meet the reverse
		 * entry of an old translated flow on the same tuple (its replies
		 * would get that frontend as their source). Only at a SYN: UDP
		 * has no start to tell, and a delete per datagram would tax every
		 * direct UDP packet of the pod for a port reused toward a backend
		 * it once reached through a Service (that flow's replies keep the
		 * frontend's address until the entry is evicted). */
		if (p.t.proto == AXON_IPPROTO_TCP && np_may_open(&p) && !p.frag) {
			rk = p.t;
			__builtin_memcpy(rk.saddr, p.t.daddr, 16);
			__builtin_memcpy(rk.daddr, p.t.saddr, 16);
			rk.sport = p.t.dport;
			rk.dport = p.t.sport;
			if (bpf_map_delete_elem(&axon_podlb_ct, &rk) == 0)
				podlb_count(AXON_PODLB_STALE_REV);
		}
		return TC_ACT_OK;
	}
	if (p.frag) {
		podlb_count(AXON_PODLB_FRAGMENT);
		return TC_ACT_OK;
	}
	fwd = bpf_map_lookup_elem(&axon_podlb_ct, &p.t);
	if (fwd && fwd->flags == PODLB_CT_FWD) {
		__builtin_memcpy(&nf, fwd, sizeof(nf));
		if (np_may_open(&p) && !podlb_backend_ok(&nf, svc)) {
			podlb_count(AXON_PODLB_RESELECT);
			r = podlb_new_flow(&p.t, &key, svc, &nf);
			if (r)
				return podlb_drop(skb, r, AXON_DROP_DIR_EGRESS,
						  r == AXON_PODLB_NO_BACKEND ? AXON_DROP_REASON_NO_BACKEND : AXON_DROP_REASON_REWRITE_FAIL);
		} else {
			if (np_may_open(&p))
				podlb_keep_reverse(&p.t, &nf);
			podlb_count(AXON_PODLB_HIT);
		}
	} else if (np_may_open(&p)) {
		r = podlb_new_flow(&p.t, &key, svc, &nf);
		if (r)
			return podlb_drop(skb, r, AXON_DROP_DIR_EGRESS,
					  r == AXON_PODLB_NO_BACKEND ? AXON_DROP_REASON_NO_BACKEND : AXON_DROP_REASON_REWRITE_FAIL);
		podlb_count(AXON_PODLB_NEW);
	} else {
		podlb_count(AXON_PODLB_UNTRACKED);
		return TC_ACT_OK;
	}
	n = p.t;
	__builtin_memcpy(n.daddr, nf.addr, 16);
	n.dport = nf.port;
	if (np_rewrite(skb, &p, &n, 0))
		return podlb_drop(skb, AXON_PODLB_REWRITE_FAIL, AXON_DROP_DIR_EGRESS, AXON_DROP_REASON_REWRITE_FAIL);
	return TC_ACT_OK;
}

SEC("tc")
int axon_podlb_ingress(struct __sk_buff *skb)
{
	struct np_pkt p = {};
	struct podlb_ct *rev;
	struct np_tuple n;

	if (np_parse_l3(skb, &p))
		return TC_ACT_OK;
	if (p.t.proto != AXON_IPPROTO_TCP && p.t.proto != AXON_IPPROTO_UDP)
		return TC_ACT_OK;
	if (p.frag || np_parse_ports(skb, &p))
		return TC_ACT_OK;
	rev = bpf_map_lookup_elem(&axon_podlb_ct, &p.t);
	if (!rev || rev->flags != PODLB_CT_REV)
		return TC_ACT_OK;
	n = p.t;
	__builtin_memcpy(n.saddr, rev->addr, 16);
	n.sport = rev->port;
	if (np_rewrite(skb, &p, &n, 0))
		return podlb_drop(skb, AXON_PODLB_REWRITE_FAIL, AXON_DROP_DIR_INGRESS, AXON_DROP_REASON_REWRITE_FAIL);
	podlb_count(AXON_PODLB_REPLY);
	return TC_ACT_OK;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
