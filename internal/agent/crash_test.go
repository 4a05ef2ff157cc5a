package agent

// Real crashes: the agent process is killed with SIGKILL (no deferred
// cleanup, no Close) at the worst moments and started again; the restarted
// agent must bring every pinned LB map to exactly what the apiserver says
// (checkPinnedLB, lbcheck_test.go).

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/lab"
	"github.com/axonhq/axon/internal/lab/controlplane"
	"github.com/axonhq/axon/internal/lb"
	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/testutil"
)

// Ports of this file's control planes (each test file has its own).
const (
	crashAPIPort   = 16873
	crashEtcdPort  = 12809
	crashHealthURL = "http://127.0.0.1:19878"
)

// crashNode is a scratch node whose agent runs as its own process against
// a real control plane, with the apiserver forwarded into the node netns.
type crashNode struct {
	cp      *controlplane.ControlPlane
	cs      kubernetes.Interface // admin, high QPS
	n       *scratchNode
	cfg     Config
	logFile string
}

func newCrashNode(t *testing.T, apiPort, etcdPort int) *crashNode {
	t.Helper()
	testutil.RequireRoot(t, "network namespaces, BPF, cgroups")
	cp := startControlPlaneOn(t, apiPort, etcdPort)
	arc, err := restConfig(cp.AdminKubeconfig())
	must(t, err)
	arc.QPS, arc.Burst = 2000, 4000
	cs, err := kubernetes.NewForConfig(arc)
	must(t, err)
	n := newScratchNode(t)
	fwd, err := controlplane.ListenForwarder([]string{n.path}, fmt.Sprintf("127.0.0.1:%d", apiPort),
		fmt.Sprintf("127.0.0.1:%d", apiPort), testLogger(t))
	must(t, err)
	fwdCtx, stopFwd := context.WithCancel(context.Background())
	fwdDone := make(chan struct{})
	go func() { defer close(fwdDone); _ = fwd.Serve(fwdCtx) }()
	t.Cleanup(func() { stopFwd(); fwd.Close(); <-fwdDone })

	kubeconfig, err := cp.AgentKubeconfig("node1")
	must(t, err)
	dir := t.TempDir()
	pinDir := filepath.Join("/sys/fs/bpf", "axt-crash-"+testutil.RandSuffix(t))
	t.Cleanup(func() { _ = os.RemoveAll(pinDir) })
	cfg := Defaults()
	cfg.CgroupRoot = testCgroup(t)
	cfg.NodeName, cfg.Kubeconfig, cfg.Uplink = "node1", kubeconfig, "eth0"
	cfg.StateDir, cfg.Socket, cfg.BPFRoot = filepath.Join(dir, "state"), filepath.Join(dir, "axon.sock"), pinDir
	cfg.HealthAddr = strings.TrimPrefix(crashHealthURL, "http://") // inside the node netns
	cfg.NodePortLB.Algorithm, cfg.NodePortLB.MaglevSize = lb.AlgorithmMaglev, 1021
	c := &crashNode{cp: cp, cs: cs, n: n, cfg: cfg, logFile: filepath.Join(dir, "agent.log")}
	t.Cleanup(func() {
		if t.Failed() || os.Getenv("AXON_TEST_AGENT_LOG") != "" {
			b, _ := os.ReadFile(c.logFile)
			t.Logf("agent log:\n%s", b)
		}
	})
	createNode(t, cs, node("node1", []string{"198.18.0.11"}, "10.244.1.0/24"))
	createNode(t, cs, node("node2", []string{"198.18.0.12"}, "10.244.2.0/24"))
	return c
}

// crashService is Service i of the crash tests: a NodePort Service (a
// ClusterIP frontend in the socket LB, a NodePort one in both LBs) with
// one local and one remote endpoint.
func crashService(ns string, i int) (*corev1.Service, *discoveryv1.EndpointSlice) {
	name := fmt.Sprintf("crash-%04d", i)
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.ServiceSpec{
		Type:  corev1.ServiceTypeNodePort,
		Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(8080)}},
	}}
	es := endpointSlice(ns, name+"-1", name, []discoveryv1.EndpointPort{slicePort("http", 8080, corev1.ProtocolTCP)},
		testEP{addr: fmt.Sprintf("10.244.1.%d", 2+i%250), node: "node1", ready: true},
		testEP{addr: fmt.Sprintf("10.244.2.%d", 2+i%250), node: "node2", ready: true})
	return svc, es
}

// createServices creates Services first..first+n-1 (crashService) with 16 workers.
func (c *crashNode) createServices(t *testing.T, ns string, first, n int) {
	t.Helper()
	ctx := t.Context()
	if _, err := c.cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); err != nil {
		_, err := c.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		must(t, err)
	}
	start := time.Now()
	c.parallel(t, first, n, func(i int) error {
		svc, es := crashService(ns, i)
		if _, err := c.cs.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			return err
		}
		_, err := c.cs.DiscoveryV1().EndpointSlices(ns).Create(ctx, es, metav1.CreateOptions{})
		return err
	})
	t.Logf("created %d NodePort Services in %s", n, time.Since(start).Round(time.Millisecond))
}

// parallel runs f(first..first+n-1) on 16 workers; the first error fails t.
func (c *crashNode) parallel(t *testing.T, first, n int, f func(i int) error) {
	t.Helper()
	must(t, parallelErr(first, n, f))
}

// parallelErr runs f(first..first+n-1) on 16 workers and returns the first error.
func parallelErr(first, n int, f func(i int) error) error {
	idx := make(chan int)
	errc := make(chan error, 1)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for i := range idx {
				if err := f(i); err != nil {
					select {
					case errc <- fmt.Errorf("item %d: %w", i, err):
					default:
					}
				}
			}
		})
	}
	for i := first; i < first+n; i++ {
		idx <- i
	}
	close(idx)
	wg.Wait()
	select {
	case err := <-errc:
		return err
	default:
		return nil
	}
}

func (c *crashNode) start(t *testing.T) *agentProc {
	t.Helper()
	return startAgent(t, t, c.n, c.cfg, c.logFile)
}

// converge waits until the pinned maps hold exactly what the apiserver says.
func (c *crashNode) converge(t *testing.T, what string, timeout time.Duration) {
	t.Helper()
	start := time.Now()
	eventually(t, what, testutil.Stretch(t, timeout), func() error {
		return checkPinnedLB(t.Context(), c.cs, c.cfg.BPFRoot, c.cfg.NodeName, true)
	})
	t.Logf("%s: the pinned maps equal the apiserver's Services %s after the start of the check", what, time.Since(start).Round(time.Millisecond))
}

// sigkill kills the agent with SIGKILL and waits for it.
func (p *agentProc) sigkill(t *testing.T) {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("agent pid %d did not die on SIGKILL", p.cmd.Process.Pid)
	}
}

// waitStopped waits until every thread of pid is stopped (SIGSTOP).
func waitStopped(pid int) error {
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
		stopped := len(tasks) > 0
		for _, st := range tasks {
			b, err := os.ReadFile(st)
			if err != nil {
				continue // the thread exited
			}
			// pid (comm) S ...: comm may hold spaces, the state follows the last ')'
			s := string(b)
			if i := strings.LastIndexByte(s, ')'); i < 0 || i+2 >= len(s) || (s[i+2] != 'T' && s[i+2] != 't') {
				stopped = false
				break
			}
		}
		if stopped {
			return nil
		}
		time.Sleep(time.Millisecond)
	}
	return fmt.Errorf("pid %d not stopped after 2s", pid)
}

// halfWritten reports a north-south frontend the LB is in the middle of
// writing: backends or slots of a frontend whose master entry is not
// written yet. Read only while the agent is stopped.
func halfWritten(pinDir string) (masters int, half string, err error) {
	ns, err := readLBSide(pinDir, "north-south LB", "axon_np_svc", "axon_np_be", true)
	if err != nil {
		return 0, "", err
	}
	ids := map[uint32]bool{}
	for _, m := range ns.masters {
		ids[m.id] = true
	}
	for fk := range ns.slots {
		if _, ok := ns.masters[fk]; !ok {
			return len(ns.masters), "slots of " + fk2s(fk) + " without their master", nil
		}
	}
	for id, b := range ns.backends {
		if !ids[b.feID] {
			return len(ns.masters), fmt.Sprintf("backend %d (%s) of frontend id %d, which has no master yet", id, b.ap, b.feID), nil
		}
	}
	return len(ns.masters), "", nil
}

// countMasters counts the north-south LB's frontends (master entries).
func countMasters(pinDir string) (int, error) {
	n := 0
	err := eachEntry(pinDir, "axon_np_svc", svcKeySize, svcValSize, func(k, _ []byte) {
		if k[20] == 0 && k[21] == 0 {
			n++
		}
	})
	return n, err
}

// killMidWrite freezes the agent (SIGSTOP) at random moments while it
// writes the north-south LB's frontends and kills it (SIGKILL) at the first
// moment a frontend is half written; it returns what was half written.
func killMidWrite(t *testing.T, p *agentProc, pinDir string, total int) string {
	t.Helper()
	pid := p.cmd.Process.Pid
	deadline := time.Now().Add(testutil.Stretch(t, 60*time.Second))
	writing := false
	target := total/10 + rand.IntN(total*8/10) // kill somewhere between 10 % and 90 % written
	for tries := 0; time.Now().Before(deadline); tries++ {
		select {
		case err := <-p.done:
			t.Fatalf("agent exited before the kill: %v", err)
		default:
		}
		if !writing {
			// the maps are pinned before the verifier runs: wait for the first
			// backend of the first frontend without stopping the agent
			if m, err := openPinned(pinDir, "axon_np_be"); err == nil {
				var k uint32
				writing = m.NextKey(nil, &k) == nil
				m.Close()
			}
			if !writing {
				time.Sleep(5 * time.Millisecond)
				continue
			}
		}
		if n, err := countMasters(pinDir); err != nil || n < target {
			time.Sleep(2 * time.Millisecond) // not yet at the random point of the write
			continue
		}
		time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
		must(t, p.cmd.Process.Signal(syscall.SIGSTOP))
		must(t, waitStopped(pid))
		masters, half, err := halfWritten(pinDir)
		if err != nil {
			t.Logf("read the frozen maps: %v", err)
		}
		if err == nil && half != "" {
			p.sigkill(t)
			t.Logf("killed the agent (SIGKILL) after %d freezes, with %d of %d north-south frontends written and %s", tries+1, masters, total, half)
			return half
		}
		must(t, p.cmd.Process.Signal(syscall.SIGCONT))
		if err == nil && masters >= total {
			t.Fatalf("the agent wrote all %d north-south frontends before a freeze caught one half written (%d freezes)", total, tries+1)
		}
	}
	t.Fatal("no half-written north-south frontend seen within the deadline")
	return ""
}

// TestCrashDuringFirstSync kills the agent with SIGKILL while it writes the
// north-south frontends of 1 000 NodePort Services for the first time, at a
// moment one frontend is half written (its backends and slots are in the
// maps, its master entry not yet). While the agent is down the Services it
// had not written yet (the half-written one among them) are deleted and a
// few others change. The restarted agent must leave the pinned maps of
// both LBs exactly as the apiserver says: nothing of the half-written
// frontend may stay behind.
func TestCrashDuringFirstSync(t *testing.T) {
	const total = 1000
	c := newCrashNode(t, crashAPIPort, crashEtcdPort)
	const ns = "crash"
	c.createServices(t, ns, 0, total)
	p := c.start(t)
	half := killMidWrite(t, p, c.cfg.BPFRoot, total)

	// what the frozen maps hold: the NodePort frontends written whole
	ctx := t.Context()
	frozen, err := readLBSide(c.cfg.BPFRoot, "north-south LB", "axon_np_svc", "axon_np_be", true)
	must(t, err)
	svcs, err := c.cs.CoreV1().Services(ns).List(ctx, metav1.ListOptions{})
	must(t, err)
	var gone, changed []string
	for i, svc := range svcs.Items {
		k := lb.FrontendKey{Addr: netip.IPv4Unspecified(), Port: uint16(svc.Spec.Ports[0].NodePort), Proto: lb.TCP, Scope: lb.ScopeNodePort}
		_, written := frozen.masters[k]
		switch {
		case !written || i%20 == 0:
			gone = append(gone, svc.Name)
		case i%20 == 1:
			changed = append(changed, svc.Name)
		}
	}
	c.parallel(t, 0, len(gone), func(i int) error {
		return c.cs.CoreV1().Services(ns).Delete(ctx, gone[i], metav1.DeleteOptions{})
	})
	c.parallel(t, 0, len(changed), func(i int) error { // drop the remote endpoint
		es, err := c.cs.DiscoveryV1().EndpointSlices(ns).Get(ctx, changed[i]+"-1", metav1.GetOptions{})
		if err != nil {
			return err
		}
		es.Endpoints = es.Endpoints[:1]
		_, err = c.cs.DiscoveryV1().EndpointSlices(ns).Update(ctx, es, metav1.UpdateOptions{})
		return err
	})
	t.Logf("while the agent was down: deleted %d Services (the %d it had not written, %s among them), dropped an endpoint of %d",
		len(gone), total-len(frozen.masters), half, len(changed))
	c.start(t)
	c.converge(t, "restart after SIGKILL mid-write", 60*time.Second) // 7-10 s quiet, 21 s with a core busy
}

// streamEcho writes 1 KiB every 10 ms on c and reads it back from the echo
// server, byte for byte, until stop closes; progress gets the bytes echoed
// so far after every round trip. An error is the first lost, wrong or late
// byte (a round trip may take at most 5 s, stretched).
func streamEcho(c net.Conn, stop <-chan struct{}, progress func(int64)) error {
	out, in := make([]byte, 1024), make([]byte, 1024)
	var total int64
	for {
		select {
		case <-stop:
			return nil
		case <-time.After(10 * time.Millisecond):
		}
		for i := range out {
			out[i] = byte((total + int64(i)) % 251)
		}
		if err := c.SetDeadline(time.Now().Add(5 * time.Second * time.Duration(max(1, slowdown())))); err != nil {
			return err
		}
		if _, err := c.Write(out); err != nil {
			return fmt.Errorf("write after %d bytes: %w", total, err)
		}
		if _, err := io.ReadFull(c, in); err != nil {
			return fmt.Errorf("read after %d bytes: %w", total, err)
		}
		if !bytes.Equal(in, out) {
			return fmt.Errorf("echo after %d bytes differs from what was sent", total)
		}
		total += int64(len(out))
		progress(total)
	}
}

// slowdown is AXON_TEST_SLOWDOWN (1 when unset).
func slowdown() int {
	n, _ := strconv.Atoi(os.Getenv("AXON_TEST_SLOWDOWN"))
	return n
}

// streamEnv carries a streamRequest: the test binary then runs
// TestCrashStreamHelper, a stream client inside the socket LB's cgroup.
const streamEnv = "AXON_TEST_STREAM_CLIENT"

type streamRequest struct {
	Netns string // where the client socket lives
	Addr  string // host:port to connect to
}

// TestCrashStreamHelper is the stream client of the crash tests when run by
// them (HelperCommand): it connects to the request's address, streams
// (streamEcho) until its stdin closes, prints "bytes N" after every round
// trip and ends with status 1 and the error on stdout at the first bad byte.
func TestCrashStreamHelper(t *testing.T) {
	var req streamRequest
	testutil.HelperStart(t, streamEnv, "helper of the crash tests (runs only when they start it)", &req)
	c, err := net.DialTimeout("tcp", req.Addr, 5*time.Second)
	if err != nil {
		fmt.Printf("error: dial %s: %v\n", req.Addr, err)
		os.Exit(1)
	}
	stop := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); close(stop) }()
	err = streamEcho(c, stop, func(n int64) { fmt.Printf("bytes %d\n", n) })
	if err != nil {
		fmt.Printf("error: %v\n", err)
		os.Exit(1)
	}
	fmt.Println("done")
	os.Exit(0)
}

// stream is one running stream client: bytes echoed so far, the longest
// gap between two round trips, and its end.
type stream struct {
	name    string
	mu      sync.Mutex
	n       int64
	last    time.Time
	maxGap  time.Duration
	err     error
	ended   bool
	stop    func()
	stopped chan struct{}
}

func (s *stream) progress(n int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if !s.last.IsZero() && now.Sub(s.last) > s.maxGap {
		s.maxGap = now.Sub(s.last)
	}
	s.n, s.last = n, now
}

func (s *stream) end(err error) {
	s.mu.Lock()
	s.err, s.ended = err, true
	s.mu.Unlock()
	close(s.stopped)
}

func (s *stream) bytes() (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended && s.err == nil {
		return s.n, fmt.Errorf("%s stream ended early", s.name)
	}
	return s.n, s.err
}

// grows waits until the stream has echoed more than from.
func (s *stream) grows(t *testing.T, from int64, what string) int64 {
	t.Helper()
	var n int64
	eventually(t, s.name+" stream flows "+what, testutil.Stretch(t, 10*time.Second), func() error {
		var err error
		if n, err = s.bytes(); err != nil {
			t.Fatalf("%s stream %s: %v", s.name, what, err)
		}
		if n <= from+4096 {
			return fmt.Errorf("%d bytes echoed, %d before", n, from)
		}
		return nil
	})
	return n
}

// finish stops the stream and fails t on any error.
func (s *stream) finish(t *testing.T) {
	t.Helper()
	s.stop()
	select {
	case <-s.stopped:
	case <-time.After(testutil.Stretch(t, 10*time.Second)):
		t.Fatalf("%s stream did not stop", s.name)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		t.Fatalf("%s stream: %v", s.name, s.err)
	}
	t.Logf("%s stream: %d bytes echoed byte for byte, longest gap between round trips %s", s.name, s.n, s.maxGap.Round(time.Millisecond))
}

// outside is the network outside the scratch node: the node's uplink peer
// moved into its own netns, holding an external client (198.18.0.99), node2
// (198.18.0.12, the next hop to node2's podCIDR) and, on its loopback, the
// echo server 10.244.2.50:8080, a "pod" of node2.
type outside struct{ name string }

const (
	outsideClient = "198.18.0.99"
	echoBackend   = "10.244.2.50"
)

func (c *crashNode) wireOutside(t *testing.T) outside {
	t.Helper()
	o := outside{name: testutil.NewNetns(t, "axt-out-")}
	h, err := netns.GetFromName(o.name)
	must(t, err)
	defer h.Close()
	peer, err := c.n.nl.LinkByName("eth0peer")
	must(t, err)
	must(t, c.n.nl.LinkSetNsFd(peer, int(h)))
	nl, err := netlink.NewHandleAt(h)
	must(t, err)
	defer nl.Close()
	peer, err = nl.LinkByName("eth0peer")
	must(t, err)
	for _, a := range []string{outsideClient + "/24", "198.18.0.12/24"} {
		addr, _ := netlink.ParseAddr(a)
		addr.Flags = unix.IFA_F_NODAD
		must(t, nl.AddrAdd(peer, addr))
	}
	must(t, nl.LinkSetUp(peer))
	lo, err := nl.LinkByName("lo")
	must(t, err)
	addr, _ := netlink.ParseAddr(echoBackend + "/32")
	must(t, nl.AddrAdd(lo, addr))
	must(t, nl.LinkSetUp(lo))
	var ln net.Listener
	must(t, netnsutil.Do(o.name, func() (err error) {
		ln, err = net.Listen("tcp", echoBackend+":8080")
		return err
	}))
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer conn.Close(); _, _ = io.Copy(conn, conn) }()
		}
	}()
	return o
}

// echoService creates default/echo: a NodePort Service whose one endpoint
// is the echo server; it returns its ClusterIP and NodePort.
func (c *crashNode) echoService(t *testing.T) (netip.Addr, uint16) {
	t.Helper()
	ctx := t.Context()
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "echo"}, Spec: corev1.ServiceSpec{
		Type:  corev1.ServiceTypeNodePort,
		Ports: []corev1.ServicePort{{Name: "tcp", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(8080)}},
	}}
	svc, err := c.cs.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
	must(t, err)
	es := endpointSlice("default", "echo-1", "echo", []discoveryv1.EndpointPort{slicePort("tcp", 8080, corev1.ProtocolTCP)},
		testEP{addr: echoBackend, node: "node2", ready: true})
	_, err = c.cs.DiscoveryV1().EndpointSlices("default").Create(ctx, es, metav1.CreateOptions{})
	must(t, err)
	return netip.MustParseAddr(svc.Spec.ClusterIP), uint16(svc.Spec.Ports[0].NodePort)
}

// nodePortStream streams from the outside client to the node's NodePort:
// the north-south LB at the uplink (SNAT to the remote echo backend).
func (c *crashNode) nodePortStream(t *testing.T, o outside, port uint16) *stream {
	t.Helper()
	target := nodePortAddr(port)
	conn, err := o.dial(target, 5*time.Second)
	must(t, err)
	stop := make(chan struct{})
	s := &stream{name: "NodePort " + target, stop: sync.OnceFunc(func() { close(stop) }), stopped: make(chan struct{})}
	go func() { defer conn.Close(); s.end(streamEcho(conn, stop, s.progress)) }()
	t.Cleanup(s.stop)
	return s
}

// nodePortAddr is the scratch node's NodePort port as seen from outside.
func nodePortAddr(port uint16) string { return fmt.Sprintf("198.18.0.11:%d", port) }

// dial connects from the outside client (outsideClient) to addr over TCP.
func (o outside) dial(addr string, timeout time.Duration) (conn net.Conn, err error) {
	err = netnsutil.Do(o.name, func() (e error) {
		d := net.Dialer{Timeout: timeout, LocalAddr: &net.TCPAddr{IP: net.ParseIP(outsideClient)}}
		conn, e = d.Dial("tcp", addr)
		return e
	})
	return conn, err
}

// clusterIPStream streams from a process in the socket LB's cgroup in the
// node netns to the ClusterIP: the socket LB translates its connect().
func (c *crashNode) clusterIPStream(t *testing.T, ip netip.Addr) *stream {
	t.Helper()
	cg, err := os.Open(c.cfg.CgroupRoot)
	must(t, err)
	defer cg.Close()
	req, _ := json.Marshal(streamRequest{Netns: c.n.name, Addr: netip.AddrPortFrom(ip, 80).String()})
	cmd := testutil.HelperCommand(context.Background(), "TestCrashStreamHelper", streamEnv, req, int(cg.Fd()))
	stdin, err := cmd.StdinPipe()
	must(t, err)
	stdout, err := cmd.StdoutPipe()
	must(t, err)
	cmd.Stderr = os.Stderr
	must(t, cmd.Start())
	s := &stream{name: "ClusterIP " + ip.String() + ":80", stop: sync.OnceFunc(func() { stdin.Close() }), stopped: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stdout)
		var err error
		for sc.Scan() {
			line := sc.Text()
			var n int64
			if _, e := fmt.Sscanf(line, "bytes %d", &n); e == nil {
				s.progress(n)
			} else if strings.HasPrefix(line, "error: ") {
				err = errors.New(strings.TrimPrefix(line, "error: "))
			}
		}
		if werr := cmd.Wait(); werr != nil && err == nil {
			err = fmt.Errorf("stream client: %w", werr)
		}
		s.end(err)
	}()
	t.Cleanup(func() {
		s.stop()
		select {
		case <-s.stopped:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
		}
	})
	return s
}

// TestCrashDuringTraffic kills the agent with SIGKILL while two TCP streams
// run through a Service, one through its ClusterIP (socket LB, from a
// process in the LB's cgroup) and one through its NodePort (north-south LB
// at the uplink, SNAT to a backend on another node), and starts it again.
// Both streams must go on byte for byte while the agent is dead and after
// it restarted, and the restarted agent must leave the pinned maps exactly
// as the apiserver says.
func TestCrashDuringTraffic(t *testing.T) {
	c := newCrashNode(t, crashAPIPort, crashEtcdPort)
	o := c.wireOutside(t)
	clusterIP, nodePort := c.echoService(t)
	p := c.start(t)
	c.converge(t, "first start", 60*time.Second)
	np := c.nodePortStream(t, o, nodePort)
	cip := c.clusterIPStream(t, clusterIP)
	n1, n2 := np.grows(t, 0, "before the kill"), cip.grows(t, 0, "before the kill")
	p.sigkill(t)
	t.Log("agent killed (SIGKILL)")
	n1, n2 = np.grows(t, n1, "while the agent is dead"), cip.grows(t, n2, "while the agent is dead")
	c.start(t)
	c.waitProbe(t, "/readyz", 200, "ok", 30*time.Second)
	c.waitAttached(t)
	c.converge(t, "restart after SIGKILL", 60*time.Second)
	np.grows(t, n1, "after the restart")
	cip.grows(t, n2, "after the restart")
	np.finish(t)
	cip.finish(t)
}

// probe GETs one of the agent's health endpoints inside the node netns.
func (c *crashNode) probe(path string) (int, string) {
	code, body, err := c.n.httpGet(crashHealthURL + path)
	if err != nil {
		return 0, err.Error()
	}
	return code, strings.TrimSpace(body)
}

// waitProbe waits until path answers code with a body containing want.
func (c *crashNode) waitProbe(t *testing.T, path string, code int, want string, timeout time.Duration) string {
	t.Helper()
	var body string
	eventually(t, fmt.Sprintf("GET %s answers %d %q", path, code, want), testutil.Stretch(t, timeout), func() error {
		var got int
		got, body = c.probe(path)
		if got != code || !strings.Contains(body, want) {
			return fmt.Errorf("%d %q", got, body)
		}
		return nil
	})
	return body
}

// waitAttached waits until the agent says the north-south LB is attached.
func (c *crashNode) waitAttached(t *testing.T) {
	t.Helper()
	cl := api.NewClient(c.cfg.Socket)
	eventually(t, "north-south LB attached", testutil.Stretch(t, 30*time.Second), func() error {
		st, err := cl.Status(t.Context())
		if err != nil {
			return err
		}
		if d := findDecision(st.Datapath, DecisionNodePortLB); !strings.Contains(d.Value, "eth0") {
			return fmt.Errorf("%s = %s (%s)", d.Name, d.Value, d.Reason)
		}
		return nil
	})
}

// reconciles reads axon_agent_reconciles_total (both results) from /metrics.
func (c *crashNode) reconciles(t *testing.T) int {
	t.Helper()
	code, body := c.probe("/metrics")
	if code != 200 {
		t.Fatalf("GET /metrics: %d %.300s", code, body)
	}
	n := 0
	for _, line := range strings.Split(body, "\n") {
		var res string
		var v int
		if _, err := fmt.Sscanf(line, "axon_agent_reconciles_total{result=%q} %d", &res, &v); err == nil {
			n += v
		}
	}
	return n
}

// TestLivenessIsNotReadiness stops the real kube-apiserver (SIGKILL) while
// the agent runs and two TCP streams go through an existing Service (its
// ClusterIP and its NodePort): /livez stays 200 all along (the reconcile
// loop keeps finishing passes: its counter moves), /readyz goes 503 saying
// the apiserver is unreachable, both streams keep flowing byte for byte,
// and when the apiserver is back /readyz is 200 again and the pinned maps
// equal the apiserver's Services.
func TestLivenessIsNotReadiness(t *testing.T) {
	c := newCrashNode(t, crashAPIPort, crashEtcdPort)
	c.cfg.ReconcileInterval = time.Second // the loop's passes are what liveness watches
	// /readyz goes 503 when the /version probe fails: probed every second, not every 10 s
	c.cfg.APIServerProbeInterval = time.Second
	o := c.wireOutside(t)
	clusterIP, nodePort := c.echoService(t)
	c.start(t)
	c.waitProbe(t, "/readyz", 200, "ok", 60*time.Second)
	c.waitAttached(t)
	c.converge(t, "first start", 30*time.Second)
	c.waitProbe(t, "/livez", 200, "ok", 5*time.Second)
	np := c.nodePortStream(t, o, nodePort)
	cip := c.clusterIPStream(t, clusterIP)
	n1, n2 := np.grows(t, 0, "before the outage"), cip.grows(t, 0, "before the outage")

	pids := c.cp.PIDs()
	apiPID := pids[len(pids)-1]
	must(t, syscall.Kill(apiPID, syscall.SIGKILL))
	t.Logf("kube-apiserver pid %d killed (SIGKILL)", apiPID)
	passes := c.reconciles(t)
	outage := time.Now()
	why := c.waitProbe(t, "/readyz", 503, "unreachable", 40*time.Second)
	t.Logf("/readyz %s after the kill: 503 %q", time.Since(outage).Round(time.Millisecond), why)
	if code, body := c.probe("/healthz"); code != 200 {
		t.Errorf("/healthz keeps its meaning (ready once synced) but answers %d %q during the outage", code, body)
	}
	// the outage lasts a few more seconds: liveness must hold all along
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		if code, body := c.probe("/livez"); code != 200 {
			t.Fatalf("/livez during the apiserver outage: %d %q, want 200 (a restart does not bring the apiserver back)", code, body)
		}
	}
	if after := c.reconciles(t); after <= passes {
		t.Errorf("reconcile passes during the outage: %d before, %d after: the loop stopped", passes, after)
	} else {
		t.Logf("reconcile passes went on during the outage: %d -> %d", passes, after)
	}
	n1, n2 = np.grows(t, n1, "during the apiserver outage"), cip.grows(t, n2, "during the apiserver outage")

	// the apiserver comes back (with its etcd, on the same data)
	etcd, err := lab.DepPath("etcd")
	must(t, err)
	apiserver, err := lab.DepPath("kube-apiserver")
	must(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), testutil.Stretch(t, 2*time.Minute))
	defer cancel()
	back := time.Now()
	c.cp, err = controlplane.Start(ctx, controlplane.Config{Dir: c.cp.Dir(), APIPort: crashAPIPort, EtcdPort: crashEtcdPort,
		EtcdBinary: etcd, APIServerBinary: apiserver, Logger: testLogger(t)})
	must(t, err)
	t.Logf("kube-apiserver back after %s (restart took %s)", time.Since(outage).Round(time.Millisecond), time.Since(back).Round(time.Millisecond))
	c.waitProbe(t, "/readyz", 200, "ok", 60*time.Second)
	t.Logf("/readyz 200 again %s after the apiserver was back", time.Since(back).Round(time.Millisecond))
	c.waitProbe(t, "/livez", 200, "ok", 5*time.Second)
	np.grows(t, n1, "after the outage")
	cip.grows(t, n2, "after the outage")
	np.finish(t)
	cip.finish(t)
	c.converge(t, "after the outage", 30*time.Second)
}

// TestCrashDuringUpgrade is a DaemonSet-style upgrade: while Services
// change, the old agent gets SIGTERM, the new one starts at once, and the
// old one gets SIGKILL 100 ms later (its grace period ending). Only one
// agent may own a node: the new one either finds --state-dir locked by the
// old one and exits saying so (the kubelet starts it again: here the test
// does) or starts after the old one died; then it adopts the pinned maps,
// and they must end up exactly as the apiserver says.
func TestCrashDuringUpgrade(t *testing.T) {
	c := newCrashNode(t, crashAPIPort, crashEtcdPort)
	const ns = "upgrade"
	c.createServices(t, ns, 0, 200)
	old := c.start(t)
	c.waitProbe(t, "/readyz", 200, "ok", 60*time.Second)
	c.waitAttached(t)
	c.converge(t, "first start", 30*time.Second)

	ctx := t.Context()
	churn := make(chan error, 1)
	go func() { // 40 Services go, 40 new ones come, while the agents change
		churn <- parallelErr(0, 40, func(i int) error {
			return c.cs.CoreV1().Services(ns).Delete(ctx, fmt.Sprintf("crash-%04d", i*5), metav1.DeleteOptions{})
		})
	}()
	c.createServices(t, ns, 200, 40)
	must(t, old.cmd.Process.Signal(syscall.SIGTERM))
	next := c.start(t)
	time.Sleep(100 * time.Millisecond)
	old.sigkill(t)
	must(t, <-churn)
	lockMsg := "is locked by another process (is another axon-agent running for this node?)"
	select {
	case err := <-next.done:
		next.done <- err
		b, _ := os.ReadFile(c.logFile)
		if !strings.Contains(string(b), lockMsg) {
			t.Fatalf("the new agent exited (%v) without saying another agent holds the node: want %q in its log", err, lockMsg)
		}
		t.Logf("the new agent found the old one still holding --state-dir and exited (%v) saying so; started again", err)
		next = c.start(t)
	case <-time.After(testutil.Stretch(t, 3*time.Second)):
		t.Log("the new agent started after the old one died")
	}
	c.waitProbe(t, "/readyz", 200, "ok", 60*time.Second)
	c.waitAttached(t)
	c.converge(t, "after the upgrade", 30*time.Second)
	select {
	case err := <-next.done:
		t.Fatalf("the new agent exited: %v", err)
	default:
	}
}

// TestReadyMeansNodePortServed: an agent answers /readyz 200 only once its
// north-south LB serves the Service table, at its first start and when it
// starts again over its pins. The LB loads after the socket LB and the first
// Service sync, about a second of verification later; until then a NodePort
// connection arriving at a fresh node meets the node's own stack and is
// refused. At each first 200 the Services API must say the north-south LB
// holds default/echo, and a connection from outside to the NodePort must be
// answered by the echo backend behind it. 300 other Services make the
// Service sync take a moment.
func TestReadyMeansNodePortServed(t *testing.T) {
	c := newCrashNode(t, crashAPIPort, crashEtcdPort)
	o := c.wireOutside(t)
	_, nodePort := c.echoService(t)
	c.createServices(t, "many", 0, 300)
	p := c.start(t)
	c.readyServesNodePort(t, "first start", o, nodePort)
	p.sigkill(t)
	c.start(t)
	c.readyServesNodePort(t, "start over the pins after SIGKILL", o, nodePort)
}

// readyServesNodePort polls /readyz every 10 ms until it answers 200, then
// checks that the north-south LB holds default/echo and serves its NodePort.
func (c *crashNode) readyServesNodePort(t *testing.T, what string, o outside, nodePort uint16) {
	t.Helper()
	var notReady []string // the distinct 503 reasons seen on the way
	deadline := time.Now().Add(testutil.Stretch(t, 60*time.Second))
	for {
		code, body := c.probe("/readyz")
		if code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: /readyz not 200 after 60 s: %d %q", what, code, body)
		}
		if code == 503 && !slices.Contains(notReady, body) {
			notReady = append(notReady, body)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("%s: /readyz 503 on the way: %q", what, notReady)
	sr, err := api.NewClient(c.cfg.Socket).Services(t.Context())
	must(t, err)
	if _, ok := sr.Programmed["default/echo"]; !sr.NorthSouth || !ok {
		t.Errorf("%s: ready, but the Services API says north-south %v, programmed %d Services without default/echo: want the north-south LB holding it",
			what, sr.NorthSouth, len(sr.Programmed))
	}
	target := nodePortAddr(nodePort)
	conn, err := o.dial(target, 2*time.Second)
	if err != nil {
		t.Fatalf("%s: ready, but the NodePort %s does not answer: %v", what, target, err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	_, err = conn.Write([]byte("ping\n"))
	must(t, err)
	buf := make([]byte, 5)
	if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "ping\n" {
		t.Fatalf("%s: NodePort %s: echo %q, %v", what, target, buf, err)
	}
}
