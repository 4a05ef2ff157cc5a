package services_test

// The Service benchmark end to end, tiny: a 4-node lab, 10 Services, one
// repetition of 0.5 s per path, two EndpointSlice changes, both full syncs.
// It proves the whole code path (pods, kube-proxies in two modes, socket LB,
// pinned-map polling, report files, cleanup) on the real kernel and a real
// apiserver. It needs root and the cached dependencies, and skips when a lab
// is already up (one lab per machine).

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

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/axonhq/axon/internal/bench/benchtest"
	"github.com/axonhq/axon/internal/bench/services"
	"github.com/axonhq/axon/internal/lab"
)

func TestServicesBenchTiny(t *testing.T) {
	bin := benchtest.LabSetup(t)

	t0 := time.Now()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	t.Cleanup(func() {
		if err := lab.Down(context.Background(), lab.DefaultStateDir, nil); err != nil {
			t.Errorf("lab down: %v", err)
		}
	})
	l, err := lab.Up(ctx, lab.DefaultStateDir, lab.UpOptions{Nodes: 4, Datapath: lab.DatapathAxon, BinDir: bin, NoDemo: true})
	if err != nil {
		t.Fatalf("lab up: %v", err)
	}
	t.Logf("lab up: %s", time.Since(t0).Round(time.Millisecond))

	out := t.TempDir()
	var progress strings.Builder
	rep, err := services.Run(ctx, l, services.Config{
		Levels: []int{10}, Endpoints: 3, Reps: 1, Duration: 500 * time.Millisecond, Changes: 2,
		SyncTimeout: time.Minute, Axon: filepath.Join(bin, "axon"), OutDir: out, Progress: &progress,
	})
	t.Logf("progress:\n%s", progress.String())
	if err != nil {
		t.Fatalf("services.Run: %v", err)
	}
	t.Logf("bench: %s (total %s)", rep.Finished.Sub(rep.Started).Round(time.Millisecond), time.Since(t0).Round(time.Millisecond))

	// Every path measured, with no failed connection (how fast is the
	// benchmark's to show, not this test's: it runs on a shared machine).
	for _, p := range rep.Paths {
		s := rep.Stats(10, p.Name, services.MetricRate)
		if s.N != 1 || !(s.Median > 0) {
			t.Errorf("%s: rate %+v, want one sample > 0 conn/s", p.Name, s)
		}
	}
	for _, s := range rep.Samples {
		if s.Err != "" || s.Result.Errors != 0 {
			t.Errorf("%s: %s (%d failed connections: %s)", s.Path, s.Err, s.Result.Errors, s.Result.FirstError)
		}
	}
	// ClusterIP against the pod IP in alternating slices, from one client;
	// the axon pod on the iptables node against the one on a rules-free
	// node, from one client moving between them.
	for _, kind := range []string{services.PairedClusterIP, services.PairedRules} {
		runs := rep.PairedOf(kind)
		if len(runs) != 1 || runs[0].Err != "" || runs[0].Result.Pairs < 1 ||
			!(runs[0].Result.RatioMedian > 0) || math.IsInf(runs[0].Result.RatioMedian, 0) ||
			runs[0].Result.A.Errors+runs[0].Result.B.Errors != 0 {
			t.Errorf("paired %s: %+v, want one level with a finite positive ratio and no failed connection", kind, runs)
		}
	}
	cp := rep.ControlPlane
	if cp == nil {
		t.Fatal("no control-plane result")
	}
	if len(cp.AxonChange) != 4 || len(cp.KubeProxyChange["nftables"]) != 4 || len(cp.KubeProxyChange["iptables"]) != 4 {
		t.Errorf("changes: axon %v, kube-proxy %v; want 4 samples each", cp.AxonChange, cp.KubeProxyChange)
	}
	for i, v := range cp.AxonChange {
		if math.IsNaN(v) || v <= 0 || v > 5000 {
			t.Errorf("axon EndpointSlice change took %v ms", v)
		}
		if i < len(cp.ChangeWrite) && !(cp.ChangeWrite[i] > 0 && cp.ChangeWrite[i] <= v) {
			t.Errorf("change %d: API write %v ms, want > 0 and within the whole change's %v ms", i, cp.ChangeWrite[i], v)
		}
	}
	// the agent's own clock: its map write happened after the API write
	// started and (give or take the end of the flush) before the benchmark
	// saw the map change
	if len(cp.AgentChange) != len(cp.AxonChange) || len(cp.AgentChangeIdle) != len(cp.AxonChangeIdle) {
		t.Errorf("agent-clock times: %d and %d samples, want one per change (%d, %d)",
			len(cp.AgentChange), len(cp.AgentChangeIdle), len(cp.AxonChange), len(cp.AxonChangeIdle))
	}
	for i, v := range append(slices.Clone(cp.AgentChange), cp.AgentChangeIdle...) {
		if math.IsNaN(v) || v <= 0 || v > 5000 {
			t.Errorf("agent-clock sample %d: %v ms, want within (0, 5000]", i, v)
		}
	}
	if len(cp.ChangeWrite) != len(cp.AxonChange) || len(cp.ChangeIdleWrite) != len(cp.AxonChangeIdle) {
		t.Errorf("API write times: %d and %d samples, want one per change (%d, %d)",
			len(cp.ChangeWrite), len(cp.ChangeIdleWrite), len(cp.AxonChange), len(cp.AxonChangeIdle))
	}
	if cp.AgentFullSync <= 0 || cp.AgentMapMasters < 11 {
		t.Errorf("agent full sync %s with %d frontends in the map, want > 0 and ≥ 11", cp.AgentFullSync, cp.AgentMapMasters)
	}
	if len(cp.KubeProxyFullSync) != 2 {
		t.Errorf("kube-proxy full syncs: %+v, want nftables and iptables", cp.KubeProxyFullSync)
	}
	for _, f := range cp.KubeProxyFullSync {
		if f.Err != "" || f.StartToSynced <= 0 || f.HWM == 0 {
			t.Errorf("kube-proxy %s full sync: %+v", f.Mode, f)
		}
	}
	for _, f := range []string{"results.md", "results.csv", "results.json", "chart.svg", "raw/kube-proxy-nftables.log"} {
		if st, err := os.Stat(filepath.Join(out, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s missing or empty: %v", f, err)
		}
	}
	md, _ := os.ReadFile(filepath.Join(out, "results.md"))
	if !strings.Contains(string(md), services.PathNFTClusterIP) || !strings.Contains(string(md), "ClusterIP vs the backend pod IP, paired") ||
		strings.Contains(string(md), "## Failures") {
		t.Errorf("results.md:\n%s", md)
	}

	// Nothing of the benchmark is left in the lab.
	for _, p := range l.Pods() {
		if strings.HasPrefix(p.Name, "svcb-") {
			t.Errorf("benchmark pod %s left in the lab", p.Name)
		}
	}
	kube, err := l.Kube()
	if err != nil {
		t.Fatal(err)
	}
	if svcs, err := kube.CoreV1().Services("svcbench").List(ctx, metav1.ListOptions{}); err != nil || len(svcs.Items) != 0 {
		t.Errorf("generated Services left: %v %v", len(svcs.Items), err)
	}
	if _, err := kube.CoreV1().Services(services.TargetNamespace).Get(ctx, services.TargetName, metav1.GetOptions{}); err == nil {
		t.Errorf("target Service %s left", services.TargetName)
	}
	for _, n := range l.Nodes() {
		out, err := exec.Command("nsenter", "--net=/run/netns/"+n.Netns, "nft", "list", "tables").CombinedOutput()
		if err != nil {
			t.Errorf("nft list tables in %s: %v: %s", n.Netns, err, out)
		} else if strings.Contains(string(out), "kube-proxy") {
			t.Errorf("kube-proxy's nft tables left in %s:\n%s", n.Netns, out)
		}
	}
	if cg := filepath.Join(filepath.Dir(l.State().Cgroup), "axon-svcbench"); exists(cg) {
		t.Errorf("cgroup %s left", cg)
	}
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
