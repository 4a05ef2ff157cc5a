package datapath

import (
	"slices"
	"testing"

	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/cilium/ebpf"
)

// TestDumpMap: the batch dump and the iterating fallback return every entry
// of a hash map exactly once, for an empty map, one below a chunk and
// several chunks.
func TestDumpMap(t *testing.T) {
	dptest.RequireRoot(t)
	for _, n := range []int{0, 1, dumpChunk - 1, 3*dumpChunk + 17} {
		m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 4, ValueSize: 8, MaxEntries: uint32(max(n, 1))})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		want := map[uint32]uint64{}
		for i := range n {
			k, v := uint32(i*7+1), uint64(i)<<20|uint64(i)
			if err := m.Put(&k, &v); err != nil {
				t.Fatal(err)
			}
			want[k] = v
		}
		for name, dump := range map[string]func(*ebpf.Map, int) ([]uint32, []uint64, error){
			"batch": DumpMap[uint32, uint64], "iterate": iterateMap[uint32, uint64],
		} {
			keys, vals, err := dump(m, 0)
			if err != nil {
				t.Fatalf("%d entries, %s: %v", n, name, err)
			}
			if len(keys) != n || len(vals) != n {
				t.Fatalf("%d entries, %s: got %d keys, %d values", n, name, len(keys), len(vals))
			}
			seen := slices.Clone(keys)
			slices.Sort(seen)
			if len(slices.Compact(seen)) != n {
				t.Fatalf("%d entries, %s: a key came back twice", n, name)
			}
			for i, k := range keys {
				if v, ok := want[k]; !ok || v != vals[i] {
					t.Fatalf("%d entries, %s: key %d value %#x, want %#x (present %v)", n, name, k, vals[i], v, ok)
				}
			}
		}
	}
}

// TestReplaceKeys: the set map ends up holding exactly the wanted keys,
// from empty, across an overlap, and down to nothing.
func TestReplaceKeys(t *testing.T) {
	dptest.RequireRoot(t)
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 8, ValueSize: 1, MaxEntries: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for _, want := range [][]uint64{{1, 2, 3}, {2, 3, 4, 5}, {5}, nil} {
		set := map[uint64]bool{}
		for _, k := range want {
			set[k] = true
		}
		if err := ReplaceKeys(m, "test", set); err != nil {
			t.Fatalf("replace with %v: %v", want, err)
		}
		keys, vals, err := iterateMap[uint64, uint8](m, 0)
		if err != nil {
			t.Fatal(err)
		}
		for i, v := range vals {
			if v != 1 {
				t.Errorf("key %d has value %d, want 1", keys[i], v)
			}
		}
		slices.Sort(keys)
		if !slices.Equal(keys, want) && !(len(keys) == 0 && len(want) == 0) {
			t.Errorf("replace with %v: map holds %v", want, keys)
		}
	}
}
