package nodeport

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/axonhq/axon/internal/netnsutil"
)

// BenchmarkPodBound: what the uplink LB costs a packet addressed to a pod
// of this node (podCIDRs known): a UDP datagram and a TCP segment that is
// not a SYN, at tc and XDP. The metric "prog-ns/op" is the kernel's own
// time of the program run (BPF_PROG_TEST_RUN, one run per call), without
// the syscall.
//
//	go test -run XXX -bench BenchmarkPodBound -benchtime 200000x ./internal/datapath/nodeport/
func BenchmarkPodBound(b *testing.B) {
	f := newNPFix(b, nil)
	if err := f.n.SetPodCIDRs([]netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}); err != nil {
		b.Fatal(err)
	}
	pkts := []struct {
		name string
		pkt  []byte
	}{
		{"udp", f.wirePkt(npUDP("198.18.0.250:40000", "10.244.1.5:8080"), 0)},
		{"tcp-ack", f.wirePkt(npTCP("198.18.0.250:40000", "10.244.1.5:8080"), npACK)},
	}
	for _, hook := range npHooks {
		for _, p := range pkts {
			b.Run(hook+"/"+p.name, func(b *testing.B) {
				var total time.Duration
				err := netnsutil.Do(f.ns, func() error {
					for i := 0; i < b.N; i++ {
						_, d, err := f.n.TestRun(hook, p.pkt, f.upIf)
						if err != nil {
							return fmt.Errorf("run %d: %w", i, err)
						}
						total += d
					}
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(total.Nanoseconds())/float64(b.N), "prog-ns/op")
			})
		}
	}
}
