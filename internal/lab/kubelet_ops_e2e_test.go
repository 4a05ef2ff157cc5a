package lab_test

// Operating axon on real kubelet nodes (docs/kubelet.md, "Operating: rolling update, restarts,
// churn"): the DaemonSet rolls to a new image tag, and the agent is killed, while clients stream
// requests through a ClusterIP and the NodePorts; no request may fail and no TCP connection may
// be reset.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/axonhq/axon/internal/datapath/drops"
	"github.com/axonhq/axon/internal/lab"
	"github.com/axonhq/axon/internal/lab/kubenode"
	"github.com/axonhq/axon/internal/netnsutil"
)

// kubeLoopEnv makes the test binary a traffic loop ("new|keep|udp ADDR") that the test starts
// in a pod's netns and cgroup or in the external namespace; it runs until stdin closes and then
// prints a kubeLoopResult.
const kubeLoopEnv = "AXON_LAB_KUBE_LOOP"

func init() {
	if v := os.Getenv(kubeLoopEnv); v != "" {
		os.Exit(kubeLoopMain(v))
	}
}

// kubeLoopResult is what a traffic loop prints when its stdin closes.
type kubeLoopResult struct {
	OK, Fails int
	// Resets: requests that failed with ECONNRESET or ECONNREFUSED (a RST came back).
	Resets int
	// Reconnects: "keep" had to open a new connection after its first one failed.
	Reconnects int
	FirstErr   string
	Seen       map[string]int // answering pod -> requests
	// FailedAt: when the first failed requests started (Unix time, seconds).
	FailedAt []float64
}

// kubeLoopConnectTimeout bounds every connect: under the kernel's first SYN retransmission
// (1 s), so a SYN the datapath dropped fails the request instead of passing late; with margin
// for a busy 2-core host.
const kubeLoopConnectTimeout = 900 * time.Millisecond

// kubeLoopMain runs one loop against agnhost netexec (HTTP /hostname on TCP, "hostname" on UDP):
//   - new:  a new TCP connection per request (connect, GET, read, close);
//   - keep: one long-lived HTTP/1.1 connection for every request; reconnects only after an error;
//   - udp:  a new UDP socket per request, one datagram and its answer within a second.
func kubeLoopMain(spec string) int {
	mode, addr, _ := strings.Cut(spec, " ")
	stop := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); close(stop) }()
	r := kubeLoopResult{Seen: map[string]int{}}
	var keep net.Conn
	var keepR *bufio.Reader
	first := true
	fmt.Println("started")
	for {
		select {
		case <-stop:
			_ = json.NewEncoder(os.Stdout).Encode(r)
			return 0
		default:
		}
		var answer string
		var err error
		start := float64(time.Now().UnixMilli()) / 1000
		switch mode {
		case "new":
			answer, err = func() (string, error) {
				c, err := net.DialTimeout("tcp", addr, kubeLoopConnectTimeout)
				if err != nil {
					return "", fmt.Errorf("connect: %w", err)
				}
				defer c.Close()
				return httpHostname(c, bufio.NewReader(c), true)
			}()
		case "keep":
			if keep == nil {
				if keep, err = net.DialTimeout("tcp", addr, kubeLoopConnectTimeout); err != nil {
					keep, err = nil, fmt.Errorf("connect: %w", err)
					break
				}
				keepR = bufio.NewReader(keep)
				if !first {
					r.Reconnects++
				}
				first = false
			}
			if answer, err = httpHostname(keep, keepR, false); err != nil {
				keep.Close()
				keep = nil
			}
		case "udp":
			answer, err = func() (string, error) {
				c, err := net.Dial("udp", addr)
				if err != nil {
					return "", err
				}
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(time.Second))
				if _, err := c.Write([]byte("hostname")); err != nil {
					return "", err
				}
				buf := make([]byte, 256)
				n, err := c.Read(buf)
				return string(buf[:n]), err
			}()
		default:
			fmt.Println("error: unknown loop mode", mode)
			return 1
		}
		if err != nil {
			r.Fails++
			if errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) {
				r.Resets++
			}
			if r.FirstErr == "" {
				r.FirstErr = err.Error()
			}
			if len(r.FailedAt) < 10 {
				r.FailedAt = append(r.FailedAt, start)
			}
		} else {
			r.OK++
			r.Seen[answer]++
		}
		time.Sleep(10 * time.Millisecond) // ~50-80 requests a second per loop: traffic, not a CPU hog
	}
}

// httpHostname sends GET /hostname on c and returns the body (netexec's pod name).
func httpHostname(c net.Conn, br *bufio.Reader, closeAfter bool) (string, error) {
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	hdr := "Connection: keep-alive"
	if closeAfter {
		hdr = "Connection: close"
	}
	if _, err := fmt.Fprintf(c, "GET /hostname HTTP/1.1\r\nHost: web\r\n%s\r\n\r\n", hdr); err != nil {
		return "", fmt.Errorf("write: %w", err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return "", fmt.Errorf("read response: %w", err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return "", fmt.Errorf("read body: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("HTTP %d: %s", resp.StatusCode, body)
	}
	return strings.TrimSpace(string(body)), nil
}

// kubeLoop is one running traffic loop.
type kubeLoop struct {
	what, mode string
	stdin      io.WriteCloser
	out        *bufio.Reader
}

// startKubeLoop starts loop spec in netns (and cgroup, when set) and waits until it runs.
func startKubeLoop(ctx context.Context, t *testing.T, what, netns, cgroup, spec string) kubeLoop {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, "nsenter", "--net="+netns, "--", self)
	cmd.Env = append(os.Environ(), kubeLoopEnv+"="+spec)
	if cgroup != "" {
		fd, err := syscall.Open(cgroup, syscall.O_DIRECTORY|syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer syscall.Close(fd)
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start loop %q (%s): %v", spec, what, err)
	}
	runtime.KeepAlive(cmd)
	t.Cleanup(func() { stdin.Close(); _ = cmd.Process.Kill(); _ = cmd.Wait() })
	out := bufio.NewReader(stdout)
	if line, err := out.ReadString('\n'); err != nil || strings.TrimSpace(line) != "started" {
		t.Fatalf("loop %q (%s): first line %q, %v", spec, what, line, err)
	}
	mode, _, _ := strings.Cut(spec, " ")
	return kubeLoop{what: what + " " + spec, mode: mode, stdin: stdin, out: out}
}

// stop ends the loop and returns its counts.
func (lp kubeLoop) stop(t *testing.T) kubeLoopResult {
	t.Helper()
	lp.stdin.Close()
	var r kubeLoopResult
	if err := json.NewDecoder(lp.out).Decode(&r); err != nil {
		t.Fatalf("%s: loop result: %v", lp.what, err)
	}
	return r
}

// tcpCounters are the TCP counters of one netns that a reset moves: Tcp AttemptFails (a connect
// answered by RST), EstabResets (an established connection reset), OutRsts (RSTs sent), and
// TcpExt TCPAbortOn* (connections the kernel aborted).
type tcpCounters map[string]int64

// readTCPCounters reads /proc/net/snmp and /proc/net/netstat inside netns.
func readTCPCounters(ctx context.Context, t *testing.T, netns string) tcpCounters {
	t.Helper()
	out, err := exec.CommandContext(ctx, "nsenter", "--net="+netns, "--", "cat", "/proc/net/snmp", "/proc/net/netstat").Output()
	if err != nil {
		t.Fatalf("read TCP counters in %s: %v", netns, err)
	}
	c := tcpCounters{}
	lines := strings.Split(string(out), "\n")
	for i := 0; i+1 < len(lines); i++ {
		names, values := strings.Fields(lines[i]), strings.Fields(lines[i+1])
		if len(names) == 0 || len(names) != len(values) || names[0] != values[0] || (names[0] != "Tcp:" && names[0] != "TcpExt:") {
			continue
		}
		for j := 1; j < len(names); j++ {
			n := names[j]
			if n == "AttemptFails" || n == "EstabResets" || n == "OutRsts" || strings.HasPrefix(n, "TCPAbortOn") {
				v, _ := strconv.ParseInt(values[j], 10, 64)
				c[n] = v
			}
		}
		i++
	}
	if _, ok := c["OutRsts"]; !ok {
		t.Fatalf("no Tcp OutRsts in %s's /proc/net/snmp:\n%s", netns, out)
	}
	return c
}

// moved lists the counters of after that differ from before ("OutRsts +3").
func (after tcpCounters) moved(before tcpCounters) []string {
	var d []string
	for k, v := range after {
		if v != before[k] {
			d = append(d, fmt.Sprintf("%s %+d", k, v-before[k]))
		}
	}
	slices.Sort(d)
	return d
}

// trafficNetns is a namespace whose TCP counters a traffic window watches.
type trafficNetns struct{ what, netns string }

// traffic is a set of loops and the namespaces whose counters must stay put while they run.
type traffic struct {
	loops  []kubeLoop
	netns  []trafficNetns
	before []tcpCounters
	t0     time.Time
	// the web pods' server processes and their run-queue wait when the loops started: a
	// server starved of CPU looks like a lost packet to its clients, so the wait is logged
	servers []runqWait
	// each node's datapath drop counters when the loops started: a request lost to one of
	// axon's programs moves one of them, one lost elsewhere (or never sent) does not
	kube  kubernetes.Interface
	drops map[string]map[string]uint64
}

// nodeDrops reads every node's drop counters (bpf/lib/drop.h: every program of the node counts
// its drops there, by direction and reason) from the maps the agent pinned in the node's own
// bpffs, through its container's root: node -> "direction/reason" -> packets. The maps outlive
// the agent, so two readings around an agent's restart compare.
func nodeDrops(ctx context.Context, t *testing.T, kube kubernetes.Interface) map[string]map[string]uint64 {
	t.Helper()
	out := map[string]map[string]uint64{}
	for node, p := range agentPods(ctx, t, kube) {
		pin := fmt.Sprintf("/proc/%d/root/sys/fs/bpf/axon", containerPID(t, p, "axon-agent"))
		m, err := drops.Open(pin)
		if err != nil {
			t.Fatalf("%s: %v", node, err)
		}
		counts, err := m.ReadCounts()
		m.Close()
		if err != nil {
			t.Fatalf("%s: %v", node, err)
		}
		out[node] = map[string]uint64{}
		for _, c := range counts {
			out[node][c.Direction+"/"+c.Reason] = c.Packets
		}
	}
	return out
}

// dropsMoved names the counters of after that grew since before, with their growth.
func dropsMoved(before, after map[string]map[string]uint64) []string {
	var moved []string
	for node, cs := range after {
		for k, v := range cs {
			if d := v - before[node][k]; v > before[node][k] {
				moved = append(moved, fmt.Sprintf("%s %s +%d", node, k, d))
			}
		}
	}
	slices.Sort(moved)
	return moved
}

// runqWait is a process's time waiting for a CPU: the sum over its threads of
// /proc/<pid>/task/<tid>/schedstat's second field (a Go server's main thread mostly sleeps).
type runqWait struct {
	what string
	pid  int
	ns   int64
}

func readRunqWait(pid int) int64 {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	var sum int64
	for _, p := range tasks {
		b, err := os.ReadFile(p)
		if f := strings.Fields(string(b)); err == nil && len(f) > 1 {
			v, _ := strconv.ParseInt(f[1], 10, 64)
			sum += v
		}
	}
	return sum
}

// startTraffic streams requests while something is done to the agents: from each web pod (its
// netns and cgroup: the socket LB translates) to the ClusterIP over new TCP connections, one
// long-lived connection and UDP; from the external namespace to both nodes' NodePort over new
// connections and one long-lived connection each (the north-south LB and its conntrack).
func startTraffic(ctx context.Context, t *testing.T, l *lab.Lab, kube kubernetes.Interface, pods []corev1.Pod, cip string, nodePort int) *traffic {
	t.Helper()
	tr := &traffic{t0: time.Now(), kube: kube, drops: nodeDrops(ctx, t, kube)}
	ext := netnsutil.Path(l.External().Netns)
	for _, p := range pods {
		netns, cg := podNamespaces(t, p)
		tr.netns = append(tr.netns, trafficNetns{"pod " + p.Name + " on " + p.Spec.NodeName, netns})
		var pid int
		fmt.Sscanf(netns, "/proc/%d/ns/net", &pid)
		tr.servers = append(tr.servers, runqWait{"pod " + p.Name + " on " + p.Spec.NodeName, pid, readRunqWait(pid)})
		for _, spec := range []string{"new " + cip + ":80", "keep " + cip + ":80", "udp " + cip + ":81"} {
			tr.loops = append(tr.loops, startKubeLoop(ctx, t, "pod "+p.Name, netns, cg, spec))
		}
	}
	tr.netns = append(tr.netns, trafficNetns{"external", ext})
	for _, n := range l.Nodes() {
		dst := hostPort(n.IP, nodePort)
		tr.loops = append(tr.loops, startKubeLoop(ctx, t, "external", ext, "", "new "+dst), startKubeLoop(ctx, t, "external", ext, "", "keep "+dst))
	}
	for _, n := range tr.netns {
		tr.before = append(tr.before, readTCPCounters(ctx, t, n.netns))
	}
	return tr
}

// stopAndCheck ends the loops and fails the test for any failed request, any reset a client saw,
// a long-lived connection that had to reconnect, or a reset counter that moved in a watched
// namespace. It also wants real traffic: every loop answered often, by both web pods.
func (tr *traffic) stopAndCheck(ctx context.Context, t *testing.T, during string, names []string) {
	t.Helper()
	total, fails := 0, 0
	for _, lp := range tr.loops {
		r := lp.stop(t)
		total += r.OK + r.Fails
		fails += r.Fails
		t.Logf("%s during %s: %d requests, %d failed (%d resets), %d reconnects, answered by %v",
			lp.what, during, r.OK+r.Fails, r.Fails, r.Resets, r.Reconnects, r.Seen)
		if r.Fails != 0 || r.Reconnects != 0 {
			var at []string
			for _, f := range r.FailedAt {
				at = append(at, fmt.Sprintf("%.2fs", f-float64(tr.t0.UnixMilli())/1000))
			}
			t.Errorf("%s during %s: %d of %d requests failed (%d with a reset), %d reconnects; first: %s; failed at %v since the loops started",
				lp.what, during, r.Fails, r.OK+r.Fails, r.Resets, r.Reconnects, r.FirstErr, at)
		}
		if r.OK < 50 {
			t.Errorf("%s during %s: only %d requests answered: not a real load", lp.what, during, r.OK)
		}
		if lp.mode != "keep" { // a long-lived connection stays with the backend it connected to
			for _, n := range names {
				if r.Seen[n] == 0 {
					t.Errorf("%s during %s: no answer from %s (answers %v): the Service must balance over both pods", lp.what, during, n, r.Seen)
				}
			}
		}
	}
	// A reset that hits a connection moves AttemptFails or EstabResets where it lands, an abort
	// TCPAbortOn*: none may move. OutRsts (RSTs sent) is only logged: one run of a dozen saw
	// OutRsts +1 in each of the three namespaces during a rollout with no failed request, no
	// reconnect and no reset received anywhere (an answer to a stray segment; cause not found,
	// docs/kubelet.md "Operating").
	var sent []string
	for i, n := range tr.netns {
		after := readTCPCounters(ctx, t, n.netns)
		if d := after.moved(tr.before[i]); len(d) > 0 {
			var hit []string
			for _, c := range d {
				if !strings.HasPrefix(c, "OutRsts ") {
					hit = append(hit, c)
				}
			}
			if len(hit) > 0 {
				t.Errorf("%s's TCP counters moved during %s: %v (a connection was reset, refused or aborted)", n.what, during, d)
			}
		}
		sent = append(sent, fmt.Sprintf("%s %+d", n.what, after["OutRsts"]-tr.before[i]["OutRsts"]))
	}
	t.Logf("%s: RSTs sent (OutRsts): %s", during, strings.Join(sent, ", "))
	var waits []string
	for _, sv := range tr.servers {
		waits = append(waits, fmt.Sprintf("%s %s", sv.what, time.Duration(readRunqWait(sv.pid)-sv.ns).Round(time.Millisecond)))
	}
	t.Logf("%s: %d requests in %s over %d loops, %d failed; the servers waited for a CPU: %s", during, total,
		time.Since(tr.t0).Round(100*time.Millisecond), len(tr.loops), fails, strings.Join(waits, ", "))
	moved := dropsMoved(tr.drops, nodeDrops(ctx, t, tr.kube))
	if len(moved) == 0 {
		moved = []string{"none"}
	}
	t.Logf("%s: the nodes' datapath drop counters that moved: %s", during, strings.Join(moved, ", "))
}

// countersShowResets is the control for the counters: a connect refused between two web pods
// (port 1, no listener) and from the external namespace to node1 must move AttemptFails in the
// client's netns and OutRsts in the server's, so that "nothing moved" later means something.
func countersShowResets(ctx context.Context, t *testing.T, l *lab.Lab, pods []corev1.Pod) {
	t.Helper()
	clientNS, clientCG := podNamespaces(t, pods[0])
	serverNS, _ := podNamespaces(t, pods[1])
	ext := netnsutil.Path(l.External().Netns)
	c0, s0, e0 := readTCPCounters(ctx, t, clientNS), readTCPCounters(ctx, t, serverNS), readTCPCounters(ctx, t, ext)
	refused := func(netns, cg, dst string) {
		t.Helper()
		cmd := exec.CommandContext(ctx, "nsenter", "--net="+netns, "--", "curl", "-sS", "-m", "2", "http://"+dst+"/")
		if cg != "" {
			fd, err := syscall.Open(cg, syscall.O_DIRECTORY|syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer syscall.Close(fd)
			cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
		}
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 7 { // curl's "Failed to connect"
			t.Fatalf("control: curl %s should fail to connect (a RST): %v %s", dst, err, out)
		}
	}
	refused(clientNS, clientCG, pods[1].Status.PodIP+":1")
	refused(ext, "", hostPort(l.Nodes()[0].IP, 1))
	if c := readTCPCounters(ctx, t, clientNS); c["AttemptFails"] <= c0["AttemptFails"] {
		t.Fatalf("control: a refused connect from pod %s did not move its AttemptFails (%v -> %v)", pods[0].Name, c0, c)
	}
	if s := readTCPCounters(ctx, t, serverNS); s["OutRsts"] <= s0["OutRsts"] {
		t.Fatalf("control: pod %s refused a connect without moving its OutRsts (%v -> %v)", pods[1].Name, s0, s)
	}
	if e := readTCPCounters(ctx, t, ext); e["AttemptFails"] <= e0["AttemptFails"] {
		t.Fatalf("control: a refused connect from the external namespace did not move its AttemptFails (%v -> %v)", e0, e)
	}
}

// agentPods returns the axon agent pods by node.
func agentPods(ctx context.Context, t *testing.T, kube kubernetes.Interface) map[string]corev1.Pod {
	t.Helper()
	l, err := kube.CoreV1().Pods(lab.AxonNamespace).List(ctx, metav1.ListOptions{LabelSelector: lab.AxonAgentSelector})
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]corev1.Pod{}
	for _, p := range l.Items {
		if p.DeletionTimestamp == nil {
			m[p.Spec.NodeName] = p
		}
	}
	return m
}

func podReady(p corev1.Pod) bool {
	return slices.ContainsFunc(p.Status.Conditions, func(c corev1.PodCondition) bool {
		return c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
	})
}

// waitAgents waits until both nodes have a Ready agent pod for which ok holds. The timeline
// says when each node's pod first satisfied ok and when it was Ready, in seconds since since.
func waitAgents(ctx context.Context, t *testing.T, kube kubernetes.Interface, timeout time.Duration, what string, since time.Time, ok func(corev1.Pod) bool) (pods map[string]corev1.Pod, timeline string) {
	t.Helper()
	seen, ready := map[string]float64{}, map[string]float64{}
	waitUntil(ctx, t, timeout, what, func() (bool, string) {
		pods = agentPods(ctx, t, kube)
		var states []string
		done := len(pods) == 2
		now := time.Since(since).Seconds()
		for _, n := range []string{"node1", "node2"} {
			p, found := pods[n]
			if found && ok(p) {
				if _, was := seen[n]; !was {
					seen[n] = now
				}
				if _, was := ready[n]; !was && podReady(p) {
					ready[n] = now
				}
			}
			if !found || !podReady(p) || !ok(p) {
				done = false
			}
			states = append(states, fmt.Sprintf("%s: %s ready=%v", n, p.Name, found && podReady(p)))
		}
		return done, strings.Join(states, "; ")
	})
	return pods, fmt.Sprintf("node1 new %.1fs Ready %.1fs, node2 new %.1fs Ready %.1fs", seen["node1"], ready["node1"], seen["node2"], ready["node2"])
}

// tagAxonImage tags the axon image (the chart's tag) as tag in every node's containerd: the
// "new version" a rolling update goes to, without a registry.
func tagAxonImage(ctx context.Context, t *testing.T, l *lab.Lab, from, to string) {
	t.Helper()
	ctr, err := lab.DepPath("ctr")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range l.Nodes() {
		sock := filepath.Join(n.KubeNodeDir, "containerd.sock")
		out, err := exec.CommandContext(ctx, ctr, "-a", sock, "-n", "k8s.io", "images", "tag", "--force", from, to).CombinedOutput()
		if err != nil {
			t.Fatalf("ctr images tag %s %s on %s: %v: %s", from, to, n.Name, err, out)
		}
	}
}

// containerPID is the first process of p's container named container.
func containerPID(t *testing.T, p corev1.Pod, container string) int {
	t.Helper()
	c, err := lab.KubeletContainer(p, container)
	if err != nil {
		t.Fatal(err)
	}
	return c.PID
}

// rollAgentsUnderTraffic rolls the axon DaemonSet to a new image tag (the same image re-tagged,
// as an upgrade changes it) while traffic streams, and waits for the rollout: both agents
// replaced by pods of the new template, Ready.
func rollAgentsUnderTraffic(ctx context.Context, t *testing.T, l *lab.Lab, kube kubernetes.Interface, pods []corev1.Pod, cip string, nodePort int, names []string) {
	t.Helper()
	ds, err := kube.AppsV1().DaemonSets(lab.AxonNamespace).Get(ctx, lab.AxonDaemonSet, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if s := ds.Spec.UpdateStrategy; s.RollingUpdate == nil || s.RollingUpdate.MaxUnavailable == nil || s.RollingUpdate.MaxUnavailable.IntValue() != 1 {
		t.Fatalf("DaemonSet %s: update strategy %+v, want RollingUpdate with maxUnavailable 1", ds.Name, s)
	}
	oldImage := ds.Spec.Template.Spec.Containers[0].Image
	newImage := oldImage + "-roll"
	tagAxonImage(ctx, t, l, oldImage, newImage)
	old := agentPods(ctx, t, kube)

	tr := startTraffic(ctx, t, l, kube, pods, cip, nodePort)
	time.Sleep(time.Second)
	t0 := time.Now()
	patch := fmt.Sprintf(`[{"op":"replace","path":"/spec/template/spec/containers/0/image","value":%q},`+
		`{"op":"replace","path":"/spec/template/spec/initContainers/0/image","value":%q}]`, newImage, newImage)
	if _, err := kube.AppsV1().DaemonSets(lab.AxonNamespace).Patch(ctx, lab.AxonDaemonSet, types.JSONPatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	_, timeline := waitAgents(ctx, t, kube, 90*time.Second, "DaemonSet rolled to "+newImage+" on both nodes", tr.t0, func(p corev1.Pod) bool {
		return p.UID != old[p.Spec.NodeName].UID && p.Spec.Containers[0].Image == newImage
	})
	t.Logf("DaemonSet rolled from %s to %s in %s (since the loops started, the same clock as their failure times: %s)",
		oldImage, newImage, time.Since(t0).Round(100*time.Millisecond), timeline)
	time.Sleep(time.Second)
	tr.stopAndCheck(ctx, t, "the DaemonSet's rolling update", names)
}

// killAgentsUnderTraffic kills node1's agent process with SIGKILL (kubelet restarts the
// container) and deletes node2's agent pod with grace period 0 (the DaemonSet makes a new one)
// while traffic streams; both agents must come back Ready.
func killAgentsUnderTraffic(ctx context.Context, t *testing.T, l *lab.Lab, kube kubernetes.Interface, pods []corev1.Pod, cip string, nodePort int, names []string) {
	t.Helper()
	old := agentPods(ctx, t, kube)
	tr := startTraffic(ctx, t, l, kube, pods, cip, nodePort)
	time.Sleep(time.Second)
	t0 := time.Now()
	p1 := old["node1"]
	pid := containerPID(t, p1, "axon-agent")
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 agent %d of %s: %v", pid, p1.Name, err)
	}
	if err := kube.CoreV1().Pods(lab.AxonNamespace).Delete(ctx, old["node2"].Name, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))}); err != nil {
		t.Fatal(err)
	}
	restarts := func(p corev1.Pod) int32 {
		for _, cs := range p.Status.ContainerStatuses {
			if cs.Name == "axon-agent" {
				return cs.RestartCount
			}
		}
		return -1
	}
	now, timeline := waitAgents(ctx, t, kube, 90*time.Second, "agents back Ready (node1's container restarted, node2's pod replaced)", tr.t0, func(p corev1.Pod) bool {
		if p.Spec.NodeName == "node1" {
			return p.UID == p1.UID && restarts(p) > restarts(p1)
		}
		return p.UID != old["node2"].UID
	})
	t.Logf("agent killed (node1, kill -9: restart %d) and deleted (node2, grace 0: new pod %s): both Ready after %s (%s)",
		restarts(now["node1"]), now["node2"].Name, time.Since(t0).Round(100*time.Millisecond), timeline)
	time.Sleep(time.Second)
	tr.stopAndCheck(ctx, t, "the agents' kill and delete", names)
}

// opsEnv runs the operations of TestKubeletLab: the rolling update and the agent kills under
// traffic, and the pod churn (50 pods created and deleted through kubelet across two agent
// kills). About 90 s more, and the traffic windows lost a request or two in 2 of 12 runs on a
// saturated host (docs/kubelet.md "Operating"): make test leaves them out; make
// test-kubelet-ops runs them.
const opsEnv = "AXON_LAB_KUBELET_OPS"

// nodeNetState is what a node holds for its pods, read from the kernel and the agent's disk,
// never from the agent's own registry: host-side veths, routes (every table, both families),
// IPAM allocations and endpoint records in the agent's state dir.
type nodeNetState struct {
	Veths, Routes, IPAM, Endpoints []string
}

func readNodeNetState(ctx context.Context, t *testing.T, n lab.Node) nodeNetState {
	t.Helper()
	run := func(args ...string) []string {
		out, err := exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + netnsutil.Path(n.Netns), "--"}, args...)...).Output()
		if err != nil {
			t.Fatalf("%s on %s: %v", strings.Join(args, " "), n.Name, err)
		}
		var lines []string
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if l = strings.TrimSpace(l); l != "" {
				lines = append(lines, l)
			}
		}
		return lines
	}
	var s nodeNetState
	for _, l := range run("ip", "-o", "link", "show", "type", "veth") {
		if f := strings.Fields(l); len(f) > 1 {
			s.Veths = append(s.Veths, strings.TrimSuffix(strings.Split(f[1], "@")[0], ":"))
		}
	}
	s.Routes = append(run("ip", "-o", "-4", "route", "show", "table", "all"), run("ip", "-o", "-6", "route", "show", "table", "all")...)
	files := func(dir string) []string {
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatalf("%s: %v", n.Name, err)
		}
		var names []string
		for _, e := range ents {
			if name := e.Name(); name != "lock" && !strings.HasPrefix(name, "last_reserved_ip") {
				names = append(names, name)
			}
		}
		return names
	}
	state := filepath.Join(n.KubeNodeDir, "private", "var_lib_axon") // the node's /var/lib/axon (kubenode PrivateDirs)
	s.IPAM, s.Endpoints = files(filepath.Join(state, "ipam")), files(filepath.Join(state, "endpoints"))
	for _, l := range [][]string{s.Veths, s.Routes, s.IPAM, s.Endpoints} {
		slices.Sort(l)
	}
	return s
}

// diff names what b has that a has not (+) and the reverse (-).
func (a nodeNetState) diff(b nodeNetState) []string {
	var d []string
	for _, f := range []struct {
		what string
		a, b []string
	}{{"veth", a.Veths, b.Veths}, {"route", a.Routes, b.Routes}, {"ipam", a.IPAM, b.IPAM}, {"endpoint", a.Endpoints, b.Endpoints}} {
		for _, x := range f.b {
			if !slices.Contains(f.a, x) {
				d = append(d, "+"+f.what+" "+x)
			}
		}
		for _, x := range f.a {
			if !slices.Contains(f.b, x) {
				d = append(d, "-"+f.what+" "+x)
			}
		}
	}
	return d
}

// podChurn creates and deletes 50 pods through kubelet (a Deployment of pause pods scaled 0 →
// 10 → 0, five times) while node1's agent is killed once as pods start and node2's once as they
// are deleted (CNI ADD and DEL meet a missing agent; kubelet retries them). Afterwards every
// node must hold exactly what it held before: no veth, route, IPAM allocation or endpoint
// record left, and the agents' endpoints are the pods running on their nodes.
func podChurn(ctx context.Context, t *testing.T, l *lab.Lab, kube kubernetes.Interface) {
	t.Helper()
	t0 := time.Now()
	before := map[string]nodeNetState{}
	for _, n := range l.Nodes() {
		before[n.Name] = readNodeNetState(ctx, t, n)
	}
	labels := map[string]string{"app": "churn"}
	zero := int32(0)
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "churn", Namespace: "default"},
		Spec: appsv1.DeploymentSpec{
			Replicas: &zero,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: ptr(int64(0)),
					Containers:                    []corev1.Container{{Name: "pause", Image: kubenode.DefaultPauseImage, ImagePullPolicy: corev1.PullNever}},
				},
			},
		},
	}
	if _, err := kube.AppsV1().Deployments("default").Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	scale := func(n int32) {
		t.Helper()
		p := fmt.Sprintf(`{"spec":{"replicas":%d}}`, n)
		if _, err := kube.AppsV1().Deployments("default").Patch(ctx, "churn", types.MergePatchType, []byte(p), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	kill := func(node string) {
		t.Helper()
		p := agentPods(ctx, t, kube)[node]
		pid := containerPID(t, p, "axon-agent")
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatalf("kill -9 agent %d on %s: %v", pid, node, err)
		}
	}
	const rounds, perRound = 5, 10
	seen := map[string]bool{} // pod UIDs that ran
	for round := 1; round <= rounds; round++ {
		scale(perRound)
		if round == 2 {
			kill("node1") // ADDs on node1 meet a missing agent
		}
		waitUntil(ctx, t, 90*time.Second, fmt.Sprintf("round %d: %d churn pods Running with an IP", round, perRound), func() (bool, string) {
			pl, err := kube.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=churn"})
			if err != nil {
				return false, err.Error()
			}
			ips, running := map[string]string{}, 0
			for _, p := range pl.Items {
				if p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" || p.DeletionTimestamp != nil {
					continue
				}
				if other, dup := ips[p.Status.PodIP]; dup {
					t.Fatalf("pods %s and %s both have IP %s", other, p.Name, p.Status.PodIP)
				}
				ips[p.Status.PodIP] = p.Name
				seen[string(p.UID)] = true
				running++
			}
			return running == perRound, fmt.Sprintf("%d of %d Running%s", running, len(pl.Items), podEvents(ctx, kube))
		})
		scale(0)
		if round == 4 {
			kill("node2") // DELs on node2 meet a missing agent
		}
		waitUntil(ctx, t, 90*time.Second, fmt.Sprintf("round %d: churn pods gone", round), func() (bool, string) {
			pl, err := kube.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=churn"})
			if err != nil {
				return false, err.Error()
			}
			return len(pl.Items) == 0, fmt.Sprintf("%d churn pods left", len(pl.Items))
		})
	}
	if len(seen) != rounds*perRound {
		t.Fatalf("%d distinct churn pods ran, want %d", len(seen), rounds*perRound)
	}
	waitAgents(ctx, t, kube, 60*time.Second, "both agents Ready after the churn", time.Now(), func(corev1.Pod) bool { return true })
	// A deleted pod's API object goes once kubelet's CNI DEL succeeded; what the agent still
	// holds after that is a leak. Allow its reconcile and GC a few seconds.
	for _, n := range l.Nodes() {
		var got nodeNetState
		waitUntil(ctx, t, 30*time.Second, n.Name+" holds what it held before the churn", func() (bool, string) {
			got = readNodeNetState(ctx, t, n)
			d := before[n.Name].diff(got)
			return len(d) == 0, strings.Join(d, "; ")
		})
		agentMatchesPods(ctx, t, l, kube, n)
		t.Logf("%s after the churn: %d veths, %d routes, IPAM %v, %d endpoint records: as before", n.Name, len(got.Veths), len(got.Routes), got.IPAM, len(got.Endpoints))
	}
	// What the kills met: kubelet's events for the churn pods whose sandbox setup or teardown
	// failed (the agent missing); logged, as the kill may also fall between two CNI calls.
	if evs, err := kube.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "type=Warning"}); err == nil {
		reasons := map[string]int{}
		for _, e := range evs.Items {
			if strings.HasPrefix(e.InvolvedObject.Name, "churn-") {
				reasons[e.Reason] += int(max(e.Count, 1))
			}
		}
		t.Logf("pod churn: kubelet's warnings for the churn pods: %v", reasons)
	}
	if err := kube.AppsV1().Deployments("default").Delete(ctx, "churn", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Logf("pod churn: %d pods created and deleted through kubelet across 2 agent kills in %s", len(seen), time.Since(t0).Round(100*time.Millisecond))
}

// agentMatchesPods: node n's agent lists exactly the pods the API has Running on n (not on the
// host network), with their IPs.
func agentMatchesPods(ctx context.Context, t *testing.T, l *lab.Lab, kube kubernetes.Interface, n lab.Node) {
	t.Helper()
	pl, err := kube.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + n.Name})
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, p := range pl.Items {
		if !p.Spec.HostNetwork && p.Status.Phase == corev1.PodRunning {
			want = append(want, p.Namespace+"/"+p.Name+" "+p.Status.PodIP)
		}
	}
	c, err := l.Agent(n.Name)
	if err != nil {
		t.Fatal(err)
	}
	eps, err := c.Endpoints(ctx)
	if err != nil {
		t.Fatalf("agent of %s: endpoints: %v", n.Name, err)
	}
	var got []string
	for _, ep := range eps {
		for _, ip := range ep.IPs {
			if ip.Is4() {
				got = append(got, ep.PodNamespace+"/"+ep.PodName+" "+ip.String())
			}
		}
	}
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("agent of %s lists endpoints %v, the API has pods %v running there", n.Name, got, want)
	}
}
