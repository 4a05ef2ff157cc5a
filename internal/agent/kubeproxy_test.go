package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/axonhq/axon/internal/healthcheck"
	"github.com/axonhq/axon/internal/lab/controlplane"
	"github.com/axonhq/axon/internal/lb"
)

// Ports of this file's control plane (each test file has its own).
const (
	kpTestAPIPort  = 16953
	kpTestEtcdPort = 12889
)

// gateWriter is an lb.MemWriter whose writes wait while its gate is
// closed: a datapath write that hangs.
type gateWriter struct {
	*lb.MemWriter
	mu   sync.Mutex
	open chan struct{} // closed = writes pass
}

func newGateWriter() *gateWriter {
	g := &gateWriter{MemWriter: lb.NewMemWriter(0), open: make(chan struct{})}
	close(g.open)
	return g
}

func (g *gateWriter) hold() {
	g.mu.Lock()
	g.open = make(chan struct{})
	g.mu.Unlock()
}

func (g *gateWriter) release() {
	g.mu.Lock()
	close(g.open)
	g.mu.Unlock()
}

func (g *gateWriter) wait() {
	g.mu.Lock()
	c := g.open
	g.mu.Unlock()
	<-c
}

func (g *gateWriter) UpsertFrontend(f lb.Frontend) error {
	g.wait()
	return g.MemWriter.UpsertFrontend(f)
}

func (g *gateWriter) DeleteFrontend(k lb.FrontendKey) error {
	g.wait()
	return g.MemWriter.DeleteFrontend(k)
}

// freeLoopbackAddr is a 127.0.0.1 port free right now.
func freeLoopbackAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	must(t, err)
	defer ln.Close()
	return ln.Addr().String()
}

type proxyReply struct {
	code int
	body string
	h    healthcheck.ProxyHealth
}

func getProxy(url string) (proxyReply, error) {
	resp, err := (&http.Client{Timeout: 2 * time.Second}).Get(url)
	if err != nil {
		return proxyReply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return proxyReply{}, err
	}
	r := proxyReply{code: resp.StatusCode, body: string(b)}
	if strings.HasSuffix(url, "/healthz") || strings.HasSuffix(url, "/livez") {
		dec := json.NewDecoder(strings.NewReader(r.body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&r.h); err != nil {
			return r, fmt.Errorf("body %q is not kube-proxy's JSON: %w", r.body, err)
		}
	}
	return r, nil
}

// TestKubeProxyPortsAgainstAPIServer serves kube-proxy's healthz and
// metrics ports from the agent's Service sync, run against a real
// kube-apiserver with the agent's own credentials, and drives every state a
// load balancer's probe must see: not synced (503), caught up (200, a
// current lastUpdated), the Node tainted for removal (503, nodeEligible
// false, /livez still 200), a datapath write that hangs and one that fails
// (503 once they last 2 × the reconcile interval, 200 again after), and a
// port held by another process (retried until free).
func TestKubeProxyPortsAgainstAPIServer(t *testing.T) {
	cp := startControlPlaneWith(t, controlplane.Config{APIPort: kpTestAPIPort, EtcdPort: kpTestEtcdPort,
		ServiceCIDR: controlplane.DefaultServiceCIDR + ",fd00:10:96::/112"}) // createServices has a dual-stack one
	cs, err := cp.Client()
	must(t, err)
	ctx := t.Context()
	createNode(t, cs, node("node1", []string{"198.18.0.11"}, "10.244.1.0/24"))
	const ns = "shop"
	createServices(ctx, t, cs, ns)

	s, err := newServiceSync(agentRESTConfig(t, cp, "node1"), "node1", testLogger(t))
	must(t, err)
	w := newGateWriter()
	s.SetWriter(w)

	// the healthz port is held by "kube-proxy" until the test frees it
	healthz := freeLoopbackAddr(t)
	squatter, err := net.Listen("tcp4", healthz)
	must(t, err)
	metrics := freeLoopbackAddr(t)
	a := &Agent{cfg: Config{NodeName: "node1", ReconcileInterval: time.Second, SocketLB: true, KubeProxyHealthzAddr: healthz, KubeProxyMetricsAddr: metrics},
		log: testLogger(t), svc: s, kp: kubeProxyPorts{retry: 200 * time.Millisecond}}
	timeout := a.proxyHealthTimeout()
	reg := prometheus.NewRegistry()
	reg.MustRegister(servicesCollector{a: a})
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	t.Cleanup(func() { stop(); wg.Wait() })
	a.serveKubeProxyPorts(runCtx, &wg, reg)

	decision := a.kubeProxyDecision
	until := func(t *testing.T, what string, limit time.Duration, cond func() (bool, string)) {
		t.Helper()
		deadline := time.Now().Add(limit)
		for {
			ok, last := cond()
			if ok {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("after %s, still not %s: %s", limit, what, last)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	probe := func(path string, code int, check func(proxyReply) bool) func() (bool, string) {
		return func() (bool, string) {
			r, err := getProxy("http://" + healthz + path)
			if err != nil {
				return false, err.Error()
			}
			return r.code == code && (check == nil || check(r)), fmt.Sprintf("%d %s", r.code, r.body)
		}
	}
	eligible := func(want bool) func(proxyReply) bool {
		return func(r proxyReply) bool { return r.h.NodeEligible != nil && *r.h.NodeEligible == want }
	}

	t.Run("a port in use is retried until free", func(t *testing.T) {
		until(t, "reported", 5*time.Second, func() (bool, string) {
			d := decision()
			return d.Value == "partly serving" && strings.Contains(d.Reason, "healthz "+healthz+": listen:") &&
				strings.Contains(d.Reason, "kube-proxy still running on this node?") && strings.Contains(d.Reason, "metrics "+metrics), d.Reason
		})
		if _, err := getProxy("http://" + healthz + "/healthz"); err == nil {
			t.Fatal("the squatter's port answered HTTP")
		}
		squatter.Close()
		until(t, "serving", 10*time.Second, func() (bool, string) {
			_, err := getProxy("http://" + healthz + "/livez")
			return err == nil, fmt.Sprint(err)
		})
	})

	t.Run("503 until the Service sync has written the table", func(t *testing.T) {
		r, err := getProxy("http://" + healthz + "/healthz")
		must(t, err)
		if r.code != 503 || r.h.Healthy || !r.h.LastUpdated.IsZero() {
			t.Fatalf("before the sync: %d %s", r.code, r.body)
		}
		if d := decision(); d.Value != "serving" || !strings.Contains(d.Reason, "(503: not serving Services yet") {
			t.Errorf("status before the sync: %+v", d)
		}
	})

	done := make(chan struct{})
	go func() { defer close(done); s.run(runCtx) }()
	t.Cleanup(func() { stop(); <-done })

	t.Run("200 with a current lastUpdated once caught up", func(t *testing.T) {
		until(t, "healthy", 30*time.Second, probe("/healthz", 200, eligible(true)))
		r, err := getProxy("http://" + healthz + "/healthz")
		must(t, err)
		if !r.h.Healthy || r.h.LastUpdated != r.h.CurrentTime || time.Since(r.h.CurrentTime) > 5*time.Second {
			t.Errorf("healthy reply %s: lastUpdated must be the current time", r.body)
		}
		if !strings.Contains(w.Render(), "10.96.1.10:80") {
			t.Errorf("healthy before the table was written:\n%s", w.Render())
		}
		if d := decision(); d.Value != "serving" || d.Reason != "healthz "+healthz+" (200), metrics "+metrics {
			t.Errorf("status: %+v", d)
		}
	})

	t.Run("proxyMode and metrics", func(t *testing.T) {
		r, err := getProxy("http://" + metrics + "/proxyMode")
		must(t, err)
		if r.code != 200 || r.body != ProxyMode {
			t.Errorf("/proxyMode: %d %q, want 200 %q", r.code, r.body, ProxyMode)
		}
		r, err = getProxy("http://" + metrics + "/metrics")
		must(t, err)
		if r.code != 200 || !strings.Contains(r.body, "axon_services_frontends ") {
			t.Errorf("/metrics: %d %.300s", r.code, r.body)
		}
	})

	taint := func(t *testing.T, on bool) {
		t.Helper()
		n, err := cs.CoreV1().Nodes().Get(ctx, "node1", metav1.GetOptions{})
		must(t, err)
		n.Spec.Taints = nil
		if on {
			n.Spec.Taints = []corev1.Taint{{Key: healthcheck.ToBeDeletedTaint, Value: "1764417600", Effect: corev1.TaintEffectNoSchedule}}
		}
		_, err = cs.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		must(t, err)
	}
	t.Run("a Node the autoscaler removes is drained", func(t *testing.T) {
		taint(t, true)
		until(t, "drained", 10*time.Second, probe("/healthz", 503, eligible(false)))
		until(t, "live", time.Second, probe("/livez", 200, func(r proxyReply) bool { return r.h.NodeEligible == nil && r.h.Healthy }))
		if d := decision(); !strings.Contains(d.Reason, "(503: the Node is tainted ToBeDeletedByClusterAutoscaler)") {
			t.Errorf("status: %+v", d)
		}
		taint(t, false)
		until(t, "eligible again", 10*time.Second, probe("/healthz", 200, eligible(true)))
	})

	slicesAPI := cs.DiscoveryV1().EndpointSlices(ns)
	moveWeb := func(t *testing.T, addr string) {
		t.Helper()
		web, err := slicesAPI.Get(ctx, "web-1", metav1.GetOptions{})
		must(t, err)
		web.Endpoints[0] = discoveryv1.Endpoint{Addresses: []string{addr}, Conditions: discoveryv1.EndpointConditions{Ready: ptrTo(true)}, NodeName: ptrTo("node3")}
		_, err = slicesAPI.Update(ctx, web, metav1.UpdateOptions{})
		must(t, err)
	}

	t.Run("a write that hangs: 503 after the timeout, 200 after it returns", func(t *testing.T) {
		w.hold()
		start := time.Now()
		moveWeb(t, "10.244.3.41")
		until(t, "behind", 3*timeout, probe("/healthz", 503, func(r proxyReply) bool { return !r.h.Healthy }))
		if waited := time.Since(start); waited < timeout {
			t.Errorf("503 after %s, before the timeout %s", waited, timeout)
		}
		if d := decision(); !strings.Contains(d.Reason, "(503: a Service change has waited") {
			t.Errorf("status: %+v", d)
		}
		w.release()
		until(t, "caught up", 10*time.Second, probe("/healthz", 200, nil))
		if !strings.Contains(w.Render(), "10.244.3.41:8080") {
			t.Errorf("the held change is not in the writer:\n%s", w.Render())
		}
	})

	t.Run("a write that fails: 503 after the timeout, 200 after it succeeds", func(t *testing.T) {
		w.FailNext(1 << 20)
		start := time.Now()
		moveWeb(t, "10.244.3.42")
		until(t, "failing", 3*timeout, probe("/healthz", 503, nil))
		if waited := time.Since(start); waited < timeout {
			t.Errorf("503 after %s, before the timeout %s", waited, timeout)
		}
		if d := decision(); !strings.Contains(d.Reason, "(503: a Service datapath write has failed for") {
			t.Errorf("status: %+v", d)
		}
		w.FailNext(0)
		// the retry backs off (100 ms doubling, at most 30 s)
		until(t, "written", 40*time.Second, probe("/healthz", 200, nil))
		if !strings.Contains(w.Render(), "10.244.3.42:8080") {
			t.Errorf("the failed change is not in the writer:\n%s", w.Render())
		}
	})
}

// TestKubeProxyPortsOff: a node where axon serves no Services does not
// answer for the node's Service proxy, whatever the chart set, and says why.
func TestKubeProxyPortsOff(t *testing.T) {
	on := Config{SocketLB: true, NodePortLB: NodePortConfig{Enabled: true}, Mode: ModeFull,
		KubeProxyHealthzAddr: "0.0.0.0:10256", KubeProxyMetricsAddr: "127.0.0.1:10249"}
	tests := []struct {
		name  string
		mod   func(*Config)
		off   string // "" = served
		value string // the status line's value before any listener started
	}{
		{"full mode", func(*Config) {}, "", "not serving"},
		{"socket LB only", func(c *Config) { c.NodePortLB.Enabled = false }, "", "not serving"},
		{"north-south LB only", func(c *Config) { c.SocketLB = false }, "", "not serving"},
		{"unset", func(c *Config) { c.KubeProxyHealthzAddr, c.KubeProxyMetricsAddr = "", "" }, "", "disabled"},
		{"bypass-only", func(c *Config) { c.Mode = ModeBypassOnly }, "--mode=bypass-only serves no Services", "disabled"},
		{"no Service datapath", func(c *Config) { c.SocketLB, c.NodePortLB.Enabled = false, false }, "--socket-lb=false and --nodeport=false: axon serves no Services here", "disabled"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := on
			tt.mod(&c)
			off := c.kubeProxyPortsOff()
			if (tt.off == "") != (off == "") || !strings.HasPrefix(off, tt.off) {
				t.Errorf("kubeProxyPortsOff() = %q, want prefix %q", off, tt.off)
			}
			a := &Agent{cfg: c}
			d := a.kubeProxyDecision()
			if d.Value != tt.value || (off != "" && d.Reason != off) {
				t.Errorf("decision %+v, want value %q (reason %q)", d, tt.value, off)
			}
		})
	}
}
