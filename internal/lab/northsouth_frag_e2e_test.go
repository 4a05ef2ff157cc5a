package lab_test

// IP fragments through the north-south LB, end to end
// (bpf/lib/frag.h): from the external namespace, UDP datagrams of 4 000
// bytes (the sending kernel fragments them at the wire's MTU of 1 500) to a
// NodePort on each node, IPv4 and IPv6, must come back whole. The backends
// are node1's pods only, so node1 is the entry node with a local backend
// (DNAT in, the reply's source restored at uplink egress, both fragmented)
// and node2 the one with a remote backend (SNAT + DNAT to node1, reverse NAT
// of the fragmented reply). The LB's counters must show the fragments were
// tracked (frag_tracked), not reassembled somewhere before it.

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/axonhq/axon/internal/datapath/nodeport"
	"github.com/axonhq/axon/internal/lab"
	"github.com/axonhq/axon/internal/netnsutil"
)

const (
	fragEchoPort  = 5659  // the big-datagram UDP echo in node1's pods
	fragNodePort  = 30087 // the test Service's NodePort
	fragDatagram  = 4000  // bytes of UDP payload: 3 fragments at MTU 1500
	fragDatagrams = 10    // per entry node and family
)

// TestLabNorthSouthFragments: at tc.
func TestLabNorthSouthFragments(t *testing.T) { labFragments(t, false) }

// TestLabNorthSouthFragmentsXDP: with --lb-acceleration best-effort. Where
// the kernel's veth runs XDP natively (probed; else it skips), the uplinks
// must hold axon_lb_xdp in driver mode and the first fragments must have
// been tracked by the XDP program, not by tc behind it.
func TestLabNorthSouthFragmentsXDP(t *testing.T) { labFragments(t, true) }

func labFragments(t *testing.T, xdp bool) {
	waitLabSlot(t)
	need(t, "axon", "axon-agent", "axon-cni")
	args := []string{"--nodes", "2", "--pods-per-node", "2"}
	if xdp {
		args = append(args, "--lb-acceleration", "best-effort")
	}
	l := up(t, args...)
	t.Logf("nodeport_lb: %v", nodePortLBStatus(t, l))
	if xdp {
		requireNativeXDP(t, l)
	}
	node1, node2 := l.Nodes()[0], l.Nodes()[1]
	var backends []lab.Pod
	for _, p := range l.Pods() {
		if p.Node == node1.Name {
			backends = append(backends, p)
			fragEchoServer(t, p.Netns, fragEchoPort)
		}
	}
	if len(backends) == 0 {
		t.Fatalf("no pods on %s", node1.Name)
	}
	kube, err := l.Kube()
	if err != nil {
		t.Fatal(err)
	}
	svc := newTestService("ns-frag", corev1.ServiceTypeNodePort, fragNodePort, corev1.ProtocolUDP)
	for i := range svc.Spec.Ports {
		svc.Spec.Ports[i].TargetPort = intstr.FromInt32(fragEchoPort)
	}
	created, err := kube.CoreV1().Services("default").Create(t.Context(), svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	(&testService{svc: created, port: fragEchoPort, backends: backends}).apply(t, kube)

	ext := l.External()
	before := map[string]map[string]map[string]uint64{}
	for _, n := range l.Nodes() {
		before[n.Name] = npPinnedCounters(t, n.PinDir)
	}
	for _, entry := range []struct {
		node lab.Node
		kind string
	}{{node1, "local backend"}, {node2, "remote backend (SNAT)"}} {
		for _, addr := range entry.node.IPs {
			dst := netip.AddrPortFrom(addr, fragNodePort)
			t.Run(fmt.Sprintf("%s/%s", entry.node.Name, dst), func(t *testing.T) {
				// the first answer may wait for the agents to program the Service
				if _, err := fragExchange(ext.Netns, dst, fragDatagram, 20*time.Second); err != nil {
					t.Fatalf("%s, %s: %v", dst, entry.kind, err)
				}
				retried := 0
				for i := range fragDatagrams {
					n, err := fragExchange(ext.Netns, dst, fragDatagram, 5*time.Second)
					if err != nil {
						t.Fatalf("datagram %d of %d bytes to %s (%s): %v", i, fragDatagram, dst, entry.kind, err)
					}
					retried += n - 1
				}
				t.Logf("%s (%s): %d datagrams of %d bytes echoed whole (%d resends)", dst, entry.kind, fragDatagrams+1, fragDatagram, retried)
			})
		}
	}
	for _, n := range l.Nodes() {
		after := npPinnedCounters(t, n.PinDir)
		moved := map[string]uint64{}
		for hook, row := range after {
			for r, v := range row {
				if d := v - before[n.Name][hook][r]; d != 0 && (strings.HasPrefix(r, "frag") || r == "malformed") {
					moved[hook+"/"+r] = d
				}
			}
		}
		t.Logf("%s: fragment counters moved: %v", n.Name, moved)
		if xdp && moved["xdp/frag_tracked"] == 0 {
			t.Errorf("%s: the XDP program tracked no first fragment (%v): the datagrams went around it", n.Name, moved)
		}
		if moved["tc/frag_tracked"]+moved["xdp/frag_tracked"] == 0 {
			t.Errorf("%s: no first fragment was tracked at its uplink ingress: did the datagrams arrive fragmented? (%v)", n.Name, moved)
		}
	}
}

// fragEchoServer echoes every UDP datagram (up to 64 KiB, both families)
// on port in the netns, whole, until the test ends.
func fragEchoServer(t *testing.T, nsName string, port int) {
	t.Helper()
	var c *net.UDPConn
	if err := netnsutil.Do(nsName, func() (err error) {
		c, err = net.ListenUDP("udp", &net.UDPAddr{Port: port})
		return err
	}); err != nil {
		t.Fatalf("UDP echo in %s: %v", nsName, err)
	}
	t.Cleanup(func() { c.Close() })
	go func() {
		buf := make([]byte, 65536)
		for {
			n, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			_, _ = c.WriteToUDPAddrPort(buf[:n], from)
		}
	}()
}

// fragExchange sends a datagram of size random bytes from the netns to dst
// until the same bytes come back from dst (resending every 500 ms) or
// timeout; it returns how many sends it took.
func fragExchange(nsName string, dst netip.AddrPort, size int, timeout time.Duration) (int, error) {
	network := "udp4"
	if dst.Addr().Is6() {
		network = "udp6"
	}
	var c *net.UDPConn
	if err := netnsutil.Do(nsName, func() (err error) {
		c, err = net.ListenUDP(network, nil)
		return err
	}); err != nil {
		return 0, err
	}
	defer c.Close()
	msg := make([]byte, size)
	_, _ = rand.Read(msg)
	buf := make([]byte, 65536)
	var last error = errors.New("no answer")
	sends := 0
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); {
		if _, err := c.WriteToUDPAddrPort(msg, dst); err != nil {
			return sends, fmt.Errorf("send: %w", err)
		}
		sends++
		_ = c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		for {
			n, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				break // resend
			}
			from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
			switch {
			case from != dst:
				last = fmt.Errorf("an answer came from %s, not from the NodePort", from)
			case n != size:
				last = fmt.Errorf("the echo has %d bytes, want %d", n, size)
			case !bytes.Equal(buf[:n], msg):
				last = errors.New("the echo differs from what was sent")
			default:
				return sends, nil
			}
		}
	}
	return sends, fmt.Errorf("after %d sends in %s: %v", sends, timeout, last)
}

// npPinnedCounters reads the north-south LB's counters of a node from its
// pinned axon_np_metrics: hook (tc, xdp, egress) -> reason -> packets.
func npPinnedCounters(t *testing.T, pinDir string) map[string]map[string]uint64 {
	t.Helper()
	m, err := nodeport.PinnedMetrics(pinDir)
	if err != nil {
		t.Fatal(err)
	}
	return m
}
