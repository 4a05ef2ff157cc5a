package datapath

import (
	"testing"

	"github.com/axonhq/axon/internal/datapath/dptest"
)

func TestProbe(t *testing.T) {
	dptest.RequireRoot(t)
	list := Probe().List()
	want := []string{"tcx", "bpf_redirect_peer", "bpf_redirect_neigh", "bpf_fib_lookup", "netkit", "sch_fq", "bpffs", "big_tcp", "bpf_sock_destroy", "fib_cache", "splice_guard"}
	if len(list) != len(want) {
		t.Fatalf("Probe().List() = %+v", list)
	}
	for i, f := range list {
		if f.Name != want[i] {
			t.Errorf("feature %d is %q, want %q", i, f.Name, want[i])
		}
		if f.Reason == "" {
			t.Errorf("feature %s has no reason", f.Name)
		}
		t.Logf("%-18s %-5v %s", f.Name, f.Available, f.Reason)
	}
	// The device probes must not leave anything behind in this netns.
	for _, name := range []string{"axprobe-nk0", "axprobe-v0"} {
		if DeviceExists(name) {
			t.Errorf("probe device %s leaked into the test's netns", name)
		}
	}
}
