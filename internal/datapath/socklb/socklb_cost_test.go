package socklb

import (
	"fmt"
	"testing"

	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/axonhq/axon/internal/lb"
	"github.com/axonhq/axon/internal/stats"
)

// BenchmarkSockLBConnectCost measures what the connect4 hook adds to a
// connect(2): a UDP socket connecting (nothing is sent) to a ClusterIP with
// 1 or 10 backends, interleaved with the same connect straight to the
// backend address (the hook runs there too and finds no frontend), in one
// client process in the attached cgroup. Rounds alternate the paths; the
// reported numbers are medians over rounds of ns per socket+connect+close.
//
//	go test -run '^$' -bench SockLBConnectCost -benchtime 1x ./internal/datapath/
//
// The /10000 variant first fills the maps with 10 000 more frontends × 10
// backends (the Service benchmark's largest level), so the hook's lookups
// run against tables of that size.
//
// The /peer variants also call getpeername after connect, as Go's net.Dial
// (and most runtimes) do, so the getpeername hook's cost is in the numbers.
func BenchmarkSockLBConnectCost(b *testing.B) {
	for _, extra := range []int{0, 10000} {
		b.Run(fmt.Sprint(extra), func(b *testing.B) { sockLBConnectCost(b, extra, "udpconnect") })
		b.Run(fmt.Sprint(extra)+"/peer", func(b *testing.B) { sockLBConnectCost(b, extra, "udpconnectpeer") })
	}
}

func sockLBConnectCost(b *testing.B, extra int, kind string) {
	e := newSockLBEnv(b, sockLBOptions{})
	var fill []lb.Frontend
	for i := range extra {
		var bes []string
		for j := range 10 {
			bes = append(bes, fmt.Sprintf("10.%d.%d.%d:8080", 100+j, i/250, i%250+1))
		}
		fill = append(fill, lb.Frontend{Key: fkey(fmt.Sprintf("10.97.%d.%d:80", i/250, i%250+1), lb.TCP, lb.ScopeCluster),
			Backends: backends(lb.Active, bes...)})
	}
	if len(fill) > 0 {
		e.upsert(b, fill...)
	}
	ns := dptest.NewNetns(b, "lbcost")
	addLoopbackAddrs(b, ns, "198.18.97.1/24")
	var ten []string
	for i := range 10 {
		ten = append(ten, fmt.Sprintf("198.18.97.1:%d", 5300+i))
	}
	e.upsert(b,
		lb.Frontend{Key: fkey("10.96.0.10:53", lb.UDP, lb.ScopeCluster), Backends: backends(lb.Active, "198.18.97.1:53")},
		lb.Frontend{Key: fkey("10.96.0.11:53", lb.UDP, lb.ScopeCluster), Backends: backends(lb.Active, ten...)},
	)
	const rounds, count = 7, 20000
	paths := []struct{ name, addr string }{
		{"direct", "198.18.97.1:53"},
		{"clusterip-1", "10.96.0.10:53"},
		{"clusterip-10", "10.96.0.11:53"},
	}
	var ops []clientOp
	for range rounds {
		for _, p := range paths {
			ops = append(ops, clientOp{Kind: kind, Family: 4, Addr: p.addr, Count: count})
		}
	}
	res := runClients(b, ns, e.cgFD, ops...)
	per := map[string][]float64{}
	for i, r := range res {
		p := paths[i%len(paths)]
		if r.Fails > 0 {
			b.Fatalf("%s: %d of %d connects failed: %s", p.name, r.Fails, count, r.Err)
		}
		per[p.name] = append(per[p.name], float64(r.Nanos)/count)
	}
	ref := stats.Median(per["direct"])
	for _, p := range paths {
		m := stats.Median(per[p.name])
		b.ReportMetric(m, p.name+"-ns/connect")
		if p.name != "direct" {
			b.ReportMetric(m-ref, p.name+"-extra-ns")
		}
	}
	b.Logf("pressure before/after is not recorded here; run it with /proc/pressure/cpu at hand. per round (ns): %v", per)
}
