package verifier

import (
	"os"
	"testing"

	"github.com/axonhq/axon/internal/datapath"
)

// TestVerifierReport loads every embedded BPF program on the running kernel
// and compares the verifier's instruction counts with the committed
// baseline. The table goes to the test log and, when $AXON_RESULTS is set,
// to verifier-<kernel>.{md,json} in that directory (the VM runner collects
// them per kernel).
func TestVerifierReport(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: loads BPF programs into the kernel")
	}
	objs, err := datapath.Objects()
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Measure(objs)
	if err != nil {
		t.Fatal(err)
	}
	base, err := EmbeddedBaseline()
	if err != nil {
		t.Fatal(err)
	}
	rep.Compare(base, DefaultMaxGrowth)
	t.Logf("verifier report, kernel %s:\n%s", rep.Release, rep.Markdown())
	if dir := os.Getenv("AXON_RESULTS"); dir != "" {
		paths, err := WriteResults(dir, rep)
		if err != nil {
			t.Errorf("write results: %v", err)
		}
		t.Logf("wrote %v", paths)
	}
	loaded := 0
	for _, r := range rep.Results {
		if r.Loads {
			loaded++
			if r.Insns == 0 {
				t.Errorf("%s loads but reports no instruction count: %s", r.Program, r.Detail)
			}
		}
	}
	if loaded == 0 {
		t.Errorf("no program loaded on %s", rep.Release)
	}
	for _, f := range rep.Failures {
		t.Error(f)
	}
}
