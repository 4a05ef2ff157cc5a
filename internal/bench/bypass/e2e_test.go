package bypass_test

// The same-node TCP bypass benchmark end to end, tiny: a one-node lab with
// the real agent, qperf between two real pods, the real bypass programs (the
// agent's where it has the bypass on, else loaded by the benchmark), one
// repetition of 1 s at two sizes. It checks the structure of the result, not
// rates: both arms measured at each size, no error, the bypass arm really
// bypassed (redirect_bytes moved) and the stack arm not (redirect_bytes
// still, and skip_not_pod moved: its sockets were seen and kept out),
// results.md written, and nothing of the benchmark left in the lab.

import (
	"context"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/axonhq/axon/internal/bench/benchtest"
	"github.com/axonhq/axon/internal/bench/bypass"
	"github.com/axonhq/axon/internal/lab"
)

func TestSockmapBenchTiny(t *testing.T) {
	bin := benchtest.LabSetup(t)
	if _, err := exec.LookPath("qperf"); err != nil {
		t.Fatalf("qperf not installed (`make deps`): %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	t.Cleanup(func() {
		if err := lab.Down(context.Background(), lab.DefaultStateDir, nil); err != nil {
			t.Errorf("lab down: %v", err)
		}
	})
	l, err := lab.Up(ctx, lab.DefaultStateDir, lab.UpOptions{Nodes: 1, PodsPerNode: 0, Datapath: lab.DatapathAxon, BinDir: bin, NoDemo: true})
	if err != nil {
		t.Fatalf("lab up: %v", err)
	}
	// The agent's bypass where it is on; where its kernel self-test keeps it
	// off (the 6.18 dev host: no BPF trampolines for the splice guard), the
	// same programs loaded by the benchmark.
	agent, err := l.Agent("node1")
	if err != nil {
		t.Fatal(err)
	}
	st, err := agent.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	attach := bypass.AttachDirect
	if st.Sockmap != nil && st.Sockmap.Enabled {
		attach = bypass.AttachAgent
	}
	t.Logf("attach %s (agent: %+v)", attach, st.Sockmap)

	out := t.TempDir()
	var progress strings.Builder
	sizes := []int{64, 16384}
	rep, err := bypass.Run(ctx, bypass.Config{Lab: l, Attach: attach, Reps: 1, Duration: time.Second, Sizes: sizes,
		OutDir: out, Progress: &progress})
	t.Logf("progress:\n%s", progress.String())
	if err != nil {
		t.Fatalf("bypass.Run: %v", err)
	}
	if rep.Attach != attach || (attach == bypass.AttachDirect && rep.AttachReason == "") {
		t.Errorf("report: attach %q (want %q), reason %q", rep.Attach, attach, rep.AttachReason)
	}
	if want := len(sizes) * len(bypass.DefaultTests) * 2; len(rep.Samples) != want {
		t.Fatalf("%d samples, want %d (2 tests × 2 sizes × 2 arms)", len(rep.Samples), want)
	}
	for _, s := range rep.Samples {
		if s.Err != "" || math.IsNaN(s.Value) || !(s.Value > 0) {
			t.Errorf("%s %d B %s: value %v, error %q", s.Test, s.Size, s.Arm, s.Value, s.Err)
		}
		if s.Test == bypass.TestBW && !(s.CPUPerGB > 0) {
			t.Errorf("%s %d B %s: CPU per GB %v", s.Test, s.Size, s.Arm, s.CPUPerGB)
		}
		switch s.Arm {
		case bypass.ArmBypass:
			if s.Counters["redirect_bytes"] == 0 || s.Counters["admit_pod"] == 0 {
				t.Errorf("%s %d B bypass arm not bypassed: counters moved %v", s.Test, s.Size, s.Counters)
			}
		case bypass.ArmStack:
			if s.Counters["redirect_bytes"] != 0 || s.Counters["skip_not_pod"] == 0 {
				t.Errorf("%s %d B stack arm: counters moved %v (want redirect_bytes still, skip_not_pod moved)", s.Test, s.Size, s.Counters)
			}
		}
	}
	for _, test := range bypass.DefaultTests {
		for _, size := range sizes {
			for _, arm := range []string{bypass.ArmStack, bypass.ArmBypass} {
				if v := rep.Values(test, size, arm); len(v) != 1 || math.IsNaN(v[0]) {
					t.Errorf("%s %d B %s: values %v, want one", test, size, arm, v)
				}
			}
		}
	}
	md, err := os.ReadFile(filepath.Join(out, "results.md"))
	if err != nil || !strings.Contains(string(md), "## Results") || !strings.Contains(string(md), "| 16 KiB |") ||
		!strings.Contains(string(md), "**Bypass attached by: "+attach+"**") {
		t.Errorf("results.md (%v):\n%s", err, md)
	}
	for _, f := range []string{"results.csv", "results.json"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Error(err)
		}
	}
	// Nothing of the benchmark left: its pods, and (direct) its pins.
	for _, p := range l.Pods() {
		if p.Name == bypass.ClientPod || p.Name == bypass.ServerPod {
			t.Errorf("bench pod %s left in the lab", p.Name)
		}
	}
	if ents, _ := filepath.Glob(filepath.Join(lab.PinRoot, "bench-sockmap-*")); len(ents) > 0 {
		t.Errorf("pins left by the direct attach: %v", ents)
	}
}
