/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* uplink_egress.c: tc egress of the node uplink (the Bandwidth
 * Manager). Packets from a pod with an egress limit get an Earliest Departure
 * Time in skb->tstamp; the fq qdisc on the uplink sends them no earlier.
 * Everything else passes untouched. Never redirects, never drops except
 * beyond the horizon. Logic in lib/edt.h. */
#include "lib/common.h"
#include "lib/eth_ip.h"
#include "lib/edt.h"

/* Load-time configuration (set by internal/datapath/bandwidth). */
volatile const __u8 cfg_set_tstamp = 1; /* 1: bpf_skb_set_tstamp (>= 5.18) marks the stamp as mono delivery time; 0: plain skb->tstamp write */

SEC("tc")
int axon_uplink_egress(struct __sk_buff *skb)
{
	struct packet pkt = {};
	struct in6_addr src;
	struct bw_state *st;
	__u64 now, base = 0, tstamp = 0, len;
	int small;

	switch (parse_packet(skb, &pkt)) {
	case PARSE_IPV4:
	case PARSE_IPV6:
		break;
	default:
		return TC_ACT_OK;
	}
	bw_addr_of(&pkt, 1, &src);
	st = bw_lookup(&src, AXON_BW_EGRESS);
	if (!st) {
		bw_count(AXON_BW_EGRESS_UNLIMITED);
		return TC_ACT_OK;
	}
	now = bpf_ktime_get_ns();
	/* A delivery time set by the pod's TCP stack (pacing, BBR) is kept
	 * across the netns switch on >= 5.18 as a mono timestamp: honour it.
	 * Any other stamp (an RX time in another clock) is not a departure
	 * time. */
	if (cfg_set_tstamp && skb->tstamp_type == BPF_SKB_TSTAMP_DELIVERY_MONO) {
		if (!(st->flags & AXON_BW_F_IGNORE_POD_TSTAMP))
			base = skb->tstamp;
		bw_count(AXON_BW_EGRESS_DELIVERY_TIME);
	}
	if (skb->sk)
		bw_count(AXON_BW_EGRESS_WITH_SOCKET);
	len = skb->wire_len ? skb->wire_len : skb->len; /* GSO: every segment's headers */
	small = !(st->flags & AXON_BW_F_NO_SMALL_BYPASS) && len <= AXON_EDT_SMALL_LEN;
	switch (edt_schedule(st, now, base, len, small, &tstamp)) {
	case EDT_DROP:
		__sync_fetch_and_add(&st->drops, 1);
		bw_count(AXON_BW_EGRESS_DROP_HORIZON);
		drop_packet(skb, AXON_PROG_UPLINK_EGRESS, AXON_DROP_DIR_EGRESS, AXON_DROP_REASON_BW_HORIZON);
		return TC_ACT_SHOT;
	default:
		break;
	}
	__sync_fetch_and_add(&st->bytes, len);
	if (cfg_set_tstamp)
		bpf_skb_set_tstamp(skb, tstamp, BPF_SKB_TSTAMP_DELIVERY_MONO);
	else
		skb->tstamp = tstamp;
	bw_count(AXON_BW_EGRESS_PACED);
	return TC_ACT_OK;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
