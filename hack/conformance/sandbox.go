package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	dto "github.com/prometheus/client_model/go"

	"github.com/axonhq/axon/internal/bench"
)

// sandboxMetric is kubelet's histogram of RunPodSandbox calls: the runtime
// creates the pod's netns, calls the CNI plugin's ADD and starts the pause
// container. Its buckets are Prometheus' defaults (5 ms … 10 s), so the
// quantiles are estimates within a bucket.
const sandboxMetric = "kubelet_run_podsandbox_duration_seconds"

// sandboxStats is one node's RunPodSandbox time over the run.
type sandboxStats struct {
	Node  string  `json:"node"`
	Count uint64  `json:"count"`
	Mean  float64 `json:"meanSeconds"`
	P50   float64 `json:"p50Seconds"` // PromQL histogram_quantile estimates
	P99   float64 `json:"p99Seconds"`
}

// collectSandbox reads every node's kubelet metrics through the apiserver
// (nodes/<name>/proxy/metrics) and writes sandbox.json into out.
func collectSandbox(ctx context.Context, kubectl, kubeconfig, out string) ([]sandboxStats, error) {
	names, err := exec.CommandContext(ctx, kubectl, "--kubeconfig", kubeconfig, "get", "nodes", "-o", "jsonpath={.items[*].metadata.name}").Output()
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	var stats []sandboxStats
	for _, n := range strings.Fields(string(names)) {
		text, err := exec.CommandContext(ctx, kubectl, "--kubeconfig", kubeconfig, "get", "--raw", "/api/v1/nodes/"+n+"/proxy/metrics").Output()
		if err != nil {
			return nil, fmt.Errorf("kubelet metrics of %s: %w", n, err)
		}
		s, err := sandboxOf(n, text)
		if err != nil {
			return nil, err
		}
		stats = append(stats, s)
	}
	b, err := json.MarshalIndent(stats, "", "  ")
	if err != nil {
		return nil, err
	}
	return stats, os.WriteFile(filepath.Join(out, "sandbox.json"), append(b, '\n'), 0o644)
}

// sandboxOf sums node's sandboxMetric over its runtime handlers.
func sandboxOf(node string, text []byte) (sandboxStats, error) {
	fams, err := bench.MetricFamilies(bytes.NewReader(text))
	if err != nil {
		return sandboxStats{}, fmt.Errorf("kubelet metrics of %s: %w", node, err)
	}
	f := fams[sandboxMetric]
	if f == nil {
		return sandboxStats{}, fmt.Errorf("kubelet of %s exports no %s", node, sandboxMetric)
	}
	sum := &dto.Histogram{SampleCount: new(uint64), SampleSum: new(float64)}
	for _, m := range f.GetMetric() {
		h := m.GetHistogram()
		*sum.SampleCount += h.GetSampleCount()
		*sum.SampleSum += h.GetSampleSum()
		for i, b := range h.GetBucket() {
			if i == len(sum.Bucket) {
				sum.Bucket = append(sum.Bucket, &dto.Bucket{UpperBound: b.UpperBound, CumulativeCount: new(uint64)})
			}
			if sum.Bucket[i].GetUpperBound() != b.GetUpperBound() {
				return sandboxStats{}, fmt.Errorf("kubelet of %s: %s handlers with different buckets", node, sandboxMetric)
			}
			*sum.Bucket[i].CumulativeCount += b.GetCumulativeCount()
		}
	}
	s := sandboxStats{Node: node, Count: sum.GetSampleCount(), Mean: math.NaN()}
	if s.Count > 0 {
		s.Mean = sum.GetSampleSum() / float64(s.Count)
	}
	s.P50, s.P99 = bench.HistogramQuantile(sum, 0.5), bench.HistogramQuantile(sum, 0.99)
	return s, nil
}

// sandboxMarkdown is the sandbox section of results.md and compare.md.
func sandboxMarkdown(stats []sandboxStats) string {
	if len(stats) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "| node | sandboxes | mean ms | p50 ms | p99 ms |\n|---|---|---|---|---|\n")
	for _, s := range stats {
		fmt.Fprintf(&b, "| %s | %d | %.0f | %.0f | %.0f |\n", s.Node, s.Count, s.Mean*1e3, s.P50*1e3, s.P99*1e3)
	}
	return b.String()
}

// readSandbox reads dir's sandbox.json (nil when the run has none).
func readSandbox(dir string) []sandboxStats {
	b, err := os.ReadFile(filepath.Join(dir, "sandbox.json"))
	if err != nil {
		return nil
	}
	var s []sandboxStats
	if json.Unmarshal(b, &s) != nil {
		return nil
	}
	return s
}
