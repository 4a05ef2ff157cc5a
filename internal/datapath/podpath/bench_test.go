package podpath

import (
	"net/netip"
	"testing"

	"github.com/axonhq/axon/internal/datapath/dptest"
)

// BenchmarkPrograms reports ns/run of each program (BPF_PROG_TEST_RUN) on a
// local-pod frame (redirect_peer path) and a remote-pod frame (fib path:
// from the route cache, and looked up per packet with the cache off), and
// fails when a program's verdict shows it took another path:
//
//	go test ./internal/datapath/podpath -run XXX -bench Programs
func BenchmarkPrograms(b *testing.B) {
	f := newProgFixture(b)
	off := newProgFixtureWith(b, func(c *Config) { c.NoFibCache = true })
	const (
		redirect = 7 // TC_ACT_REDIRECT
		pass     = 0 // TC_ACT_OK: to the stack (uplink ingress: not a local pod)
	)
	// TTL / hop limit 255: see maxRunsPerCall
	cases := []struct {
		desc    string
		pkt     []byte
		ifindex int
		want    map[string]uint32 // program -> verdict of the path measured
		noCache bool              // run in the fixture loaded with NoFibCache
	}{
		{"local_pod_v4", dptest.IPv4Packet(f.hostMAC, f.podMAC, netip.MustParseAddr("10.244.1.7"), f.ep.IP, 255, nil), f.podIf,
			map[string]uint32{"pod_egress": redirect, "uplink_ingress": redirect}, false},
		{"local_pod_v6", dptest.IPv6Packet(f.hostMAC, f.podMAC, netip.MustParseAddr("fd00:10:244:1::7"), f.ep6.IP, 255), f.podIf,
			map[string]uint32{"pod_egress": redirect, "uplink_ingress": redirect}, false},
		{"remote_pod_v4_fib", dptest.IPv4Packet(f.hostMAC, f.podMAC, netip.MustParseAddr("10.244.1.7"), netip.MustParseAddr("10.244.2.9"), 255, nil), f.podIf,
			map[string]uint32{"pod_egress": redirect, "uplink_ingress": pass}, false},
		{"remote_pod_v4_fib_nocache", dptest.IPv4Packet(f.hostMAC, f.podMAC, netip.MustParseAddr("10.244.1.7"), netip.MustParseAddr("10.244.2.9"), 255, nil), off.podIf,
			map[string]uint32{"pod_egress": redirect}, true},
	}
	for _, c := range cases {
		fx := f
		if c.noCache {
			fx = off
		}
		for _, name := range []string{"pod_egress", "uplink_ingress"} {
			if _, ok := c.want[name]; !ok {
				continue
			}
			b.Run(c.desc+"/"+name, func(b *testing.B) {
				p := fx.d.podProg
				if name == "uplink_ingress" {
					p = fx.d.upProg
				}
				var (
					ret uint32
					err error
				)
				dptest.InNetns(b, fx.ns, func() {
					b.ResetTimer()
					_, ret, err = benchProgram(p, c.pkt, c.ifindex, b.N)
				})
				if err != nil {
					b.Fatal(err)
				}
				if ret != c.want[name] {
					b.Fatalf("verdict %d, want %d: the program took another path than the one measured", ret, c.want[name])
				}
			})
		}
	}
}
