package lab_test

// The socket LB end to end: a ClusterIP Service reached from a pod through the
// socket load balancer the agents attach to their node cgroups.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/datapath/podlb"
	"github.com/axonhq/axon/internal/lab"
	"github.com/axonhq/axon/internal/lab/probe"
	"github.com/axonhq/axon/internal/testutil"
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
	// Answer is what a "serve" backend answered a "line" probe: its name.
	Answer string `json:"answer,omitempty"`
}

// setErr records the probe's outcome: OK without err, else err and its errno name.
func (r *svcProbeResult) setErr(err error) {
	r.OK = err == nil
	if err != nil {
		r.Err = err.Error()
		var errno syscall.Errno
		if errors.As(err, &errno) {
			r.Errno = unix.ErrnoName(errno)
		}
	}
}

func svcProbeMain(spec string) int {
	proto, addr, _ := strings.Cut(spec, " ")
	switch proto { // long-running modes, stopped by closing stdin
	case "serve":
		return svcServe(addr)
	case "tcploop":
		return svcTCPLoop(addr)
	case "udphold":
		return svcUDPHold(addr)
	}
	start := time.Now()
	var r svcProbeResult
	var err error
	switch proto {
	case "tcp":
		r.Peer, err = svcProbeTCP(addr)
	case "udp":
		r.Peer, err = svcProbeUDP(addr)
	case "bind": // addr is a port: bind TCP [::]:port (dual stack)
		err = svcProbeBind(addr)
	case "line": // one request to a "serve" backend: its name in Answer
		r.Peer, r.Answer, err = svcProbeLine(addr)
	default:
		err = fmt.Errorf("unknown probe %q", spec)
	}
	r.RTT = time.Since(start)
	r.setErr(err)
	_ = json.NewEncoder(os.Stdout).Encode(r)
	return 0
}

// svcProbeTCP echoes a token through a TCP connection to addr; peer is what
// getpeername reports (probe.EchoTCP, the lab check's own TCP probe).
func svcProbeTCP(addr string) (string, error) { return svcProbeEcho(probe.EchoTCP, addr) }

// svcProbeUDP uses an unconnected socket: sendmsg translates the service
// address, recvmsg must show the reply as coming from it (probe.EchoUDP).
func svcProbeUDP(addr string) (string, error) { return svcProbeEcho(probe.EchoUDP, addr) }

// svcProbeEcho runs echo against addr within 2 s; peer is "" when echo did
// not learn it.
func svcProbeEcho(echo func(context.Context, netip.AddrPort) (netip.AddrPort, error), addr string) (peer string, err error) {
	a, err := netip.ParseAddrPort(addr)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	p, err := echo(ctx, a)
	if p.IsValid() {
		peer = p.String()
	}
	return peer, err
}

func svcProbeLine(addr string) (peer, answer string, err error) {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return "", "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("hello\n")); err != nil {
		return "", "", err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return c.RemoteAddr().String(), strings.TrimSpace(line), err
}

func svcProbeBind(port string) error {
	ln, err := net.Listen("tcp", ":"+port)
	if err != nil {
		return err
	}
	return ln.Close()
}

// svcServe ("serve NAME PORT") answers every line on TCP [::]:PORT with
// NAME, so the client knows which backend it reached; it prints "ready" and
// runs until stdin closes.
func svcServe(spec string) int {
	name, port, _ := strings.Cut(spec, " ")
	ln, err := net.Listen("tcp", ":"+port)
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	testutil.ServeConns(ln, func(c net.Conn) { testutil.AnswerLines(c, 30*time.Second, name) })
	pc, err := net.ListenPacket("udp", ":"+port)
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	go func() {
		buf := make([]byte, 512)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo([]byte(name+"\n"), from)
		}
	}()
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
	ln.Close()
	pc.Close()
	return 0
}

// svcUDPHold ("udphold ADDR") is a DNS resolver's socket: connected UDP,
// one exchange, then it waits (prints "started <answer>") for a line on
// stdin and reads again: a socket whose backend was removed is aborted
// (ECONNABORTED), a live one times out after a second.
func svcUDPHold(addr string) int {
	c, err := net.Dial("udp", addr)
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	defer c.Close()
	buf := make([]byte, 512)
	answer := ""
	for range 10 {
		_, _ = c.Write([]byte("hello\n"))
		_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		if n, err := c.Read(buf); err == nil {
			answer = strings.TrimSpace(string(buf[:n]))
			break
		}
	}
	fmt.Println("started", answer)
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	var r svcProbeResult
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	n, err := c.Read(buf)
	r.setErr(err)
	if err == nil {
		r.Answer = strings.TrimSpace(string(buf[:n]))
	}
	_ = json.NewEncoder(os.Stdout).Encode(r)
	return 0
}

// svcLoopResult is what "tcploop" prints when stdin closes.
type svcLoopResult struct {
	OK, Fails int
	FirstErr  string
	Seen      map[string]int // answering backend name -> connections
	Last      []string       // the last 20 answers, oldest first
	// Connect times of the connections that connected, and how many did
	// not within loopConnectTimeout.
	ConnectP50, ConnectP99, ConnectMax time.Duration
	ConnectFails                       int
}

// loopConnectTimeout bounds each connect of "tcploop": well under the
// initial SYN retransmission timeout (1 s), so a SYN that was dropped and
// retried counts as a failure instead of a slow success.
const loopConnectTimeout = 300 * time.Millisecond

// svcTCPLoop ("tcploop ADDR") connects, sends a line, reads the answer
// and closes, over and over until stdin closes; then prints the counts.
func svcTCPLoop(addr string) int {
	stop := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); close(stop) }()
	r := svcLoopResult{Seen: map[string]int{}}
	var connects []time.Duration
	fmt.Println("started")
	for {
		select {
		case <-stop:
			if n := len(connects); n > 0 {
				slices.Sort(connects)
				r.ConnectP50, r.ConnectP99, r.ConnectMax = connects[n/2], connects[(n*99+99)/100-1], connects[n-1]
			}
			_ = json.NewEncoder(os.Stdout).Encode(r)
			return 0
		default:
		}
		answer, err := func() (string, error) {
			t0 := time.Now()
			c, err := net.DialTimeout("tcp", addr, loopConnectTimeout)
			if err != nil {
				r.ConnectFails++
				return "", fmt.Errorf("connect: %w", err)
			}
			connects = append(connects, time.Since(t0))
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(2 * time.Second))
			if _, err := c.Write([]byte("hello\n")); err != nil {
				return "", err
			}
			line, err := bufio.NewReader(c).ReadString('\n')
			return strings.TrimSpace(line), err
		}()
		if err != nil {
			r.Fails++
			if r.FirstErr == "" {
				r.FirstErr = err.Error()
			}
			continue
		}
		r.OK++
		r.Seen[answer]++
		r.Last = append(r.Last, answer)
		if len(r.Last) > 20 {
			r.Last = r.Last[1:]
		}
		time.Sleep(2 * time.Millisecond) // about 300 connections a second: load, not a CPU hog
	}
}

// startLongProbe starts a long-running mode of the prober in target and
// waits for its first line (ready/started).
func startLongProbe(t *testing.T, ctx context.Context, l *lab.Lab, target, spec string) (stdin io.WriteCloser, out *bufio.Reader, cmd *exec.Cmd) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd = l.Command(ctx, target, self)
	cmd.Env = append(os.Environ(), svcProbeEnv+"="+spec)
	if stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %q in %s: %v", spec, target, err)
	}
	t.Cleanup(func() { stdin.Close(); _ = cmd.Process.Kill(); _ = cmd.Wait() })
	out = bufio.NewReader(stdout)
	line, err := out.ReadString('\n')
	if first := strings.Fields(line); err != nil || len(first) == 0 || (first[0] != "ready" && first[0] != "started") {
		t.Fatalf("%q in %s: first line %q, %v", spec, target, line, err)
	}
	longProbeFirst[cmd] = line
	return stdin, out, cmd
}

// longProbeFirst keeps the first line of each long probe (udphold's answer).
var longProbeFirst = map[*exec.Cmd]string{}

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

	// Backends that tell who they are, for the rolling replacement and the
	// opt-out checks: "old" and "new" on node2, port 9090.
	oldPod, newPod := podsOn(l, "node2")[0], podsOn(l, "node2")[1]
	optPod := podsOn(l, "node1")[1]
	for _, p := range []lab.Pod{oldPod, newPod} {
		name := map[bool]string{true: "old", false: "new"}[p.Name == oldPod.Name]
		startLongProbe(t, ctx, l, p.Name, "serve "+name+" 9090")
	}
	type ep struct {
		pod                lab.Pod
		ready, terminating bool
	}
	rollSlice := func(rv string, eps ...ep) *discoveryv1.EndpointSlice {
		name, proto, port := "tcp", corev1.ProtocolTCP, int32(9090)
		es := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: "roll-1", Namespace: "default", ResourceVersion: rv, Labels: map[string]string{discoveryv1.LabelServiceName: "roll"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: &name, Protocol: &proto, Port: &port}},
		}
		for _, e := range eps {
			node, serving := e.pod.Node, e.ready || e.terminating
			es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{e.pod.IP.String()}, NodeName: &node,
				Conditions: discoveryv1.EndpointConditions{Ready: &e.ready, Serving: &serving, Terminating: &e.terminating}})
		}
		return es
	}
	const rollVIP = "10.96.77.10:80"
	if _, err := kube.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "roll", Namespace: "default"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, ClusterIP: "10.96.77.10",
			Ports: []corev1.ServicePort{{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: 80, NodePort: 31977, TargetPort: intstr.FromInt32(9090)}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create service roll: %v", err)
	}
	roll, err := kube.DiscoveryV1().EndpointSlices("default").Create(ctx, rollSlice("", ep{pod: oldPod, ready: true}), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create endpointslice roll-1: %v", err)
	}
	eventuallyProbe(t, "roll reachable", 10*time.Second, func() error {
		if r := svcProbe(t, ctx, l, client.Name, "line", rollVIP); !r.OK || r.Answer != "old" || r.Peer != rollVIP {
			return fmt.Errorf("%+v, want an answer from old with peer %s", r, rollVIP)
		}
		return nil
	})

	t.Run("rolling replacement of backends under load: zero failed requests", func(t *testing.T) {
		rollingReplacement(t, ctx, l, roll, newPod)
	})

	t.Run("NodePort bind refused inside a pod", func(t *testing.T) {
		eventuallyProbe(t, "bind 31977 refused", 10*time.Second, func() error {
			if r := svcProbe(t, ctx, l, client.Name, "bind", "31977"); r.Errno != "EADDRINUSE" {
				return fmt.Errorf("bind [::]:31977 in %s: %+v, want EADDRINUSE", client.Name, r)
			}
			return nil
		})
		if r := svcProbe(t, ctx, l, client.Name, "bind", "31978"); !r.OK {
			t.Errorf("bind of a port no NodePort owns: %+v", r)
		}
	})

	t.Run("connected UDP socket of a removed backend is aborted", func(t *testing.T) {
		agent, err := l.Agent(client.Node)
		if err != nil {
			t.Fatal(err)
		}
		st, err := agent.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range st.Features {
			if f.Name == "bpf_sock_destroy" && !f.Available {
				t.Skipf("kernel without bpf_sock_destroy (%s): the socket keeps its backend until the application reconnects", f.Reason)
			}
		}
		const dnsVIP = "10.96.77.53:53"
		if _, err := kube.CoreV1().Services("default").Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "dnsroll", Namespace: "default"},
			Spec: corev1.ServiceSpec{ClusterIP: "10.96.77.53",
				Ports: []corev1.ServicePort{{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53, TargetPort: intstr.FromInt32(9090)}}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create service dnsroll: %v", err)
		}
		dnsSlice := func(rv string, p lab.Pod) *discoveryv1.EndpointSlice {
			es := rollSlice(rv, ep{pod: p, ready: true})
			es.Name, es.Labels[discoveryv1.LabelServiceName] = "dnsroll-1", "dnsroll"
			proto := corev1.ProtocolUDP
			es.Ports[0].Protocol, es.Ports[0].Name = &proto, ptr("dns")
			return es
		}
		cur, err := kube.DiscoveryV1().EndpointSlices("default").Create(ctx, dnsSlice("", oldPod), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		eventuallyProbe(t, "dnsroll programmed", 10*time.Second, func() error {
			sr, err := agent.LBMaps(ctx)
			if err != nil || !strings.Contains(sr.Text, dnsVIP+"/UDP") {
				return fmt.Errorf("maps: %v %v", err, sr.Text)
			}
			return nil
		})
		stdin, out, cmd := startLongProbe(t, ctx, l, client.Name, "udphold "+dnsVIP)
		if got := strings.TrimSpace(longProbeFirst[cmd]); got != "started old" {
			t.Fatalf("connected UDP socket before the change: %q, want an answer from old", got)
		}
		if _, err := kube.DiscoveryV1().EndpointSlices("default").Update(ctx, dnsSlice(cur.ResourceVersion, newPod), metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		eventuallyProbe(t, "old removed from the maps", 10*time.Second, func() error {
			sr, err := agent.LBMaps(ctx)
			if err != nil || strings.Contains(sr.Text, netip.AddrPortFrom(oldPod.IP, 9090).String()) {
				return fmt.Errorf("maps: %v %v", err, sr.Text)
			}
			return nil
		})
		fmt.Fprintln(stdin, "go")
		var r svcProbeResult
		if err := json.NewDecoder(out).Decode(&r); err != nil {
			t.Fatal(err)
		}
		if r.Errno != "ECONNABORTED" {
			t.Errorf("the resolver's socket after its backend left: %+v, want ECONNABORTED", r)
		}
		stdin2, _, cmd2 := startLongProbe(t, ctx, l, client.Name, "udphold "+dnsVIP)
		stdin2.Close()
		if got := strings.TrimSpace(longProbeFirst[cmd2]); got != "started new" {
			t.Errorf("a resolver reconnecting: %q, want an answer from new", got)
		}
	})

	t.Run("opt-out annotation: the pod's sockets are not translated, its pod LB serves it", func(t *testing.T) {
		agent, err := l.Agent(optPod.Node)
		if err != nil {
			t.Fatal(err)
		}
		annotate := func(value string) {
			v := "null"
			if value != "" {
				v = `"` + value + `"`
			}
			patch := fmt.Sprintf(`{"metadata":{"annotations":{"axon.io/socket-lb":%s}}}`, v)
			if _, err := kube.CoreV1().Pods("default").Patch(ctx, optPod.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
				t.Fatalf("annotate pod %s: %v", optPod.Name, err)
			}
		}
		optedOut := func() (bool, string) {
			st, err := agent.Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range st.Datapath {
				if d.Name == "socket_lb" {
					return strings.Contains(d.Reason, "default/"+optPod.Name), d.Reason
				}
			}
			return false, "no socket_lb decision"
		}
		annotate("disabled")
		eventuallyProbe(t, "agent applies the opt-out", 10*time.Second, func() error {
			if ok, reason := optedOut(); !ok {
				return fmt.Errorf("socket_lb decision: %s", reason)
			}
			return nil
		})
		// its sockets untranslated, the pod's own per-packet LB (on its
		// interface, in its netns) serves the ClusterIP: its counter of new
		// flows moves by the probe's connection
		var node lab.Node
		for _, n := range l.Nodes() {
			if n.Name == optPod.Node {
				node = n
			}
		}
		plb, err := podlb.New(podlb.Config{PinDir: node.PinDir})
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		eventuallyProbe(t, "the pod LB attached", 10*time.Second, func() error {
			if ids, err = podlb.Attached(node.PinDir); err != nil || len(ids) != 1 {
				return fmt.Errorf("pod LBs %v (%v), want the opted-out pod's", ids, err)
			}
			return nil
		})
		before, err := plb.Counters(ids[0])
		if err != nil {
			t.Fatal(err)
		}
		r := svcProbe(t, ctx, l, optPod.Name, "line", rollVIP)
		after, err := plb.Counters(ids[0])
		if err != nil {
			t.Fatal(err)
		}
		if !r.OK || r.Answer != "new" || r.Peer != rollVIP || after["new"] != before["new"]+1 || after["reply"] <= before["reply"] {
			t.Errorf("opted-out pod %s -> %s: %+v; pod LB new %d -> %d, reply %d -> %d: want answered by new through the pod LB",
				optPod.Name, rollVIP, r, before["new"], after["new"], before["reply"], after["reply"])
		} else {
			t.Logf("opted-out pod %s: %s answered by new through its pod LB (new +1, reply +%d)", optPod.Name, rollVIP, after["reply"]-before["reply"])
		}
		// control: the same pod reaches the backend itself, and another pod
		// on the node still gets the Service translated
		direct := netip.AddrPortFrom(newPod.IP, 9090).String()
		if r := svcProbe(t, ctx, l, optPod.Name, "line", direct); !r.OK || r.Answer != "new" {
			t.Errorf("control: %s -> backend %s directly: %+v", optPod.Name, direct, r)
		}
		if r := svcProbe(t, ctx, l, client.Name, "line", rollVIP); !r.OK || r.Answer != "new" || r.Peer != rollVIP {
			t.Errorf("control: %s (not opted out) -> %s: %+v, want translated to new", client.Name, rollVIP, r)
		}
		annotate("")
		eventuallyProbe(t, "agent drops the opt-out", 10*time.Second, func() error {
			if ok, reason := optedOut(); ok {
				return fmt.Errorf("socket_lb decision still lists the pod: %s", reason)
			}
			return nil
		})
		eventuallyProbe(t, "translated again", 10*time.Second, func() error {
			if r := svcProbe(t, ctx, l, optPod.Name, "line", rollVIP); !r.OK || r.Answer != "new" || r.Peer != rollVIP {
				return fmt.Errorf("%+v", r)
			}
			return nil
		})
		annotate("bogus")
		// the agent's InvalidAnnotation Event says it has read the bad value;
		// only then does "not opted out" mean it refused it
		var evs *corev1.EventList
		eventuallyProbe(t, "InvalidAnnotation event", 10*time.Second, func() error {
			if evs, err = kube.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + optPod.Name + ",reason=InvalidAnnotation"}); err != nil {
				return err
			}
			if len(evs.Items) == 0 {
				return errors.New("no event yet")
			}
			return nil
		})
		t.Logf("event: %s", evs.Items[0].Message)
		if ok, reason := optedOut(); ok {
			t.Errorf("a malformed annotation opted the pod out: %s", reason)
		}
		annotate("")
	})
}

func ptr[T any](v T) *T { return &v }

// rollingReplacement replaces the backend of Service default/roll (slice
// roll-1, port 9090) as a Deployment's rolling update does, under two
// connect loops: pod → ClusterIP (the socket LB of the client's node) and
// external client → NodePort of node1 (its north-south LB, SNAT to node2).
// The old backend is a pod of its own that really goes away: after it is
// terminating (and the agent acknowledged that), its pod is deleted as a
// kubelet does (its server killed, CNI DEL, netns removed), and only then
// does its endpoint leave the slice. Every connect has loopConnectTimeout
// (300 ms, well under the 1 s SYN retransmission) and must succeed; the
// p99 of the connect times is bounded.
func rollingReplacement(t *testing.T, ctx context.Context, l *lab.Lab, roll *discoveryv1.EndpointSlice, newPod lab.Pod) {
	kube, err := l.Kube()
	if err != nil {
		t.Fatal(err)
	}
	oldPod, err := l.AddPod(ctx, newPod.Node, "roll-old", lab.DatapathAxon)
	if err != nil {
		t.Fatalf("add the old backend's pod: %v", err)
	}
	deleted := false
	t.Cleanup(func() {
		if !deleted {
			_ = l.DeletePod(context.WithoutCancel(ctx), oldPod.Name)
		}
	})
	startLongProbe(t, ctx, l, oldPod.Name, "serve old 9090")
	entry := l.Nodes()[0] // node1: no backend of roll, so the NodePort is SNATed to node2
	client := podsOn(l, entry.Name)[0]
	update := func(what string, eps ...discoveryv1.Endpoint) {
		t.Helper()
		roll.Endpoints = eps
		upd, err := kube.DiscoveryV1().EndpointSlices("default").Update(ctx, roll, metav1.UpdateOptions{})
		if err != nil {
			t.Fatalf("%s: update endpointslice: %v", what, err)
		}
		roll = upd
		waitProgrammed(t, l, entry.Name, "roll")
	}
	endpoint := func(p lab.Pod, ready, terminating bool) discoveryv1.Endpoint {
		node, serving := p.Node, ready || terminating
		return discoveryv1.Endpoint{Addresses: []string{p.IP.String()}, NodeName: &node,
			Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &serving, Terminating: &terminating}}
	}
	update("old alone", endpoint(oldPod, true, false))
	const rollVIP = "10.96.77.10:80"
	nodePort := netip.AddrPortFrom(entry.IP, 31977).String()
	eventuallyProbe(t, "old answers", 10*time.Second, func() error {
		if r := svcProbe(t, ctx, l, client.Name, "line", rollVIP); !r.OK || r.Answer != "old" {
			return fmt.Errorf("%+v, want an answer from old", r)
		}
		return nil
	})

	type loop struct {
		what  string
		stdin io.WriteCloser
		out   *bufio.Reader
	}
	var loops []loop
	for _, lp := range []struct{ what, from, to string }{
		{"pod " + client.Name + " → ClusterIP " + rollVIP + " (socket LB)", client.Name, rollVIP},
		{"external → NodePort " + nodePort + " (north-south LB)", lab.ExternalName, nodePort},
	} {
		stdin, out, _ := startLongProbe(t, ctx, l, lp.from, "tcploop "+lp.to)
		loops = append(loops, loop{lp.what, stdin, out})
	}
	t0 := time.Now()
	step := func(what string, do func()) {
		t.Helper()
		time.Sleep(time.Second)
		do()
		t.Logf("%5.2fs %s", time.Since(t0).Seconds(), what)
	}
	step("new ready next to old", func() { update("new ready", endpoint(oldPod, true, false), endpoint(newPod, true, false)) })
	step("old terminating (still serving), acknowledged", func() {
		update("old terminating", endpoint(oldPod, false, true), endpoint(newPod, true, false))
	})
	step("old pod deleted: server killed, CNI DEL, netns gone", func() {
		if err := l.DeletePod(ctx, oldPod.Name); err != nil {
			t.Fatalf("delete pod %s: %v", oldPod.Name, err)
		}
		deleted = true
	})
	step("old endpoint removed", func() { update("old removed", endpoint(newPod, true, false)) })
	time.Sleep(time.Second)

	agent, err := l.Agent(entry.Name)
	if err != nil {
		t.Fatal(err)
	}
	if mr, err := agent.LBMaps(ctx); err != nil || strings.Contains(mr.Text, oldPod.IP.String()+":") {
		t.Errorf("the socket LB of %s still holds the deleted pod %s (%v):\n%s", entry.Name, oldPod.IP, err, mr.Text)
	}
	p99Bound := testutil.Stretch(t, 100*time.Millisecond)
	for _, lp := range loops {
		lp.stdin.Close()
		var r svcLoopResult
		if err := json.NewDecoder(lp.out).Decode(&r); err != nil {
			t.Fatalf("%s: loop result: %v", lp.what, err)
		}
		t.Logf("%s: %d requests, %d failed (%d connects not within %s), answered by %v; connect p50 %s p99 %s max %s",
			lp.what, r.OK+r.Fails, r.Fails, r.ConnectFails, loopConnectTimeout, r.Seen, r.ConnectP50, r.ConnectP99, r.ConnectMax)
		if r.Fails != 0 {
			t.Errorf("%s: %d of %d requests failed during the rolling replacement (%d at connect), first: %s", lp.what, r.Fails, r.OK+r.Fails, r.ConnectFails, r.FirstErr)
		}
		if r.ConnectP99 > p99Bound {
			t.Errorf("%s: connect p99 %s over %s during the rolling replacement", lp.what, r.ConnectP99, p99Bound)
		}
		if r.Seen["old"] == 0 || r.Seen["new"] == 0 || r.OK < 200 {
			t.Errorf("%s: answers %v over %d requests: want both backends and a real load", lp.what, r.Seen, r.OK)
		}
		for _, a := range r.Last {
			if a != "new" {
				t.Errorf("%s: after the old backend was removed, a request reached %q (last answers %v)", lp.what, a, r.Last)
				break
			}
		}
	}
}
