package datapath

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"

	"github.com/axonhq/axon/internal/datapath/lbmap"
)

// dumpChunk is the entries one BPF_MAP_LOOKUP_BATCH call returns at most; a
// hash map needs room for its largest bucket (ENOSPC otherwise), which this
// is far above.
const dumpChunk = 4096

// DumpMap reads every entry of a hash map m: with BPF_MAP_LOOKUP_BATCH (a
// handful of system calls for 100 000 entries) where the kernel has it,
// else by iterating (two system calls per entry). hint sizes the result.
// The caller keeps other writers out meanwhile (a concurrent delete can make
// a batch walk restart or skip a bucket).
func DumpMap[K, V any](m *ebpf.Map, hint int) ([]K, []V, error) {
	keys, vals := make([]K, 0, hint), make([]V, 0, hint)
	kb, vb := make([]K, dumpChunk), make([]V, dumpChunk)
	var cur ebpf.MapBatchCursor
	for {
		n, err := m.BatchLookup(&cur, kb, vb, nil)
		keys, vals = append(keys, kb[:n]...), append(vals, vb[:n]...)
		switch {
		case errors.Is(err, ebpf.ErrKeyNotExist):
			return keys, vals, nil // the end
		case errors.Is(err, ebpf.ErrNotSupported) && len(keys) == 0:
			return iterateMap[K, V](m, hint)
		case err != nil:
			return nil, nil, fmt.Errorf("batch lookup: %w", err)
		}
	}
}

func iterateMap[K, V any](m *ebpf.Map, hint int) ([]K, []V, error) {
	keys, vals := make([]K, 0, hint), make([]V, 0, hint)
	var k K
	var v V
	it := m.Iterate()
	for it.Next(&k, &v) {
		keys, vals = append(keys, k), append(vals, v)
	}
	if err := it.Err(); err != nil {
		return nil, nil, err
	}
	return keys, vals, nil
}

// ReplaceKeys makes m (named name; a set: value 1 per key) hold exactly the
// keys of want: the missing ones are added first, then the others removed,
// so a key in both states is never absent. Callers validate want and add
// their own context to the error.
func ReplaceKeys[K comparable](m *ebpf.Map, name string, want map[K]bool) error {
	have, _, err := iterateMap[K, uint8](m, len(want))
	if err != nil {
		return fmt.Errorf("read %s: %w", name, err)
	}
	one := uint8(1)
	for k := range want {
		if err := m.Put(&k, &one); err != nil {
			return fmt.Errorf("write %s: %w", name, lbmap.MapFullHint(err, name))
		}
	}
	var errs []error
	for _, k := range have {
		if !want[k] {
			if err := m.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				errs = append(errs, fmt.Errorf("delete from %s: %w", name, err))
			}
		}
	}
	return errors.Join(errs...)
}
