package datapath

import (
	"net/netip"
	"testing"
)

// BenchmarkPrograms reports ns/run of each program (BPF_PROG_TEST_RUN) on a
// local-pod frame (redirect_peer path) and a remote-pod frame (fib path):
//
//	go test ./internal/datapath -run XXX -bench Programs
func BenchmarkPrograms(b *testing.B) {
	f := newProgFixture(b)
	cases := []struct {
		desc    string
		pkt     []byte
		ifindex int
	}{
		{"local_pod_v4", ipv4Packet(f.hostMAC, f.podMAC, netip.MustParseAddr("10.244.1.7"), f.ep.IP, 64, nil), f.podIf},
		{"local_pod_v6", ipv6Packet(f.hostMAC, f.podMAC, netip.MustParseAddr("fd00:10:244:1::7"), f.ep6.IP, 64), f.podIf},
		{"remote_pod_v4_fib", ipv4Packet(f.hostMAC, f.podMAC, netip.MustParseAddr("10.244.1.7"), netip.MustParseAddr("10.244.2.9"), 64, nil), f.podIf},
	}
	for _, c := range cases {
		for _, name := range []string{"pod_egress", "uplink_ingress"} {
			b.Run(c.desc+"/"+name, func(b *testing.B) {
				p := f.d.podProg
				if name == "uplink_ingress" {
					p = f.d.upProg
				}
				var err error
				inNetns(b, f.ns, func() {
					b.ResetTimer()
					_, err = benchProgram(p, c.pkt, c.ifindex, b.N)
				})
				if err != nil {
					b.Fatal(err)
				}
			})
		}
	}
}
