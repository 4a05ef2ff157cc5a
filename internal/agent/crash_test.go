package agent

// Real crashes: the agent process is killed with SIGKILL (no deferred
// cleanup, no Close) at the worst moments and started again; the restarted
// agent must bring every pinned LB map to exactly what the apiserver says
// (checkPinnedLB, lbcheck_test.go).

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/axonhq/axon/internal/lab/controlplane"
	"github.com/axonhq/axon/internal/lb"
	"github.com/axonhq/axon/internal/testutil"
)

// Ports of this file's control planes (each test file has its own).
const (
	crashAPIPort   = 16813
	crashEtcdPort  = 12749
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
	idx := make(chan int)
	errc := make(chan error, 16)
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
		t.Fatal(err)
	default:
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
	c.converge(t, "restart after SIGKILL mid-write", 30*time.Second)
}
