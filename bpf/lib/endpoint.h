/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* endpoint.h: the local pod endpoint maps, written by the agent only. */
#ifndef AXON_ENDPOINT_H
#define AXON_ENDPOINT_H

#include "common.h"

/* One pod interface on this node. Layout is ABI with internal/datapath/podpath
 * (20 bytes, no padding). */
struct endpoint_info {
	__u32 ifindex;     /* host-side veth ifindex (bpf_redirect_peer target) */
	__u8 pod_mac[6];   /* MAC of the pod's eth0: new ethernet destination */
	__u8 host_mac[6];  /* MAC of the host-side veth: new ethernet source */
	__u32 flags;       /* AXON_EP_F_* */
};

/* axon_ep_v4: pod IPv4 address (network byte order) -> endpoint_info. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, AXON_MAX_ENDPOINTS);
	__type(key, __be32);
	__type(value, struct endpoint_info);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} axon_ep_v4 SEC(".maps");

/* axon_ep_v6: pod IPv6 address (16 bytes, network order) -> endpoint_info. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, AXON_MAX_ENDPOINTS);
	__type(key, struct in6_addr);
	__type(value, struct endpoint_info);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} axon_ep_v6 SEC(".maps");

AXON_INLINE struct endpoint_info *endpoint_lookup_v4(__be32 daddr)
{
	return bpf_map_lookup_elem(&axon_ep_v4, &daddr);
}

AXON_INLINE struct endpoint_info *endpoint_lookup_v6(const struct in6_addr *daddr)
{
	struct in6_addr key;

	__builtin_memcpy(&key, daddr, sizeof(key)); /* key must live on the stack */
	return bpf_map_lookup_elem(&axon_ep_v6, &key);
}

#endif /* AXON_ENDPOINT_H */
