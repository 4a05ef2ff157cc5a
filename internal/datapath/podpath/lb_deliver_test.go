package podpath_test

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/axonhq/axon/internal/datapath/nodeport"
	"github.com/axonhq/axon/internal/datapath/podpath"
	"github.com/axonhq/axon/internal/inetcsum"
)

// The nodeport LB delivering to local pods needs package nodeport (an
// importer of this one): external tests, with the traffic fixture through
// export_test.go.
var (
	newTrafficNode = podpath.NewTrafficNode
	addPod         = podpath.AddPod
	loadWithPods   = podpath.LoadWithPods
)

// progRuns is how many times prog has run since BPF_ENABLE_STATS was on.
func progRuns(t *testing.T, prog *ebpf.Program) uint64 {
	t.Helper()
	st, err := prog.Stats()
	if err != nil {
		t.Fatalf("program stats: %v", err)
	}
	return st.RunCount
}

// TestTrafficLBDeliversPods: frames from the wire to a pod of the node,
// with the north-south LB attached on the uplink ahead of
// axon_uplink_ingress. With DeliverPods, axon_lb_ingress hands pod-bound
// TCP/UDP to the pod itself and axon_uplink_ingress does not run for it;
// what needs a decision (TTL 1) and other protocols (ICMP) still go on to
// axon_uplink_ingress, which decides and counts as before. Without
// DeliverPods (the control), axon_uplink_ingress runs for every frame.
// Delivery is counted in the uplink_ingress row either way, and real UDP
// echoes from the wire are answered.
func TestTrafficLBDeliversPods(t *testing.T) {
	dptest.RequireRoot(t)
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		t.Skipf("BPF run-time statistics unavailable (Linux >= 5.8): %v", err)
	}
	defer stats.Close()

	node, ext := newTrafficNode(t)
	a := addPod(t, node, "lxcA", "10.244.1.2", "fd00:10:244:1::2")
	d := loadWithPods(t, node, a)
	nodeMAC, wireMAC := dptest.LinkMAC(t, node, "eth0"), dptest.LinkMAC(t, ext, "wire")
	src4, src6 := netip.MustParseAddr("198.18.0.250"), netip.MustParseAddr("fd00:198:18::250")

	icmp4 := dptest.IPv4Packet(nodeMAC, wireMAC, src4, a.IP4(), 64, nil)
	icmp4[14+9] = 1 // protocol ICMP (the payload is not parsed on the way)
	binary.BigEndian.PutUint16(icmp4[14+10:], 0)
	binary.BigEndian.PutUint16(icmp4[14+10:], inetcsum.Checksum(icmp4[14:14+20], 0))
	const k = 8
	frames := func(f []byte) [][]byte {
		out := make([][]byte, k)
		for i := range out {
			out[i] = f
		}
		return out
	}

	for _, tc := range []struct {
		name    string
		deliver bool
	}{{"DeliverPods", true}, {"uplink program delivers", false}} {
		t.Run(tc.name, func(t *testing.T) {
			var np *nodeport.LB
			var err error
			dptest.InNetns(t, node, func() {
				np, err = nodeport.Load(nodeport.Options{PinDir: podpath.PinDirOf(d), NodeName: "node1",
					NodeAddrs:   []netip.Addr{netip.MustParseAddr("198.18.0.11"), netip.MustParseAddr("fd00:198:18::11")},
					DeliverPods: tc.deliver, Logger: dptest.Logger(t)})
				if err == nil {
					err = np.SetPodCIDRs([]netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:10:244:1::/64")})
				}
				if err == nil {
					_, err = np.Attach("eth0", nodeport.XDPNone)
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				np.Close()
				dptest.InNetns(t, node, func() {
					if err := nodeport.Uninstall(podpath.PinDirOf(d)); err != nil {
						t.Errorf("uninstall LB: %v", err)
					}
				})
			}()

			steps := []struct {
				desc   string
				frames [][]byte
				reason string // uplink_ingress counter that must grow by k
				upRuns bool   // axon_uplink_ingress must run for them
			}{
				{"UDP, IPv4", frames(dptest.IPv4Packet(nodeMAC, wireMAC, src4, a.IP4(), 64, nil)), "redirect_peer_local", !tc.deliver},
				{"UDP, IPv6", frames(dptest.IPv6Packet(nodeMAC, wireMAC, src6, a.IP6(), 64)), "redirect_peer_local", !tc.deliver},
				{"UDP, IPv4, TTL 1", frames(dptest.IPv4Packet(nodeMAC, wireMAC, src4, a.IP4(), 1, nil)), "pass_ttl", true},
				{"ICMP, IPv4", frames(icmp4), "redirect_peer_local", true},
			}
			for _, s := range steps {
				m0, err := d.MetricsByDirection()
				if err != nil {
					t.Fatal(err)
				}
				up0, lb0 := progRuns(t, podpath.UplinkProgram(d)), progRuns(t, np.Program(nodeport.HookTC))
				dptest.SendRaw(t, ext, "wire", s.frames)
				time.Sleep(50 * time.Millisecond) // frames are handled in the receiver's softirq
				m1, err := d.MetricsByDirection()
				if err != nil {
					t.Fatal(err)
				}
				up, lbRuns := progRuns(t, podpath.UplinkProgram(d))-up0, progRuns(t, np.Program(nodeport.HookTC))-lb0
				if got := m1["uplink_ingress"][s.reason] - m0["uplink_ingress"][s.reason]; got != k {
					t.Errorf("%s: uplink_ingress %s +%d, want +%d", s.desc, s.reason, got, k)
				}
				if lbRuns < k {
					t.Errorf("%s: axon_lb_ingress ran %d times for %d frames (not attached ahead?)", s.desc, lbRuns, k)
				}
				switch {
				case s.upRuns && up < k:
					t.Errorf("%s: axon_uplink_ingress ran %d times for %d frames, want every frame", s.desc, up, k)
				case !s.upRuns && up >= k:
					t.Errorf("%s: axon_uplink_ingress ran %d times for %d frames the LB should have delivered", s.desc, up, k)
				}
			}
			if got := dptest.UDPEcho(t, ext, a.NS(), a.IP4(), 5); got != 5 {
				t.Errorf("wire -> pod UDP echo, IPv4: %d of 5 came back", got)
			}
			if got := dptest.UDPEcho(t, ext, a.NS(), a.IP6(), 5); got != 5 {
				t.Errorf("wire -> pod UDP echo, IPv6: %d of 5 came back", got)
			}
		})
	}
}
