package controlplane

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/axonhq/axon/internal/proc"
	"github.com/axonhq/axon/internal/testutil"
)

// labBinaries returns the cached etcd and kube-apiserver built by hack/deps.sh, or skips.
// It reads hack/versions.env rather than importing internal/lab (which imports this package).
func labBinaries(t *testing.T) (etcd, apiserver string) {
	t.Helper()
	hack := filepath.Join("..", "..", "..", "hack")
	if out, err := exec.Command(filepath.Join(hack, "deps.sh"), "--check").CombinedOutput(); err != nil {
		t.Skipf("lab binaries not built: run `make deps` (hack/deps.sh):\n%s", out)
	}
	f, err := os.Open(filepath.Join(hack, "versions.env"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	v := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, val, ok := strings.Cut(strings.TrimSpace(sc.Text()), "="); ok && !strings.HasPrefix(k, "#") {
			v[k] = val
		}
	}
	cache := os.Getenv("AXON_CACHE")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache", "axon")
	}
	return filepath.Join(cache, "etcd-"+v["ETCD_VERSION"], "etcd"),
		filepath.Join(cache, "k8s-"+v["K8S_VERSION"], "kube-apiserver")
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// TestControlPlane runs the real etcd + kube-apiserver once and checks, in order: admin access,
// agent least privilege, idempotent Start, the node-netns forwarder, Stop, and a restart that
// keeps the PKI and etcd data.
func TestControlPlane(t *testing.T) {
	testutil.RequireRoot(t, "creates network namespaces")
	etcdBin, apiBin := labBinaries(t)
	dir := t.TempDir()
	apiPort, etcdPort := freeControlPlanePorts(t)
	cfg := Config{
		Dir:             dir,
		APIPort:         apiPort,
		EtcdPort:        etcdPort,
		EtcdBinary:      etcdBin,
		APIServerBinary: apiBin,
		Logger:          testLogger(t),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	t0 := time.Now()
	cp, err := Start(ctx, cfg)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		if err := Stop(dir); err != nil {
			t.Errorf("cleanup Stop: %v", err)
		}
	})
	t.Logf("control plane ready in %v, pids %v", time.Since(t0).Round(time.Millisecond), cp.PIDs())
	pids := cp.PIDs()
	if len(pids) != 2 {
		t.Fatalf("PIDs() = %v, want etcd and kube-apiserver", pids)
	}

	admin, err := cp.Client()
	if err != nil {
		t.Fatal(err)
	}

	t.Run("admin lists namespaces", func(t *testing.T) {
		nss, err := admin.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, ns := range nss.Items {
			names = append(names, ns.Name)
		}
		for _, want := range []string{"default", "kube-system"} {
			if !slices.Contains(names, want) {
				t.Errorf("namespaces %v lack %q", names, want)
			}
		}
		// The admin kubeconfig file works too (what `axon lab kubectl` uses).
		rc, err := clientcmd.BuildConfigFromFlags("", cp.AdminKubeconfig())
		if err != nil {
			t.Fatal(err)
		}
		cs := kubernetes.NewForConfigOrDie(rc)
		if _, err := cs.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{}); err != nil {
			t.Errorf("admin kubeconfig: %v", err)
		}
		// Pods can be created without a ServiceAccount controller.
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "p1", Namespace: "default"},
			Spec:       corev1.PodSpec{NodeName: "node1", Containers: []corev1.Container{{Name: "c", Image: "none"}}},
		}
		if _, err := admin.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Errorf("create pod as admin: %v", err)
		}
	})

	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node1"}, Spec: corev1.NodeSpec{PodCIDRs: []string{"10.244.1.0/24"}}}
	if _, err := admin.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create node: %v", err)
	}

	t.Run("agent is least privilege", func(t *testing.T) {
		kc, err := cp.AgentKubeconfig("node1")
		if err != nil {
			t.Fatal(err)
		}
		rc, err := clientcmd.BuildConfigFromFlags("", kc)
		if err != nil {
			t.Fatal(err)
		}
		agent := kubernetes.NewForConfigOrDie(rc)
		lo := metav1.ListOptions{}
		allowed := []struct {
			name string
			call func() error
		}{
			{"list nodes", func() error { _, err := agent.CoreV1().Nodes().List(ctx, lo); return err }},
			{"get node", func() error { _, err := agent.CoreV1().Nodes().Get(ctx, "node1", metav1.GetOptions{}); return err }},
			{"list pods", func() error { _, err := agent.CoreV1().Pods("").List(ctx, lo); return err }},
			{"list services", func() error { _, err := agent.CoreV1().Services("").List(ctx, lo); return err }},
			{"list endpointslices", func() error { _, err := agent.DiscoveryV1().EndpointSlices("").List(ctx, lo); return err }},
			{"list namespaces", func() error { _, err := agent.CoreV1().Namespaces().List(ctx, lo); return err }},
			{"watch nodes", func() error {
				w, err := agent.CoreV1().Nodes().Watch(ctx, lo)
				if err == nil {
					w.Stop()
				}
				return err
			}},
			{"create event", func() error {
				ev := &corev1.Event{
					ObjectMeta:     metav1.ObjectMeta{GenerateName: "axon-", Namespace: "default"},
					InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: "node1"},
					Reason:         "Test", Message: "agent may report", Type: corev1.EventTypeNormal,
				}
				_, err := agent.CoreV1().Events("default").Create(ctx, ev, metav1.CreateOptions{})
				return err
			}},
		}
		for _, tc := range allowed {
			if err := tc.call(); err != nil {
				t.Errorf("agent %s: %v (want allowed)", tc.name, err)
			}
		}
		denied := []struct {
			name string
			call func() error
		}{
			{"create secret", func() error {
				_, err := agent.CoreV1().Secrets("default").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s"}}, metav1.CreateOptions{})
				return err
			}},
			{"list secrets", func() error { _, err := agent.CoreV1().Secrets("").List(ctx, lo); return err }},
			{"delete node", func() error { return agent.CoreV1().Nodes().Delete(ctx, "node1", metav1.DeleteOptions{}) }},
			{"patch node", func() error {
				_, err := agent.CoreV1().Nodes().Patch(ctx, "node1", types.MergePatchType, []byte(`{"metadata":{"labels":{"x":"y"}}}`), metav1.PatchOptions{})
				return err
			}},
			{"delete pod", func() error { return agent.CoreV1().Pods("default").Delete(ctx, "p1", metav1.DeleteOptions{}) }},
			{"create endpointslice", func() error {
				_, err := agent.DiscoveryV1().EndpointSlices("default").Create(ctx, &discoveryv1.EndpointSlice{
					ObjectMeta: metav1.ObjectMeta{Name: "e"}, AddressType: discoveryv1.AddressTypeIPv4,
				}, metav1.CreateOptions{})
				return err
			}},
			{"list clusterroles", func() error { _, err := agent.RbacV1().ClusterRoles().List(ctx, lo); return err }},
		}
		for _, tc := range denied {
			if err := tc.call(); !apierrors.IsForbidden(err) {
				t.Errorf("agent %s: err = %v, want Forbidden", tc.name, err)
			}
		}
		if _, err := admin.CoreV1().Nodes().Get(ctx, "node1", metav1.GetOptions{}); err != nil {
			t.Errorf("node1 gone after the agent's denied delete: %v", err)
		}
	})

	t.Run("start twice is idempotent", func(t *testing.T) {
		cp2, err := Start(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(cp2.PIDs(), pids) {
			t.Errorf("second Start PIDs %v, want the running %v", cp2.PIDs(), pids)
		}
	})

	t.Run("forwarder serves readyz inside a node netns", func(t *testing.T) {
		path := testNetns(t, "cp")
		fctx, fcancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			done <- ServeForwarder(fctx, []string{path}, "127.0.0.1:6443", strings.TrimPrefix(cp.Server(), "https://"), cfg.Logger)
		}()
		defer func() {
			fcancel()
			if err := <-done; err != nil {
				t.Errorf("ServeForwarder: %v", err)
			}
		}()
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(cp.CACertPEM()) {
			t.Fatal("bad CA PEM")
		}
		pair, err := tls.LoadX509KeyPair(filepath.Join(dir, "pki", adminCertFile), filepath.Join(dir, "pki", adminKeyFile))
		if err != nil {
			t.Fatal(err)
		}
		hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}},
			DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
				return dialInNetns(ctx, path, addr)
			},
		}}
		var body []byte
		deadline := time.Now().Add(10 * time.Second)
		for {
			resp, err := hc.Get("https://127.0.0.1:6443/readyz")
			if err == nil {
				body, _ = io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					break
				}
				err = &httpStatusError{resp.Status, string(body)}
			}
			if time.Now().After(deadline) {
				t.Fatalf("GET /readyz through the forwarder: %v", err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		if strings.TrimSpace(string(body)) != "ok" {
			t.Errorf("readyz body %q, want ok", body)
		}
	})

	t.Run("stop leaves no process", func(t *testing.T) {
		if err := Stop(dir); err != nil {
			t.Fatal(err)
		}
		for _, pid := range pids {
			if !proc.Exited(pid) {
				t.Errorf("pid %d still running after Stop", pid)
			}
		}
		if err := Stop(dir); err != nil {
			t.Errorf("second Stop: %v", err)
		}
		for _, f := range []string{"pki/ca.crt", "etcd-data", "logs/kube-apiserver.log", "admin.kubeconfig"} {
			if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
				t.Errorf("Stop removed %s: %v", f, err)
			}
		}
	})

	t.Run("restart keeps PKI and data", func(t *testing.T) {
		caBefore := cp.CACertPEM()
		cp3, err := Start(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if string(cp3.CACertPEM()) != string(caBefore) {
			t.Error("CA regenerated on restart")
		}
		if slices.Equal(cp3.PIDs(), pids) {
			t.Error("restart reported the stopped PIDs")
		}
		cs, err := cp3.Client()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cs.CoreV1().Nodes().Get(ctx, "node1", metav1.GetOptions{}); err != nil {
			t.Errorf("node1 lost across Stop/Start: %v", err)
		}
		if err := Stop(dir); err != nil {
			t.Fatal(err)
		}
		for _, pid := range cp3.PIDs() {
			if !proc.Exited(pid) {
				t.Errorf("pid %d still running after Stop", pid)
			}
		}
	})
}

type httpStatusError struct{ status, body string }

func (e *httpStatusError) Error() string { return e.status + ": " + e.body }
