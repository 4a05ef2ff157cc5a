package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/axonhq/axon/internal/testutil"
)

// TestLookupProgHitsTheGoKey: the key a program builds on its stack is the one Go inserted
// (a hit, XDP_PASS); against a map without it the same program misses (XDP_DROP), so the
// bench's "return code 2" check would catch a key that does not match.
func TestLookupProgHitsTheGoKey(t *testing.T) {
	testutil.RequireRoot(t, "creates BPF maps and programs")
	for _, size := range []int{16, 40} {
		m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.LRUHash, KeySize: uint32(size), ValueSize: 48, MaxEntries: 64})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.XDP, License: "GPL", Instructions: lookupProg(m, size)})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		pkt := make([]byte, 64)
		if ret, err := p.Run(&ebpf.RunOptions{Data: pkt}); err != nil || ret != 1 {
			t.Errorf("key %d B, empty map: return %d, %v; want 1 (a miss)", size, ret, err)
		}
		if err := m.Put(key(size, 0), make([]byte, 48)); err != nil {
			t.Fatal(err)
		}
		if ret, err := p.Run(&ebpf.RunOptions{Data: pkt}); err != nil || ret != 2 {
			t.Errorf("key %d B, flow 0 inserted: return %d, %v; want 2 (a hit)", size, ret, err)
		}
	}
}

func TestRunPrintsEveryVariant(t *testing.T) {
	testutil.RequireRoot(t, "creates BPF maps and programs")
	var b bytes.Buffer
	if err := run(1, 3, &b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| key 16 B, 131072 entries |", "| key 16 B, 1048576 entries |", "| key 40 B, 131072 entries |", "| key 40 B, 1048576 entries |", "| empty program |"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, b.String())
		}
	}
}
