/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* common.h: constants shared by every axon BPF program.
 *
 * Only UAPI headers and libbpf's bpf_helpers.h are used (no vmlinux.h):
 * do not include <linux/icmp.h> or anything pulling <linux/if.h>, they drag in
 * glibc's 32-bit stubs when compiling for -target bpf.
 */
#ifndef AXON_COMMON_H
#define AXON_COMMON_H

#include <linux/types.h>
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/in6.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

/* Kernel and protocol numbers from headers that cannot be included for
 * -target bpf (<sys/socket.h>, <linux/in.h>, <linux/icmp.h>, <errno.h>,
 * <netinet/tcp.h>). Every program spells them so, from here only; ETH_P_*,
 * TC_ACT_*, XDP_* and BPF_* come from the UAPI headers above. */

/* Address families (struct bpf_fib_lookup, struct bpf_sock_addr). */
#define AXON_AF_INET 2
#define AXON_AF_INET6 10

/* IP protocol numbers (IPv4 protocol, IPv6 next header). */
#define AXON_IPPROTO_HOPOPTS 0   /* IPv6 hop-by-hop options header */
#define AXON_IPPROTO_ICMP 1
#define AXON_IPPROTO_IPIP 4      /* IPv4 in IPv4 (DSR, lib/dsr.h) */
#define AXON_IPPROTO_TCP 6
#define AXON_IPPROTO_UDP 17
#define AXON_IPPROTO_IPV6 41     /* IPv6 in IPv6 (DSR, lib/dsr.h) */
#define AXON_IPPROTO_FRAGMENT 44 /* IPv6 fragment header */
#define AXON_IPPROTO_ICMPV6 58
#define AXON_IPPROTO_SCTP 132

/* ICMP / ICMPv6 message types and codes (lib/icmp_err.h, lib/icmp_too_big.h). */
#define AXON_ICMP_DEST_UNREACH 3
#define AXON_ICMP_FRAG_NEEDED 4 /* code of AXON_ICMP_DEST_UNREACH: fragmentation needed and DF set */
#define AXON_ICMP_TIME_EXCEEDED 11
#define AXON_ICMP6_DEST_UNREACH 1
#define AXON_ICMP6_PKT_TOOBIG 2
#define AXON_ICMP6_TIME_EXCEED 3

/* errno values a sock_addr program returns through bpf_set_retval
 * (sock_lb.c). */
#define AXON_EADDRINUSE 98
#define AXON_ECONNREFUSED 111

/* TCP states (sk_state) a socket iterator skips (sock_destroy.c). */
#define AXON_TCP_TIME_WAIT 6
#define AXON_TCP_LISTEN 10
#define AXON_TCP_NEW_SYN_RECV 12

/* Maximum number of pod endpoints per address family on one node. */
#define AXON_MAX_ENDPOINTS 65536

/* Attach points ("directions"). The metrics map holds one row of reasons per
 * direction: index = dir * AXON_REASON_MAX + reason. Names: the members'
 * without AXON_DIR_, lower case (directionNames in internal/datapath/podpath). */
enum axon_dir {
	AXON_DIR_POD_EGRESS = 0,     /* tc ingress of a pod's host-side veth */
	AXON_DIR_UPLINK_INGRESS = 1, /* tc ingress of the node uplink */
	AXON_DIR_MAX = 2,
};

/* Why a packet got its verdict. Names: the members' without AXON_, lower
 * case (reasonNames in internal/datapath/podpath, the metric and status names). */
enum axon_reason {
	AXON_REDIRECT_PEER_LOCAL = 0, /* to a pod on this node via bpf_redirect_peer */
	AXON_REDIRECT_FIB = 1,        /* fib hit with neighbour: bpf_redirect; or a cached route (fib_cache.h): bpf_redirect_neigh */
	AXON_REDIRECT_NEIGH = 2,      /* fib hit, no neighbour yet: bpf_redirect_neigh */
	AXON_PASS_HOST_BOUND = 3,     /* fib says not forwarded (local address, no route), link-local/multicast */
	AXON_PASS_ARP_NON_IP = 4,     /* ARP and every non-IP ethertype */
	AXON_PASS_NO_ROUTE = 5,       /* fib: unreachable/blackhole/prohibit/frag needed/forwarding off/... */
	AXON_PASS_MALFORMED = 6,      /* truncated ethernet/IP header, bad IHL or version */
	AXON_PASS_TTL = 7,            /* TTL/hop limit <= 1: the stack sends ICMP time exceeded */
	AXON_PASS_NOT_LOCAL = 8,      /* uplink ingress: destination is not a local pod */
	AXON_REDIRECT_FAILED = 9,     /* a redirect helper refused the packet (passed to the stack) */
	/* Source address validation at pod egress (lib/srcguard.h): dropped. */
	AXON_DROP_SPOOF_SRC = 10,     /* IPv4/IPv6 source the pod does not own (or link-local/:: off its link) */
	AXON_DROP_SPOOF_ARP = 11,     /* ARP whose sender address the pod does not own, or not Ethernet/IPv4 ARP */
	AXON_DROP_SPOOF_ND = 12,      /* Neighbor Advertisement for an address the pod does not own; Router Advertisement, Redirect */
	AXON_DROP_L2 = 13,            /* an ethertype other than IPv4/IPv6/ARP, or a VLAN tag */
	AXON_DROP_MALFORMED = 14,     /* headers the program cannot check (truncated, or not in the linear area) */
	AXON_REDIRECT_ARP_REPLY = 15, /* the pod's ARP request for its gateway, answered back to it (lib/arp.h) */
	AXON_REASON_MAX = 16,
};

/* Why a packet was dropped (or a socket refused), one vocabulary for every
 * program: the index of axon_drops and the reason of an axon_drop_event
 * (lib/drop.h). Each program family also keeps its own verdict counters
 * (enum axon_reason, enum np_reason, the Bandwidth Manager's); a drop is
 * counted there and here. Names: "drop_" + the member's without
 * AXON_DROP_REASON_, lower case (internal/datapath/drops ReasonNames: the
 * reason label of axon_drop_count_total and of `axon monitor`). */
enum axon_drop_reason {
	AXON_DROP_REASON_SPOOF_SRC = 0,     /* pod_egress: IPv4/IPv6 source the pod does not own (lib/srcguard.h) */
	AXON_DROP_REASON_SPOOF_ARP = 1,     /* pod_egress: ARP whose sender address the pod does not own */
	AXON_DROP_REASON_SPOOF_ND = 2,      /* pod_egress: Neighbor Advertisement for an address not the pod's; RA, Redirect */
	AXON_DROP_REASON_L2 = 3,            /* pod_egress: ethertype other than IPv4/IPv6/ARP, or a VLAN tag */
	AXON_DROP_REASON_MALFORMED = 4,     /* pod_egress: headers the source guard cannot check */
	AXON_DROP_REASON_NO_BACKEND = 5,    /* LB (tc/XDP), socket LB or pod LB: a Service frontend without a usable backend */
	AXON_DROP_REASON_SRC_RANGE = 6,     /* LB: client outside loadBalancerSourceRanges */
	AXON_DROP_REASON_NOT_LOCAL = 7,     /* LB: externalTrafficPolicy Local and no backend on this node */
	AXON_DROP_REASON_NO_ROUTE = 8,      /* LB: the FIB has no way to the backend or the client */
	AXON_DROP_REASON_SNAT_NO_PORT = 9,  /* LB: no free SNAT source port for a new flow */
	AXON_DROP_REASON_NO_SNAT_ADDR = 10, /* LB: remote backend, but no node address configured for SNAT */
	AXON_DROP_REASON_NAT_FULL = 11,     /* LB: axon_np_nat full, no reverse entry for a new flow's replies */
	AXON_DROP_REASON_REWRITE_FAIL = 12, /* LB: a packet write or encapsulation failed */
	AXON_DROP_REASON_DSR_TOO_BIG = 13,  /* LB: too big once DSR-encapsulated (an ICMP answer is sent) */
	AXON_DROP_REASON_BW_HORIZON = 14,   /* uplink_egress: the Bandwidth Manager's egress limit, beyond the EDT horizon */
	AXON_DROP_REASON_BW_INGRESS = 15,   /* to a local pod over its ingress limit (Bandwidth Manager policer) */
	AXON_DROP_REASON_MAX = 16,
};

/* Direction of the hook that dropped: tc ingress and XDP (a packet coming
 * into the node from the uplink or from a pod's device) or tc egress of the
 * uplink and the socket LB (a local socket's connect/sendmsg). Names: the
 * members' without AXON_DROP_DIR_, lower case (the direction label). */
enum axon_drop_dir {
	AXON_DROP_DIR_INGRESS = 0,
	AXON_DROP_DIR_EGRESS = 1,
	AXON_DROP_DIR_MAX = 2,
};

/* The program that dropped, in an axon_drop_event. Names: the members'
 * without AXON_PROG_, lower case. */
enum axon_prog {
	AXON_PROG_POD_EGRESS = 0,     /* pod_egress.c */
	AXON_PROG_UPLINK_INGRESS = 1, /* uplink_ingress.c */
	AXON_PROG_LB_TC = 2,          /* lb_tc.c, tc ingress of the uplink */
	AXON_PROG_LB_XDP = 3,         /* lb_xdp.c */
	AXON_PROG_LB_EGRESS = 4,      /* lb_tc.c, tc egress of the uplink */
	AXON_PROG_UPLINK_EGRESS = 5,  /* uplink_egress.c (Bandwidth Manager) */
	AXON_PROG_SOCK_LB = 6,        /* sock_lb.c: a connect/sendmsg refused */
	AXON_PROG_POD_LB = 7,         /* pod_lb.c: a pod's own per-packet Service LB */
	AXON_PROG_MAX = 8,
};

/* Frontend scopes of both Service load balancers (lb_svc_key.scope in
 * lib/lb.h, np_svc_key.scope in lib/nodeport.h); the values of lb.Scope in
 * internal/lb. */
enum axon_lb_scope {
	AXON_LB_SCOPE_CLUSTER = 0,  /* exact address: ClusterIP, externalIP, LoadBalancer IP */
	AXON_LB_SCOPE_NODEPORT = 1, /* any node address (NodePort) */
	AXON_LB_SCOPE_HOSTPORT = 2, /* any node address, a pod's hostPort */
};

/* Backend states of both Service load balancers (lb_backend.state,
 * np_backend.state); the values of lb.BackendState in internal/lb. */
enum axon_lb_state {
	AXON_LB_ACTIVE = 0,      /* picked for new flows */
	AXON_LB_TERMINATING = 1, /* picked only when no backend is active */
	AXON_LB_QUARANTINED = 2, /* never picked for a new flow */
};

/* Counters of the same-node TCP bypass (sockops.c, sk_msg.c), the index of
 * axon_sockmap_metrics (lib/sockmap.h). Names: the members' without AXON_SM_,
 * lower case (metricNames in internal/datapath/sockmap, the metric and status
 * names). */
enum axon_sockmap_counter {
	AXON_SM_ADMIT_POD = 0,           /* sockops: pod <-> pod socket entered axon_sock_hash */
	AXON_SM_ADMIT_LOOPBACK = 1,      /* sockops: loopback socket of an enabled pod netns entered */
	AXON_SM_SKIP_NOT_POD = 2,        /* sockops: local or remote address is not an admitted pod */
	AXON_SM_SKIP_NETNS_MISMATCH = 3, /* sockops: local address is a pod's, the socket's netns is not that pod's */
	AXON_SM_SKIP_NOT_ENABLED = 4,    /* sockops: loopback socket of a netns not in axon_sockmap_netns */
	AXON_SM_INSERT_FAILED = 5,       /* sockops: admitted, but the map update failed (map full, key taken) */
	AXON_SM_REDIRECT_MSGS = 6,       /* sk_msg: writes moved into the peer socket */
	AXON_SM_REDIRECT_BYTES = 7,      /* sk_msg: bytes of those writes */
	AXON_SM_PASS_NO_PEER = 8,        /* sk_msg: peer not in the map: this write and all later ones go through TCP */
	AXON_SM_PASS_STICKY = 9,         /* sk_msg: the socket is in stack mode: through TCP */
	AXON_SM_PASS_BYTES = 10,         /* sk_msg: bytes of writes passed to TCP (both reasons) */
	AXON_SM_SWITCH_STACK = 11,       /* sk_msg: a bypassed socket switched to the stack (small-write rule: small writes its peer does not keep up with) */
	AXON_SM_SPLICE_REFUSED = 12,     /* sock_splice: splice(2)/sendfile(2) from a bypassed socket failed with EINVAL (the caller falls back to read/write) */
	AXON_SM_BACKPRESSURE = 13,       /* sk_msg: the peer's unread bypass bytes exceeded its sk_rcvbuf: the socket switched to the stack */
	AXON_SM_ADMIT_INTRAPOD = 14,     /* sockops: intra-pod socket (one end loopback, the other the pod's own address) entered */
	AXON_SM_ALIAS_PAIRED = 15,       /* sk_msg: a socket whose exact peer key missed found its peer by alias key (sidecar REDIRECT) */
	AXON_SM_ALIAS_COLLISION = 16,    /* sockops: two sockets claimed one alias key: poisoned, neither paired through it */
	AXON_SM_ALIAS_POISONED = 17,     /* sockops, sk_msg: an alias insert or redirect refused because its key is poisoned */
	AXON_SM_LEFT = 18,               /* sockops: a socket left axon_sock_hash (quiet, peer quiet or gone, queue empty): plain TCP from then on */
	AXON_SM_MAX = 19,
};

/* Counters of the VM-pod bridge bypass (vm_bypass.c), the index of its
 * per-pod axon_vmb_stats. "tap": frames the guest sent (tc ingress of the
 * VM's tap); "pod": frames the node sent into the pod (tc ingress of the pod
 * interface). Names: the members' without AXON_VMB_, lower case (counterNames
 * in internal/datapath/vmbypass). */
enum axon_vmb_counter {
	AXON_VMB_TAP_FRAMES = 0,     /* tap -> pod interface: frames redirected (bpf_redirect to its egress) */
	AXON_VMB_TAP_BYTES = 1,      /* bytes of those frames (skb->len, Ethernet header included) */
	AXON_VMB_POD_FRAMES = 2,     /* pod interface -> tap: frames redirected */
	AXON_VMB_POD_BYTES = 3,      /* bytes of those frames */
	AXON_VMB_TAP_TO_BRIDGE = 4,  /* tap: unicast to the bridge's own MAC (the pod's DHCP server): passed to the bridge, not redirected */
	AXON_VMB_TAP_BCAST_COPY = 5, /* tap: broadcast/multicast also delivered to the bridge itself (a clone into its ingress), e.g. a DHCP DISCOVER */
	AXON_VMB_REDIRECT_FAIL = 6,  /* a redirect or clone the helper refused (the frame then takes the bridge path) */
	AXON_VMB_MAX = 7,
};

/* Counters of a pod's per-packet Service LB (pod_lb.c), the index of its
 * per-pod axon_podlb_stats. Names: the members' without AXON_PODLB_, lower
 * case (counterNames in internal/datapath/podlb). */
enum axon_podlb_counter {
	AXON_PODLB_NEW = 0,         /* egress: a new flow to a frontend got a backend (destination rewritten) */
	AXON_PODLB_HIT = 1,         /* egress: a packet of a known flow rewritten to its backend */
	AXON_PODLB_REPLY = 2,       /* ingress: a reply given its frontend back as source */
	AXON_PODLB_RESELECT = 3,    /* egress: a known flow's backend was gone or unusable at a SYN or UDP datagram: chosen again */
	AXON_PODLB_NO_BACKEND = 4,  /* egress: a frontend without a usable backend: dropped (drop reason no_backend) */
	AXON_PODLB_UNTRACKED = 5,   /* egress: TCP without SYN to a frontend, no flow known: passed untranslated */
	AXON_PODLB_FRAGMENT = 6,    /* egress: an IP fragment to a frontend: passed untranslated */
	AXON_PODLB_CT_FAIL = 7,     /* egress: the flow could not be written to axon_podlb_ct: dropped (rewrite_fail) */
	AXON_PODLB_REWRITE_FAIL = 8, /* a header write failed: dropped (rewrite_fail) */
	AXON_PODLB_STALE_REV = 9,   /* egress: a new direct TCP connection removed a reverse entry of its tuple left by an old translated flow */
	AXON_PODLB_REV_RESTORED = 10, /* egress: a known flow's reverse entry, evicted by the LRU, written again at a SYN or UDP datagram */
	AXON_PODLB_MAX = 11,
};

/* Per-socket mode of the bypass (struct sockmap_state.mode, lib/sockmap.h). */
enum axon_sockmap_mode {
	AXON_SM_MODE_UNDECIDED = 0, /* no write yet */
	AXON_SM_MODE_BYPASS = 1,    /* the first write was redirected: later writes try the redirect too */
	AXON_SM_MODE_STACK = 2,     /* a write went through TCP: never redirect again (ordering) */
	AXON_SM_MODE_UNKNOWN = 3,   /* sockmap_iter.c: the socket has no state (not a mode of sk_msg) */
};

/* endpoint_info.flags bits (reserved; none defined yet). */
#define AXON_EP_F_NONE 0

#define AXON_INLINE static __always_inline

/* AXON_BTF_ANCHOR(name, members) defines a global that no program reads,
 * so that the enums the packages under internal/datapath mirror (names and
 * values of counters, flags, directions) are in the object's BTF even where
 * every use of them is inlined. Each package checks its tables against
 * them (enums_btf_test.go, dptest.CheckEnums). A read-only global: in .rodata, never looked
 * at by the verifier. */
#define AXON_BTF_ANCHOR(name, members) const volatile struct name members name = {}

/* axon_barrier: the compiler keeps every memory access on its side of it
 * (a compiler barrier, no CPU fence): np_ct_nh_fill in nodeport.h writes
 * a generation last so that a reader on x86 never takes it with older
 * fields; a weakly ordered CPU (arm64) may still show them out of order,
 * the one-packet race that function accepts. */
#define axon_barrier() asm volatile("" ::: "memory")

#endif /* AXON_COMMON_H */
