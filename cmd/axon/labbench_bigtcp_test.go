package main

import (
	"math"
	"strings"
	"testing"

	"github.com/axonhq/axon/internal/bench"
)

// TestBigTCPSummary: the two BIG TCP ratios and the CPU per byte behind the second, of medians and per repetition
// (a failed sample, NaN, drops that repetition's pair only).
func TestBigTCPSummary(t *testing.T) {
	rep := &bench.Report{Reps: 3, Host: bench.Host{Kernel: "6.18.0"}, Reference: bigTCPRefPath, Results: []*bench.Result{
		{Path: bigTCPRefPath, Throughput: []float64{20e9, 22e9, 24e9}, CPUPerGB: []float64{0.40, 0.40, 0.38}},
		{Path: bigTCPOnPath, Throughput: []float64{20e9, 23e9, math.NaN()}, CPUPerGB: []float64{0.42, 0.41, math.NaN()}},
		{Path: bigTCPOffPath, Throughput: []float64{16e9, 18e9, 20e9}},
	}}
	got := bigTCPSummary(rep)
	for _, want := range []string{
		"| BIG TCP on / off (axon pod-to-pod cross-node, 192 KiB / 64 KiB) | 1.19× | 1.26× (CI: < 8 pairs) | 1.25–1.28 | 2 of 2 | report the ratio |",
		"| axon pod-to-pod (BIG TCP) / host-to-host, same GSO settings | 0.98× | 1.02× (CI: < 8 pairs) | 1.00–1.05 | 1 of 2 | ≥ 0.98 |",
		"| CPU s per GB, axon pod-to-pod (BIG TCP) / host-to-host: the work per byte behind the line above | 1.04× | 1.04× (CI: < 8 pairs) | 1.02–1.05 | 2 of 2 | (context) |",
		"kernel 6.18.0",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("summary lacks %q:\n%s", want, got)
		}
	}
	rep.Results = rep.Results[:2]
	if got := bigTCPSummary(rep); !strings.Contains(got, "| BIG TCP on / off (axon pod-to-pod cross-node, 192 KiB / 64 KiB) | n/a |") {
		t.Errorf("missing 64 KiB path not reported as n/a:\n%s", got)
	}
}
