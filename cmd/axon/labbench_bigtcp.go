package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/axonhq/axon/internal/bench"
	"github.com/axonhq/axon/internal/lab"
)

// `axon lab bench --compare-big-tcp` adds a cross-node pair of axon
// pods whose devices keep the pre-BIG-TCP GSO/GRO limit (65536), so BIG TCP
// on and off are measured interleaved in one run (on = the lab's own pods,
// with `axon lab up --big-tcp on`).
const (
	benchSmallGSOClient = "bench-axon-c64k"
	benchSmallGSOServer = "bench-axon-s64k"
	smallGSO            = 65536
	// path names of the two ratios the BIG TCP benchmark reports (labbench.go names the first two)
	bigTCPRefPath = "host-to-host"
	bigTCPOnPath  = "axon pod-to-pod cross-node"
	bigTCPOffPath = "axon pod-to-pod cross-node, GSO 64 KiB"
)

// addSmallGSOPath creates the two pods and returns the extra path; cleanup
// removes them unless keep.
func addSmallGSOPath(ctx context.Context, l *lab.Lab, nodes []lab.Node, keep bool) (bench.Path, func(), error) {
	var made []string
	if !l.State().BigTCP {
		return bench.Path{}, func() {}, fmt.Errorf("--compare-big-tcp compares the lab's BIG TCP pods with 64 KiB ones, but this lab runs without BIG TCP: bring it up with axon lab up --big-tcp on")
	}
	cleanup := func() {
		if keep {
			return
		}
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, name := range made {
			if err := l.DeletePod(cctx, name); err != nil {
				fmt.Fprintf(os.Stderr, "benchmark: remove pod %s: %v\n", name, err)
			}
		}
	}
	existing := map[string]bool{}
	for _, p := range l.Pods() {
		existing[p.Name] = true
	}
	pods := map[string]lab.Pod{}
	for i, name := range []string{benchSmallGSOClient, benchSmallGSOServer} {
		if existing[name] {
			if err := l.DeletePod(ctx, name); err != nil {
				return bench.Path{}, cleanup, fmt.Errorf("remove stale benchmark pod %s: %w", name, err)
			}
		}
		p, err := l.AddPod(ctx, nodes[i].Name, name, lab.DatapathAxon)
		if err != nil {
			return bench.Path{}, cleanup, fmt.Errorf("add benchmark pod %s on %s: %w", name, nodes[i].Name, err)
		}
		made = append(made, name)
		if err := lab.SetPodGSO(p, nodes[i], smallGSO); err != nil {
			return bench.Path{}, cleanup, err
		}
		pods[name] = p
	}
	ep := func(p lab.Pod) bench.Endpoint {
		return bench.Endpoint{Name: p.Name, Netns: "/run/netns/" + p.Netns, Cgroup: p.Cgroup, IP: p.IP}
	}
	return bench.Path{Name: bigTCPOffPath, Client: ep(pods[benchSmallGSOClient]), Server: ep(pods[benchSmallGSOServer])}, cleanup, nil
}

// bigTCPSummary states the two BIG TCP ratios from a --compare-big-tcp
// run: BIG TCP on / off, and axon pod-to-pod (BIG TCP) / host-to-host with
// the same GSO settings (the lab's wire and uplinks are at 192 KiB), each as
// the ratio of medians and as the median of the per-repetition ratios (the
// paths of one repetition run back to back) with its 95 % interval.
func bigTCPSummary(rep *bench.Report) string {
	var b strings.Builder
	b.WriteString("\n## BIG TCP\n\n")
	b.WriteString("Single-flow throughput (iperf3), kernel " + rep.Host.Kernel + "; wire, uplinks and the BIG TCP pods at 192 KiB GSO/GRO, the 64 KiB pair at the pre-BIG-TCP limit.\n\n")
	b.WriteString("| ratio | of medians | paired: per-repetition median (95 % CI) | min–max | repetitions > 1 | asked |\n|---|---:|---:|---:|---:|---|\n")
	for _, c := range []struct{ name, num, den, metric, asked string }{
		{"BIG TCP on / off (axon pod-to-pod cross-node, 192 KiB / 64 KiB)", bigTCPOnPath, bigTCPOffPath, bench.MetricThroughput, "report the ratio"},
		{"axon pod-to-pod (BIG TCP) / host-to-host, same GSO settings", bigTCPOnPath, bigTCPRefPath, bench.MetricThroughput, "≥ 0.98"},
		{"CPU s per GB, axon pod-to-pod (BIG TCP) / host-to-host: the work per byte behind the line above", bigTCPOnPath, bigTCPRefPath, bench.MetricCPUPerGB, "(context)"},
	} {
		if rep.Result(c.num) == nil || rep.Result(c.den) == nil {
			fmt.Fprintf(&b, "| %s | n/a | n/a | n/a | n/a | %s |\n", c.name, c.asked)
			continue
		}
		p := rep.PairedTo(c.num, c.den, c.metric)
		spread := "n/a"
		if p.N > 0 {
			spread = fmt.Sprintf("%.2f–%.2f", p.Min, p.Max)
		}
		fmt.Fprintf(&b, "| %s | %.2f× | %s | %s | %d of %d | %s |\n", c.name,
			rep.Stats(c.num, c.metric).Median/rep.Stats(c.den, c.metric).Median,
			bench.FormatPaired(p), spread, p.Above, p.N, c.asked)
	}
	return b.String()
}

// writeBigTCPSummary prints the summary and appends it to results.md in out.
func writeBigTCPSummary(w io.Writer, rep *bench.Report, out string) error {
	sum := bigTCPSummary(rep)
	fmt.Fprint(w, sum)
	f, err := os.OpenFile(filepath.Join(out, "results.md"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("append the BIG TCP summary to results.md: %w", err)
	}
	defer f.Close()
	_, err = f.WriteString(sum)
	return err
}
