package agent

import (
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/datapath/socklb"
	"github.com/axonhq/axon/internal/lb"
)

// fakeSockLB stands in for *socklb.LB in the pure-logic tests below.
type fakeSockLB struct {
	cgroup string
	local  []netip.Addr
}

func (f *fakeSockLB) UpsertFrontend(lb.Frontend) error    { return nil }
func (f *fakeSockLB) DeleteFrontend(lb.FrontendKey) error { return nil }
func (f *fakeSockLB) Frontends() ([]lb.Frontend, error)   { return nil, nil }
func (f *fakeSockLB) SetLocalAddrs(a []netip.Addr) error  { f.local = a; return nil }
func (f *fakeSockLB) CgroupPath() string                  { return f.cgroup }
func (f *fakeSockLB) SetSkipNetns([]uint64) error         { return nil }
func (f *fakeSockLB) EnableSockDestroy(func() []string) error {
	return errors.New("bpf_sock_destroy: not in this fake")
}
func (f *fakeSockLB) SockDestroyStatus() (bool, string, socklb.DestroyStats) {
	return false, "fake", socklb.DestroyStats{}
}
func (f *fakeSockLB) Close() error { return nil }

// A socket LB that fails to load leaves the agent running and says why in
// status; the next pass retries and, once loaded, status says enabled.
func TestEnsureSockLBDecision(t *testing.T) {
	nl, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		t.Skipf("netlink: %v", err)
	}
	defer nl.Close()
	fail := errors.New("attach to cgroup /x: operation not permitted")
	fake := &fakeSockLB{cgroup: "/sys/fs/cgroup/test"}
	tests := []struct {
		name      string
		socketLB  bool
		loads     []error // one per reconcile pass
		wantValue string
		wantIn    string
	}{
		{name: "not loaded yet", socketLB: true, wantValue: "pending", wantIn: "after the tc datapath"},
		{name: "load fails", socketLB: true, loads: []error{fail}, wantValue: "disabled", wantIn: "operation not permitted"},
		{name: "load fails then works", socketLB: true, loads: []error{fail, nil}, wantValue: "enabled", wantIn: "cgroup /sys/fs/cgroup/test"},
		{name: "flag off", socketLB: false, wantValue: "disabled", wantIn: "--socket-lb=false"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &socketLB{cfg: Config{SocketLB: tt.socketLB}, nl: nl, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
			calls := 0
			s.load = func() (sockLB, error) {
				err := tt.loads[calls]
				calls++
				if err != nil {
					return nil, err
				}
				return fake, nil
			}
			for range tt.loads {
				s.ensure()
			}
			d := s.decision()
			if d.Name != DecisionSocketLB || d.Value != tt.wantValue || !strings.Contains(d.Reason, tt.wantIn) {
				t.Errorf("decision %+v, want value %q with reason containing %q", d, tt.wantValue, tt.wantIn)
			}
			if calls != len(tt.loads) {
				t.Errorf("loader called %d times, want %d", calls, len(tt.loads))
			}
			if tt.wantValue == "enabled" && s.lb != fake {
				t.Errorf("socket LB not kept after a successful load")
			}
		})
	}
}

func TestValidateSocketLB(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{"defaults", Config{SocketLBMode: SocketLBModeAll}, ""},
		{"hostns-only", Config{SocketLBMode: SocketLBModeHostNS}, ""},
		{"empty mode is all", Config{}, ""},
		{"bad mode", Config{SocketLBMode: "pods"}, `--socket-lb-mode "pods" is invalid`},
		{"sizes", Config{SocketLBMode: SocketLBModeAll, LBServiceMapSize: 1024, LBBackendMapSize: 512}, ""},
		{"service map too small", Config{SocketLBMode: SocketLBModeAll, LBServiceMapSize: 3}, "--lb-service-map-size 3 is out of range"},
		{"backend map too large", Config{SocketLBMode: SocketLBModeAll, LBBackendMapSize: 1 << 30}, "--lb-backend-map-size"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.validateSocketLB()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("got %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}
