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

/* Address families as used by struct bpf_fib_lookup (from <sys/socket.h>,
 * which cannot be included for -target bpf). */
#define AXON_AF_INET 2
#define AXON_AF_INET6 10

/* IP protocol numbers (<linux/in.h> is not includable for -target bpf). */
#define AXON_IPPROTO_TCP 6

/* Maximum number of pod endpoints per address family on one node. */
#define AXON_MAX_ENDPOINTS 65536

/* Attach points ("directions"). The metrics map holds one row of reasons per
 * direction: index = dir * AXON_REASON_MAX + reason. Keep in sync with
 * internal/datapath/metrics.go. */
enum axon_dir {
	AXON_DIR_POD_EGRESS = 0,     /* tc ingress of a pod's host-side veth */
	AXON_DIR_UPLINK_INGRESS = 1, /* tc ingress of the node uplink */
	AXON_DIR_MAX = 2,
};

/* Why a packet got its verdict. Names in internal/datapath/metrics.go. */
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
	AXON_REASON_MAX = 10,
};

/* endpoint_info.flags bits (reserved; none defined yet). */
#define AXON_EP_F_NONE 0

#define AXON_INLINE static __always_inline

#endif /* AXON_COMMON_H */
