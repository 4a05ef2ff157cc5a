package lab_test

// Issue 4 end to end: a ClusterIP Service reached from a pod through the
// socket load balancer the agents attach to their node cgroups.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/lab"
)

// svcProbeEnv makes the test binary a one-shot prober ("tcp|udp addr:port")
// that the test starts inside a pod (its netns and cgroup) or a node.
const svcProbeEnv = "AXON_LAB_SVC_PROBE"

func init() {
	if v := os.Getenv(svcProbeEnv); v != "" {
		os.Exit(svcProbeMain(v))
	}
}

// svcProbeResult is what the prober prints (one JSON line).
type svcProbeResult struct {
	OK    bool   `json:"ok"`
	Errno string `json:"errno,omitempty"` // e.g. ECONNREFUSED
	Err   string `json:"err,omitempty"`
	Peer  string `json:"peer,omitempty"` // TCP: getpeername; UDP: source of the reply (recvmsg)
	RTT   time.Duration
}

func svcProbeMain(spec string) int {
	proto, addr, _ := strings.Cut(spec, " ")
	start := time.Now()
	var r svcProbeResult
	var err error
	switch proto {
	case "tcp":
		r.Peer, err = svcProbeTCP(addr)
	case "udp":
		r.Peer, err = svcProbeUDP(addr)
	default:
		err = fmt.Errorf("unknown probe %q", spec)
	}
	r.RTT = time.Since(start)
	r.OK = err == nil
	if err != nil {
		r.Err = err.Error()
		var errno syscall.Errno
		if errors.As(err, &errno) {
			r.Errno = unix.ErrnoName(errno)
		}
	}
	_ = json.NewEncoder(os.Stdout).Encode(r)
	return 0
}

func svcToken() []byte {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return []byte("axon-svc-" + hex.EncodeToString(b))
}

func svcProbeTCP(addr string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	var peer string
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		return "", err
	}
	var gerr error
	if err := rc.Control(func(fd uintptr) {
		var sa unix.Sockaddr
		if sa, gerr = unix.Getpeername(int(fd)); gerr == nil {
			if in4, ok := sa.(*unix.SockaddrInet4); ok {
				peer = netip.AddrPortFrom(netip.AddrFrom4(in4.Addr), uint16(in4.Port)).String()
			}
		}
	}); err != nil || gerr != nil {
		return "", fmt.Errorf("getpeername: %w", errors.Join(err, gerr))
	}
	tok := svcToken()
	if _, err := c.Write(tok); err != nil {
		return peer, fmt.Errorf("write: %w", err)
	}
	buf := make([]byte, len(tok))
	if _, err := io.ReadFull(c, buf); err != nil {
		return peer, fmt.Errorf("read echo: %w", err)
	}
	if !bytes.Equal(buf, tok) {
		return peer, errors.New("echo mismatch")
	}
	return peer, nil
}

// svcProbeUDP uses an unconnected socket: sendmsg translates the service
// address, recvmsg must show the reply as coming from it.
func svcProbeUDP(addr string) (string, error) {
	dst, err := net.ResolveUDPAddr("udp4", addr)
	if err != nil {
		return "", err
	}
	c, err := net.ListenUDP("udp4", &net.UDPAddr{})
	if err != nil {
		return "", err
	}
	defer c.Close()
	tok := svcToken()
	buf := make([]byte, 256)
	for range 6 {
		if _, err := c.WriteToUDP(tok, dst); err != nil {
			return "", err
		}
		_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		n, from, err := c.ReadFromUDPAddrPort(buf)
		if err == nil && bytes.Equal(buf[:n], tok) {
			return netip.AddrPortFrom(from.Addr().Unmap(), from.Port()).String(), nil
		}
	}
	return "", errors.New("no UDP echo")
}

// svcProbe runs one probe in target (a pod: its netns and cgroup; a node:
// its netns only, in the test's own cgroup).
func svcProbe(t *testing.T, ctx context.Context, l *lab.Lab, target, proto, addr string) svcProbeResult {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := l.Command(ctx, target, self)
	cmd.Env = append(os.Environ(), svcProbeEnv+"="+proto+" "+addr)
	out, err := cmd.Output()
	var r svcProbeResult
	if err != nil || json.Unmarshal(out, &r) != nil {
		t.Fatalf("probe %s %s from %s: %v\n%s", proto, addr, target, err, out)
	}
	return r
}

func eventuallyProbe(t *testing.T, what string, timeout time.Duration, f func() error) time.Duration {
	t.Helper()
	t0 := time.Now()
	var last error
	for time.Since(t0) < timeout {
		if last = f(); last == nil {
			return time.Since(t0)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s: not within %s: %v", what, timeout, last)
	return 0
}

// sockPrograms lists the cgroup programs attached to dir (bpftool).
func sockPrograms(t *testing.T, dir string) string {
	t.Helper()
	out, err := exec.Command("bpftool", "cgroup", "show", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("bpftool cgroup show %s: %v\n%s", dir, err, out)
	}
	return string(out)
}

func TestLabServiceSocketLB(t *testing.T) {
	need(t, "axon", "axon-agent", "axon-cni")
	if _, err := exec.LookPath("bpftool"); err != nil {
		t.Skip("bpftool not installed: `make packages`")
	}
	// Runs after `down` (registered before up): no axon program may be
	// left on the machine's cgroup2 root either.
	var cg2 string
	if b, err := os.ReadFile("/proc/mounts"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) >= 3 && f[2] == "cgroup2" {
				cg2 = f[1]
			}
		}
	}
	if cg2 == "" {
		t.Skip("no cgroup2 filesystem mounted")
	}
	t.Cleanup(func() {
		if out := sockPrograms(t, cg2); strings.Contains(out, "axon_sock") {
			t.Errorf("axon socket programs on the cgroup2 root %s after down:\n%s", cg2, out)
		}
	})
	l := up(t, "--nodes", "2", "--pods-per-node", "2")
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()

	for _, n := range l.Nodes() {
		out := sockPrograms(t, n.Cgroup)
		for _, p := range []string{"axon_sock_connect4", "axon_sock_sendmsg4", "axon_sock_recvmsg4", "axon_sock_getpeername4"} {
			if !strings.Contains(out, p) {
				t.Errorf("%s not attached to node cgroup %s:\n%s", p, n.Cgroup, out)
			}
		}
	}

	client, server := podsOn(l, "node1")[0], podsOn(l, "node2")[0]
	srv := l.Command(ctx, server.Name, filepath.Join(binDir, "axon"), "lab", "_echo", "serve", "--port", "8080")
	stdin, err := srv.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := srv.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); _ = srv.Process.Kill(); _ = srv.Wait() })
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || strings.TrimSpace(line) != "ready" {
		t.Fatalf("echo server in %s: %q %v", server.Name, line, err)
	}

	kube, err := l.Kube()
	if err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "echo", Namespace: "default"},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP, ClusterIP: "10.96.0.50", ClusterIPs: []string{"10.96.0.50"},
			Ports: []corev1.ServicePort{
				{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)},
				{Name: "udp", Protocol: corev1.ProtocolUDP, Port: 80, TargetPort: intstr.FromInt32(8080)},
			},
		},
	}
	if _, err := kube.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create service: %v", err)
	}
	slice := func(ready bool) *discoveryv1.EndpointSlice {
		p := func(name string, proto corev1.Protocol) discoveryv1.EndpointPort {
			port := int32(8080)
			return discoveryv1.EndpointPort{Name: &name, Protocol: &proto, Port: &port}
		}
		node := server.Node
		return &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: "echo-1", Namespace: "default", Labels: map[string]string{discoveryv1.LabelServiceName: "echo"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{p("tcp", corev1.ProtocolTCP), p("udp", corev1.ProtocolUDP)},
			Endpoints: []discoveryv1.Endpoint{{
				Addresses: []string{server.IP.String()}, NodeName: &node,
				Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &ready},
			}},
		}
	}
	t0 := time.Now()
	created, err := kube.DiscoveryV1().EndpointSlices("default").Create(ctx, slice(true), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create endpointslice: %v", err)
	}
	const vip = "10.96.0.50:80"

	t.Run("pod reaches the ClusterIP over TCP and UDP", func(t *testing.T) {
		d := eventuallyProbe(t, "TCP echo through "+vip, 10*time.Second, func() error {
			if r := svcProbe(t, ctx, l, client.Name, "tcp", vip); !r.OK {
				return errors.New(r.Err)
			}
			return nil
		})
		t.Logf("service reachable %s after the EndpointSlice create returned (%s after the create call)", d.Round(time.Millisecond), time.Since(t0).Round(time.Millisecond))
		tcp := svcProbe(t, ctx, l, client.Name, "tcp", vip)
		udp := svcProbe(t, ctx, l, client.Name, "udp", vip)
		if !tcp.OK || !udp.OK {
			t.Fatalf("tcp %+v, udp %+v", tcp, udp)
		}
		if tcp.Peer != vip {
			t.Errorf("TCP getpeername = %s, want the service address %s", tcp.Peer, vip)
		}
		if udp.Peer != vip {
			t.Errorf("UDP reply source (recvmsg) = %s, want the service address %s", udp.Peer, vip)
		}
	})

	t.Run("service list and bpf lb list show the frontend", func(t *testing.T) {
		agent, err := l.Agent(client.Node)
		if err != nil {
			t.Fatal(err)
		}
		fe, be := vip+"/TCP", "-> "+netip.AddrPortFrom(server.IP, 8080).String()
		// desired and programmed tables render alike once the maps converged
		var sr api.ServicesReply
		var mr api.LBMapsReply
		eventuallyProbe(t, "desired table == programmed maps", 5*time.Second, func() error {
			if sr, err = agent.Services(ctx); err != nil {
				return fmt.Errorf("Services: %w", err)
			}
			if mr, err = agent.LBMaps(ctx); err != nil {
				return fmt.Errorf("LBMaps: %w", err)
			}
			if !mr.Enabled || sr.Text != mr.Text || sr.Frontends != mr.Frontends {
				return fmt.Errorf("differ:\nservices %+v\nmaps %+v", sr, mr)
			}
			return nil
		})
		out, err := exec.CommandContext(ctx, filepath.Join(binDir, "axon"), "bpf", "lb", "list", "-n", client.Node).CombinedOutput()
		if err != nil {
			t.Fatalf("axon bpf lb list: %v\n%s", err, out)
		}
		for what, text := range map[string]string{"desired (/v1/services)": sr.Text, "programmed (/v1/bpf/lb)": mr.Text, "axon bpf lb list": string(out)} {
			if !strings.Contains(text, fe) || !strings.Contains(text, be) {
				t.Errorf("%s lacks %q or %q:\n%s", what, fe, be, text)
			}
		}
		t.Logf("axon bpf lb list -n %s:\n%s", client.Node, out)
	})

	t.Run("node netns outside the node cgroup is not translated", func(t *testing.T) {
		// control: the backend itself is reachable from node1's netns
		if r := svcProbe(t, ctx, l, "node1", "tcp", netip.AddrPortFrom(server.IP, 8080).String()); !r.OK {
			t.Fatalf("control probe node1 -> %s:8080 failed: %+v", server.IP, r)
		}
		if r := svcProbe(t, ctx, l, "node1", "tcp", vip); r.OK {
			t.Errorf("a process outside the node cgroup reached %s: the socket LB leaks out of its cgroup (%+v)", vip, r)
		} else {
			t.Logf("untranslated from node1 netns (test cgroup): %s", r.Err)
		}
	})

	t.Run("agent restart keeps the service and adopts its pins", func(t *testing.T) {
		t0 := time.Now()
		if err := l.RestartAgent(ctx, client.Node); err != nil {
			t.Fatalf("restart agent: %v", err)
		}
		t.Logf("agent on %s restarted in %s", client.Node, time.Since(t0).Round(time.Millisecond))
		if r := svcProbe(t, ctx, l, client.Name, "tcp", vip); !r.OK || r.Peer != vip {
			t.Errorf("after the agent restart: %+v", r)
		}
		n := nodeByName(t, l, client.Node)
		if out := sockPrograms(t, n.Cgroup); strings.Count(out, "axon_sock_connect4") != 1 {
			t.Errorf("want exactly one connect4 program on %s after restart (links updated in place):\n%s", n.Cgroup, out)
		}
	})

	t.Run("endpoint not ready: connect refused at once", func(t *testing.T) {
		upd := slice(false)
		upd.ResourceVersion = created.ResourceVersion
		if _, err := kube.DiscoveryV1().EndpointSlices("default").Update(ctx, upd, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("update endpointslice: %v", err)
		}
		for _, proto := range []string{"tcp", "udp"} {
			eventuallyProbe(t, proto+" refused", 10*time.Second, func() error {
				if r := svcProbe(t, ctx, l, client.Name, proto, vip); r.Errno != "ECONNREFUSED" {
					return fmt.Errorf("%s probe: %+v, want ECONNREFUSED", proto, r)
				}
				return nil
			})
			r := svcProbe(t, ctx, l, client.Name, proto, vip)
			if r.Errno != "ECONNREFUSED" || r.RTT > 200*time.Millisecond {
				t.Errorf("%s to %s with no ready endpoint: %+v, want ECONNREFUSED within 200ms", proto, vip, r)
			}
			t.Logf("%s refused in %s", proto, r.RTT)
		}
	})

	t.Run("ready again, then slice deleted: refused", func(t *testing.T) {
		cur, err := kube.DiscoveryV1().EndpointSlices("default").Get(ctx, "echo-1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		upd := slice(true)
		upd.ResourceVersion = cur.ResourceVersion
		if _, err := kube.DiscoveryV1().EndpointSlices("default").Update(ctx, upd, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("update endpointslice: %v", err)
		}
		eventuallyProbe(t, "tcp back", 10*time.Second, func() error {
			if r := svcProbe(t, ctx, l, client.Name, "tcp", vip); !r.OK {
				return errors.New(r.Err)
			}
			return nil
		})
		if err := kube.DiscoveryV1().EndpointSlices("default").Delete(ctx, "echo-1", metav1.DeleteOptions{}); err != nil {
			t.Fatalf("delete endpointslice: %v", err)
		}
		eventuallyProbe(t, "tcp refused without a slice", 10*time.Second, func() error {
			if r := svcProbe(t, ctx, l, client.Name, "tcp", vip); r.Errno != "ECONNREFUSED" {
				return fmt.Errorf("%+v, want ECONNREFUSED", r)
			}
			return nil
		})
	})
}
