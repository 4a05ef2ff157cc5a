/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* lb_xdp.c: north-south load balancing at XDP on the node uplink: the code
 * of lb_tc.c (lib/nodeport.h) compiled for struct xdp_md. */
#define AXON_CTX_XDP 1
#include "lib/common.h"
#include "lib/ctx.h"
#include "lib/nodeport.h"

SEC("xdp")
int axon_lb_xdp(struct xdp_md *ctx)
{
	return np_ingress(ctx, NP_HOOK_XDP, 0);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
