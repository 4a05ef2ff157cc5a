package maglev

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

func backendsN(n int) []Backend {
	out := make([]Backend, n)
	for i := range out {
		out[i] = Backend{Name: fmt.Sprintf("10.244.%d.%d:8080", i/250, i%250+1), Weight: 1}
	}
	return out
}

// names maps a table of indexes to backend names (so tables of different
// backend sets can be compared slot by slot).
func names(t *testing.T, bs []Backend, cfg Config) []string {
	t.Helper()
	tab, err := Build(bs, cfg)
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	out := make([]string, len(tab))
	for i, b := range tab {
		out[i] = bs[b].Name
	}
	return out
}

// TestRemoveOneBackendDisruption is the target: with 100 backends
// and the default size, removing one backend remaps at most 1 % of the slots
// beyond those that were on it (slots = flows under a uniform flow hash).
// The paper's round-robin population is measured too, for the record.
func TestRemoveOneBackendDisruption(t *testing.T) {
	bs := backendsN(100)
	for _, tc := range []struct {
		name  string
		cfg   Config
		limit float64
	}{
		{"stable (default)", Config{}, 0.01},
		{"round-robin (paper)", Config{Population: RoundRobin}, 0.02},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			before := names(t, bs, tc.cfg)
			t.Logf("build: %d backends, %d slots in %s", len(bs), len(before), time.Since(start).Round(10*time.Microsecond))
			worst := 0.0
			for _, removed := range []int{0, 17, 42, 99} {
				after := names(t, slices.Delete(slices.Clone(bs), removed, removed+1), tc.cfg)
				gone := bs[removed].Name
				var onRemoved, moved int
				for i := range before {
					switch {
					case before[i] == gone:
						onRemoved++
						if after[i] == gone {
							t.Fatalf("slot %d still points at removed backend %s", i, gone)
						}
					case before[i] != after[i]:
						moved++
					}
				}
				frac := float64(moved) / float64(len(before))
				worst = max(worst, frac)
				t.Logf("removed %s: %d slots were on it, %d other slots moved (%.3f %% of %d)", gone, onRemoved, moved, 100*frac, len(before))
				if frac > tc.limit {
					t.Errorf("removing %s moved %.3f %% of slots that were not on it, want ≤ %.0f %%", gone, 100*frac, 100*tc.limit)
				}
			}
			t.Logf("worst extra disruption: %.3f %%", 100*worst)
		})
	}
}

// TestAddOneBackendDisruption: adding a backend takes about 1/(N+1) of the
// slots, and moves few slots between the existing backends.
func TestAddOneBackendDisruption(t *testing.T) {
	bs := backendsN(100)
	before := names(t, bs, Config{})
	added := Backend{Name: "10.244.9.9:8080", Weight: 1}
	after := names(t, append(slices.Clone(bs), added), Config{})
	var toNew, moved int
	for i := range before {
		switch {
		case after[i] == added.Name:
			toNew++
		case before[i] != after[i]:
			moved++
		}
	}
	t.Logf("new backend took %d slots; %d slots moved between old backends", toNew, moved)
	if frac := float64(moved) / float64(len(before)); frac > 0.01 {
		t.Errorf("adding a backend moved %.3f %% of slots between other backends, want ≤ 1 %%", 100*frac)
	}
	if want := len(before) / 101; toNew < want*9/10 || toNew > want*11/10 {
		t.Errorf("new backend got %d slots, want about %d", toNew, want)
	}
}

func TestEvenness(t *testing.T) {
	for _, tc := range []struct {
		n, size   int
		maxSpread float64 // (max-min)/mean
	}{
		{n: 3, size: 251, maxSpread: 0.02},
		{n: 10, size: DefaultSize, maxSpread: 0.01},
		{n: 100, size: DefaultSize, maxSpread: 0.02},
		{n: 100, size: 131071, maxSpread: 0.01},
		{n: 1000, size: 65521, maxSpread: 0.1},
	} {
		t.Run(fmt.Sprintf("n=%d,m=%d", tc.n, tc.size), func(t *testing.T) {
			bs := backendsN(tc.n)
			tab, err := Build(bs, Config{Size: tc.size})
			if err != nil {
				t.Fatal(err)
			}
			if len(tab) != tc.size {
				t.Fatalf("table has %d slots, want %d", len(tab), tc.size)
			}
			c := Counts(tab, len(bs))
			lo, hi := slices.Min(c), slices.Max(c)
			mean := float64(tc.size) / float64(tc.n)
			spread := float64(hi-lo) / mean
			t.Logf("slots per backend: min %d max %d mean %.1f spread %.2f %%", lo, hi, mean, 100*spread)
			if lo == 0 {
				t.Errorf("a backend got no slot")
			}
			if spread > tc.maxSpread {
				t.Errorf("spread (max-min)/mean = %.3f, want ≤ %.3f", spread, tc.maxSpread)
			}
		})
	}
}

func TestWeights(t *testing.T) {
	bs := []Backend{{"a", 1}, {"b", 2}, {"c", 4}, {"d", 0}}
	tab, err := Build(bs, Config{Size: 4093})
	if err != nil {
		t.Fatal(err)
	}
	c := Counts(tab, len(bs))
	if c[3] != 0 {
		t.Errorf("weight-0 backend got %d slots", c[3])
	}
	total := float64(len(tab))
	for i, want := range []float64{1.0 / 7, 2.0 / 7, 4.0 / 7} {
		got := float64(c[i]) / total
		if d := got - want; d > 0.01 || d < -0.01 {
			t.Errorf("backend %s share %.3f, want %.3f ± 0.01", bs[i].Name, got, want)
		}
	}
}

// TestDeterministic: same names → same table, whatever the input order and
// across calls (so across restarts and nodes); another seed → another table.
func TestDeterministic(t *testing.T) {
	bs := backendsN(50)
	a := names(t, bs, Config{})
	shuffled := slices.Clone(bs)
	r := rand.New(rand.NewPCG(1, 2))
	r.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	b := names(t, shuffled, Config{})
	if !slices.Equal(a, b) {
		t.Fatal("table depends on the input order")
	}
	// Golden prefix: guards against an accidental change of the hash, which
	// would reshuffle every flow of every cluster on upgrade.
	tab, _ := Build([]Backend{{"10.0.0.1:80", 1}, {"10.0.0.2:80", 1}, {"10.0.0.3:80", 1}}, Config{Size: 251})
	got := fmt.Sprint(tab[:16])
	const golden = "[0 0 2 0 0 1 2 0 0 1 0 1 2 2 0 2]"
	if got != golden {
		t.Errorf("first 16 slots = %s, want %s (the permutation hash changed: this remaps every flow on upgrade)", got, golden)
	}
	c := names(t, bs, Config{Seed: "cluster-b"})
	if slices.Equal(a, c) {
		t.Error("a different seed gave the same table")
	}
}

func TestBadInput(t *testing.T) {
	for _, tc := range []struct {
		name string
		bs   []Backend
		cfg  Config
		want string
	}{
		{"size not prime", backendsN(2), Config{Size: 1000}, "not a prime"},
		{"size too small", backendsN(2), Config{Size: 7}, "outside"},
		{"size too large", backendsN(2), Config{Size: 262139}, "outside"},
		{"no backends", nil, Config{}, "no backend"},
		{"all drained", []Backend{{"a", 0}}, Config{}, "no backend"},
		{"duplicate", []Backend{{"a", 1}, {"a", 1}}, Config{}, "same name"},
		{"empty name", []Backend{{"", 1}}, Config{}, "empty name"},
		{"weight", []Backend{{"a", MaxWeight + 1}}, Config{}, "weight"},
		{"too many", backendsN(300), Config{Size: 251}, "do not fit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Build(tc.bs, tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Build error = %v, want one containing %q", err, tc.want)
			}
		})
	}
	for _, m := range Sizes {
		if err := CheckSize(m); err != nil {
			t.Errorf("recommended size %d rejected: %v", m, err)
		}
	}
}

// TestHashSeed pins HashSeed's values: nodes running different versions must
// derive the same flow-hash seed from the same configured seed.
func TestHashSeed(t *testing.T) {
	for _, tc := range []struct {
		seed string
		want uint32
	}{
		{"", 0},                // the datapath's default seed
		{"a", 0xe40c292d},      // FNV-1a("a") = 0xe40c292c
		{"foobar", 0xbf9cf969}, // FNV-1a("foobar") = 0xbf9cf968
		{"axon", 0x52270645},
		{"cluster-1", 0x8209eec3},
	} {
		if got := HashSeed(tc.seed); got != tc.want {
			t.Errorf("HashSeed(%q) = %#08x, want %#08x", tc.seed, got, tc.want)
		}
	}
}
