package podpath

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/datapath/dptest"
)

// TestMetricsMigration: an axon_metrics pinned by an older object (fewer
// reasons, another size) is unpinned so that Load can create the new one;
// one of the current size stays, counters and all.
func TestMetricsMigration(t *testing.T) {
	dptest.RequireRoot(t)
	spec, err := loadPodEgress()
	if err != nil {
		t.Fatal(err)
	}
	ms := spec.Maps["axon_metrics"]
	if want := uint32(len(directionNames) * len(reasonNames)); ms.MaxEntries != want {
		t.Fatalf("axon_metrics has %d entries in the object, want %d", ms.MaxEntries, want)
	}
	for _, tc := range []struct {
		desc    string
		entries uint32
		kept    bool
	}{
		{"older layout (10 reasons)", uint32(len(directionNames) * 10), false},
		{"current layout", ms.MaxEntries, true},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			pin := newPinDir(t)
			if err := datapath.EnsurePinDir(pin); err != nil {
				t.Fatal(err)
			}
			old := ms.Copy()
			old.MaxEntries = tc.entries
			old.Pinning = ebpf.PinNone
			m, err := ebpf.NewMap(old)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			path := filepath.Join(pin, "axon_metrics")
			if err := m.Pin(path); err != nil {
				t.Fatal(err)
			}
			if err := metricsMigration(pin, ms, dptest.Logger(t)); err != nil {
				t.Fatal(err)
			}
			_, err = os.Stat(path)
			if kept := err == nil; kept != tc.kept {
				t.Fatalf("pin kept = %v (stat: %v), want %v", kept, err, tc.kept)
			}
		})
	}
}
