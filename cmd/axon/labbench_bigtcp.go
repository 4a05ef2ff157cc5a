package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/axonhq/axon/internal/bench"
	"github.com/axonhq/axon/internal/lab"
)

// issue 5: `axon lab bench --compare-big-tcp` adds a cross-node pair of axon
// pods whose devices keep the pre-BIG-TCP GSO/GRO limit (65536), so BIG TCP
// on and off are measured interleaved in one run (on = the lab's own pods,
// with `axon lab up --big-tcp on`).
const (
	benchSmallGSOClient = "bench-axon-c64k"
	benchSmallGSOServer = "bench-axon-s64k"
	smallGSO            = 65536
)

// addSmallGSOPath creates the two pods and returns the extra path; cleanup
// removes them unless keep.
func addSmallGSOPath(ctx context.Context, l *lab.Lab, nodes []lab.Node, keep bool) (bench.Path, func(), error) {
	var made []string
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
	return bench.Path{Name: "axon pod-to-pod cross-node, GSO 64 KiB", Client: ep(pods[benchSmallGSOClient]), Server: ep(pods[benchSmallGSOServer])}, cleanup, nil
}
