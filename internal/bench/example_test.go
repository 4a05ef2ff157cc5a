package bench_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"time"

	"github.com/axonhq/axon/internal/bench"
)

// How `axon lab bench` drives the runner with namespaces the lab created.
func Example() {
	node := func(name, ip string) bench.Endpoint {
		return bench.Endpoint{Name: name, Netns: "/run/netns/axonlab-" + name, IP: netip.MustParseAddr(ip)}
	}
	pod := func(name, nodeName, ip string) bench.Endpoint {
		e := node(name, ip)                                                   // pods have their own netns named like nodes
		e.Cgroup = "/sys/fs/cgroup/unified/axon-lab/" + nodeName + "/" + name // the pod's cgroup
		return e
	}
	cfg := bench.Config{
		Paths: []bench.Path{ // the first path is the reference for every ratio
			{Name: "host-to-host", Client: node("node1", "198.18.0.11"), Server: node("node2", "198.18.0.12")},
			{Name: "axon pod-to-pod cross-node", Client: pod("node1-pod0", "node1", "10.244.1.2"), Server: pod("node2-pod0", "node2", "10.244.2.2")},
		},
		Reps:     5,
		Duration: 10 * time.Second,
		OutDir:   bench.DefaultOutDir("results", time.Now()),
		Logger:   slog.Default(),
		Progress: os.Stderr,
	}
	rep, err := bench.Run(context.Background(), cfg)
	if rep != nil {
		fmt.Println(rep.Table()) // also in <OutDir>/results.md
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
	}
}
