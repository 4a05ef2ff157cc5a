package podpath

import (
	"net"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
)

// What the external tests (package datapath_test: policer_test.go and
// lb_deliver_test.go need package bandwidth or nodeport, which import this
// one) use of the internal fixtures.

// ProgFixture is newProgFixture's node: pod_egress and uplink_ingress loaded
// (not attached) in netns NS, with two local pod endpoints.
type ProgFixture struct {
	NS, PinDir   string
	D            *Datapath
	Up, Pod      *ebpf.Program // axon_uplink_ingress, axon_pod_egress
	EP, EP6      Endpoint      // the local pod (v4, v6)
	Sender       Endpoint      // the pod behind PodIf that pod_egress runs for (v4)
	Sender6      Endpoint      // the same (v6)
	PodIf        int           // its host-side device: the ctx ifindex of pod_egress runs
	UpMAC, GwMAC net.HardwareAddr
}

func NewProgFixture(t testing.TB) *ProgFixture {
	t.Helper()
	f := newProgFixture(t)
	return &ProgFixture{NS: f.ns, PinDir: f.d.cfg.PinDir, D: f.d, Up: f.d.upProg, Pod: f.d.podProg,
		EP: f.ep, EP6: f.ep6, Sender: f.sender, Sender6: f.sender6, PodIf: f.podIf, UpMAC: f.upMAC, GwMAC: f.gwMAC}
}

// The traffic fixture (traffic_test.go): a node netns with pods.
var (
	NewTrafficNode = newTrafficNode
	AddPod         = addPod
	LoadWithPods   = loadWithPods
)

// Pod is a pod of AddPod.
type Pod = pod

func (p pod) NS() string      { return p.ns }
func (p pod) IP4() netip.Addr { return p.ip4 }
func (p pod) IP6() netip.Addr { return p.ip6 }

// PinDirOf is d's pin dir; UplinkProgram its axon_uplink_ingress.
func PinDirOf(d *Datapath) string             { return d.cfg.PinDir }
func UplinkProgram(d *Datapath) *ebpf.Program { return d.upProg }
