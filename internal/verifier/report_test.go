package verifier

import (
	"os"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/testutil"
)

// TestVerifierReport loads every embedded BPF program on the running kernel
// and compares the verifier's instruction counts with the committed
// baseline. The table goes to the test log and, when $AXON_RESULTS is set,
// to verifier-<kernel>.{md,json} in that directory (the VM runner collects
// them per kernel).
func TestVerifierReport(t *testing.T) {
	testutil.RequireRoot(t, "loads BPF programs into the kernel")
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

// TestUnsupportedHelper: a program calling a helper its program type does not get on this
// kernel is reported as unsupported with the helper's name, not as rejected; a program the
// verifier refuses for its own fault stays rejected.
func TestUnsupportedHelper(t *testing.T) {
	testutil.RequireRoot(t, "loads BPF programs into the kernel")
	prog := func(insns ...asm.Instruction) *ebpf.ProgramSpec {
		return &ebpf.ProgramSpec{Name: "axt_prog", Type: ebpf.XDP, License: "GPL", Instructions: insns}
	}
	cases := []struct {
		desc       string
		spec       *ebpf.ProgramSpec
		wantStatus string
		wantDetail string
	}{
		{"helper of another program type", prog(
			asm.Mov.Imm(asm.R1, 0), asm.FnSetRetval.Call(), asm.Mov.Imm(asm.R0, 2), asm.Return()),
			StatusUnsupported, "helper bpf_set_retval not available to XDP programs"},
		{"reads an uninitialised register", prog(asm.Mov.Reg(asm.R0, asm.R5), asm.Return()),
			StatusRejected, "R5"},
		{"loads", prog(asm.Mov.Imm(asm.R0, 2), asm.Return()), "", ""},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			o := datapath.Object{Name: "synthetic", Spec: &ebpf.CollectionSpec{
				Programs: map[string]*ebpf.ProgramSpec{"axt_prog": c.spec}, Maps: map[string]*ebpf.MapSpec{}}}
			r := measureOne(o, "axt_prog")
			if r.Status != c.wantStatus || !strings.Contains(r.Detail, c.wantDetail) {
				t.Errorf("status %q detail %q, want %q containing %q", r.Status, r.Detail, c.wantStatus, c.wantDetail)
			}
			rep := Report{Kernel: "6.18", Results: []Result{r}}
			rep.Compare(Baseline{}, DefaultMaxGrowth)
			if fails := len(rep.Failures) > 0; fails != (c.wantStatus == StatusRejected) {
				t.Errorf("failures %q for status %q", rep.Failures, r.Status)
			}
		})
	}
}
