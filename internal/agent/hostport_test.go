package agent

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/datapath/nodeport"
	"github.com/axonhq/axon/internal/datapath/socklb"
	"github.com/axonhq/axon/internal/lb"
	"github.com/axonhq/axon/internal/testutil"
)

// Ports of the HostPort test's control plane (see services_test.go).
const (
	hpTestAPIPort  = 16693
	hpTestEtcdPort = 12629
)

type hpPort struct {
	name      string
	container int32
	host      int32
	proto     corev1.Protocol
	hostIP    string
}

func hpPod(name, node string, ports ...hpPort) *corev1.Pod {
	c := corev1.Container{Name: "app", Image: "axon.dev/test:latest"}
	for _, p := range ports {
		c.Ports = append(c.Ports, corev1.ContainerPort{Name: p.name, ContainerPort: p.container, HostPort: p.host, Protocol: p.proto, HostIP: p.hostIP})
	}
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{c}}}
}

func running(ips ...string) corev1.PodStatus {
	st := corev1.PodStatus{Phase: corev1.PodRunning}
	for _, ip := range ips {
		st.PodIPs = append(st.PodIPs, corev1.PodIP{IP: ip})
	}
	if len(ips) > 0 {
		st.PodIP = ips[0]
	}
	return st
}

func TestTranslateHostPorts(t *testing.T) {
	a := netip.MustParseAddr
	be := func(ip string, port uint16) []lb.Backend {
		return []lb.Backend{{Addr: a(ip), Port: port, State: lb.Active, NodeName: "node1"}}
	}
	key := func(addr string, port uint16, proto lb.Proto, scope lb.Scope) lb.FrontendKey {
		return lb.FrontendKey{Addr: a(addr), Port: port, Proto: proto, Scope: scope}
	}
	withStatus := func(p *corev1.Pod, st corev1.PodStatus) *corev1.Pod { p.Status = st; return p }
	tests := []struct {
		name  string
		pod   *corev1.Pod
		want  []lb.FrontendKey
		bes   [][]lb.Backend
		probs int
	}{
		{name: "dual-stack wildcard TCP and UDP",
			pod: withStatus(hpPod("a", "node1", hpPort{"web", 8080, 30900, corev1.ProtocolTCP, ""}, hpPort{"webu", 8080, 30900, corev1.ProtocolUDP, ""}),
				running("10.244.1.5", "fd00:10:244:1::5")),
			want: []lb.FrontendKey{key("0.0.0.0", 30900, lb.TCP, lb.ScopeHostPort), key("0.0.0.0", 30900, lb.UDP, lb.ScopeHostPort),
				key("::", 30900, lb.TCP, lb.ScopeHostPort), key("::", 30900, lb.UDP, lb.ScopeHostPort)},
			bes: [][]lb.Backend{be("10.244.1.5", 8080), be("10.244.1.5", 8080), be("fd00:10:244:1::5", 8080), be("fd00:10:244:1::5", 8080)}},
		{name: "protocol defaults to TCP; IPv4-only pod gets IPv4 only",
			pod:  withStatus(hpPod("a", "node1", hpPort{"", 80, 8000, "", ""}), running("10.244.1.5")),
			want: []lb.FrontendKey{key("0.0.0.0", 8000, lb.TCP, lb.ScopeHostPort)}, bes: [][]lb.Backend{be("10.244.1.5", 80)}},
		{name: "hostIP of a node address: exact frontend",
			pod:  withStatus(hpPod("a", "node1", hpPort{"", 80, 8000, corev1.ProtocolTCP, "198.18.0.11"}), running("10.244.1.5", "fd00:10:244:1::5")),
			want: []lb.FrontendKey{key("198.18.0.11", 8000, lb.TCP, lb.ScopeCluster)}, bes: [][]lb.Backend{be("10.244.1.5", 80)}},
		{name: "hostIP :: is the IPv6 wildcard only",
			pod:  withStatus(hpPod("a", "node1", hpPort{"", 80, 8000, corev1.ProtocolSCTP, "::"}), running("10.244.1.5", "fd00:10:244:1::5")),
			want: []lb.FrontendKey{key("::", 8000, lb.SCTP, lb.ScopeHostPort)}, bes: [][]lb.Backend{be("fd00:10:244:1::5", 80)}},
		{name: "not Running: nothing",
			pod: withStatus(hpPod("a", "node1", hpPort{"", 80, 8000, corev1.ProtocolTCP, ""}), corev1.PodStatus{Phase: corev1.PodPending, PodIP: "10.244.1.5"})},
		{name: "Running without an IP: nothing",
			pod: withStatus(hpPod("a", "node1", hpPort{"", 80, 8000, corev1.ProtocolTCP, ""}), running())},
		{name: "hostNetwork: nothing to translate",
			pod: func() *corev1.Pod {
				p := withStatus(hpPod("a", "node1", hpPort{"", 8000, 8000, corev1.ProtocolTCP, ""}), running("198.18.0.11"))
				p.Spec.HostNetwork = true
				return p
			}()},
		{name: "bad hostIP and a hostIP without a pod IP of its family: skipped and reported, the rest programmed",
			pod: withStatus(hpPod("a", "node1", hpPort{"", 80, 8000, corev1.ProtocolTCP, "nope"}, hpPort{"", 80, 8001, corev1.ProtocolTCP, "fd00::1"},
				hpPort{"", 80, 8002, corev1.ProtocolTCP, ""}), running("10.244.1.5")),
			want: []lb.FrontendKey{key("0.0.0.0", 8002, lb.TCP, lb.ScopeHostPort)}, bes: [][]lb.Backend{be("10.244.1.5", 80)}, probs: 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fs, probs := translateHostPorts(tc.pod, "node1")
			if len(probs) != tc.probs {
				t.Errorf("problems %+v, want %d", probs, tc.probs)
			}
			if len(fs) != len(tc.want) {
				t.Fatalf("frontends:\n%s\nwant keys %v", lb.Render(fs), tc.want)
			}
			for i, f := range fs {
				if f.Key != tc.want[i] || f.Kind != lb.KindHostPort || !slicesEqualBackends(f.Backends, tc.bes[i]) {
					t.Errorf("frontend %d: %+v, want key %v backends %v", i, f, tc.want[i], tc.bes[i])
				}
			}
		})
	}
	// A pod being deleted keeps its frontend with a terminating backend.
	p := withStatus(hpPod("a", "node1", hpPort{"", 80, 8000, corev1.ProtocolTCP, ""}), running("10.244.1.5"))
	now := metav1.Now()
	p.DeletionTimestamp = &now
	if fs, _ := translateHostPorts(p, "node1"); len(fs) != 1 || fs[0].Backends[0].State != lb.Terminating {
		t.Errorf("terminating pod: %+v", fs)
	}
	// The agent's slim pod cache keeps exactly what translateHostPorts reads.
	full := withStatus(hpPod("a", "node1", hpPort{"web", 8080, 30900, corev1.ProtocolTCP, ""}, hpPort{"noport", 9090, 0, corev1.ProtocolTCP, ""}),
		running("10.244.1.5", "fd00:10:244:1::5"))
	slim, err := slimPod(full)
	must(t, err)
	a1, _ := translateHostPorts(full, "node1")
	a2, _ := translateHostPorts(slim.(*corev1.Pod), "node1")
	if lb.Render(a1) != lb.Render(a2) || len(slim.(*corev1.Pod).Spec.Containers[0].Ports) != 1 {
		t.Errorf("slim pod translates differently:\n%s\nvs\n%s", lb.Render(a1), lb.Render(a2))
	}
}

func slicesEqualBackends(a, b []lb.Backend) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestHostPortAgainstAPIServer runs the Service watch with the HostPort
// source against a real kube-apiserver (the agent's least-privilege
// kubeconfig): Pods with hostPorts on node1 → HostPort frontends in the
// golden text format, a conflicting later pod (Event, first keeps it,
// takes over when the first goes), a hostPort on a NodePort (Event), pods
// that are not Running, hostNetwork or on another node (nothing).
func TestHostPortAgainstAPIServer(t *testing.T) {
	cp := startControlPlaneOn(t, hpTestAPIPort, hpTestEtcdPort)
	cs, err := cp.Client()
	must(t, err)
	ctx := t.Context()
	createNode(t, cs, node("node1", []string{"198.18.0.11"}, "10.244.1.0/24"))
	createNode(t, cs, node("node2", []string{"198.18.0.12"}, "10.244.2.0/24"))
	const ns = "hp"
	_, err = cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	must(t, err)
	// A NodePort Service whose nodePort one pod also asks for as hostPort.
	_, err = cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "np"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, ClusterIP: "10.96.2.20",
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, NodePort: 30080, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(8080)}}}},
		metav1.CreateOptions{})
	must(t, err)

	hostNet := hpPod("hostnet", "node1", hpPort{"", 30903, 30903, corev1.ProtocolTCP, ""})
	hostNet.Spec.HostNetwork = true
	type podCase struct {
		pod    *corev1.Pod
		status corev1.PodStatus
	}
	for _, pc := range []podCase{
		{hpPod("web-0", "node1",
			hpPort{"http", 8080, 30900, corev1.ProtocolTCP, ""}, hpPort{"http-udp", 8080, 30900, corev1.ProtocolUDP, ""},
			hpPort{"admin", 9090, 30901, corev1.ProtocolTCP, "198.18.0.11"}, hpPort{"metrics", 9100, 30905, corev1.ProtocolTCP, "::"},
			hpPort{"plain", 7070, 0, corev1.ProtocolTCP, ""}),
			running("10.244.1.10", "fd00:10:244:1::10")},
		{hpPod("clash", "node1", hpPort{"web", 80, 30080, corev1.ProtocolTCP, ""}), running("10.244.1.12")},
		{hpPod("pending", "node1", hpPort{"web", 80, 30902, corev1.ProtocolTCP, ""}), corev1.PodStatus{Phase: corev1.PodPending}},
		{hostNet, running("198.18.0.11")},
		{hpPod("other", "node2", hpPort{"web", 80, 30904, corev1.ProtocolTCP, ""}), running("10.244.2.10")},
	} {
		createRunningPod(t, cs, ns, pc.pod, pc.status)
	}

	rc := agentRESTConfig(t, cp, "node1")
	s, err := newServiceSync(rc, "node1", testLogger(t))
	must(t, err)
	k, err := newKube(rc, "node1", testLogger(t), func() {})
	must(t, err)
	must(t, s.watchHostPorts(k))
	w := lb.NewMemWriter(0)
	s.SetWriter(w)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{}, 2)
	go func() { defer func() { done <- struct{}{} }(); k.run(runCtx, func() {}) }()
	go func() { defer func() { done <- struct{}{} }(); s.run(runCtx) }()
	t.Cleanup(func() { stop(); <-done; <-done })

	waitFor(t, w, 30*time.Second, "web-0's hostPorts", func() bool {
		return s.status().Synced && strings.Contains(w.Render(), "pod/hp/web-0:metrics")
	})
	// The later pod asks for web-0's 30900/TCP.
	createRunningPod(t, cs, ns, hpPod("web-1", "node1", hpPort{"http", 8081, 30900, corev1.ProtocolTCP, ""}, hpPort{"extra", 8082, 30906, corev1.ProtocolTCP, ""}),
		running("10.244.1.11"))
	waitFor(t, w, 10*time.Second, "web-1's free hostPort", func() bool { return strings.Contains(w.Render(), "pod/hp/web-1:extra") })
	goldenFile(t, "hostport-apiserver", w.Render())
	if got := s.render(); got != w.Render() {
		t.Fatalf("table and writer differ:\n%s\nvs\n%s", got, w.Render())
	}
	st := s.status()
	if len(st.Conflicts) != 1 || !strings.Contains(st.Conflicts[0], "pod/hp/web-1 is used by pod/hp/web-0") {
		t.Errorf("status conflicts %v, want web-1 losing 30900/TCP to web-0", st.Conflicts)
	}

	t.Run("events", func(t *testing.T) {
		for _, c := range []struct{ pod, reason, text string }{
			{"web-1", ReasonHostPortConflict, "already used by pod hp/web-0"},
			{"clash", ReasonHostPortShadowed, "collides with NodePort 30080/TCP of Service hp/np"},
		} {
			msg := waitEvent(t, cs, ns, "Pod", c.pod, c.reason)
			t.Logf("%s %s: %s", c.pod, c.reason, msg)
			if !strings.Contains(msg, c.text) {
				t.Errorf("%s Event on %s: %q, want it to say %q", c.reason, c.pod, msg, c.text)
			}
		}
	})

	t.Run("first pod gone: the later one takes over", func(t *testing.T) {
		must(t, cs.CoreV1().Pods(ns).Delete(ctx, "web-0", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}))
		waitFor(t, w, 10*time.Second, "web-1 on 30900/TCP", func() bool {
			r := w.Render()
			return !strings.Contains(r, "web-0") && strings.Contains(r, "0.0.0.0:30900/TCP           HostPort      pod/hp/web-1:http")
		})
		if st := s.status(); len(st.Conflicts) != 0 {
			t.Errorf("conflicts left: %v", st.Conflicts)
		}
	})

	t.Run("pod no longer Running: removed", func(t *testing.T) {
		p, err := cs.CoreV1().Pods(ns).Get(ctx, "web-1", metav1.GetOptions{})
		must(t, err)
		p.Status.Phase = corev1.PodSucceeded
		_, err = cs.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{})
		must(t, err)
		waitFor(t, w, 10*time.Second, "web-1 gone", func() bool { return !strings.Contains(w.Render(), "web-1") })
	})

	t.Run("pending pod starts running: programmed", func(t *testing.T) {
		p, err := cs.CoreV1().Pods(ns).Get(ctx, "pending", metav1.GetOptions{})
		must(t, err)
		p.Status = running("10.244.1.13")
		_, err = cs.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{})
		must(t, err)
		waitFor(t, w, 10*time.Second, "pending's hostPort", func() bool { return strings.Contains(w.Render(), "10.244.1.13:80") })
	})

	// The same table through the real writers: the socket LB's maps (what
	// `axon bpf lb list` prints) and the north-south LB's maps.
	t.Run("BPF maps", func(t *testing.T) {
		sock, np, npErr := loadHostPortWriters(t)
		var wr lb.Writer = sock
		if npErr != nil {
			t.Errorf("north-south LB did not load (checking the socket LB alone): %v", npErr)
		} else {
			wr = newTeeWriter(sock, np)
		}
		s.SetWriter(wr)
		defer s.SetWriter(w) // before the deferred unloads
		want := s.render()
		var got string
		for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			fs, err := sock.Frontends()
			must(t, err)
			if got = lb.Render(fs); got == want {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("socket LB maps never matched the table:\n--- table\n%s--- maps\n%s", want, got)
			}
		}
		t.Logf("axon bpf lb list:\n%s", got)
		if np == nil {
			return
		}
		nsf, err := np.Frontends()
		must(t, err)
		var hp []string
		for _, f := range nsf {
			if f.Kind == lb.KindHostPort {
				hp = append(hp, f.Key.String()+" -> "+f.Backends[0].Addr.String())
			}
		}
		t.Logf("north-south HostPort frontends: %v", hp)
		if len(hp) != 2 {
			t.Errorf("north-south LB HostPort frontends %v, want clash's 30080/TCP and pending's 30902/TCP", hp)
		}
	})
}

// loadHostPortWriters loads the socket LB on a private cgroup (never the
// cgroup2 root) and the north-south LB's maps in a private pin dir; np is
// nil with the error when the north-south LB does not load.
func loadHostPortWriters(t *testing.T) (*socklb.LB, *nodeport.LB, error) {
	t.Helper()
	testutil.RequireRoot(t, "loads BPF programs and pins maps")
	root := Cgroup2Mount()
	if root == "" {
		t.Skip("no cgroup2 mount")
	}
	cg := filepath.Join(root, fmt.Sprintf("axt-hp-%d", os.Getpid()))
	must(t, os.MkdirAll(cg, 0o755))
	t.Cleanup(func() { os.Remove(cg) })
	pinDir := filepath.Join(datapath.BPFFSRoot, fmt.Sprintf("axt-hp-agent-%d", os.Getpid()))
	t.Cleanup(func() { os.RemoveAll(pinDir) })
	sock, err := socklb.Load(pinDir, cg, testLogger(t))
	if err != nil {
		t.Fatalf("load socket LB: %v", err)
	}
	t.Cleanup(func() {
		sock.Close()
		if err := socklb.Uninstall(pinDir, cg); err != nil {
			t.Errorf("uninstall socket LB: %v", err)
		}
	})
	np, err := nodeport.Load(nodeport.Options{
		PinDir: pinDir, NodeName: "node1", NodeAddrs: []netip.Addr{netip.MustParseAddr("198.18.0.11")},
		MaglevTableSize: 1021, Logger: testLogger(t),
	})
	if err != nil {
		return sock, nil, err
	}
	t.Cleanup(func() {
		np.Close()
		if err := nodeport.Uninstall(pinDir); err != nil {
			t.Errorf("uninstall nodeport LB: %v", err)
		}
	})
	return sock, np, nil
}

func createRunningPod(t *testing.T, cs kubernetes.Interface, ns string, p *corev1.Pod, st corev1.PodStatus) {
	t.Helper()
	ctx := t.Context()
	created, err := cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s: %v", p.Name, err)
	}
	created.Status = st
	if _, err := cs.CoreV1().Pods(ns).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("pod %s status: %v", p.Name, err)
	}
}
