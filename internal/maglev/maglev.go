// Package maglev builds Maglev consistent-hashing lookup tables (Eisenbud et
// al., "Maglev: A Fast and Reliable Software Network Load Balancer", NSDI
// 2016, §3.4): a table of M slots (M prime) where every slot names a backend,
// filled so that every backend gets a near-equal share (or a share
// proportional to its weight) and adding or removing one backend moves few
// slots that belonged to the others.
//
// The datapath hashes a flow's 5-tuple to a slot and sends it to the backend
// in that slot: every node (and every restart of the same node) computes the
// same table from the same backend set, because the permutation of a backend
// depends only on its name and the seed — never on the order of the input or
// on process state.
package maglev

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
)

// DefaultSize is the default table size M: a prime, as Cilium's default, good
// for up to ~160 backends per service at ≤ 1 % imbalance (M ≥ 100 × N keeps
// the shares within about 1 % of each other).
const DefaultSize = 16381

// MaxSize bounds M: the table is an inner BPF array of M u32 per frontend.
const MaxSize = 131071

// MinSize is the smallest table accepted.
const MinSize = 251

// Sizes lists the recommended primes (each roughly twice the previous), for
// error messages and flag help.
var Sizes = []int{251, 509, 1021, 2039, 4093, 8191, 16381, 32749, 65521, 131071}

// MaxWeight bounds a backend weight (weights are relative; 0 = drained).
const MaxWeight = 65535

// Backend is one entry of the input set. Name identifies the backend across
// table builds (an "addr:port" string is natural): the same name always gets
// the same permutation, so it keeps most of its slots when others change.
type Backend struct {
	Name   string
	Weight uint32 // relative weight; 0 = gets no slot (drained)
}

// Config selects the table size and hash seed.
type Config struct {
	// Size is the number of slots M; must be a prime in MinSize..MaxSize.
	// 0 = DefaultSize.
	Size int
	// Seed perturbs the backend permutations (e.g. a per-cluster secret so
	// tables are not predictable from backend names). All nodes of a cluster
	// must use the same seed to compute the same table.
	Seed string
	// Population: Stable (default) or RoundRobin (the paper's).
	Population Population
}

// CheckSize says what is wrong with a table size, nil when it is usable.
func CheckSize(m int) error {
	if m < MinSize || m > MaxSize {
		return fmt.Errorf("maglev table size %d is outside %d..%d: use a prime such as %s", m, MinSize, MaxSize, sizeList())
	}
	if !isPrime(m) {
		return fmt.Errorf("maglev table size %d is not a prime: use a prime such as %s (the permutations need a prime size to visit every slot)", m, sizeList())
	}
	return nil
}

func sizeList() string {
	s := make([]string, len(Sizes))
	for i, v := range Sizes {
		s[i] = fmt.Sprint(v)
	}
	return strings.Join(s, ", ")
}

func isPrime(n int) bool {
	if n < 2 {
		return false
	}
	for d := 2; d*d <= n; d++ {
		if n%d == 0 {
			return false
		}
	}
	return true
}

// ErrNoBackends is returned when no backend has a weight above zero.
var ErrNoBackends = errors.New("maglev: no backend with a weight above 0")

// Population selects how slots are handed out along the permutations.
type Population uint8

const (
	// Stable (the default): every backend gets a fixed quota of slots
	// (⌊M·w/W⌋ or one more) and a slot goes to the backend that ranks it
	// earliest in its permutation (a capacity-bounded stable assignment,
	// computed by deferred acceptance: unique, independent of processing
	// order). Balance is exact (quotas differ by at most one slot per unit of
	// weight), and removing one of 100 backends at the default size moves
	// about 0.65 % of the other slots.
	Stable Population = iota
	// RoundRobin is the population of the Maglev paper and Cilium: backends
	// take turns claiming their next free preferred slot. Same permutations,
	// same balance, but about 1.35 % of the other slots move when one of 100
	// backends is removed at the default size (TestRemoveOneBackendDisruption
	// logs both).
	RoundRobin
)

// Build returns the lookup table: slot → index into backends. The result
// does not depend on the order of backends (they are processed sorted by
// name), only on their names, weights, the size, the seed and the
// population. Names must be unique and non-empty; weights ≤ MaxWeight.
func Build(backends []Backend, cfg Config) ([]int, error) {
	m := cfg.Size
	if m == 0 {
		m = DefaultSize
	}
	if err := CheckSize(m); err != nil {
		return nil, err
	}
	order := make([]int, 0, len(backends)) // indexes with weight > 0, sorted by name
	seen := make(map[string]int, len(backends))
	for i, b := range backends {
		if b.Name == "" {
			return nil, fmt.Errorf("maglev: backend %d has an empty name", i)
		}
		if j, dup := seen[b.Name]; dup {
			return nil, fmt.Errorf("maglev: backends %d and %d have the same name %q: names must be unique", j, i, b.Name)
		}
		seen[b.Name] = i
		if b.Weight > MaxWeight {
			return nil, fmt.Errorf("maglev: backend %q weight %d is above %d", b.Name, b.Weight, MaxWeight)
		}
		if b.Weight > 0 {
			order = append(order, i)
		}
	}
	if len(order) == 0 {
		return nil, ErrNoBackends
	}
	if len(order) > m {
		return nil, fmt.Errorf("maglev: %d backends do not fit a table of %d slots: use a larger size (%s)", len(order), m, sizeList())
	}
	slices.SortFunc(order, func(a, b int) int { return strings.Compare(backends[a].Name, backends[b].Name) })
	p := &perms{m: uint64(m), off: make([]uint64, len(order)), skip: make([]uint64, len(order)), w: make([]uint64, len(order))}
	for k, i := range order {
		p.off[k], p.skip[k] = permutation(backends[i].Name, cfg.Seed, uint64(m))
		p.w[k] = uint64(backends[i].Weight)
	}
	var slots []int // slot → position in order
	switch cfg.Population {
	case Stable:
		slots = p.stable()
	case RoundRobin:
		slots = p.roundRobin()
	default:
		return nil, fmt.Errorf("maglev: unknown population %d", cfg.Population)
	}
	for s, k := range slots {
		slots[s] = order[k]
	}
	return slots, nil
}

// perms holds the permutation of every backend (in name order) and weights.
type perms struct {
	m         uint64
	off, skip []uint64
	w         []uint64
}

func (p *perms) slot(k int, j uint64) int { return int((p.off[k] + j*p.skip[k]) % p.m) }

// roundRobin is the paper's population (weighted by credits: a backend
// claims one slot per turn in which it has accumulated the largest weight).
func (p *perms) roundRobin() []int {
	n, m := len(p.off), int(p.m)
	maxW := slices.Max(p.w)
	next := make([]uint64, n)
	credit := make([]uint64, n)
	table := make([]int, m)
	for i := range table {
		table[i] = -1
	}
	filled := 0
	for filled < m {
		for k := range n {
			credit[k] += p.w[k]
			if credit[k] < maxW {
				continue
			}
			credit[k] -= maxW
			for { // the next free slot of this backend's permutation
				c := p.slot(k, next[k])
				next[k]++
				if table[c] < 0 {
					table[c] = k
					filled++
					break
				}
			}
			if filled == m {
				break
			}
		}
	}
	return table
}

// quotas splits the m slots by weight: ⌊m·w/W⌋ each, the remainder one by
// one to the largest fractional parts (ties: smallest offset, then name).
func (p *perms) quotas() []int {
	n := len(p.w)
	var total uint64
	for _, w := range p.w {
		total += w
	}
	q := make([]int, n)
	frac := make([]uint64, n)
	left := int(p.m)
	for k, w := range p.w {
		q[k] = int(p.m * w / total)
		frac[k] = p.m * w % total
		left -= q[k]
	}
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int {
		if frac[a] != frac[b] {
			return cmp.Compare(frac[b], frac[a]) // descending
		}
		if p.off[a] != p.off[b] {
			return cmp.Compare(p.off[a], p.off[b])
		}
		return a - b
	})
	for _, k := range idx[:left] {
		q[k]++
	}
	return q
}

// stable is the capacity-bounded stable assignment: backends propose slots
// in permutation order up to their quota; a taken slot goes to the proposer
// that ranks it earlier in its own permutation (ties: name order), and the
// bumped backend proposes on. The result is the backend-optimal stable
// assignment, unique whatever the processing order.
func (p *perms) stable() []int {
	n, m := len(p.off), int(p.m)
	inv := make([]uint64, n) // skip⁻¹ mod m, to get a slot's rank in a permutation
	for k := range n {
		inv[k] = powmod(p.skip[k], p.m-2, p.m)
	}
	rank := func(s, k int) uint64 { return (uint64(s) + p.m - p.off[k]) % p.m * inv[k] % p.m }
	quota := p.quotas()
	holder := make([]int, m)
	for i := range holder {
		holder[i] = -1
	}
	count := make([]int, n)
	next := make([]uint64, n)
	stack := make([]int, 0, n)
	for k := n - 1; k >= 0; k-- {
		stack = append(stack, k)
	}
	for len(stack) > 0 {
		k := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		for count[k] < quota[k] {
			s := p.slot(k, next[k])
			next[k]++
			h := holder[s]
			if h < 0 {
				holder[s] = k
				count[k]++
				continue
			}
			if rk, rh := rank(s, k), rank(s, h); rk < rh || (rk == rh && k < h) {
				holder[s] = k
				count[k]++
				count[h]--
				stack = append(stack, h)
			}
		}
	}
	return holder
}

// powmod is a^e mod m (m < 2^32, so products fit in 64 bits).
func powmod(a, e, m uint64) uint64 {
	r := uint64(1)
	a %= m
	for ; e > 0; e >>= 1 {
		if e&1 == 1 {
			r = r * a % m
		}
		a = a * a % m
	}
	return r
}

// permutation derives (offset, skip) of one backend from two independent
// 64-bit hashes of its name: offset in 0..m-1, skip in 1..m-1. With m prime,
// offset + j·skip (mod m) for j = 0..m-1 visits every slot exactly once.
func permutation(name, seed string, m uint64) (offset, skip uint64) {
	h := sha256.Sum256([]byte("axon-maglev\x00" + seed + "\x00" + name))
	h1 := binary.BigEndian.Uint64(h[0:8])
	h2 := binary.BigEndian.Uint64(h[8:16])
	return h1 % m, h2%(m-1) + 1
}

// Counts returns how many slots each backend index holds in table (a
// backend absent from the table has 0).
func Counts(table []int, backends int) []int {
	c := make([]int, backends)
	for _, i := range table {
		if i >= 0 && i < backends {
			c[i]++
		}
	}
	return c
}

// HashSeed maps a cluster's Maglev seed (Config.Seed, --maglev-hash-seed) to
// the datapath's 32-bit flow-hash seed: FNV-1a of the string with the low bit
// set, so it is never 0, which the datapath reads as "use the default seed"
// (HashSeed("") = 0 asks for exactly that). The flow hash picks a flow's
// table slot, so every node of a cluster, whatever its version, must derive
// the same value from the same seed: never change this mapping.
func HashSeed(seed string) uint32 {
	if seed == "" {
		return 0
	}
	h := fnv.New32a()
	h.Write([]byte(seed))
	return h.Sum32() | 1
}
