/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* backend.h: the backend choice rule both Service LBs share: the socket
 * LB (lb.h: axon_lb_svc / axon_lb_be) and the north-south LB (nodeport.h:
 * axon_np_svc / axon_np_be). Their maps have the same layout where it
 * matters (a master entry with slot counts, backends with a state and
 * their frontend id) but are separate maps with separate C types. No maps
 * here: both objects include it. */
#ifndef AXON_BACKEND_H
#define AXON_BACKEND_H

#include "common.h"

/* backend_usable(b, svc): backend b (lb_backend / np_backend) may take a
 * new connection of frontend svc (its master entry, lb_svc_val /
 * np_svc_val): it belongs to the frontend, and is Active, or Terminating
 * while the frontend has no Active backend. A macro, not a function of the
 * four fields: arguments would be read before the frontend check, and that
 * change alone made the verifier walk up to 2.6 % more of axon_lb_xdp. */
#define backend_usable(b, svc)                                              \
	((b)->frontend_id == (svc)->id &&                                   \
	 ((b)->state == AXON_LB_ACTIVE ||                                   \
	  ((b)->state == AXON_LB_TERMINATING && (svc)->active == 0)))

#endif /* AXON_BACKEND_H */
