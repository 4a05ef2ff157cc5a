package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/vishvananda/netlink"

	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/datapath/nodeport"
	"github.com/axonhq/axon/internal/lb"
	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/testutil"
)

// Ports of this file's control plane (each test file has its own).
const (
	npTestAPIPort  = 16653
	npTestEtcdPort = 12589
)

// TestNodePortAgainstAPIServer: Services from a real kube-apiserver reach a
// real (loaded, unattached) north-south LB through the tee writer: external
// frontends only, Maglev per annotation over ETP=Local backends, the
// kube-proxy-compatible health check on healthCheckNodePort, and the API
// routes (maglev, ct, explain) read from the live maps.
func TestNodePortAgainstAPIServer(t *testing.T) {
	testutil.RequireRoot(t, "loads BPF programs and pins maps")
	pinDir := filepath.Join(datapath.BPFFSRoot, fmt.Sprintf("axt-nsctl-agent-%d", os.Getpid()))
	np, err := nodeport.Load(nodeport.Options{
		PinDir: pinDir, NodeName: "node1", NodeAddrs: []netip.Addr{netip.MustParseAddr("198.18.0.11")},
		MaglevTableSize: 1021, Logger: testLogger(t),
	})
	if err != nil {
		t.Fatalf("load nodeport LB: %v", err)
	}
	t.Cleanup(func() {
		np.Close()
		if err := nodeport.Uninstall(pinDir); err != nil {
			t.Errorf("uninstall: %v", err)
		}
		os.RemoveAll(pinDir)
	})

	cp := startControlPlaneOn(t, npTestAPIPort, npTestEtcdPort)
	cs, err := cp.Client()
	must(t, err)
	ctx := t.Context()
	createNode(t, cs, node("node1", []string{"198.18.0.11"}, "10.244.1.0/24"))
	rc := agentRESTConfig(t, cp, "node1")
	s, err := newServiceSync(rc, "node1", testLogger(t))
	must(t, err)

	cfg := Config{NodeName: "node1", NodePortLB: DefaultNodePortConfig()}
	cfg.NodePortLB.MaglevSize = 1021
	n := &nodePort{cfg: cfg, log: testLogger(t), svc: s}
	a := &Agent{cfg: cfg, log: testLogger(t), svc: s, nport: n}
	n.np, n.attached = np, "tc on test0 (not attached: maps only)"
	n.addrs = []netip.Addr{netip.MustParseAddr("127.0.0.1")} // health checks on loopback
	np.SetFrontendOptions(n.frontendOptions)
	sock := lb.NewMemWriter(0)
	s.SetWriter(newTeeWriter(sock, np))
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); s.run(runCtx) }()
	t.Cleanup(func() {
		stop()
		<-done
		n.closeHealthChecks()
	})

	const ns = "default"
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web", Annotations: map[string]string{lb.AnnotationAlgorithm: "maglev"}},
		Spec: corev1.ServiceSpec{
			Type:                     corev1.ServiceTypeLoadBalancer,
			ExternalTrafficPolicy:    corev1.ServiceExternalTrafficPolicyLocal,
			LoadBalancerSourceRanges: []string{"198.51.100.0/24"},
			Ports:                    []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(8080)}},
		},
	}
	svc, err = cs.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
	must(t, err)
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "203.0.113.10"}}
	svc, err = cs.CoreV1().Services(ns).UpdateStatus(ctx, svc, metav1.UpdateOptions{})
	must(t, err)
	nodePort, hcPort := svc.Spec.Ports[0].NodePort, svc.Spec.HealthCheckNodePort
	if hcPort == 0 {
		t.Fatal("the apiserver allocated no healthCheckNodePort")
	}
	slice := endpointSlice(ns, "web-1", "web", []discoveryv1.EndpointPort{slicePort("http", 8080, corev1.ProtocolTCP)},
		testEP{addr: "10.244.1.5", node: "node1", ready: true}, testEP{addr: "10.244.2.7", node: "node2", ready: true})
	slice, err = cs.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice, metav1.CreateOptions{})
	must(t, err)

	lbKey := lb.FrontendKey{Addr: netip.MustParseAddr("203.0.113.10"), Port: 80, Proto: lb.TCP}
	npKey := lb.FrontendKey{Addr: netip.IPv4Unspecified(), Port: uint16(nodePort), Proto: lb.TCP, Scope: lb.ScopeNodePort}
	wait := func(t *testing.T, what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				fs, _ := np.Frontends()
				t.Fatalf("timed out waiting for %s; north-south LB holds:\n%s", what, lb.Render(fs))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	wait(t, "the LoadBalancer and NodePort frontends", func() bool {
		fs, _ := np.Frontends()
		return len(fs) == 2 && fs[0].Key == npKey && fs[1].Key == lbKey && len(fs[1].Backends) == 1
	})
	fs, _ := np.Frontends()
	t.Logf("north-south LB:\n%s", lb.Render(fs))
	if got := fs[1].Backends[0].Addr.String(); got != "10.244.1.5" {
		t.Errorf("ETP=Local frontend has backend %s, want only the local 10.244.1.5", got)
	}
	if s, _ := sock.Frontends(); len(s) != 4 {
		t.Errorf("socket LB has %d frontends, want 4 (default/kubernetes; web's ClusterIP, LoadBalancer, NodePort)", len(s))
	}

	t.Run("maglev per annotation", func(t *testing.T) {
		rep, err := a.Maglev(ctx, "default/web", "", false)
		must(t, err)
		if len(rep.Tables) != 2 || rep.Tables[0].Random || len(rep.Tables[0].Backends) != 1 || rep.Tables[0].Backends[0].Slots != 1021 {
			t.Fatalf("maglev tables %+v, want 2 tables of 1021 slots on 10.244.1.5", rep)
		}
		svc.Annotations[lb.AnnotationAlgorithm] = "random"
		svc, err = cs.CoreV1().Services(ns).Update(ctx, svc, metav1.UpdateOptions{})
		must(t, err)
		wait(t, "the table to go", func() bool { tab, err := np.MaglevTable(lbKey); return err == nil && tab == nil })
	})

	t.Run("explain from the live maps", func(t *testing.T) {
		for _, tc := range []struct{ src, dst, verdict string }{
			{"198.51.100.7:40000", "203.0.113.10:80", "dnat_local"},
			{"192.0.2.7:40000", "203.0.113.10:80", "drop_src_range"},
			{"192.0.2.7:40000", fmt.Sprintf("198.18.0.11:%d", nodePort), "dnat_local"},
			{"192.0.2.7:40000", "198.18.0.11:22", "not_service"},
		} {
			rep, err := a.Explain(ctx, "tcp", tc.src, tc.dst)
			must(t, err)
			if rep.Verdict != tc.verdict {
				t.Errorf("explain %s -> %s: verdict %s, want %s (%+v)", tc.src, tc.dst, rep.Verdict, tc.verdict, rep)
			}
			if tc.verdict == "dnat_local" && (rep.Backend != "10.244.1.5:8080" || rep.Service != "default/web") {
				t.Errorf("explain %s -> %s: %+v, want backend 10.244.1.5:8080 of default/web", tc.src, tc.dst, rep)
			}
		}
	})

	t.Run("health check node port", func(t *testing.T) {
		get := func() (int, map[string]any) {
			n.syncHealthChecks()
			resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/healthz", hcPort))
			if err != nil {
				t.Fatalf("health check: %v", err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			var m map[string]any
			if err := json.Unmarshal(b, &m); err != nil {
				t.Fatalf("health check body %q: %v", b, err)
			}
			return resp.StatusCode, m
		}
		code, body := get()
		if code != 200 || body["localEndpoints"] != 1.0 || body["service"].(map[string]any)["name"] != "web" {
			t.Fatalf("health check with a local endpoint: %d %v", code, body)
		}
		slice.Endpoints[0].Conditions.Ready = ptrTo(false)
		slice, err = cs.DiscoveryV1().EndpointSlices(ns).Update(ctx, slice, metav1.UpdateOptions{})
		must(t, err)
		deadline := time.Now().Add(20 * time.Second)
		for code == 200 && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
			code, body = get()
		}
		if code != 503 || body["localEndpoints"] != 0.0 {
			t.Errorf("health check without a ready local endpoint: %d %v", code, body)
		}
		d := n.decision()
		if d.Name != DecisionNodePortLB || !strings.Contains(d.Reason, "1 health check") {
			t.Errorf("decision %+v", d)
		}
		t.Logf("status: %s = %s (%s)", d.Name, d.Value, d.Reason)
	})

	t.Run("malformed annotation is an Event", func(t *testing.T) {
		n.kube = func() *kube { return &kube{client: cs} }
		svc.Annotations[lb.AnnotationAlgorithm] = "round-robin"
		svc, err = cs.CoreV1().Services(ns).Update(ctx, svc, metav1.UpdateOptions{})
		must(t, err)
		sent := map[string]bool{}
		wait(t, "the Event", func() bool {
			n.emitAnnotationEvents(ctx, sent)
			evs, err := cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=web,reason=" + EventReasonLBAlgorithm})
			return err == nil && len(evs.Items) == 1 && strings.Contains(evs.Items[0].Message, `"round-robin" is not a load-balancing algorithm`)
		})
		n.emitAnnotationEvents(ctx, sent) // no duplicate while the problem stays
		evs, _ := cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "reason=" + EventReasonLBAlgorithm})
		if len(evs.Items) != 1 {
			t.Errorf("%d Events, want 1", len(evs.Items))
		}
		if tab, err := np.MaglevTable(lbKey); err != nil || tab != nil {
			t.Errorf("malformed annotation: the node default (random) should apply, got a table of %d (%v)", len(tab), err)
		}
	})

	t.Run("the Node reconciliation writes this node's podCIDRs", func(t *testing.T) {
		own := []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:10:244:1::/64")}
		n.setClusterPrefixes([]NodeInfo{
			{Name: "node2", PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.2.0/24")}},
			{Name: "node1", PodCIDRs: own, InternalIPs: []netip.Addr{netip.MustParseAddr("198.18.0.11")}},
		})
		if got, err := np.PodCIDRs(); err != nil || !slices.Equal(got, own) {
			t.Fatalf("LB podCIDRs %v (%v), want node1's %v", got, err, own)
		}
		n.setClusterPrefixes([]NodeInfo{{Name: "node2", PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.2.0/24")}}})
		if got, err := np.PodCIDRs(); err != nil || len(got) != 0 {
			t.Fatalf("own Node gone: LB podCIDRs %v (%v), want none", got, err)
		}
	})

	t.Run("deleted service leaves both writers", func(t *testing.T) {
		must(t, cs.CoreV1().Services(ns).Delete(ctx, "web", metav1.DeleteOptions{}))
		wait(t, "no frontends of default/web", func() bool {
			fs, _ := np.Frontends()
			s, _ := sock.Frontends()
			return len(fs) == 0 && len(s) == 1 // the apiserver's own default/kubernetes stays
		})
	})
}

// TestEnsureNodePortAttach: the agent loads the north-south LB, attaches it
// to the uplink per --lb-acceleration (native XDP works on veth), says so in
// status, and a restart with another setting switches in place;
// --nodeport=false removes it.
func TestEnsureNodePortAttach(t *testing.T) {
	testutil.RequireRoot(t, "network namespaces, BPF programs")
	n := newScratchNode(t)
	pinDir := filepath.Join(datapath.BPFFSRoot, "axt-nsctl-attach-"+testutil.RandSuffix(t))
	t.Cleanup(func() {
		_ = netnsutil.Do(n.name, func() error { return nodeport.Uninstall(pinDir) })
		os.RemoveAll(pinDir)
	})
	xdpAttached := func() bool {
		l, err := n.nl.LinkByName("eth0")
		must(t, err)
		return l.Attrs().Xdp != nil && l.Attrs().Xdp.Attached
	}
	for _, tc := range []struct {
		accel, want string
		enabled     bool
		xdp         bool
	}{
		{accel: "disabled", enabled: true, want: "tc on eth0 (tc ingress tcx, egress tcx)"},
		{accel: "native", enabled: true, want: "xdp-native on eth0", xdp: true},
		{accel: "best-effort", enabled: true, want: "xdp-native on eth0", xdp: true},
		{accel: "disabled", enabled: true, want: "tc on eth0", xdp: false}, // a restart switches XDP off in place
		{accel: "disabled", enabled: false, want: "disabled", xdp: false},
	} {
		cfg := Config{NodeName: "node1", BPFRoot: pinDir, NodePortLB: DefaultNodePortConfig()}
		cfg.NodePortLB.Acceleration, cfg.NodePortLB.Enabled = tc.accel, tc.enabled
		nport := &nodePort{cfg: cfg, log: testLogger(t), nl: n.nl}
		must(t, netnsutil.Do(n.name, func() error { nport.ensure("eth0", nil, false); return nil }))
		d := nport.decision()
		t.Logf("--lb-acceleration=%s --nodeport=%v: %s = %s (%s)", tc.accel, tc.enabled, d.Name, d.Value, d.Reason)
		if !strings.HasPrefix(d.Value, tc.want) {
			t.Errorf("--lb-acceleration=%s: decision %q, want it to start with %q", tc.accel, d.Value, tc.want)
		}
		if got := xdpAttached(); got != tc.xdp {
			t.Errorf("--lb-acceleration=%s: XDP attached = %v, want %v", tc.accel, got, tc.xdp)
		}
		if tc.enabled && nport.tee == nil {
			t.Error("no tee writer installed")
		}
		if tc.accel == "best-effort" {
			// A device without native XDP (a bridge): best-effort falls back to tc, native fails.
			must(t, n.nl.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}}))
			var how string
			var nerr error
			must(t, netnsutil.Do(n.name, func() error {
				var err error
				if how, err = attachNodePort(nport.np, "br0", "best-effort"); err != nil {
					return err
				}
				_, nerr = attachNodePort(nport.np, "br0", "native")
				return nil
			}))
			t.Logf("best-effort on a bridge: %s", how)
			if !strings.HasPrefix(how, "tc on br0") || !strings.Contains(how, "no native XDP") {
				t.Errorf("best-effort on a bridge: %q, want tc with the reason", how)
			}
			if nerr == nil || !strings.Contains(nerr.Error(), "best-effort") {
				t.Errorf("native on a bridge: %v, want an error suggesting best-effort", nerr)
			}
		}
		nport.close()
	}
	if _, err := os.Stat(filepath.Join(pinDir, nodeport.MapCT)); !os.IsNotExist(err) {
		t.Errorf("--nodeport=false left the conntrack map pinned (%v)", err)
	}
}
