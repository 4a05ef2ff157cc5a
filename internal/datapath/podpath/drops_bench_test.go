package podpath

import (
	"net/netip"
	"testing"

	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/axonhq/axon/internal/datapath/drops"
)

// BenchmarkDropMonitor reports ns/run of axon_pod_egress (BPF_PROG_TEST_RUN)
// on a spoofed frame (dropped, drop_spoof_src) and on a local-pod frame
// (forwarded), with the drop monitor off (no listener) and on (a reader
// drains the ring buffer; events it could not keep up with are lost in
// the kernel and reported as lost/op):
//
//	go test ./internal/datapath/podpath -run XXX -bench DropMonitor -p 1
func BenchmarkDropMonitor(b *testing.B) {
	f := newProgFixture(b)
	mp, err := drops.Open(f.d.cfg.PinDir)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(mp.Close)
	hub, err := drops.NewHub(mp, dptest.Logger(b))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(hub.Close)
	const (
		redirect = 7 // TC_ACT_REDIRECT
		shot     = 2 // TC_ACT_SHOT
	)
	cases := []struct {
		desc string
		pkt  []byte
		want uint32
	}{
		{"dropped_spoof_v4", dptest.IPv4Packet(f.hostMAC, f.podMAC, netip.MustParseAddr("10.244.1.250"), f.ep.IP, 255, nil), shot},
		{"forwarded_local_pod_v4", dptest.IPv4Packet(f.hostMAC, f.podMAC, netip.MustParseAddr("10.244.1.7"), f.ep.IP, 255, nil), redirect},
	}
	for _, c := range cases {
		for _, on := range []bool{false, true} {
			name := c.desc + "/monitor_off"
			if on {
				name = c.desc + "/monitor_on"
			}
			b.Run(name, func(b *testing.B) {
				if on {
					sub, cancel, err := hub.Subscribe(4096)
					if err != nil {
						b.Fatal(err)
					}
					defer cancel()
					go func() {
						for range sub.C {
						}
					}()
				}
				r0, _ := mp.ReadRingStats()
				var (
					ret uint32
					err error
				)
				dptest.InNetns(b, f.ns, func() {
					b.ResetTimer()
					_, ret, err = benchProgram(f.d.podProg, c.pkt, f.podIf, b.N)
				})
				b.StopTimer()
				if err != nil {
					b.Fatal(err)
				}
				if ret != c.want {
					b.Fatalf("verdict %d, want %d: the program took another path than the one measured", ret, c.want)
				}
				r1, _ := mp.ReadRingStats()
				b.ReportMetric(float64(r1.Emitted-r0.Emitted)/float64(b.N), "events/op")
				b.ReportMetric(float64(r1.Lost-r0.Lost)/float64(b.N), "lost/op")
				if !on && r1.Emitted != r0.Emitted {
					b.Fatalf("events emitted with the monitor off: %d", r1.Emitted-r0.Emitted)
				}
			})
		}
	}
}
