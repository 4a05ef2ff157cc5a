package agent

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/axonhq/axon/internal/lb"
)

// TestLBMapsStates: pure logic; the socket LB is stood in for by lb.MemWriter
// (the real maps are covered by internal/lab's TestLabServiceSocketLB).
func TestLBMapsStates(t *testing.T) {
	mw := lb.NewMemWriter(0)
	fe := lb.Frontend{Key: lb.FrontendKey{Addr: netip.MustParseAddr("10.96.0.50"), Port: 80, Proto: lb.TCP},
		Kind: lb.KindClusterIP, Service: "default/echo", PortName: "tcp",
		Backends: []lb.Backend{{Addr: netip.MustParseAddr("10.244.2.1"), Port: 8080, State: lb.Active, NodeName: "node2"}}}
	if err := mw.UpsertFrontend(fe); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		s        *socketLB
		enabled  bool
		reason   string
		text     []string
		fes, bes int
	}{
		{"flag off", &socketLB{cfg: Config{SocketLB: false}}, false, "--socket-lb=false", nil, 0, 0},
		{"load failed", &socketLB{cfg: Config{SocketLB: true}, err: "load failed, Services are not translated: no cgroup2"}, false, "no cgroup2", nil, 0, 0},
		{"pending", &socketLB{cfg: Config{SocketLB: true}}, false, "not loaded yet", nil, 0, 0},
		{"loaded", &socketLB{cfg: Config{SocketLB: true}, cgroup: "/sys/fs/cgroup/x", svc: &serviceSync{w: mw}}, true, "",
			[]string{"10.96.0.50:80/TCP", "default/echo:tcp", "-> 10.244.2.1:8080"}, 1, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rep, err := (&Agent{sock: tc.s}).LBMaps(context.Background())
			if err != nil {
				t.Fatalf("LBMaps: %v", err)
			}
			if rep.Enabled != tc.enabled || !strings.Contains(rep.Reason, tc.reason) || rep.Frontends != tc.fes || rep.Backends != tc.bes {
				t.Fatalf("LBMaps = %+v, want enabled=%v reason~%q frontends=%d backends=%d", rep, tc.enabled, tc.reason, tc.fes, tc.bes)
			}
			if !tc.enabled && rep.Text != "" {
				t.Errorf("disabled but text %q", rep.Text)
			}
			for _, w := range tc.text {
				if !strings.Contains(rep.Text, w) {
					t.Errorf("text lacks %q:\n%s", w, rep.Text)
				}
			}
		})
	}
}

func TestServiceListWithoutWatch(t *testing.T) {
	rep, err := (&Agent{}).ServiceList(context.Background())
	if err != nil || rep.Text != "" || rep.Synced || rep.Frontends != 0 {
		t.Fatalf("ServiceList without a Service watch = %+v, %v", rep, err)
	}
}
