/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* nodeport.h: north-south load balancing, one code base for tc and XDP
 * (ctx.h): NodePort, LoadBalancer ingress IPs, externalIPs and HostPort
 * frontends, TCP and UDP, ICMP errors of translated flows, IPv4 and IPv6.
 *
 * Per packet at the uplink ingress (np_ingress):
 *   0. TCP/UDP to a pod of this node (axon_np_pods): continues untouched,
 *      nothing looked up (pod-to-pod traffic pays almost nothing here).
 *   1. CT hit (client -> frontend tuple in axon_np_ct): translate as stored.
 *   2. frontend hit (axon_np_svc; NodePort/HostPort only for the node's own
 *      addresses, axon_np_local): source ranges, then a backend (session
 *      affinity, Maglev table or random), a CT entry (+ the reverse entry),
 *      then translate:
 *        local backend  DNAT, continue (uplink_ingress / the stack delivers)
 *        remote, SNAT   source -> node address:port from cfg_snat_port_*,
 *                       destination -> backend; FIB lookup, redirect
 *        remote, DSR    IPIP to the backend (dsr.h); FIB lookup, redirect
 *                       (clients of the cluster itself, axon_np_cluster: SNAT)
 *   On the backend's node, an IPIP / IPv6-in-IPv6 DSR request for a local
 *   pod (axon_np_dsr) is decapsulated first and then handled as a packet
 *   for its frontend with that pod as the backend (np_dsr_accept).
 *   3. reply of an SNAT flow (axon_np_nat): back to frontend -> client.
 *   4. ICMP error quoting a translated flow: inner and outer header
 *      translated like the flow, so PMTU discovery works end to end.
 *   Anything else continues untouched (CTX_NEXT).
 * At the uplink egress (tc only, np_egress): replies of local backends get
 * the frontend back as their source.
 *
 * XDP cannot resolve neighbours: a packet whose FIB lookup does not succeed
 * at XDP is passed to the stack unchanged (NP_XDP_PUNT) after its CT entry
 * was written, and the tc program finishes it with bpf_redirect_neigh.
 *
 * Fragments (IPv4 MF/offset, IPv6 fragment header) of TCP/UDP are tracked
 * (frag.h): the first fragment's ports are recorded per datagram, the later
 * fragments get the same translation of their IP header; a later fragment
 * whose first was not seen continues untouched (NP_FRAG_NOT_FOUND).
 * No VLAN tags: the IP header is expected at ETH_HLEN.
 */
#ifndef AXON_NODEPORT_H
#define AXON_NODEPORT_H

#include "common.h"
#include "ctx.h"
#include "eth_ip.h"
#include "l4.h"
#include "drop.h"
#include "backend.h"
#include "ct.h"
#include "nat.h"
#include "maglev.h"
#include "dsr.h"
#include "fib_cache.h"

#define AXON_NP_SVC_MAX 65536
#define AXON_NP_BACKEND_MAX 65536
#define AXON_NP_LOCAL_MAX 256
#define AXON_NP_AFFINITY_MAX 65536
#define AXON_NP_SRCRANGE_MAX 16384

/* np_svc_val.flags (npFlag* in internal/datapath/nodeport). */
enum np_svc_flag {
	NP_F_AFFINITY = 0x01,   /* sessionAffinity ClientIP (affinity_timeout s) */
	NP_F_MAGLEV = 0x02,     /* pick from axon_lb_maglev, not at random */
	NP_F_SRC_RANGES = 0x04, /* only clients in axon_np_srcrange */
	NP_F_DSR = 0x08,        /* remote backends by DSR (IPIP), else SNAT */
	NP_F_LOCAL_ONLY = 0x10, /* externalTrafficPolicy Local: never a remote backend */
};

/* np_backend.flags (np_backend.state: enum axon_lb_state, common.h). */
enum np_be_flag {
	NP_BE_F_LOCAL = 0x01, /* a pod on this node: DNAT only */
};

/* Hooks (rows of axon_np_metrics). */
enum np_hook {
	NP_HOOK_TC = 0,     /* tc ingress of the uplink */
	NP_HOOK_XDP = 1,    /* XDP of the uplink */
	NP_HOOK_EGRESS = 2, /* tc egress of the uplink */
	NP_HOOK_MAX = 3,
};

/* Counters, index hook * NP_REASON_MAX + reason. Names: the members'
 * without NP_, lower case (npReasonNames in internal/datapath/nodeport). */
enum np_reason {
	NP_NOT_SERVICE = 0,      /* no CT entry, frontend or reverse entry: untouched */
	NP_CT_HIT = 1,           /* established flow, translated from its CT entry */
	NP_CT_NEW = 2,           /* new flow: backend selected, CT entry written */
	NP_CT_INSERT_FAIL = 3,   /* CT update failed (translated anyway) */
	NP_SNAT_NO_PORT = 4,     /* no free SNAT port after NP_SNAT_TRIES: dropped */
	NP_REV_NAT = 5,          /* reply of an SNAT flow back to the client */
	NP_DNAT_LOCAL = 6,       /* to a backend on this node */
	NP_SNAT_FWD = 7,         /* to a remote backend, source NATed */
	NP_DSR_ENCAP = 8,        /* to a remote backend, IPIP */
	NP_ICMP_ERROR = 9,       /* ICMP error of a translated flow translated */
	NP_DROP_NO_BACKEND = 10, /* frontend without a usable backend */
	NP_DROP_SRC_RANGE = 11,  /* client outside loadBalancerSourceRanges */
	NP_DROP_NOT_LOCAL = 12,  /* externalTrafficPolicy Local, backend not local */
	NP_DROP_NO_ROUTE = 13,   /* FIB has no way to the backend / client */
	NP_XDP_PUNT = 14,        /* XDP: FIB needs the stack (no neighbour): tc finishes */
	NP_FRAGMENT = 15,        /* IP fragment of a protocol other than TCP/UDP: untouched (frag.h) */
	NP_MALFORMED = 16,       /* truncated headers: untouched */
	NP_TTL = 17,             /* TTL <= 1 on a forwarded flow: the stack answers */
	NP_EGRESS_REV = 18,      /* egress: reply of a local backend, source restored */
	NP_DROP_NO_SNAT_ADDR = 19, /* remote backend, but no node address configured */
	NP_REWRITE_FAIL = 20,    /* a packet write or encapsulation failed: dropped */
	NP_DSR_DECAP = 21,       /* backend side: IPIP outer header removed (np_dsr_accept at tc ingress; axon_lb_decap: egress row) */
	NP_FRAG_TRACKED = 22,    /* frag.h: first fragment, its ports recorded in axon_np_frag */
	NP_FRAG_NOT_FOUND = 23,  /* frag.h: later fragment whose first was not seen: untouched */
	NP_DSR_TOO_BIG = 24,     /* icmp_too_big.h: DSR packet too big once encapsulated: dropped, ICMP answer sent */
	/* conntrack of handshake-less and unanswered flows (ct.h) */
	NP_CT_NO_SYN = 25,       /* TCP to a frontend, no CT entry, not a SYN without ACK: opens no flow, to the stack untouched */
	NP_CT_ESTABLISHED = 26,  /* flow moved from axon_np_ct_new to axon_np_ct (ct.h: UDP reply, TCP client ACK after a reply, DSR second packet) */
	NP_SNAT_PORT_REUSED = 27, /* new SNAT flow took over the port of an unanswered flow evicted from axon_np_ct_new (np_nat_stale) */
	NP_CT_MAGLEV_RESUME = 28, /* TCP without SYN and without CT entry to a Maglev frontend: the same backend picked again, the flow resumed */
	NP_NAT_FULL = 29,        /* new flow to a local backend, axon_np_nat full: no reverse entry for its replies, dropped */
	NP_DIRECT_REUSE = 30,    /* a client reached a local pod directly with the ports of a NodePort flow to it: that flow's entries removed (np_direct_reuse) */
	NP_REASON_MAX = 31,
};

/* axon_np_btf: the enums above and the CT/NAT flags (ct.h, nat.h) in BTF
 * (see AXON_BTF_ANCHOR): internal/datapath/nodeport's npHookNames, npReasonNames,
 * npFlag*, npBackendLocal, npCT* and npNAT*. */
AXON_BTF_ANCHOR(axon_np_btf, {
	enum np_hook hook;
	enum np_reason reason;
	enum np_svc_flag svc_flag;
	enum np_be_flag be_flag;
	enum np_ct_flag ct_flag;
	enum np_nat_flag nat_flag;
});

struct np_svc_key {
	__u8 addr[16]; /* frontend address; :: or ::ffff:0.0.0.0 for NodePort/HostPort */
	__be16 port;
	__u8 proto;
	__u8 scope; /* AXON_LB_SCOPE_* */
	__u16 slot; /* 0: master; 1..n: backends (Active, Terminating, Quarantined) */
	__u16 pad;
};

struct np_svc_val {
	__u32 id;          /* master: frontend id; slot: backend id */
	__u16 active;      /* master: slot counts */
	__u16 terminating;
	__u16 quarantined;
	__u16 flags;       /* NP_F_* */
	__u32 affinity_timeout; /* s */
};

struct np_backend {
	__u8 addr[16];
	__be16 port;
	__u8 state; /* AXON_LB_ACTIVE... */
	__u8 flags; /* NP_BE_F_* */
	__u32 frontend_id;
};

struct np_srcrange_key {
	__u32 prefixlen; /* 32 (frontend id) + prefix bits of addr (v4: 96 + bits) */
	__u32 frontend_id;
	__u8 addr[16];
};

struct np_aff_key {
	__u8 addr[16]; /* client */
	__u32 frontend_id;
	__u32 pad;
};

struct np_aff_val {
	__u32 backend_id;
	__u32 pad;
	__u64 last_used; /* ns, bpf_ktime_get_coarse_ns */
};

/* np_explain: the dry-run instance's answer (axon_np_explain[0]). */
struct np_explain {
	__u32 reason;      /* enum np_reason of the verdict */
	__u32 frontend_id;
	__u32 backend_id;
	__u8 be_addr[16];
	__be16 be_port;
	__be16 nat_port;
	__u8 ct_hit;       /* 1: an existing CT entry decided */
	__u8 ct_flags;     /* NP_CT_* of the translation */
	__u16 pad;
};

/* axon_np_svc: frontend master + backend slots (as lib/lb.h, own ids). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, AXON_NP_SVC_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct np_svc_key);
	__type(value, struct np_svc_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} axon_np_svc SEC(".maps");

/* axon_np_be: backend id -> backend. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, AXON_NP_BACKEND_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct np_backend);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} axon_np_be SEC(".maps");

/* axon_np_dsr: the backend side of DSR. {frontend id, address of a
 * backend that is a pod on this node} -> backend id (axon_np_be), written by
 * the agent for every local backend of every frontend. An IPIP / IPv6-in-IPv6
 * packet whose outer destination is such a pod and whose inner packet is for
 * that frontend is another node's DSR request: np_dsr_accept removes the
 * outer header and the flow is DNATed to the pod here (NP_CT_LOCAL), so its
 * replies get the frontend as source at the uplink egress and go straight
 * to the client. */
struct np_dsr_key {
	__u32 frontend_id; /* np_svc_val.id on this node */
	__u8 addr[16];     /* backend (pod) address, IPv4 as ::ffff:a.b.c.d */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, AXON_NP_BACKEND_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct np_dsr_key);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} axon_np_dsr SEC(".maps");

/* axon_np_cluster: the cluster's own addresses (every Node's podCIDRs and
 * InternalIPs, from the agent's Node watch), {prefixlen, addr} -> 1. A
 * client inside them is served by SNAT even where the frontend says DSR:
 * its replies would not leave through the backend node's uplink egress
 * (a pod on the backend's node gets them by bpf_redirect_peer, the node
 * itself through its stack), so nothing would give them the frontend
 * address back. Empty (the standalone L4LB): every client may get DSR. */
struct np_cluster_key {
	__u32 prefixlen; /* prefix bits of addr (IPv4: 96 + bits) */
	__u8 addr[16];
};

#define AXON_NP_CLUSTER_MAX 16384

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, AXON_NP_CLUSTER_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct np_cluster_key);
	__type(value, __u8);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} axon_np_cluster SEC(".maps");

/* axon_np_pods: this node's podCIDRs (from its Node; at most one per
 * family), [0] IPv4, [1] IPv6, in np_tuple address form (IPv4 v4-mapped).
 * A TCP/UDP packet to an address inside them is for a pod on this node and
 * never for a frontend (frontends are node addresses, LoadBalancer IPs and
 * externalIPs; a DSR request for a pod is IPIP and handled before), so
 * np_ingress hands it on without the CT and frontend lookups, which are
 * most of this program's cost for pod traffic. set = 0 (the standalone
 * L4LB, or before the agent knows its podCIDRs): every packet is looked up.
 * The agent warns about a frontend address inside a podCIDR: it would not
 * be translated on this node. */
struct np_pod_cidr {
	__u32 net[4];  /* masked network address */
	__u32 mask[4];
	__u32 set;     /* 1: net/mask hold this node's podCIDR of the family */
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, struct np_pod_cidr);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} axon_np_pods SEC(".maps");

/* axon_np_local: the node's addresses (16 bytes, v4 mapped) -> 1: where
 * NodePort/HostPort frontends match and SNAT replies arrive. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, AXON_NP_LOCAL_MAX);
	__type(key, struct in6_addr);
	__type(value, __u8);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} axon_np_local SEC(".maps");

/* axon_np_srcrange: loadBalancerSourceRanges, {frontend id, prefix} -> 1. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, AXON_NP_SRCRANGE_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct np_srcrange_key);
	__type(value, __u8);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} axon_np_srcrange SEC(".maps");

/* axon_np_aff: sessionAffinity ClientIP, {client, frontend id} -> backend. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, AXON_NP_AFFINITY_MAX);
	__type(key, struct np_aff_key);
	__type(value, struct np_aff_val);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} axon_np_aff SEC(".maps");

/* axon_np_metrics: per-CPU counters (enum np_hook x enum np_reason). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, NP_HOOK_MAX * NP_REASON_MAX);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} axon_np_metrics SEC(".maps");

/* axon_np_explain: written only by the dry-run instance (not pinned). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct np_explain);
} axon_np_explain SEC(".maps");

/* np_scratch: per-CPU scratch for what does not fit the 512-byte BPF
 * stack (FIB parameters, the reverse entry of a new flow). Valid for one
 * program run; nothing is carried between runs or programs in it. */
struct np_scratch {
	struct bpf_fib_lookup fp;
	struct np_nat nat;
	struct np_tuple rk;
	struct np_ct ct;  /* the flow being translated (np_ingress_l4) */
	__u8 answer[160]; /* np_reply_too_big's ICMP answer (icmp_too_big.h) */
	struct np_tuple key; /* the CT or reverse key of the non-inlined helpers
			      * (np_nat_stale, np_promote_nat, np_establish) */
	__u32 gen[2];     /* np_fib: the generations a next hop is kept under (np_nh_gens) */
	__u8 nh_keep;     /* np_fib: keep the next hop in the flow's CT entry (np_ct_nh_fill):
			   * 1 for a hit, 0 for a new flow's first packet. Here, not an
			   * argument: a register that differs splits the verifier's states */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__uint(value_size, sizeof(struct np_scratch)); /* untyped: no Go type for bpf_fib_lookup */
} axon_np_scratch SEC(".maps");

/* axon_np_neigh_gen[0]: the neighbour generation of the LB's next-hop
 * cache (fib_cache.h, np_fib). nodeport.LB's neighbour watch sets it to 1
 * once it listens to the netns' IPv4 neighbour changes and adds 1 on each
 * (a new, changed, failed or removed neighbour); an entry filled under
 * another generation is a miss. 0: nobody watches (not yet, or the watch
 * failed): every packet is looked up in the FIB. Shared by the tc and XDP
 * programs, not pinned: a new LB starts at 0 with empty caches. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} axon_np_neigh_gen SEC(".maps");

/* cfg_fib_cache (load time): 1 where the kernel has bpf_cast_to_kern_ctx
 * (6.3+) to read rt_genid (fib_cache.h): known IPv4 next hops come from
 * the cache. 0: the verifier prunes the cache, every packet is looked up. */
volatile const __u8 cfg_fib_cache = 0;

AXON_INLINE struct np_scratch *np_scratch(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&axon_np_scratch, &zero);
}

/* Load-time configuration (Options in internal/datapath/nodeport):
 *  cfg_snat_v4/v6   node address used as SNAT source for frontends that are
 *                   not a node address (LoadBalancer IP, externalIP) and as
 *                   the DSR outer source; 0 / :: = none configured
 *  cfg_enable_neigh bpf_redirect_neigh may be used (tc)
 *  cfg_dry_run      the Explain instance: no map writes, no redirect; the
 *                   decision goes to axon_np_explain */
volatile const __be32 cfg_snat_v4 = 0;
volatile const __u32 cfg_snat_v6[4] = {}; /* memory order */
volatile const __u8 cfg_enable_neigh = 1;
volatile const __u8 cfg_dry_run = 0;
/* cfg_dsr_mss_v4/v6: the largest TCP MSS a client may use towards a DSR
 * backend on this node: the uplink MTU minus the IP and TCP headers and the
 * LB's outer header (v4: MTU - 60, v6: MTU - 100); 0 = no clamp. */
volatile const __u16 cfg_dsr_mss_v4 = 0;
volatile const __u16 cfg_dsr_mss_v6 = 0;

AXON_INLINE void np_count(enum np_hook hook, enum np_reason r)
{
	__u32 idx = (__u32)hook * NP_REASON_MAX + (__u32)r;
	__u64 *v;

	if (cfg_dry_run)
		return;
	v = bpf_map_lookup_elem(&axon_np_metrics, &idx);
	if (v)
		*v += 1;
}

/* np_drop_reason: the drop vocabulary's name (lib/drop.h) of a verdict
 * that drops. */
AXON_INLINE enum axon_drop_reason np_drop_reason(enum np_reason r)
{
	switch (r) {
	case NP_DROP_NO_BACKEND:
		return AXON_DROP_REASON_NO_BACKEND;
	case NP_DROP_SRC_RANGE:
		return AXON_DROP_REASON_SRC_RANGE;
	case NP_DROP_NOT_LOCAL:
		return AXON_DROP_REASON_NOT_LOCAL;
	case NP_DROP_NO_ROUTE:
		return AXON_DROP_REASON_NO_ROUTE;
	case NP_SNAT_NO_PORT:
		return AXON_DROP_REASON_SNAT_NO_PORT;
	case NP_DROP_NO_SNAT_ADDR:
		return AXON_DROP_REASON_NO_SNAT_ADDR;
	case NP_NAT_FULL:
		return AXON_DROP_REASON_NAT_FULL;
	case NP_DSR_TOO_BIG:
		return AXON_DROP_REASON_DSR_TOO_BIG;
	default:
		return AXON_DROP_REASON_REWRITE_FAIL;
	}
}

/* np_drop counts a drop by its verdict r, in the LB's counters and the
 * drop vocabulary's (with an event while `axon monitor` listens), and
 * returns the drop verdict. The dry run (nodeport_explain) counts nothing. */
AXON_INLINE int np_drop(axon_ctx_t *ctx, enum np_hook hook, enum np_reason r)
{
	np_count(hook, r);
	if (!cfg_dry_run)
		drop_packet(ctx,
			    hook == NP_HOOK_XDP ? AXON_PROG_LB_XDP : hook == NP_HOOK_EGRESS ? AXON_PROG_LB_EGRESS : AXON_PROG_LB_TC,
			    hook == NP_HOOK_EGRESS ? AXON_DROP_DIR_EGRESS : AXON_DROP_DIR_INGRESS, np_drop_reason(r));
	return CTX_DROP;
}

#include "frag.h"
#include "icmp_too_big.h"

/* np_rt_genid reads the IPv4 route generation of the netns the packet's
 * FIB lookup happens in (fib_cache.h). */
AXON_INLINE int np_rt_genid(axon_ctx_t *ctx, __u32 *genid)
{
#ifdef AXON_CTX_XDP
	return fib_cache_genid_xdp(ctx, genid);
#else
	return fib_cache_genid(ctx, genid);
#endif
}

/* np_nh_gens reads the generations a kept next hop is valid under: gen[0]
 * the netns' rt_genid, gen[1] the neighbour generation
 * (axon_np_neigh_gen). 0: nothing is kept (nobody watches the neighbours,
 * or rt_genid cannot be read). */
AXON_INLINE int np_nh_gens(axon_ctx_t *ctx, __u32 *gen)
{
	__u32 zero = 0, genid = 0, *g;

	g = bpf_map_lookup_elem(&axon_np_neigh_gen, &zero);
	if (!g || !*g || !np_rt_genid(ctx, &genid))
		return 0;
	gen[0] = genid;
	gen[1] = *g;
	return 1;
}

/* np_ct_nh_get: the next hop kept in the flow's CT entry (nh, a copy of
 * it) is valid for this packet: filled under the current generations gen,
 * from the device the packet came from. fp then holds family, ifindex and
 * the MACs, all np_send reads of a SUCCESS. Inlined on purpose, unlike
 * np_fib_cached: a conntrack hit makes no call for its next hop (a call
 * and its return cost ~10 ns where the kernel mitigates return-stack
 * attacks, e.g. "Safe RET" on AMD Zen). */
AXON_INLINE int np_ct_nh_get(axon_ctx_t *ctx, const struct np_nh *nh, const __u32 *gen,
			     struct bpf_fib_lookup *fp)
{
	if (nh->neigh_gen != gen[1] || nh->rt_gen != gen[0] || nh->iif != ctx_ifindex(ctx))
		return 0;
	fp->family = AXON_AF_INET;
	fp->ifindex = nh->oif;
	__builtin_memcpy(fp->dmac, nh->dmac, 6);
	__builtin_memcpy(fp->smac, nh->smac, 6);
	return 1;
}

/* np_fib_cached looks the IPv4 next hop from s4 to d4 up in the per-CPU
 * cache of fib_cache.h: 1 when an entry filled under the generations gen
 * (np_nh_gens) matches, fp then holding family, ifindex and the MACs only;
 * else 0. Not inlined: its branches end in one return value, so the
 * verifier does not carry a hit and a miss state through the rest of every
 * caller. */
static __noinline int np_fib_cached(axon_ctx_t *ctx, __be32 s4, __be32 d4, struct bpf_fib_lookup *fp,
				    const __u32 *gen)
{
	struct fib_cache_entry *ce;
	__u32 iif = ctx_ifindex(ctx), slot = fib_cache_slot(iif, s4, d4);

	ce = bpf_map_lookup_elem(&axon_fib_cache, &slot);
	if (!ce || ce->neigh_gen != gen[1] || !fib_cache_match_key(ce, iif, s4, d4, 0, 0, gen[0]))
		return 0;
	fp->family = AXON_AF_INET;
	fp->ifindex = ce->oif;
	__builtin_memcpy(fp->dmac, ce->dmac, 6);
	__builtin_memcpy(fp->smac, ce->smac, 6);
	return 1;
}

/* np_fib_fill caches the result fp of a lookup from s4 to d4 that
 * returned SUCCESS, under the generations gen of np_fib_cached. Not
 * inlined, for the same reason: nothing of the caller's state differs
 * after it, so the paths with and without a fill are verified once. */
static __noinline void np_fib_fill(__u32 iif, __be32 s4, __be32 d4, const struct bpf_fib_lookup *fp,
				   const __u32 *gen)
{
	__u32 slot = fib_cache_slot(iif, s4, d4);
	struct fib_cache_entry *ce = bpf_map_lookup_elem(&axon_fib_cache, &slot);

	if (!ce)
		return;
	ce->valid = 0;
	__builtin_memcpy(ce->dmac, fp->dmac, 6);
	__builtin_memcpy(ce->smac, fp->smac, 6);
	ce->neigh_gen = gen[1];
	fib_cache_put_key(ce, iif, s4, d4, 0, 0, gen[0], fp->ifindex, fp->ipv4_dst, fp->mtu_result);
}

/* np_ct_nh_fill keeps the next hop fp (a SUCCESS, from the per-CPU cache
 * or a lookup under the generations gen) in flow k's CT entry (np_nh): a
 * plain store into the value, no map update. On a hit only (sc->nh_keep),
 * once per flow and generation: a new flow's first packet does not pay for
 * it (most flows are short, and the per-CPU cache serves their next
 * packets); an unreplied flow's entry takes its next hop along when it
 * moves to axon_np_ct (a copy). The generation is cleared first and
 * written last; another CPU that copies the entry while it is filled may
 * still take the previous next hop for one packet, as a packet sent just
 * before the change would have. */
static __noinline void np_ct_nh_fill(const struct np_tuple *k, __u32 iif, const struct bpf_fib_lookup *fp,
				     const __u32 *gen)
{
	struct np_ct *v = bpf_map_lookup_elem(&axon_np_ct, k);

	if (!v)
		v = bpf_map_lookup_elem(&axon_np_ct_new, k);
	if (!v)
		return;
	v->nh.neigh_gen = 0;
	axon_barrier();
	__builtin_memcpy(v->nh.dmac, fp->dmac, 6);
	__builtin_memcpy(v->nh.smac, fp->smac, 6);
	v->nh.oif = fp->ifindex;
	v->nh.iif = iif;
	v->nh.rt_gen = gen[0];
	axon_barrier();
	v->nh.neigh_gen = gen[1];
}

/* np_fib looks up the way to dst (from src) in the node's FIB. An IPv4
 * next hop found before (SUCCESS: egress device and both MACs) is used
 * again while the netns' rt_genid and the neighbour generation are what
 * they were at its lookup: from the flow's CT entry (nh: a copy of it, ctk
 * its key; NULL: not a flow's packet), else from the per-CPU cache
 * (np_fib_cached). One from the per-CPU cache or a lookup is kept in the CT
 * entry for the flow's next packets. Anything else is looked up every
 * time. */
AXON_INLINE long np_fib(axon_ctx_t *ctx, int v6, const __u8 *src, const __u8 *dst,
			struct bpf_fib_lookup *fp, const struct np_nh *nh, const struct np_tuple *ctk)
{
	struct np_scratch *sc = np_scratch();
	__u32 iif = ctx_ifindex(ctx), *gen;
	__be32 s4 = np_v4(src), d4 = np_v4(dst);
	long rc;

	if (!sc)
		return BPF_FIB_LKUP_RET_NOT_FWDED;
	/* the generations in the scratch map, not on the stack: on the stack,
	 * the verifier told the states after a new flow's backend choice apart
	 * by those slots and walked the rest of the program twice (+50 % at
	 * XDP). Looked up here, not passed in: as measured, that costs the
	 * verifier less. */
	gen = sc->gen;
	gen[1] = 0;
	if (cfg_fib_cache && !v6 && np_nh_gens(ctx, gen)) {
		if (nh && np_ct_nh_get(ctx, nh, gen, fp))
			return BPF_FIB_LKUP_RET_SUCCESS;
		if (np_fib_cached(ctx, s4, d4, fp, gen)) {
			if (ctk && !cfg_dry_run && sc->nh_keep)
				np_ct_nh_fill(ctk, iif, fp, gen);
			return BPF_FIB_LKUP_RET_SUCCESS;
		}
	}
	__builtin_memset(fp, 0, sizeof(*fp));
	fp->ifindex = iif;
	if (v6) {
		fp->family = AXON_AF_INET6;
		__builtin_memcpy(fp->ipv6_src, src, 16);
		__builtin_memcpy(fp->ipv6_dst, dst, 16);
	} else {
		fp->family = AXON_AF_INET;
		fp->ipv4_src = s4;
		fp->ipv4_dst = d4;
	}
	rc = bpf_fib_lookup(ctx, fp, sizeof(*fp), 0);
	if (cfg_fib_cache && !v6 && gen[1] && rc == BPF_FIB_LKUP_RET_SUCCESS) {
		np_fib_fill(iif, s4, d4, fp, gen);
		if (ctk && !cfg_dry_run && sc->nh_keep)
			np_ct_nh_fill(ctk, iif, fp, gen);
	}
	return rc;
}

/* np_fib_usable says whether this hook can finish the packet after a FIB
 * lookup returned rc: SUCCESS always, NO_NEIGH only at tc with
 * bpf_redirect_neigh. */
AXON_INLINE int np_fib_usable(long rc)
{
	if (rc == BPF_FIB_LKUP_RET_SUCCESS)
		return 1;
	return !CTX_IS_XDP && rc == BPF_FIB_LKUP_RET_NO_NEIGH && cfg_enable_neigh;
}

/* np_send transmits the rewritten packet the way np_fib found. */
AXON_INLINE int np_send(axon_ctx_t *ctx, long rc, struct bpf_fib_lookup *fp)
{
	if (rc == BPF_FIB_LKUP_RET_SUCCESS) {
		__u8 macs[12];

		__builtin_memcpy(macs, fp->dmac, 6);
		__builtin_memcpy(macs + 6, fp->smac, 6);
		if (ctx_store(ctx, 0, macs, sizeof(macs)))
			return CTX_DROP;
#ifdef AXON_CTX_XDP
		if (fp->ifindex == ctx_ifindex(ctx))
			return XDP_TX;
#endif
		return bpf_redirect(fp->ifindex, 0);
	}
#ifndef AXON_CTX_XDP
	{
		struct bpf_redir_neigh nh = {};

		nh.nh_family = fp->family;
		if (fp->family == AXON_AF_INET)
			nh.ipv4_nh = fp->ipv4_dst;
		else
			__builtin_memcpy(nh.ipv6_nh, fp->ipv6_dst, 16);
		return bpf_redirect_neigh(fp->ifindex, &nh, sizeof(nh), 0);
	}
#else
	return CTX_PASS;
#endif
}

/* np_unroutable is the verdict on a packet whose FIB lookup returned rc
 * this hook cannot use (np_fib_usable): at XDP without a neighbour it goes
 * up unchanged for tc to finish (NP_XDP_PUNT), else it is dropped
 * (NP_DROP_NO_ROUTE). */
AXON_INLINE int np_unroutable(axon_ctx_t *ctx, long rc, enum np_hook hook)
{
	if (CTX_IS_XDP && rc == BPF_FIB_LKUP_RET_NO_NEIGH) {
		np_count(hook, NP_XDP_PUNT);
		return CTX_PASS;
	}
	return np_drop(ctx, hook, NP_DROP_NO_ROUTE);
}

/* np_route looks up the way from src to dst of a packet this hook forwards
 * (np_fib): 0 when the hook can finish it, *rc for np_transmit; else 1,
 * and the caller returns *verdict (np_unroutable). A dry run looks nothing
 * up (*rc stays 0). */
AXON_INLINE int np_route(axon_ctx_t *ctx, int v6, const __u8 *src, const __u8 *dst,
			 struct bpf_fib_lookup *fp, const struct np_nh *nh, const struct np_tuple *ctk,
			 enum np_hook hook, long *rc, int *verdict)
{
	if (cfg_dry_run)
		return 0;
	*rc = np_fib(ctx, v6, src, dst, fp, nh, ctk);
	if (np_fib_usable(*rc))
		return 0;
	*verdict = np_unroutable(ctx, *rc, hook);
	return 1;
}

/* np_transmit counts a rewritten packet as reason and sends it the way
 * np_route found (np_send); the dry run stops here (CTX_PASS). */
AXON_INLINE int np_transmit(axon_ctx_t *ctx, long rc, struct bpf_fib_lookup *fp, enum np_hook hook,
			    enum np_reason reason)
{
	np_count(hook, reason);
	if (cfg_dry_run)
		return CTX_PASS;
	return np_send(ctx, rc, fp);
}

/* np_lookup_svc finds the frontend of tuple t: exact address first, then,
 * for the node's own addresses (node: the caller found t->daddr in
 * axon_np_local), the NodePort and HostPort wildcards. With remote set (a
 * DSR request: the destination is the address of the node whose LB
 * forwarded it), the NodePort wildcard matches any address. */
AXON_INLINE struct np_svc_val *np_lookup_svc(const struct np_tuple *t, int v6, struct np_svc_key *key,
					     int *local, int remote, int node)
{
	struct np_svc_val *svc;

	__builtin_memset(key, 0, sizeof(*key));
	__builtin_memcpy(key->addr, t->daddr, 16);
	key->port = t->dport;
	key->proto = t->proto;
	key->scope = AXON_LB_SCOPE_CLUSTER;
	svc = bpf_map_lookup_elem(&axon_np_svc, key);
	if (svc)
		return svc;
	if (!remote && !node)
		return NULL;
	*local = !remote;
	if (v6)
		__builtin_memset(key->addr, 0, 16);
	else
		np_addr4(key->addr, 0);
	key->scope = AXON_LB_SCOPE_NODEPORT;
	svc = bpf_map_lookup_elem(&axon_np_svc, key);
	if (svc || remote)
		return svc;
	key->scope = AXON_LB_SCOPE_HOSTPORT;
	return bpf_map_lookup_elem(&axon_np_svc, key);
}

/* np_usable: backend b may take a new flow of frontend svc (backend.h). */
AXON_INLINE int np_usable(const struct np_backend *b, const struct np_svc_val *svc)
{
	return backend_usable(b, svc);
}

/* np_random picks a random Active backend, else a random Terminating one. */
AXON_INLINE __u32 np_random(struct np_svc_key *key, const struct np_svc_val *svc)
{
	struct np_svc_val *slot;
	__u32 n = svc->active, first = 1, id;

	if (n == 0) {
		n = svc->terminating;
		first = 1 + svc->active;
	}
	if (n == 0)
		return 0;
	key->slot = first + bpf_get_prandom_u32() % n;
	slot = bpf_map_lookup_elem(&axon_np_svc, key);
	key->slot = 0;
	id = slot ? slot->id : 0;
	return id;
}

/* np_select chooses the backend of a new flow into be: the affine one
 * while fresh and usable, else the Maglev slot's, else a random one. */
AXON_INLINE __u32 np_select(struct np_svc_key *key, const struct np_svc_val *svc,
			    const struct np_tuple *t, __u64 now, struct np_backend *be)
{
	struct np_aff_key akey = {};
	struct np_aff_val *aff, aval = {};
	struct np_backend *b;
	__u32 id = 0;

	if (svc->flags & NP_F_AFFINITY) {
		__builtin_memcpy(akey.addr, t->saddr, 16);
		akey.frontend_id = svc->id;
		aff = bpf_map_lookup_elem(&axon_np_aff, &akey);
		if (aff && now - aff->last_used <= (__u64)svc->affinity_timeout * 1000000000ULL) {
			id = aff->backend_id;
			b = bpf_map_lookup_elem(&axon_np_be, &id);
			if (b && np_usable(b, svc)) {
				__builtin_memcpy(be, b, sizeof(*be));
				if (!cfg_dry_run)
					aff->last_used = now;
				return id;
			}
		}
	}
	id = 0;
	if (svc->flags & NP_F_MAGLEV) {
		id = maglev_pick(svc->id, t);
		b = id ? bpf_map_lookup_elem(&axon_np_be, &id) : NULL;
		if (!b || !np_usable(b, svc))
			id = 0;
	}
	if (!id)
		id = np_random(key, svc);
	if (!id)
		return 0;
	b = bpf_map_lookup_elem(&axon_np_be, &id);
	if (!b || b->frontend_id != svc->id || b->state == AXON_LB_QUARANTINED)
		return 0;
	__builtin_memcpy(be, b, sizeof(*be));
	if ((svc->flags & NP_F_AFFINITY) && !cfg_dry_run) {
		__builtin_memcpy(akey.addr, t->saddr, 16);
		akey.frontend_id = svc->id;
		aval.backend_id = id;
		aval.last_used = now;
		bpf_map_update_elem(&axon_np_aff, &akey, &aval, BPF_ANY);
	}
	return id;
}

/* np_to_local_pod: addr (np_tuple form) is inside this node's podCIDR of
 * its family (axon_np_pods). */
AXON_INLINE int np_to_local_pod(const __u8 *addr, int v6)
{
	__u32 fam = v6 ? 1 : 0, a[4];
	struct np_pod_cidr *c = bpf_map_lookup_elem(&axon_np_pods, &fam);

	if (!c || !c->set)
		return 0;
	__builtin_memcpy(a, addr, 16);
	return ((a[0] & c->mask[0]) == c->net[0]) && ((a[1] & c->mask[1]) == c->net[1]) &&
	       ((a[2] & c->mask[2]) == c->net[2]) && ((a[3] & c->mask[3]) == c->net[3]);
}

/* np_in_cluster: addr is a pod or node address of the cluster
 * (axon_np_cluster). */
AXON_INLINE int np_in_cluster(const __u8 *addr)
{
	struct np_cluster_key k = {.prefixlen = 128};

	__builtin_memcpy(k.addr, addr, 16);
	return bpf_map_lookup_elem(&axon_np_cluster, &k) != NULL;
}

/* np_src_allowed checks loadBalancerSourceRanges. */
AXON_INLINE int np_src_allowed(const struct np_svc_val *svc, const struct np_tuple *t)
{
	struct np_srcrange_key k = {};

	if (!(svc->flags & NP_F_SRC_RANGES))
		return 1;
	k.prefixlen = 32 + 128;
	k.frontend_id = svc->id;
	__builtin_memcpy(k.addr, t->saddr, 16);
	return bpf_map_lookup_elem(&axon_np_srcrange, &k) != NULL;
}

/* np_snat_addr: the source address of an SNAT flow to t's frontend: the
 * node address the client used, else the configured node address. A
 * frontend address that is the configured one (a NodePort on the node's
 * first address: the common case) is the answer either way, without the
 * axon_np_local lookup. */
AXON_INLINE int np_snat_addr(const struct np_tuple *t, int v6, __u8 *out)
{
	const __u32 *d = (const __u32 *)t->daddr;

	if (!v6 && cfg_snat_v4 && d[3] == cfg_snat_v4) {
		np_addr4(out, cfg_snat_v4);
		return 0;
	}
	if (v6 && !np_addr_zero(t->daddr, 1) && d[0] == cfg_snat_v6[0] && d[1] == cfg_snat_v6[1] &&
	    d[2] == cfg_snat_v6[2] && d[3] == cfg_snat_v6[3]) {
		__builtin_memcpy(out, t->daddr, 16);
		return 0;
	}
	if (bpf_map_lookup_elem(&axon_np_local, t->daddr)) {
		__builtin_memcpy(out, t->daddr, 16);
		return 0;
	}
	if (v6) {
		__u32 *w = (__u32 *)out;

		w[0] = cfg_snat_v6[0]; /* volatile reads: the value is set at load */
		w[1] = cfg_snat_v6[1];
		w[2] = cfg_snat_v6[2];
		w[3] = cfg_snat_v6[3];
		return np_addr_zero(out, 1) ? -1 : 0;
	}
	np_addr4(out, cfg_snat_v4);
	return cfg_snat_v4 ? 0 : -1;
}

/* np_explain_set records the dry-run decision. */
AXON_INLINE void np_explain_set(enum np_reason r, const struct np_ct *ct, int hit)
{
	__u32 zero = 0;
	struct np_explain *e;

	if (!cfg_dry_run)
		return;
	e = bpf_map_lookup_elem(&axon_np_explain, &zero);
	if (!e)
		return;
	__builtin_memset(e, 0, sizeof(*e));
	e->reason = r;
	e->ct_hit = hit;
	if (ct) {
		e->frontend_id = ct->frontend_id;
		e->backend_id = ct->backend_id;
		__builtin_memcpy(e->be_addr, ct->be_addr, 16);
		e->be_port = ct->be_port;
		e->nat_port = ct->nat_port;
		e->ct_flags = ct->flags;
	}
}

/* np_forward translates and sends a packet of a known flow (ct), in the
 * client -> frontend direction. */
AXON_INLINE int np_forward(axon_ctx_t *ctx, struct np_pkt *p, const struct np_ct *ct,
			   enum np_hook hook, int hit)
{
	struct np_scratch *sc = np_scratch();
	struct bpf_fib_lookup *fp;
	struct np_tuple n;
	__u8 src[16];
	long rc = 0;
	int verdict;

	if (!sc)
		return CTX_DROP;
	fp = &sc->fp;

	__builtin_memcpy(&n, &p->t, sizeof(n));
	__builtin_memcpy(n.daddr, ct->be_addr, 16);
	n.dport = ct->be_port;

	if (ct->flags & NP_CT_LOCAL) {
		np_explain_set(NP_DNAT_LOCAL, ct, hit);
		if (np_rewrite(ctx, p, &n, 0)) {
			return np_drop(ctx, hook, NP_REWRITE_FAIL);
		}
		np_count(hook, NP_DNAT_LOCAL);
		return CTX_NEXT;
	}
	if (p->ttl <= 1) {
		np_explain_set(NP_TTL, ct, hit);
		np_count(hook, NP_TTL);
		return CTX_PASS;
	}
	if (ct->flags & NP_CT_DSR) {
		if (np_dsr_too_big(ctx, p)) {
			np_explain_set(NP_DSR_TOO_BIG, ct, hit);
			return NP_RET_TOO_BIG; /* np_ingress answers: np_reply_too_big's frame off this chain */
		}
		np_explain_set(NP_DSR_ENCAP, ct, hit);
		if (np_snat_addr(&p->t, p->v6, src)) {
			return np_drop(ctx, hook, NP_DROP_NO_SNAT_ADDR);
		}
		if (np_route(ctx, p->v6, src, ct->be_addr, fp, &ct->nh, &p->t, hook, &rc, &verdict))
			return verdict;
		if (p->v6 ? dsr_encap6(ctx, src, ct->be_addr) : dsr_encap4(ctx, np_v4(src), np_v4(ct->be_addr))) {
			return np_drop(ctx, hook, NP_REWRITE_FAIL);
		}
		return np_transmit(ctx, rc, fp, hook, NP_DSR_ENCAP);
	}
	/* SNAT */
	np_explain_set(NP_SNAT_FWD, ct, hit);
	if (np_snat_addr(&p->t, p->v6, src)) {
		return np_drop(ctx, hook, NP_DROP_NO_SNAT_ADDR);
	}
	__builtin_memcpy(n.saddr, src, 16);
	n.sport = ct->nat_port;
	if (np_route(ctx, p->v6, n.saddr, n.daddr, fp, &ct->nh, &p->t, hook, &rc, &verdict))
		return verdict;
	if (np_rewrite(ctx, p, &n, 1)) {
		return np_drop(ctx, hook, NP_REWRITE_FAIL);
	}
	return np_transmit(ctx, rc, fp, hook, NP_SNAT_FWD);
}

/* np_ct_promote moves the unreplied flow k (axon_np_ct_new) to the
 * established table axon_np_ct: its first reply was seen. */
AXON_INLINE void np_ct_promote(const struct np_tuple *k, enum np_hook hook)
{
	struct np_ct *v;

	if (cfg_dry_run)
		return;
	v = bpf_map_lookup_elem(&axon_np_ct_new, k);
	if (!v)
		return;
	if (bpf_map_update_elem(&axon_np_ct, k, v, BPF_ANY)) {
		np_count(hook, NP_CT_INSERT_FAIL);
		return;
	}
	bpf_map_delete_elem(&axon_np_ct_new, k);
	np_count(hook, NP_CT_ESTABLISHED);
}

/* np_promote_nat: a reply passed the reverse entry nat of a flow that is
 * not established yet (NP_NAT_UNREPLIED): a UDP flow is established now, a
 * TCP flow is marked NP_CT_REPLIED (the client's ACK establishes it,
 * np_establish). Not inlined, and its key in the per-CPU scratch: it runs
 * inside the programs' deepest call chains, whose frames add up to the
 * 512-byte limit. */
static __noinline void np_promote_nat(struct np_nat *nat, __u8 proto, enum np_hook hook)
{
	struct np_scratch *s = np_scratch();
	struct np_ct *v;

	if (cfg_dry_run || !s)
		return;
	np_nat_ct_key(nat, proto, &s->key);
	if (proto == AXON_IPPROTO_TCP) {
		v = bpf_map_lookup_elem(&axon_np_ct_new, &s->key);
		if (v && !(v->flags & NP_CT_REPLIED))
			v->flags |= NP_CT_REPLIED;
		return;
	}
	nat->flags &= ~NP_NAT_UNREPLIED;
	np_ct_promote(&s->key, hook);
}

/* np_reverse sends a reply of an SNAT flow back to the client. */
AXON_INLINE int np_reverse(axon_ctx_t *ctx, struct np_pkt *p, struct np_nat *nat, enum np_hook hook)
{
	struct np_scratch *sc = np_scratch();
	struct bpf_fib_lookup *fp;
	struct np_tuple n;
	__u64 now;
	long rc = 0;
	int verdict;

	if (!sc)
		return CTX_DROP;
	fp = &sc->fp;

	__builtin_memcpy(&n, &p->t, sizeof(n));
	__builtin_memcpy(n.saddr, nat->saddr, 16);
	__builtin_memcpy(n.daddr, nat->daddr, 16);
	n.sport = nat->sport;
	n.dport = nat->dport;
	if (p->ttl <= 1) {
		np_count(hook, NP_TTL);
		return CTX_PASS;
	}
	if (!cfg_dry_run) {
		now = np_now();
		if (now - nat->last_seen > cfg_ct_refresh_ns)
			nat->last_seen = now;
		if (nat->flags & NP_NAT_UNREPLIED)
			np_promote_nat(nat, p->t.proto, hook);
	}
	if (np_route(ctx, p->v6, n.saddr, n.daddr, fp, NULL, NULL, hook, &rc, &verdict))
		return verdict;
	if (np_rewrite(ctx, p, &n, 1)) {
		return np_drop(ctx, hook, NP_REWRITE_FAIL);
	}
	return np_transmit(ctx, rc, fp, hook, NP_REV_NAT);
}

/* np_snat_insert inserts the reservation natp under the reply key rkp
 * (rkp->dport: the candidate port) with BPF_NOEXIST. 0: reserved; 1: the
 * key exists (the port is taken for this backend), *oldp its entry; -1:
 * not inserted and no entry either: the map is full (or the insert failed
 * otherwise, or GC removed the entry in between: the SYN is retransmitted):
 * no port anywhere.
 *
 * The error code of a failed insert is deliberately not looked at: on
 * kernels before 6.4 the verifier turns bpf_map_update_elem into a direct
 * call of the map's map_update_elem, declared int (commit d7ba4cc900bf
 * "bpf: return long from bpf_map_ops funcs" made it long), so the program's
 * 64-bit r0 holds -EEXIST as 0xffffffef without sign extension, not -17:
 * on 6.1 every collision compared as "map full". Only the low 32 bits of the result are
 * defined there, hence the (int) before the test for 0, and whether the key
 * is present is asked of the map itself. */
AXON_INLINE int np_snat_insert(struct np_tuple *rkp, struct np_nat *natp, struct np_nat **oldp)
{
	struct np_nat *old;

	if ((int)bpf_map_update_elem(&axon_np_nat, rkp, natp, BPF_NOEXIST) == 0)
		return 0;
	old = bpf_map_lookup_elem(&axon_np_nat, rkp);
	if (!old)
		return -1;
	*oldp = old;
	return 1;
}

/* np_nat_stale: v is the SNAT reservation of a flow that was never
 * answered and is no longer tracked (evicted from axon_np_ct_new by newer
 * flows): nobody will use its port, a new flow may take it over. Without
 * this a SYN flood would hold every SNAT port of a backend until GC. A
 * global function: the verifier checks it once, not in each of the SNAT
 * port search's iterations (np_snat_port), which made that loop three
 * times as costly to verify. Its CT key lives in the per-CPU scratch, not
 * on the stack: called from the SNAT port search inside the programs'
 * deepest call chains, 40 more bytes of stack went past the 512-byte limit
 * of a chain (the north-south LB with pod delivery). */
__noinline int np_nat_stale(const struct np_nat *v, __u32 proto)
{
	struct np_scratch *s = np_scratch();

	if (!v || !s || !(v->flags & NP_NAT_UNREPLIED))
		return 0;
	np_nat_ct_key(v, proto, &s->key);
	return !bpf_map_lookup_elem(&axon_np_ct_new, &s->key) && !bpf_map_lookup_elem(&axon_np_ct, &s->key);
}


/* np_snat_reuse takes over the reservation old (under rkp) when it is
 * stale (np_nat_stale: its flow was never answered and is no longer
 * tracked). 0: taken over; 1: not. */
AXON_INLINE int np_snat_reuse(struct np_nat *old, struct np_tuple *rkp, struct np_nat *natp, enum np_hook hook)
{
	if (!old || !np_nat_stale(old, rkp->proto) || (int)bpf_map_update_elem(&axon_np_nat, rkp, natp, BPF_EXIST) != 0)
		return 1;
	np_count(hook, NP_SNAT_PORT_REUSED);
	return 0;
}

/* np_snat_try reserves port for the reply key rkp (np_snat_insert), or
 * takes over the entry if it is t's own old reservation (np_nat_mine).
 * 0: reserved; 1: taken or outside the range; -1: the map is full (no port
 * anywhere). */
AXON_INLINE int np_snat_try(const struct np_tuple *t, struct np_tuple *rkp, struct np_nat *natp, __u16 port,
				enum np_hook hook)
{
	struct np_nat *old = NULL;
	int rc;

	if (port < cfg_snat_port_min || port > cfg_snat_port_max)
		return 1;
	rkp->dport = bpf_htons(port);
	rc = np_snat_insert(rkp, natp, &old);
	if (rc <= 0)
		return rc;
	/* (int): as in np_snat_insert, only the low 32 bits are defined < 6.4 */
	if (old && np_nat_mine(old, t) && (int)bpf_map_update_elem(&axon_np_nat, rkp, natp, BPF_EXIST) == 0)
		return 0;
	return np_snat_reuse(old, rkp, natp, hook);
}

/* np_snat_port reserves the SNAT source port of a new flow t -> backend
 * (rkp: the reply key with the backend and the SNAT address filled in;
 * natp: the reverse entry). Candidates in order: prev_port (the port of the
 * same client tuple's previous, closing flow to the same backend), the
 * client's own port when it is inside the range (as nf_nat keeps it), the
 * flow hash (these three may be t's own old reservation, taken over), then
 * consecutive ports from a random start (as nf_nat searches; a pool smaller
 * than the tries is searched whole), NP_SNAT_TRIES in all, each inserted with BPF_NOEXIST
 * (a taken port whose flow was never answered and is no longer tracked is
 * taken over: np_snat_reuse)
 * (unique per SNAT address, backend address:port and protocol); a taken
 * port moves on to the next candidate, a full map ends the search. Returns
 * 0 with rkp->dport set, or NP_SNAT_NO_PORT (pool or map full: the packet
 * is dropped, a TCP client retransmits its SYN). */
AXON_INLINE int np_snat_port(const struct np_tuple *t, struct np_tuple *rkp, struct np_nat *natp,
			     __u16 prev_port, enum np_hook hook)
{
	__u32 span = (__u32)cfg_snat_port_max - cfg_snat_port_min + 1;
	struct np_nat *old;
	__u32 start;
	int i, rc;

	if (cfg_snat_port_max < cfg_snat_port_min)
		return NP_SNAT_NO_PORT;
	if (prev_port) {
		rc = np_snat_try(t, rkp, natp, prev_port, hook);
		if (rc <= 0)
			return rc ? NP_SNAT_NO_PORT : 0;
	}
	rc = np_snat_try(t, rkp, natp, bpf_ntohs(t->sport), hook);
	if (rc <= 0)
		return rc ? NP_SNAT_NO_PORT : 0;
	rc = np_snat_try(t, rkp, natp, cfg_snat_port_min + np_hash_tuple(t) % span, hook);
	if (rc <= 0)
		return rc ? NP_SNAT_NO_PORT : 0;
	start = bpf_get_prandom_u32();
	for (i = 3; i < NP_SNAT_TRIES; i++) {
		rkp->dport = bpf_htons(cfg_snat_port_min + (start + i) % span);
		old = NULL;
		rc = np_snat_insert(rkp, natp, &old);
		if (rc <= 0)
			return rc ? NP_SNAT_NO_PORT : 0; /* reserved, or map full */
		if (!np_snat_reuse(old, rkp, natp, hook))
			return 0;
	}
	return NP_SNAT_NO_PORT;
}

/* np_new_flow sets up a new flow of frontend svc: backend, CT entry (in
 * axon_np_ct_new: not answered yet) and reverse entry (NP_NAT_UNREPLIED).
 * prev is the flow's closing CT entry a SYN reopens (NULL if none): its
 * SNAT port is tried first when the same backend is chosen; prev_est: prev
 * is in axon_np_ct, where it is removed (the new flow is unreplied again).
 * Returns 0 with ct filled, or a verdict (> 0 reason) to drop. */
AXON_INLINE int np_new_flow(struct np_pkt *p, struct np_svc_key *key, const struct np_svc_val *found,
			    struct np_ct *ct, __u64 now, enum np_hook hook, const struct np_ct *prev, int prev_est)
{
	struct np_scratch *sc = np_scratch();
	struct np_svc_val svc;
	struct np_backend be;
	struct np_nat *natp;
	struct np_tuple *rkp;
	__u16 prev_port = 0;
	__u32 id;

	if (!sc)
		return NP_REWRITE_FAIL;
	natp = &sc->nat;
	rkp = &sc->rk;
	__builtin_memset(natp, 0, sizeof(*natp));
	__builtin_memset(rkp, 0, sizeof(*rkp));

	__builtin_memcpy(&svc, found, sizeof(svc));
	if (!np_src_allowed(&svc, &p->t))
		return NP_DROP_SRC_RANGE;
	if (!CTX_IS_XDP && p->dsr_be) {
		/* the forwarding node's LB chose this pod (np_dsr_accept) */
		struct np_backend *b;

		id = p->dsr_be;
		b = bpf_map_lookup_elem(&axon_np_be, &id);
		if (!b || b->frontend_id != svc.id || !(b->flags & NP_BE_F_LOCAL))
			return NP_DROP_NO_BACKEND;
		__builtin_memcpy(&be, b, sizeof(be));
	} else {
		id = np_select(key, &svc, &p->t, now, &be);
	}
	if (!id)
		return NP_DROP_NO_BACKEND;
	/* prev (a CT map value, unchanged until the CT update below): the same
	 * backend means the same reply key, so its port comes first */
	if (prev && (prev->flags & NP_CT_SNAT) && prev->be_port == be.port && np_addr_eq(prev->be_addr, be.addr))
		prev_port = bpf_ntohs(prev->nat_port);
	__builtin_memset(ct, 0, sizeof(*ct));
	__builtin_memcpy(ct->be_addr, be.addr, 16);
	ct->be_port = be.port;
	ct->backend_id = id;
	ct->frontend_id = svc.id;
	ct->last_seen = now;
	ct->created = now;
	if (be.flags & NP_BE_F_LOCAL)
		ct->flags = CTX_IS_XDP ? NP_CT_LOCAL | NP_CT_XDP : NP_CT_LOCAL;
	else if (svc.flags & NP_F_LOCAL_ONLY)
		return NP_DROP_NOT_LOCAL;
	else if ((svc.flags & NP_F_DSR) && !np_in_cluster(p->t.saddr))
		ct->flags = NP_CT_DSR;
	else
		ct->flags = NP_CT_SNAT;
	if (cfg_dry_run) {
		if (ct->flags & NP_CT_SNAT)
			ct->nat_port = bpf_htons(cfg_snat_port_min);
		return 0;
	}

	/* reverse entry */
	__builtin_memcpy(natp->saddr, p->t.daddr, 16);
	__builtin_memcpy(natp->daddr, p->t.saddr, 16);
	natp->sport = p->t.dport;
	natp->dport = p->t.sport;
	natp->frontend_id = svc.id;
	natp->last_seen = now;
	natp->flags = NP_NAT_UNREPLIED;
	__builtin_memcpy(rkp->saddr, be.addr, 16);
	rkp->sport = be.port;
	rkp->proto = p->t.proto;
	if (ct->flags & NP_CT_LOCAL) {
		natp->flags |= NP_NAT_LOCAL;
		if (!CTX_IS_XDP && p->dsr_be)
			natp->flags |= NP_NAT_DSR;
		__builtin_memcpy(rkp->daddr, p->t.saddr, 16);
		rkp->dport = p->t.sport;
		/* without it the replies would leave with the pod's address;
		 * (int): only the low 32 bits are defined before 6.4 (np_snat_insert) */
		if ((int)bpf_map_update_elem(&axon_np_nat, rkp, natp, BPF_ANY) != 0)
			return NP_NAT_FULL;
	} else if (ct->flags & NP_CT_SNAT) {
		if (np_snat_addr(&p->t, p->v6, rkp->daddr))
			return NP_DROP_NO_SNAT_ADDR;
		natp->flags |= NP_NAT_SNAT;
		if (np_snat_port(&p->t, rkp, natp, prev_port, hook))
			return NP_SNAT_NO_PORT;
		ct->nat_port = rkp->dport;
	}
	if (bpf_map_update_elem(&axon_np_ct_new, &p->t, ct, BPF_ANY)) {
		np_count(hook, NP_CT_INSERT_FAIL);
		return 0;
	}
	if (prev_est)
		bpf_map_delete_elem(&axon_np_ct, &p->t);
	np_count(hook, NP_CT_NEW);
	return 0;
}

/* np_rev_key is the reverse (NAT) key of flow ct of packet p (client ->
 * frontend): the backend's reply to the SNAT port or to the client. -1: no
 * SNAT address. */
AXON_INLINE int np_rev_key(const struct np_ct *ct, const struct np_pkt *p, struct np_tuple *rk)
{
	__builtin_memset(rk, 0, sizeof(*rk));
	__builtin_memcpy(rk->saddr, ct->be_addr, 16);
	rk->sport = ct->be_port;
	rk->proto = p->t.proto;
	if (ct->flags & NP_CT_SNAT) {
		if (np_snat_addr(&p->t, p->v6, rk->daddr))
			return -1;
		rk->dport = ct->nat_port;
	} else {
		__builtin_memcpy(rk->daddr, p->t.saddr, 16);
		rk->dport = p->t.sport;
	}
	return 0;
}

/* np_establish: p (client -> frontend) makes its unreplied flow v
 * (axon_np_ct_new) established: moved to axon_np_ct, its reverse entry no
 * longer NP_NAT_UNREPLIED. Not inlined, its key in the per-CPU scratch (as
 * np_promote_nat); once per flow. */
static __noinline void np_establish(const struct np_ct *v, const struct np_pkt *p, enum np_hook hook)
{
	struct np_scratch *s = np_scratch();
	struct np_nat *nat;

	if (cfg_dry_run || !s)
		return;
	if ((v->flags & (NP_CT_SNAT | NP_CT_LOCAL)) && !np_rev_key(v, p, &s->key)) {
		nat = bpf_map_lookup_elem(&axon_np_nat, &s->key);
		if (nat)
			nat->flags &= ~NP_NAT_UNREPLIED;
	}
	np_ct_promote(&p->t, hook);
}

/* np_ct_touch refreshes a CT hit lazily and notes TCP FIN/RST; unreplied:
 * the entry is in axon_np_ct_new (a reverse entry it re-creates says so). */
AXON_INLINE void np_ct_touch(struct np_ct *ct, const struct np_pkt *p, __u64 now, int unreplied)
{
	if (cfg_dry_run)
		return;
	/* NP_CT_XDP says where this packet is DNATed to its local pod */
	if ((ct->flags & NP_CT_LOCAL) && !(ct->flags & NP_CT_XDP) != !CTX_IS_XDP)
		ct->flags ^= NP_CT_XDP;
	if (now - ct->last_seen > cfg_ct_refresh_ns) {
		ct->last_seen = now;
		if (ct->flags & (NP_CT_SNAT | NP_CT_LOCAL)) {
			/* keep the reverse entry alive with its flow */
			struct np_tuple rk;
			struct np_nat *nat;

			if (np_rev_key(ct, p, &rk))
				return;
			nat = bpf_map_lookup_elem(&axon_np_nat, &rk);
			if (nat) {
				nat->last_seen = now;
			} else {
				struct np_nat nv = {};

				__builtin_memcpy(nv.saddr, p->t.daddr, 16);
				__builtin_memcpy(nv.daddr, p->t.saddr, 16);
				nv.sport = p->t.dport;
				nv.dport = p->t.sport;
				nv.frontend_id = ct->frontend_id;
				nv.flags = (ct->flags & NP_CT_SNAT) ? NP_NAT_SNAT : NP_NAT_LOCAL;
				if (unreplied)
					nv.flags |= NP_NAT_UNREPLIED;
				nv.last_seen = now;
				/* NOEXIST: never take over a port another flow reserved
				 * after this one's entry was removed */
				bpf_map_update_elem(&axon_np_nat, &rk, &nv, BPF_NOEXIST);
			}
		}
	}
	if ((p->tcp_flags & (NP_TCP_FIN | NP_TCP_RST)) && !(ct->flags & NP_CT_CLOSING))
		ct->flags |= NP_CT_CLOSING;
}

#include "icmp_err.h"

/* np_reopens: p is a SYN (without FIN or RST) for the closing flow ct: a
 * new flow of the same tuple (the client reused its port), which selects
 * its backend again. */
AXON_INLINE int np_reopens(const struct np_ct *ct, const struct np_pkt *p)
{
	return (ct->flags & NP_CT_CLOSING) && (p->tcp_flags & (NP_TCP_SYN | NP_TCP_FIN | NP_TCP_RST)) == NP_TCP_SYN;
}

/* np_ingress_l4: a TCP/UDP packet at the uplink ingress (not inlined: its
 * own stack frame). */
static __noinline int np_ingress_l4(axon_ctx_t *ctx, struct np_pkt *pp, enum np_hook hook)
{
	struct np_scratch *sc = np_scratch();
	struct np_svc_key key;
	struct np_svc_val *svc;
	struct np_ct *ctp, *ct, *newp;
	struct np_nat *nat;
	__u64 now;
	int rc, local = 0, node, hit = 1, dsr_req = !CTX_IS_XDP && pp->dsr_be;

	if (!sc)
		return CTX_NEXT;
	ct = &sc->ct;

	if (np_parse_ports(ctx, pp)) {
		np_count(hook, NP_MALFORMED);
		return CTX_NEXT;
	}
	now = np_now();
	ctp = bpf_map_lookup_elem(&axon_np_ct, &pp->t);
	/* a DSR request only ever continues a local DNAT here (never forwards on) */
	if (dsr_req && ctp && (!(ctp->flags & NP_CT_LOCAL) || ctp->backend_id != pp->dsr_be))
		ctp = NULL;
	if (ctp && !np_reopens(ctp, pp)) {
		np_ct_touch(ctp, pp, now, 0);
		__builtin_memcpy(ct, ctp, sizeof(*ct));
		goto hit;
	}
	/* replies of SNAT flows are addressed to a node address (axon_np_local);
	 * they are looked up before the frontends, so an SNAT port that is also
	 * a NodePort or hostPort can never be taken for a new flow */
	node = bpf_map_lookup_elem(&axon_np_local, pp->t.daddr) != NULL;
	if (node) {
		nat = bpf_map_lookup_elem(&axon_np_nat, &pp->t);
		if (nat && (nat->flags & NP_NAT_SNAT))
			return np_reverse(ctx, pp, nat, hook);
	}
	svc = np_lookup_svc(&pp->t, pp->v6, &key, &local, dsr_req, node);
	if (svc && !ctp) {
		/* a flow not answered yet (only looked up for a frontend's
		 * packets: other traffic pays nothing for it) */
		newp = bpf_map_lookup_elem(&axon_np_ct_new, &pp->t);
		if (dsr_req && newp && (!(newp->flags & NP_CT_LOCAL) || newp->backend_id != pp->dsr_be))
			newp = NULL;
		if (newp && !np_reopens(newp, pp)) {
			np_ct_touch(newp, pp, now, 1);
			__builtin_memcpy(ct, newp, sizeof(*ct));
			/* the client's packet after its SYN, once the backend
			 * answered (DSR: its replies go direct, this packet
			 * stands for both) */
			if (!(pp->tcp_flags & NP_TCP_SYN) &&
			    ((ct->flags & NP_CT_DSR) || (pp->t.proto == AXON_IPPROTO_TCP && (ct->flags & NP_CT_REPLIED))))
				np_establish(newp, pp, hook);
			goto hit;
		}
		if (newp) {
			rc = np_new_flow(pp, &key, svc, ct, now, hook, newp, 0);
			goto opened;
		}
	}
	if (svc && !np_may_open(pp) && !dsr_req && !(svc->flags & NP_F_MAGLEV)) {
		/* no flow of ours (never seen, expired, or from before the LB,
		 * e.g. the node's own netfilter conntrack): the stack decides,
		 * which answers a NodePort without a socket with a RST. A DSR
		 * request (dsr_be) is exempt: the forwarding node's LB already
		 * chose this pod, so a backend node that lost its entry picks
		 * the flow up again. */
		np_explain_set(NP_CT_NO_SYN, NULL, 0);
		np_count(hook, NP_CT_NO_SYN);
		return CTX_NEXT;
	}
	if (svc) {
		/* a Maglev frontend picks the same backend for the tuple again
		 * (while the backend set is unchanged), so a flow whose entry
		 * was evicted or lost resumes where it was */
		if (!np_may_open(pp) && (svc->flags & NP_F_MAGLEV))
			np_count(hook, NP_CT_MAGLEV_RESUME);
		rc = np_new_flow(pp, &key, svc, ct, now, hook, ctp, ctp != NULL);
opened:
		if (rc) {
			np_explain_set(rc, NULL, 0);
			return np_drop(ctx, hook, rc);
		}
		hit = 0;
		sc->nh_keep = 0;
		goto forward;
	}
	np_explain_set(NP_NOT_SERVICE, NULL, 0);
	np_count(hook, NP_NOT_SERVICE);
	return CTX_NEXT;
hit:
	np_count(hook, NP_CT_HIT);
	sc->nh_keep = 1;
forward:
	return np_forward(ctx, pp, ct, hook, hit);
}

/* np_dsr_accept is the backend side of DSR (tc only: XDP passes IP-in-IP
 * up to it). p is an IPIP (IPv4 in IPv4) or IPv6-in-IPv6 packet. It is a
 * DSR request of another node's LB when its outer destination is a pod on
 * this node that backs the inner packet's frontend (axon_np_dsr), or, for a
 * running flow, when the inner tuple's CT entry is a local DNAT to that pod
 * (established flows do not depend on axon_np_dsr). Inner fragments count
 * too (a client that learnt the path MTU from np_reply_too_big fragments
 * its datagrams): a later fragment finds its ports in axon_np_frag, where
 * the first one was recorded after its decapsulation (frag.h). So does an
 * ICMP error the LB forwarded about a reply of a local DNAT flow to that
 * pod (icmp_err.h, b): found by the CT entry of the flow it quotes. Anything
 * else (another tunnel, a pod's own IPIP traffic) is left as it is. A
 * request has its outer header removed and p parsed again as the inner
 * packet, p->dsr_be set to the backend: np_ingress_l4 then DNATs it like a
 * packet that came to this node's own frontend (np_icmp_error translates
 * the error), and its reverse entry gives the replies the frontend as
 * source at the uplink egress (np_egress), straight to the client.
 * 0: decapsulated; 1: not a DSR request, untouched; -1: drop. */
static __noinline int np_dsr_accept(axon_ctx_t *ctx, struct np_pkt *p)
{
	struct np_pkt in = {};
	struct np_dsr_key dk = {};
	struct np_svc_key key;
	struct np_svc_val *svc;
	struct np_tuple it;
	struct np_ct *ct;
	__u32 be_id = 0, *idp, inner_off, inner_l4;
	int local = 0;

	if (p->frag)
		return 1;
	if (p->v6 ? (p->t.proto != AXON_IPPROTO_IPV6 || p->l4_off != ETH_HLEN + sizeof(struct ipv6hdr))
		  : (p->t.proto != AXON_IPPROTO_IPIP || p->l4_off != ETH_HLEN + sizeof(struct iphdr)))
		return 1;
	if (np_parse_ip(ctx, &in, p->l4_off, p->v6))
		return 1;
	if (in.t.proto == AXON_IPPROTO_ICMP || in.t.proto == AXON_IPPROTO_ICMPV6) {
		/* an error about a reply (frontend -> client) of a flow that
		 * is a local DNAT to this pod */
		if (in.frag || np_icmp_quoted(ctx, &in, &it, &inner_off, &inner_l4))
			return 1;
		np_tuple_swap(&in.t, &it); /* the flow's CT key; in is not needed after */
		ct = np_ct_any(&in.t);
		if (!ct || !(ct->flags & NP_CT_LOCAL) || !np_addr_eq(ct->be_addr, p->t.daddr))
			return 1;
		goto decap;
	}
	if (in.t.proto != AXON_IPPROTO_TCP && in.t.proto != AXON_IPPROTO_UDP)
		return 1;
	if (in.frag ? np_frag_ports(ctx, &in) : np_parse_ports(ctx, &in))
		return 1;
	ct = np_ct_any(&in.t);
	if (ct && (ct->flags & NP_CT_LOCAL) && np_addr_eq(ct->be_addr, p->t.daddr)) {
		be_id = ct->backend_id;
	} else {
		if (in.frag == AXON_FRAG_LATER)
			return 1; /* the first fragment made the CT entry, or was not ours */
		svc = np_lookup_svc(&in.t, in.v6, &key, &local, 1, 0);
		if (!svc)
			return 1;
		dk.frontend_id = svc->id;
		__builtin_memcpy(dk.addr, p->t.daddr, 16);
		idp = bpf_map_lookup_elem(&axon_np_dsr, &dk);
		if (!idp)
			return 1;
		be_id = *idp;
	}
decap:
	if (dsr_decap(ctx) <= 0)
		return -1;
	__builtin_memset(p, 0, sizeof(*p));
	if (np_parse_l3(ctx, p))
		return -1;
	p->dsr_be = be_id;
	return 0;
}

/* np_direct_reuse: p (TCP or UDP, not a later fragment) arrived addressed
 * to a pod of this node itself, not to a frontend. When a local DNAT flow
 * (NodePort, LoadBalancer, externalIP) has the same reply tuple, the client
 * now reaches that pod directly with the old flow's ports: a client node's
 * socket LB connects to backends directly, and its new socket may get the
 * port of a socket that went through a NodePort before. The old flow's
 * reverse entry would give the new flow's replies the old frontend as
 * source (np_egress), so the old flow's entries go. UDP: any datagram (a
 * client cannot hold both sockets on one port at once); TCP: a SYN, once
 * the old flow is closing or gone (while it is open the pod refuses a SYN
 * of its tuple anyway, and the old flow keeps working). At tc after XDP,
 * the packet XDP just DNATed (NP_CT_XDP) is not a reuse. Costs one lookup
 * per UDP datagram and TCP SYN to a local pod; not inlined (its own
 * frame). */
static __noinline void np_direct_reuse(axon_ctx_t *ctx, struct np_pkt *p, enum np_hook hook)
{
	struct np_scratch *s = np_scratch();
	struct np_nat *nat;
	struct np_ct *ct;

	if (cfg_dry_run || !s || p->frag == AXON_FRAG_LATER || np_parse_ports(ctx, p))
		return;
	if (p->t.proto == AXON_IPPROTO_TCP &&
	    (p->tcp_flags & (NP_TCP_SYN | NP_TCP_ACK | NP_TCP_FIN | NP_TCP_RST)) != NP_TCP_SYN)
		return;
	np_tuple_swap(&s->key, &p->t);
	nat = bpf_map_lookup_elem(&axon_np_nat, &s->key);
	if (!nat || !(nat->flags & NP_NAT_LOCAL))
		return;
	/* the old flow's CT key: client -> frontend */
	__builtin_memcpy(s->rk.saddr, p->t.saddr, 16);
	__builtin_memcpy(s->rk.daddr, nat->saddr, 16);
	s->rk.sport = p->t.sport;
	s->rk.dport = nat->sport;
	s->rk.proto = p->t.proto;
	s->rk.pad[0] = s->rk.pad[1] = s->rk.pad[2] = 0;
	ct = np_ct_any(&s->rk);
	if (ct && (ct->flags & NP_CT_LOCAL) && np_addr_eq(ct->be_addr, p->t.daddr) && ct->be_port == p->t.dport) {
		if (!CTX_IS_XDP && (ct->flags & NP_CT_XDP))
			return;
		if (p->t.proto == AXON_IPPROTO_TCP && !(ct->flags & NP_CT_CLOSING))
			return;
		bpf_map_delete_elem(&axon_np_ct, &s->rk);
		bpf_map_delete_elem(&axon_np_ct_new, &s->rk);
	}
	bpf_map_delete_elem(&axon_np_nat, &s->key);
	np_count(hook, NP_DIRECT_REUSE);
}

/* np_ingress is the whole uplink ingress path (tc and XDP). *pod (pod may
 * be NULL) is set to 1 when the packet is TCP or UDP for this node's
 * podCIDR and so no business of the LB: axon_lb_ingress then hands it to
 * its pod itself (lb_tc.c). */
AXON_INLINE int np_ingress(axon_ctx_t *ctx, enum np_hook hook, int *pod)
{
	struct np_pkt p = {};
	int rc;

	rc = np_parse_l3(ctx, &p);
	if (rc) {
		if (rc < 0)
			np_count(hook, NP_MALFORMED);
		return CTX_NEXT;
	}
	if (p.t.proto == AXON_IPPROTO_IPIP || p.t.proto == AXON_IPPROTO_IPV6) {
		/* maybe a DSR request for a local pod: tc decapsulates it */
		if (CTX_IS_XDP || cfg_dry_run) {
			np_count(hook, NP_NOT_SERVICE);
			return CTX_NEXT;
		}
		rc = np_dsr_accept(ctx, &p);
		if (rc < 0) {
			return np_drop(ctx, hook, NP_REWRITE_FAIL);
		}
		if (rc > 0) {
			np_count(hook, NP_NOT_SERVICE);
			return CTX_NEXT;
		}
		np_count(hook, NP_DSR_DECAP);
	}
	if ((p.t.proto == AXON_IPPROTO_TCP || p.t.proto == AXON_IPPROTO_UDP) && !p.dsr_be &&
	    np_to_local_pod(p.t.daddr, p.v6)) {
		/* pod traffic: no frontend can match (axon_np_pods) */
		np_count(hook, NP_NOT_SERVICE);
		np_direct_reuse(ctx, &p, hook);
		if (pod)
			*pod = 1;
		return CTX_NEXT;
	}
	if (p.frag && np_frag_track(ctx, &p, hook)) /* frag.h: ports of fragments */
		return CTX_NEXT;
	if (p.t.proto == AXON_IPPROTO_ICMP || p.t.proto == AXON_IPPROTO_ICMPV6)
		return np_icmp_error(ctx, &p, hook);
	if (p.t.proto != AXON_IPPROTO_TCP && p.t.proto != AXON_IPPROTO_UDP) {
		np_count(hook, NP_NOT_SERVICE);
		return CTX_NEXT;
	}
	rc = np_ingress_l4(ctx, &p, hook);
	if (rc == NP_RET_TOO_BIG)
		return np_reply_too_big(ctx, &p, hook);
	return rc;
}

/* np_dsr_clamp_mss lowers the MSS option of a SYN-ACK that answers a DSR
 * request to cfg_dsr_mss_v4/v6: the client's segments reach this node
 * through another node's LB, which adds an outer IP header (20 / 40
 * bytes); without the clamp a full-sized segment would not fit the wire
 * and, with no ICMP error on that path, the flow would stall. The SYN-ACK
 * goes to the client directly, so this node is the only place to do it.
 * Only an MSS in the first option slot is changed, where Linux, the BSDs
 * and Windows put it. */
AXON_INLINE void np_dsr_clamp_mss(axon_ctx_t *ctx, const struct np_pkt *p)
{
	__u16 max = p->v6 ? cfg_dsr_mss_v6 : cfg_dsr_mss_v4;
	__u8 opt[4], doff;
	__be16 old, mss;
	__s64 d;

	if (!max || p->t.proto != AXON_IPPROTO_TCP)
		return;
	if (ctx_load(ctx, p->l4_off + 12, &doff, 1) || (doff >> 4) < 6)
		return;
	if (ctx_load(ctx, p->l4_off + 20, opt, sizeof(opt)) || opt[0] != 2 || opt[1] != 4)
		return;
	__builtin_memcpy(&old, &opt[2], 2);
	if (bpf_ntohs(old) <= max)
		return;
	mss = bpf_htons(max);
	d = bpf_csum_diff((__be32 *)opt, 4, 0, 0, 0);
	__builtin_memcpy(&opt[2], &mss, 2);
	d = bpf_csum_diff(0, 0, (__be32 *)opt, 4, d);
	if (ctx_store(ctx, p->l4_off + 22, &mss, 2) || ctx_l4_csum_diff(ctx, np_l4_csum_off(p), d, 0, 0))
		np_count(NP_HOOK_EGRESS, NP_REWRITE_FAIL);
}

/* np_egress restores the frontend as source of local backends' replies
 * (tc egress of the uplink). */
AXON_INLINE int np_egress(axon_ctx_t *ctx)
{
	struct np_pkt p = {};
	struct np_tuple n;
	struct np_nat *nat;
	__u64 now;

	if (np_parse_l3(ctx, &p))
		return CTX_NEXT;
	if (p.t.proto != AXON_IPPROTO_TCP && p.t.proto != AXON_IPPROTO_UDP)
		return CTX_NEXT;
	if (p.frag && np_frag_track(ctx, &p, NP_HOOK_EGRESS)) /* frag.h: ports of fragments */
		return CTX_NEXT;
	if (np_parse_ports(ctx, &p))
		return CTX_NEXT;
	nat = bpf_map_lookup_elem(&axon_np_nat, &p.t);
	if (!nat || !(nat->flags & NP_NAT_LOCAL))
		return CTX_NEXT;
	now = np_now();
	if (now - nat->last_seen > cfg_ct_refresh_ns)
		nat->last_seen = now;
	if (nat->flags & NP_NAT_UNREPLIED)
		np_promote_nat(nat, p.t.proto, NP_HOOK_EGRESS);
	__builtin_memcpy(&n, &p.t, sizeof(n));
	__builtin_memcpy(n.saddr, nat->saddr, 16);
	n.sport = nat->sport;
	if (np_rewrite(ctx, &p, &n, 0)) {
		return np_drop(ctx, NP_HOOK_EGRESS, NP_REWRITE_FAIL);
	}
	if ((nat->flags & NP_NAT_DSR) && (p.tcp_flags & NP_TCP_SYN))
		np_dsr_clamp_mss(ctx, &p);
	np_count(NP_HOOK_EGRESS, NP_EGRESS_REV);
	return CTX_NEXT;
}

#endif /* AXON_NODEPORT_H */
