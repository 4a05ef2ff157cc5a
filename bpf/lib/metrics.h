/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* metrics.h: per-CPU packet counters by direction and reason. */
#ifndef AXON_METRICS_H
#define AXON_METRICS_H

#include "common.h"

/* axon_metrics: PERCPU_ARRAY of __u64 packet counts, index
 * dir * AXON_REASON_MAX + reason (see enum axon_dir / enum axon_reason).
 * Pinned by name so counters survive agent restarts. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, AXON_DIR_MAX * AXON_REASON_MAX);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} axon_metrics SEC(".maps");

/* axon_metrics_btf: enum axon_dir and enum axon_reason in BTF (see
 * AXON_BTF_ANCHOR); their names are internal/datapath/podpath's directionNames and
 * reasonNames. */
AXON_BTF_ANCHOR(axon_metrics_btf, {
	enum axon_dir dir;
	enum axon_reason reason;
});

AXON_INLINE void metrics_count(enum axon_dir dir, enum axon_reason reason)
{
	__u32 idx = (__u32)dir * AXON_REASON_MAX + (__u32)reason;
	__u64 *v = bpf_map_lookup_elem(&axon_metrics, &idx);

	if (v)
		*v += 1; /* per-CPU slot: no atomics needed */
}

#endif /* AXON_METRICS_H */
