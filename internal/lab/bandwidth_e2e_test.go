package lab_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/axonhq/axon/internal/lab"
)

// TestLabBandwidthCNIPlugin: `axon lab up --bandwidth-manager cni-plugin`
// chains the reference bandwidth plugin after axon-cni. A pod annotated
// with kubernetes.io/egress-bandwidth=10M and ingress-bandwidth=20M gets,
// once its sandbox is re-created (the plugin reads annotations only at
// ADD), a TBF on an ifb (egress) and a TBF on its host veth (ingress), and
// TCP flows from and to it run at those rates. A bad annotation is refused
// and the limits in place stay; removing the annotations removes the TBFs.
// Runs on this host (tbf, ifb, mirred are there; fq is not needed).
func TestLabBandwidthCNIPlugin(t *testing.T) {
	need(t, "axon", "axon-agent", "axon-cni")
	if _, err := lab.DepPath("bandwidth"); errors.Is(err, lab.ErrDepMissing) {
		t.Skipf("reference bandwidth plugin not cached (%v): run `make deps`", err)
	}
	l := up(t, "--nodes", "1", "--pods-per-node", "2", "--no-demo", "--bandwidth-manager", "cni-plugin")
	ctx := t.Context()
	pods := podsOn(l, "node1")
	if len(pods) < 2 {
		t.Fatalf("want 2 pods on node1, got %v", pods)
	}
	src, dst := pods[0], pods[1]
	node := nodeByName(t, l, "node1")
	qdiscs := func() string {
		out, err := exec.Command("tc", "-n", node.Netns, "qdisc", "show").CombinedOutput()
		if err != nil {
			t.Fatalf("tc qdisc show in %s: %v\n%s", node.Netns, err, out)
		}
		return string(out)
	}
	tbfs := func() []string {
		var out []string
		for _, line := range strings.Split(qdiscs(), "\n") {
			if strings.HasPrefix(line, "qdisc tbf") {
				out = append(out, line)
			}
		}
		return out
	}
	if got := tbfs(); len(got) != 0 {
		t.Fatalf("TBF before any annotation: %v", got)
	}
	kube, err := l.Kube()
	if err != nil {
		t.Fatal(err)
	}
	annotate := func(egress, ingress string) {
		t.Helper()
		ann := map[string]any{"kubernetes.io/egress-bandwidth": nil, "kubernetes.io/ingress-bandwidth": nil}
		if egress != "" {
			ann["kubernetes.io/egress-bandwidth"] = egress
		}
		if ingress != "" {
			ann["kubernetes.io/ingress-bandwidth"] = ingress
		}
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": ann}})
		if _, err := kube.CoreV1().Pods(src.Namespace).Patch(ctx, src.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	annotate("10M", "20M")
	if err := l.ReapplyPodBandwidth(ctx, src.Name); err != nil {
		t.Fatal(err)
	}
	got := tbfs()
	t.Logf("qdiscs with 10M egress / 20M ingress on %s:\n%s", src.Name, strings.Join(got, "\n"))
	if len(got) != 2 || !strings.Contains(strings.Join(got, "\n"), "rate 10Mbit") || !strings.Contains(strings.Join(got, "\n"), "rate 20Mbit") {
		t.Fatalf("want a 10Mbit TBF (ifb, egress) and a 20Mbit TBF (host veth, ingress), got %v", got)
	}
	if !strings.Contains(qdiscs(), "dev bwp") {
		t.Errorf("no ifb (bwp…) device with a qdisc: %s", qdiscs())
	}

	iperfServer(t, ctx, l, dst.Name, 5201)
	egress := labIperf(t, ctx, l, src.Name, dst.IP.String(), 5201, false)
	iperfServer(t, ctx, l, dst.Name, 5202)
	ingress := labIperf(t, ctx, l, src.Name, dst.IP.String(), 5202, true)
	t.Logf("goodput from the pod %.2f Mbit/s (egress limit 10M: %.3f), toward it %.2f Mbit/s (ingress limit 20M: %.3f)",
		egress/1e6, egress/10e6, ingress/1e6, ingress/20e6)
	// TBF counts L2 bytes: TCP goodput is at most 0.956 of the rate
	if r := egress / 10e6; r > 1.05 || r < 0.70 {
		t.Errorf("egress goodput %.3f of the 10M limit, want 0.70..1.05", r)
	}
	if r := ingress / 20e6; r > 1.05 || r < 0.70 {
		t.Errorf("ingress goodput %.3f of the 20M limit, want 0.70..1.05", r)
	}

	// bad input: refused, the limits in place stay
	annotate("abc", "20M")
	if err := l.ReapplyPodBandwidth(ctx, src.Name); err == nil || !strings.Contains(err.Error(), "not a Kubernetes quantity") {
		t.Errorf("egress-bandwidth=abc: %v, want a refusal naming the annotation", err)
	}
	if got := tbfs(); len(got) != 2 {
		t.Errorf("after a refused annotation the TBFs changed: %v", got)
	}

	annotate("", "")
	if err := l.ReapplyPodBandwidth(ctx, src.Name); err != nil {
		t.Fatal(err)
	}
	if got := tbfs(); len(got) != 0 {
		t.Errorf("annotations removed, TBFs left: %v", got)
	}
	if strings.Contains(qdiscs(), "dev bwp") {
		t.Errorf("annotations removed, ifb left: %s", qdiscs())
	}
}

// labIperf runs a 5 s iperf3 TCP flow from pod src to addr (reverse: toward
// src) and returns the receiver's goodput in bits per second.
func labIperf(t *testing.T, ctx context.Context, l *lab.Lab, src, addr string, port int, reverse bool) float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	args := []string{"iperf3", "-c", addr, "-p", fmt.Sprint(port), "-t", "5", "-O", "1", "-J"}
	if reverse {
		args = append(args, "-R")
	}
	out, err := l.Command(ctx, src, args...).Output()
	if err != nil {
		t.Fatalf("iperf3 from %s: %v\n%s", src, err, out)
	}
	var r struct {
		End struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("iperf3 JSON: %v\n%s", err, out)
	}
	return r.End.SumReceived.BitsPerSecond
}
