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
	"slices"
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

// TestSockmapChainBenchTiny runs the sidecar chain once: a one-node lab, a
// real HAProxy sidecar in each bench pod behind real nat REDIRECT rules,
// qperf through both, one repetition of 1 s at 64 B. It checks structure,
// not rates: the original destination kept (two server ports, each reached
// its own listener, from 127.0.0.1: through the server proxy), both arms
// measured with data through all three hops (each hop's sockets seen in
// every snapshot, the proxies' ends on 15001 and 15006), the stack arm with
// no socket in the SOCKHASH and redirect_bytes still, the bypass arm with
// redirect_bytes moved and the loopback hop to the app bypassed, the
// report's rows, and nothing left (pods, proxies' files, pins).
func TestSockmapChainBenchTiny(t *testing.T) {
	bin := benchtest.LabSetup(t)
	for _, tool := range []string{"qperf", "iptables"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not installed (`make deps`): %v", tool, err)
		}
	}
	if _, err := os.Stat("/usr/sbin/haproxy"); err != nil {
		t.Skipf("no HAProxy (/usr/sbin/haproxy; Debian's haproxy package): %v", err)
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
	before, _ := filepath.Glob(filepath.Join(os.TempDir(), "axon-bench-chain-*"))

	out := t.TempDir()
	var progress strings.Builder
	rep, err := bypass.Run(ctx, bypass.Config{Lab: l, Attach: attach, Chain: true, Reps: 1, Duration: time.Second,
		Sizes: []int{64}, OutDir: out, Progress: &progress})
	t.Logf("progress:\n%s", progress.String())
	if err != nil {
		t.Fatalf("bypass.Run --chain: %v", err)
	}
	if rep.Chain == nil || len(rep.Chain.OrigDst) != 2 {
		t.Fatalf("no original-destination check in the report: %+v", rep.Chain)
	}
	for _, c := range rep.Chain.OrigDst {
		if !c.OK() {
			t.Errorf("original destination %s: reply %q from %s (%s)", c.Dial, c.Reply, c.Peer, c.Err)
		}
	}
	if r0, r1 := rep.Chain.OrigDst[0].Reply, rep.Chain.OrigDst[1].Reply; r0 == r1 {
		t.Errorf("both ports answered %q: the proxies lost the original port", r0)
	}
	if want := 2 * 2; len(rep.Samples) != want { // tcp_lat and tcp_bw at 64 B, two arms
		t.Fatalf("%d samples, want %d", len(rep.Samples), want)
	}
	for _, s := range rep.Samples {
		name := s.Test + " " + s.Arm
		if s.Err != "" || !(s.Value > 0) || s.HopsErr != "" {
			t.Errorf("%s: value %v, error %q, hop snapshot error %q", name, s.Value, s.Err, s.HopsErr)
			continue
		}
		perHop := map[string]int{}
		inMap := 0
		var proxyPorts []uint16
		for _, h := range s.Hops {
			perHop[h.Hop]++
			if h.InMap {
				inMap++
			}
			if h.Proxy {
				proxyPorts = append(proxyPorts, h.Local.Port())
			}
		}
		for _, hop := range bypass.Hops { // qperf's control and data connections: 2 sockets each, per hop
			if perHop[hop] < 2 {
				t.Errorf("%s: hop %q has %d sockets, want at least 2 (data through the proxies): %+v", name, hop, perHop[hop], s.Hops)
			}
		}
		if !slices.Contains(proxyPorts, bypass.OutboundPort) || !slices.Contains(proxyPorts, bypass.InboundPort) {
			t.Errorf("%s: no proxy socket on %d and %d: %v", name, bypass.OutboundPort, bypass.InboundPort, proxyPorts)
		}
		switch s.Arm {
		case bypass.ArmStack:
			if inMap != 0 || s.Counters["redirect_bytes"] != 0 {
				t.Errorf("%s: %d sockets in the SOCKHASH, counters %v (want none, redirect_bytes still)", name, inMap, s.Counters)
			}
		case bypass.ArmBypass:
			if s.Counters["redirect_bytes"] == 0 {
				t.Errorf("%s: redirect_bytes did not move: %v", name, s.Counters)
			}
		}
	}
	rows := rep.HopRows()
	// The loopback hop pairs today; a socket whose first write races its
	// peer's entry into the map stays on TCP (sticky), so under load one of
	// the hop's sockets may be "stack": at least one must be bypassed.
	if len(rows) != 3 || rows[2].Bypass == 0 || rows[2].StackArmInMap != 0 {
		t.Errorf("hop rows %+v: want the server proxy → app loopback hop bypassed, nothing in the map in the stack arm", rows)
	}
	for _, r := range rows {
		t.Logf("hop %s: %s (%d of %d sockets in the map, %d bypass, %d stack)", r.Hop, r.Verdict(), r.InMap, r.Sockets, r.Bypass, r.Stack)
	}
	md, err := os.ReadFile(filepath.Join(out, "results.md"))
	for _, w := range []string{"# Same-node TCP bypass benchmark: sidecar chain", "| 64 B |", "## Which hops were bypassed",
		"| 3 server proxy → app |", "Original destination kept (checked before measuring, passed)", "## Sidecars"} {
		if err != nil || !strings.Contains(string(md), w) {
			t.Errorf("results.md (%v) lacks %q:\n%s", err, w, md)
		}
	}
	for _, p := range l.Pods() {
		if p.Name == bypass.ClientPod || p.Name == bypass.ServerPod {
			t.Errorf("bench pod %s left in the lab", p.Name)
		}
	}
	if strings.Contains(progress.String(), "undo the") { // the proxies, nat rules, the direct attach
		t.Errorf("the bench could not undo all it set up:\n%s", progress.String())
	}
	if after, _ := filepath.Glob(filepath.Join(os.TempDir(), "axon-bench-chain-*")); len(after) > len(before) {
		t.Errorf("the sidecars' configuration left behind: %v", after)
	}
	if ents, _ := filepath.Glob(filepath.Join(lab.PinRoot, "bench-sockmap-*")); len(ents) > 0 {
		t.Errorf("pins left by the direct attach: %v", ents)
	}
}
