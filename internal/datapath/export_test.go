package datapath

import (
	"net"
	"testing"

	"github.com/cilium/ebpf"
)

// What the external tests (package datapath_test, policer_test.go: they need
// package bandwidth, which imports this one) use of the internal fixture.

// ProgFixture is newProgFixture's node: pod_egress and uplink_ingress loaded
// (not attached) in netns NS, with two local pod endpoints.
type ProgFixture struct {
	NS, PinDir   string
	D            *Datapath
	Up, Pod      *ebpf.Program // axon_uplink_ingress, axon_pod_egress
	EP, EP6      Endpoint      // the local pod (v4, v6)
	UpMAC, GwMAC net.HardwareAddr
}

func NewProgFixture(t testing.TB) *ProgFixture {
	t.Helper()
	f := newProgFixture(t)
	return &ProgFixture{NS: f.ns, PinDir: f.d.cfg.PinDir, D: f.d, Up: f.d.upProg, Pod: f.d.podProg,
		EP: f.ep, EP6: f.ep6, UpMAC: f.upMAC, GwMAC: f.gwMAC}
}
