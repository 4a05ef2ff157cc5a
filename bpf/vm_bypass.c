/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* vm_bypass.c: the VM-pod bridge bypass. A KubeVirt VM pod with the bridge
 * binding wires its guest as tap -> in-pod Linux bridge (k6t-eth0) -> the
 * pod interface (eth0) -> node. Both programs run inside the pod's netns:
 * axon_vmb_from_tap at the tc ingress of the VM's tap (what the guest
 * sends), axon_vmb_from_pod at the tc ingress of the pod interface (what
 * the node sends to the guest). Each bpf_redirect()s every frame (IPv4,
 * IPv6, ARP, ND, DHCP, anything: it is an L2 hop) to the other device's
 * egress, so the bridge never sees it. The kernel's transmit path of the
 * target device finishes CHECKSUM_PARTIAL and GSO skbs for it (a tap without
 * checksum offload gets the checksum computed, a guest-offloaded one from
 * the tap leaves the veth partial as through the bridge).
 *
 * Two exceptions keep the pod's own services on the bridge working (KubeVirt
 * runs the guest's DHCP server on k6t-eth0): a frame from the guest to the
 * bridge's own MAC is passed to the bridge (local delivery), and a
 * broadcast/multicast frame from the guest is also cloned into the bridge
 * device's ingress (local delivery only: a frame received by the bridge
 * device itself is not forwarded to its ports) before the redirect.
 *
 * One instance per VM pod (the ifindexes are the pod netns'), loaded by
 * internal/datapath/vmbypass. Never drops. */
#include "lib/common.h"

/* Load-time configuration (set by internal/datapath/vmbypass). */
volatile const __u32 cfg_tap_ifindex = 0;    /* the VM's tap in the pod netns (target of axon_vmb_from_pod) */
volatile const __u32 cfg_pod_ifindex = 0;    /* the pod interface (eth0) in the pod netns (target of axon_vmb_from_tap) */
volatile const __u32 cfg_bridge_ifindex = 0; /* the in-pod bridge; 0: no local delivery to it (the exceptions above off) */
volatile const __u8 cfg_bridge_mac[6] = {};  /* the bridge's own MAC (frames from the guest to it go to the bridge) */

/* axon_vmb_stats: per-CPU counters of one VM pod's bypass, indexed by enum
 * axon_vmb_counter (lib/common.h). Pinned by name under the pod's own pin
 * dir (<pin dir>/vmbypass/<pod>/axon_vmb_stats), so it outlives an agent
 * restart and goes with the pod. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, AXON_VMB_MAX);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} axon_vmb_stats SEC(".maps");

/* axon_vmb_btf: enum axon_vmb_counter in BTF (see AXON_BTF_ANCHOR):
 * counterNames in internal/datapath/vmbypass. */
AXON_BTF_ANCHOR(axon_vmb_btf, {
	enum axon_vmb_counter counter;
});

AXON_INLINE void vmb_add(enum axon_vmb_counter c, __u64 n)
{
	__u32 idx = c;
	__u64 *v = bpf_map_lookup_elem(&axon_vmb_stats, &idx);

	if (v)
		*v += n;
}

/* vmb_redirect sends the frame to the egress of ifindex, counting it under
 * frames/frames+1 (frames, bytes); a refused redirect leaves the frame to
 * the bridge path. */
AXON_INLINE int vmb_redirect(struct __sk_buff *skb, __u32 ifindex, enum axon_vmb_counter frames)
{
	__u32 len = skb->len;

	if (!ifindex || bpf_redirect(ifindex, 0) != TC_ACT_REDIRECT) {
		vmb_add(AXON_VMB_REDIRECT_FAIL, 1);
		return TC_ACT_OK;
	}
	vmb_add(frames, 1);
	vmb_add(frames + 1, len);
	return TC_ACT_REDIRECT;
}

/* is_bridge_mac: mac is cfg_bridge_mac (read element by element: a memcmp
 * would let the compiler fold the constant's zero initial value). */
AXON_INLINE int is_bridge_mac(const __u8 *mac)
{
	int diff = 0;

#pragma unroll
	for (int i = 0; i < 6; i++)
		diff |= mac[i] ^ cfg_bridge_mac[i];
	return diff == 0;
}

SEC("tc")
int axon_vmb_from_tap(struct __sk_buff *skb)
{
	__u8 dst[6];

	if (cfg_bridge_ifindex && bpf_skb_load_bytes(skb, 0, dst, sizeof(dst)) == 0) {
		if (dst[0] & 1) { /* group bit: broadcast or multicast */
			if (bpf_clone_redirect(skb, cfg_bridge_ifindex, BPF_F_INGRESS) == 0)
				vmb_add(AXON_VMB_TAP_BCAST_COPY, 1);
			else
				vmb_add(AXON_VMB_REDIRECT_FAIL, 1);
		} else if (is_bridge_mac(dst)) {
			vmb_add(AXON_VMB_TAP_TO_BRIDGE, 1);
			return TC_ACT_OK;
		}
	}
	return vmb_redirect(skb, cfg_pod_ifindex, AXON_VMB_TAP_FRAMES);
}

SEC("tc")
int axon_vmb_from_pod(struct __sk_buff *skb)
{
	return vmb_redirect(skb, cfg_tap_ifindex, AXON_VMB_POD_FRAMES);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
