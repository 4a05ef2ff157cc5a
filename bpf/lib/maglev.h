/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* maglev.h: consistent-hashing backend selection (Maglev, Eisenbud et al.
 * NSDI'16). The agent computes each frontend's lookup table (internal/maglev)
 * and swaps it in whole: axon_lb_maglev maps a frontend id to an inner ARRAY
 * of cfg_maglev_size backend ids; the program hashes the flow's tuple into a
 * slot. The hash has a fixed seed so every node picks the same backend. */
#ifndef AXON_MAGLEV_H
#define AXON_MAGLEV_H

#include "common.h"
#include "ct.h"

/* Default Maglev table size M (prime, as Cilium's default). The inner map's
 * max_entries and cfg_maglev_size are set together at load time. */
#define AXON_MAGLEV_M 16381
/* Frontends with a Maglev table. */
#define AXON_MAGLEV_MAX 4096

struct np_maglev_inner {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, AXON_MAGLEV_M);
	__type(key, __u32);
	__type(value, __u32);
};

/* axon_lb_maglev: frontend id -> inner ARRAY[M] of backend ids. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH_OF_MAPS);
	__uint(max_entries, AXON_MAGLEV_MAX);
	__type(key, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__array(values, struct np_maglev_inner);
} axon_lb_maglev SEC(".maps");

volatile const __u32 cfg_maglev_size = AXON_MAGLEV_M;
volatile const __u32 cfg_hash_seed = 0x61786f6e; /* "axon" */

AXON_INLINE __u32 np_rol32(__u32 w, int s)
{
	return (w << s) | (w >> (32 - s));
}

/* np_hash_tuple: a murmur3-style 32-bit hash of the client tuple. */
AXON_INLINE __u32 np_hash_tuple(const struct np_tuple *t)
{
	const __u32 *w = (const __u32 *)t;
	__u32 h = cfg_hash_seed;
	int i;

#pragma unroll
	for (i = 0; i < 10; i++) {
		__u32 k = w[i] * 0xcc9e2d51;

		k = np_rol32(k, 15) * 0x1b873593;
		h ^= k;
		h = np_rol32(h, 13) * 5 + 0xe6546b64;
	}
	h ^= 40;
	h ^= h >> 16;
	h *= 0x85ebca6b;
	h ^= h >> 13;
	h *= 0xc2b2ae35;
	h ^= h >> 16;
	return h;
}

/* maglev_pick returns the backend id of t in frontend fid's table, 0 when
 * the frontend has no table. */
AXON_INLINE __u32 maglev_pick(__u32 fid, const struct np_tuple *t)
{
	__u32 idx, *id;
	void *inner = bpf_map_lookup_elem(&axon_lb_maglev, &fid);

	if (!inner || cfg_maglev_size == 0)
		return 0;
	idx = np_hash_tuple(t) % cfg_maglev_size;
	id = bpf_map_lookup_elem(inner, &idx);
	return id ? *id : 0;
}

#endif /* AXON_MAGLEV_H */
