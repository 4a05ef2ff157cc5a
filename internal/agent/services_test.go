package agent

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/lab/controlplane"
	"github.com/axonhq/axon/internal/lb"
)

var updateGolden = flag.Bool("update", false, "rewrite testdata/*.golden from the current output")

func goldenFile(t *testing.T, name string, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *updateGolden {
		must(t, os.MkdirAll(filepath.Dir(path), 0o755))
		must(t, os.WriteFile(path, []byte(got), 0o644))
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read golden file (run go test -run %s -update to create it): %v", t.Name(), err)
	}
	if string(want) != got {
		t.Fatalf("%s differs (run with -update to accept):\n--- want\n%s--- got\n%s", path, want, got)
	}
}

func ptrTo[T any](v T) *T { return &v }

// Ports of the Service tests' control plane: apart from kube_test.go's, so
// both can run at the same time on a shared machine.
const (
	svcTestAPIPort  = 16573
	svcTestEtcdPort = 12509
)

// startServiceControlPlane is startControlPlane on the Service tests'
// ports, with a dual-stack service CIDR.
func startServiceControlPlane(t *testing.T) *controlplane.ControlPlane {
	t.Helper()
	return startControlPlaneWith(t, controlplane.Config{APIPort: svcTestAPIPort, EtcdPort: svcTestEtcdPort,
		ServiceCIDR: controlplane.DefaultServiceCIDR + ",fd00:10:96::/112"})
}

type testEP struct {
	addr, node  string
	ready       bool
	terminating bool
	zone        string
}

func endpointSlice(ns, name, svc string, ports []discoveryv1.EndpointPort, eps ...testEP) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{lb.ServiceNameLabel: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       ports,
	}
	for _, e := range eps {
		x := discoveryv1.Endpoint{
			Addresses: []string{e.addr}, NodeName: ptrTo(e.node),
			Conditions: discoveryv1.EndpointConditions{Ready: ptrTo(e.ready), Serving: ptrTo(e.ready || e.terminating), Terminating: ptrTo(e.terminating)},
		}
		if e.zone != "" {
			x.Zone = ptrTo(e.zone)
			x.Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: e.zone}}}
		}
		es.Endpoints = append(es.Endpoints, x)
	}
	return es
}

// v6slice makes es an IPv6 slice.
func v6slice(es *discoveryv1.EndpointSlice) *discoveryv1.EndpointSlice {
	es.AddressType = discoveryv1.AddressTypeIPv6
	return es
}

// nodeHints gives every endpoint a forNodes hint for its own node.
func nodeHints(es *discoveryv1.EndpointSlice) *discoveryv1.EndpointSlice {
	for i := range es.Endpoints {
		es.Endpoints[i].Hints = &discoveryv1.EndpointHints{ForNodes: []discoveryv1.ForNode{{Name: *es.Endpoints[i].NodeName}}}
	}
	return es
}

func slicePort(name string, port int32, proto corev1.Protocol) discoveryv1.EndpointPort {
	return discoveryv1.EndpointPort{Name: ptrTo(name), Port: ptrTo(port), Protocol: ptrTo(proto)}
}

// createServices creates the fixture: one Service of every type and policy,
// with hand-written EndpointSlices (no controller runs in the test cluster).
func createServices(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns string) {
	t.Helper()
	_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	must(t, err)
	port := func(name string, p, np int32, proto corev1.Protocol, target intstr.IntOrString) corev1.ServicePort {
		return corev1.ServicePort{Name: name, Port: p, NodePort: np, Protocol: proto, TargetPort: target}
	}
	svcs := []*corev1.Service{
		{ObjectMeta: metav1.ObjectMeta{Name: "web"}, Spec: corev1.ServiceSpec{ClusterIP: "10.96.1.10",
			Ports: []corev1.ServicePort{port("http", 80, 0, corev1.ProtocolTCP, intstr.FromString("http"))}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "dns"}, Spec: corev1.ServiceSpec{ClusterIP: "10.96.1.53",
			SessionAffinity: corev1.ServiceAffinityClientIP, SessionAffinityConfig: &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptrTo(int32(600))}},
			Ports: []corev1.ServicePort{port("dns", 53, 0, corev1.ProtocolUDP, intstr.FromString("dns")), port("dns-tcp", 53, 0, corev1.ProtocolTCP, intstr.FromString("dns-tcp"))}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "np"}, Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, ClusterIP: "10.96.1.20",
			ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
			Ports:                 []corev1.ServicePort{port("http", 80, 30080, corev1.ProtocolTCP, intstr.FromInt32(8080))}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "lbsvc"}, Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, ClusterIP: "10.96.1.21",
			Ports: []corev1.ServicePort{port("https", 443, 30443, corev1.ProtocolTCP, intstr.FromInt32(8443))}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "ext"}, Spec: corev1.ServiceSpec{ClusterIP: "10.96.1.22", ExternalIPs: []string{"198.51.100.7"},
			InternalTrafficPolicy: ptrTo(corev1.ServiceInternalTrafficPolicyLocal),
			Ports:                 []corev1.ServicePort{port("", 5000, 0, corev1.ProtocolTCP, intstr.FromInt32(5000))}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "zonal"}, Spec: corev1.ServiceSpec{ClusterIP: "10.96.1.30",
			Ports: []corev1.ServicePort{port("http", 80, 0, corev1.ProtocolTCP, intstr.FromInt32(8080))}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "empty"}, Spec: corev1.ServiceSpec{ClusterIP: "10.96.1.40",
			Ports: []corev1.ServicePort{port("sctp", 3868, 0, corev1.ProtocolSCTP, intstr.FromInt32(3868))}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "headless"}, Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone,
			Ports: []corev1.ServicePort{port("http", 80, 0, corev1.ProtocolTCP, intstr.FromInt32(8080))}}},
		// dual-stack: one frontend per family, each with its family's slice
		{ObjectMeta: metav1.ObjectMeta{Name: "ds"}, Spec: corev1.ServiceSpec{ClusterIP: "10.96.1.60", ClusterIPs: []string{"10.96.1.60", "fd00:10:96::60"},
			IPFamilyPolicy: ptrTo(corev1.IPFamilyPolicyRequireDualStack), IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol},
			Ports: []corev1.ServicePort{port("http", 80, 0, corev1.ProtocolTCP, intstr.FromString("http"))}}},
		// sessionAffinity ClientIP without a config: the default 10800 s
		{ObjectMeta: metav1.ObjectMeta{Name: "affdefault"}, Spec: corev1.ServiceSpec{ClusterIP: "10.96.1.61", SessionAffinity: corev1.ServiceAffinityClientIP,
			Ports: []corev1.ServicePort{port("http", 80, 0, corev1.ProtocolTCP, intstr.FromInt32(8080))}}},
		// trafficDistribution PreferClose with node hints: node1 keeps its own endpoint
		{ObjectMeta: metav1.ObjectMeta{Name: "hinted"}, Spec: corev1.ServiceSpec{ClusterIP: "10.96.1.62", TrafficDistribution: ptrTo(corev1.ServiceTrafficDistributionPreferClose),
			Ports: []corev1.ServicePort{port("http", 80, 0, corev1.ProtocolTCP, intstr.FromInt32(8080))}}},
		// NodePort over UDP with a numeric targetPort
		{ObjectMeta: metav1.ObjectMeta{Name: "udpnp"}, Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, ClusterIP: "10.96.1.63",
			Ports: []corev1.ServicePort{port("syslog", 514, 30514, corev1.ProtocolUDP, intstr.FromInt32(5514))}}},
		// only not-ready endpoints: all quarantined, connections refused
		{ObjectMeta: metav1.ObjectMeta{Name: "notready"}, Spec: corev1.ServiceSpec{ClusterIP: "10.96.1.64",
			Ports: []corev1.ServicePort{port("http", 80, 0, corev1.ProtocolTCP, intstr.FromInt32(8080))}}},
		// only terminating (still serving) endpoints: used, as nothing else serves
		{ObjectMeta: metav1.ObjectMeta{Name: "termonly"}, Spec: corev1.ServiceSpec{ClusterIP: "10.96.1.65",
			Ports: []corev1.ServicePort{port("http", 80, 0, corev1.ProtocolTCP, intstr.FromInt32(8080))}}},
	}
	for _, s := range svcs {
		created, err := cs.CoreV1().Services(ns).Create(ctx, s, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create service %s: %v", s.Name, err)
		}
		if s.Name == "lbsvc" {
			created.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "203.0.113.10"}}
			if _, err := cs.CoreV1().Services(ns).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
				t.Fatalf("service lbsvc status: %v", err)
			}
		}
	}
	http := []discoveryv1.EndpointPort{slicePort("http", 8080, corev1.ProtocolTCP)}
	esl := []*discoveryv1.EndpointSlice{
		endpointSlice(ns, "web-1", "web", http,
			testEP{addr: "10.244.1.5", node: "node1", ready: true},
			testEP{addr: "10.244.2.7", node: "node2", ready: true},
			testEP{addr: "10.244.2.8", node: "node2", terminating: true},
			testEP{addr: "10.244.1.9", node: "node1"}),
		endpointSlice(ns, "dns-a", "dns", []discoveryv1.EndpointPort{slicePort("dns", 53, corev1.ProtocolUDP), slicePort("dns-tcp", 53, corev1.ProtocolTCP)},
			testEP{addr: "10.244.1.53", node: "node1", ready: true}),
		endpointSlice(ns, "dns-b", "dns", []discoveryv1.EndpointPort{slicePort("dns", 5353, corev1.ProtocolUDP), slicePort("dns-tcp", 5353, corev1.ProtocolTCP)},
			testEP{addr: "10.244.2.53", node: "node2", ready: true}),
		endpointSlice(ns, "np-1", "np", http,
			testEP{addr: "10.244.1.20", node: "node1", ready: true},
			testEP{addr: "10.244.2.20", node: "node2", ready: true}),
		endpointSlice(ns, "lbsvc-1", "lbsvc", []discoveryv1.EndpointPort{slicePort("https", 8443, corev1.ProtocolTCP)},
			testEP{addr: "10.244.2.21", node: "node2", ready: true}),
		endpointSlice(ns, "ext-1", "ext", []discoveryv1.EndpointPort{slicePort("", 5000, corev1.ProtocolTCP)},
			testEP{addr: "10.244.1.22", node: "node1", ready: true},
			testEP{addr: "10.244.2.22", node: "node2", ready: true}),
		endpointSlice(ns, "zonal-1", "zonal", http,
			testEP{addr: "10.244.1.30", node: "node1", ready: true, zone: "zone-a"},
			testEP{addr: "10.244.3.30", node: "node3", ready: true, zone: "zone-b"}),
		endpointSlice(ns, "headless-1", "headless", http, testEP{addr: "10.244.1.31", node: "node1", ready: true}),
		endpointSlice(ns, "ds-v4", "ds", http, testEP{addr: "10.244.1.60", node: "node1", ready: true}),
		v6slice(endpointSlice(ns, "ds-v6", "ds", http,
			testEP{addr: "fd00:10:244:1::60", node: "node1", ready: true},
			testEP{addr: "fd00:10:244:2::60", node: "node2", terminating: true})),
		endpointSlice(ns, "affdefault-1", "affdefault", http, testEP{addr: "10.244.1.61", node: "node1", ready: true}),
		nodeHints(endpointSlice(ns, "hinted-1", "hinted", http,
			testEP{addr: "10.244.1.62", node: "node1", ready: true},
			testEP{addr: "10.244.2.62", node: "node2", ready: true})),
		endpointSlice(ns, "udpnp-1", "udpnp", []discoveryv1.EndpointPort{slicePort("syslog", 5514, corev1.ProtocolUDP)},
			testEP{addr: "10.244.2.63", node: "node2", ready: true}),
		endpointSlice(ns, "notready-1", "notready", http, testEP{addr: "10.244.1.64", node: "node1"}, testEP{addr: "10.244.2.64", node: "node2"}),
		endpointSlice(ns, "termonly-1", "termonly", http, testEP{addr: "10.244.2.65", node: "node2", terminating: true}),
	}
	for _, es := range esl {
		if _, err := cs.DiscoveryV1().EndpointSlices(ns).Create(ctx, es, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create endpointslice %s: %v", es.Name, err)
		}
	}
}

// waitFor polls cond until it holds, waking up on every write of w.
func waitFor(t *testing.T, w *lb.MemWriter, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(timeout)
	for {
		ch := w.Changed()
		if cond() {
			return
		}
		select {
		case <-ch:
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			t.Fatalf("timed out after %s waiting for %s; writer has:\n%s", timeout, what, w.Render())
		}
	}
}

// TestServicesAgainstAPIServer runs the Service watch with the agent's
// least-privilege kubeconfig against a real kube-apiserver and checks what an
// in-memory lb.Writer receives.
func TestServicesAgainstAPIServer(t *testing.T) {
	cp := startServiceControlPlane(t)
	cs, err := cp.Client()
	must(t, err)
	ctx := t.Context()
	n := node("node1", []string{"198.18.0.11"}, "10.244.1.0/24")
	n.Labels = map[string]string{lb.ZoneLabel: "zone-a"}
	createNode(t, cs, n)
	const ns = "shop"
	createServices(ctx, t, cs, ns)

	rc := agentRESTConfig(t, cp, "node1")
	s, err := newServiceSync(rc, "node1", testLogger(t))
	must(t, err)
	w := lb.NewMemWriter(0)
	s.SetWriter(w)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); s.run(runCtx) }()
	t.Cleanup(func() { stop(); <-done })

	golden, err := os.ReadFile(filepath.Join("testdata", "services-apiserver.golden"))
	if err != nil && !*updateGolden {
		t.Fatalf("read golden file: %v (run with -update to create it)", err)
	}
	waitFor(t, w, 30*time.Second, "the initial sync", func() bool {
		return s.status().Synced && (*updateGolden && strings.Contains(w.Render(), "10.96.1.53") || w.Render() == string(golden))
	})
	goldenFile(t, "services-apiserver", w.Render())
	if got := s.render(); got != w.Render() {
		t.Fatalf("table and writer differ:\n%s\nvs\n%s", got, w.Render())
	}
	st := s.status()
	t.Logf("initial sync: %+v", st)
	if !st.Writer || st.Services != 14 || len(st.Problems)+len(st.WriteErrors)+len(st.Conflicts) != 0 {
		t.Errorf("status %+v", st)
	}

	slicesAPI := cs.DiscoveryV1().EndpointSlices(ns)
	web, err := slicesAPI.Get(ctx, "web-1", metav1.GetOptions{})
	must(t, err)

	t.Run("one slice change writes only its frontend", func(t *testing.T) {
		_, from := w.Ops(0)
		web.Endpoints[2] = endpointSlice(ns, "", "", nil, testEP{addr: "10.244.3.3", node: "node3", ready: true}).Endpoints[0]
		web, err = slicesAPI.Update(ctx, web, metav1.UpdateOptions{})
		must(t, err)
		waitFor(t, w, 10*time.Second, "10.244.3.3 in the writer", func() bool { return strings.Contains(w.Render(), "10.244.3.3:8080") })
		time.Sleep(300 * time.Millisecond) // anything else would have been written by now
		ops, _ := w.Ops(from)
		if len(ops) != 1 || ops[0].Delete || ops[0].Frontend.Service != ns+"/web" || ops[0].Key.String() != "10.96.1.10:80/TCP" {
			t.Fatalf("want one upsert of shop/web 10.96.1.10:80/TCP, got %+v", ops)
		}
		if strings.Contains(w.Render(), "10.244.2.8") {
			t.Errorf("removed endpoint still in the writer:\n%s", w.Render())
		}
	})

	t.Run("latency from update call to writer", func(t *testing.T) {
		const changes = 50
		var lat []time.Duration
		for i := range changes {
			ready := i%2 == 1 // flip 10.244.1.5 between quarantined and active
			want := "10.244.1.5:8080          quarantined"
			if ready {
				want = "10.244.1.5:8080          active"
			}
			web.Endpoints[0].Conditions.Ready = ptrTo(ready)
			web.Endpoints[0].Conditions.Serving = ptrTo(ready)
			start := time.Now()
			web, err = slicesAPI.Update(ctx, web, metav1.UpdateOptions{})
			must(t, err)
			waitFor(t, w, 10*time.Second, want, func() bool { return strings.Contains(w.Render(), want) })
			lat = append(lat, time.Since(start))
		}
		slices.Sort(lat)
		p50, p99 := lat[len(lat)/2], lat[(len(lat)*99+99)/100-1]
		t.Logf("EndpointSlice update → writer: p50 %s p99 %s max %s over %d changes", p50, p99, lat[len(lat)-1], changes)
		if p99 > time.Second {
			t.Errorf("p99 %s: an EndpointSlice change must reach the maps well within a second (target 50 ms)", p99)
		}
	})

	t.Run("failed writes are retried and reported", func(t *testing.T) {
		w.FailNext(1 << 30)
		web.Endpoints[1].Conditions.Ready = ptrTo(false)
		web, err = slicesAPI.Update(ctx, web, metav1.UpdateOptions{})
		must(t, err)
		deadline := time.Now().Add(10 * time.Second)
		for len(s.status().WriteErrors) == 0 {
			if time.Now().After(deadline) {
				t.Fatal("no write error reported")
			}
			time.Sleep(20 * time.Millisecond)
		}
		if st := s.status(); !strings.Contains(st.WriteErrors[0], "10.96.1.10:80/TCP") {
			t.Errorf("write errors %v", st.WriteErrors)
		}
		w.FailNext(0)
		waitFor(t, w, 40*time.Second, "the retry", func() bool {
			return strings.Contains(w.Render(), "10.244.2.7:8080          quarantined") && len(s.status().WriteErrors) == 0
		})
	})

	t.Run("write acknowledgement: the versions written, none while a write fails", func(t *testing.T) {
		svc, err := cs.CoreV1().Services(ns).Get(ctx, "web", metav1.GetOptions{})
		must(t, err)
		acked := func() (api.ServiceVersions, bool) {
			v, ok := s.programmed()[ns+"/web"]
			return v, ok
		}
		w.FailNext(1 << 30)
		web.Endpoints[1].Conditions.Ready = ptrTo(true)
		web, err = slicesAPI.Update(ctx, web, metav1.UpdateOptions{})
		must(t, err)
		waitFor(t, w, 10*time.Second, "a write error", func() bool { return len(s.status().WriteErrors) > 0 })
		if v, ok := acked(); ok {
			t.Errorf("shop/web acknowledged as programmed (%+v) while its write fails: %v", v, s.status().WriteErrors)
		}
		if _, ok := s.programmed()[ns+"/np"]; !ok {
			t.Errorf("shop/np, untouched and written, lost its acknowledgement: %v", s.programmed())
		}
		w.FailNext(0)
		want := api.ServiceVersions{Service: svc.ResourceVersion, Slices: map[string]string{"web-1": web.ResourceVersion}}
		waitFor(t, w, 40*time.Second, "the acknowledgement of the retried write", func() bool {
			v, ok := acked()
			return ok && reflect.DeepEqual(v, want)
		})
		if !strings.Contains(w.Render(), "10.244.2.7:8080          active") {
			t.Errorf("acknowledged %+v, but the writer lacks the change:\n%s", want, w.Render())
		}
	})

	t.Run("a Service labelled for another proxy, or headless, is not served", func(t *testing.T) {
		for _, label := range []string{LabelServiceProxyName, LabelHeadless} {
			svc, err := cs.CoreV1().Services(ns).Get(ctx, "web", metav1.GetOptions{})
			must(t, err)
			if !strings.Contains(w.Render(), "10.96.1.10") {
				t.Fatalf("shop/web is not in the writer before %s is set: the check below would prove nothing", label)
			}
			svc.Labels = map[string]string{label: "other-proxy"}
			svc, err = cs.CoreV1().Services(ns).Update(ctx, svc, metav1.UpdateOptions{})
			must(t, err)
			waitFor(t, w, 10*time.Second, "shop/web gone with "+label, func() bool { return !strings.Contains(w.Render(), "10.96.1.10") })
			delete(svc.Labels, label)
			_, err = cs.CoreV1().Services(ns).Update(ctx, svc, metav1.UpdateOptions{})
			must(t, err)
			waitFor(t, w, 10*time.Second, "shop/web back without "+label, func() bool { return strings.Contains(w.Render(), "10.96.1.10:80") })
		}
	})

	t.Run("service deleted", func(t *testing.T) {
		must(t, cs.CoreV1().Services(ns).Delete(ctx, "empty", metav1.DeleteOptions{}))
		waitFor(t, w, 10*time.Second, "10.96.1.40 gone", func() bool { return !strings.Contains(w.Render(), "10.96.1.40") })
	})

	t.Run("new writer converges with stale content", func(t *testing.T) {
		w2 := lb.NewMemWriter(0)
		stale := lb.Frontend{Key: lb.FrontendKey{Addr: netip.MustParseAddr("10.96.9.9"), Port: 80, Proto: lb.TCP}, Kind: lb.KindClusterIP, Service: "gone/svc"}
		must(t, w2.UpsertFrontend(stale))
		fs, _ := w.Frontends()
		wrong := fs[0]
		wrong.Backends = nil
		must(t, w2.UpsertFrontend(wrong))
		_, from := w2.Ops(0)
		s.SetWriter(w2)
		waitFor(t, w2, 10*time.Second, "the resync", func() bool { return w2.Render() == s.render() })
		ops, _ := w2.Ops(from)
		if len(ops) != len(fs)+1 { // every frontend but the 'wrong' one was missing, plus one delete
			t.Errorf("resync wrote %d ops, want %d", len(ops), len(fs)+1)
		}
	})

	t.Run("north-south LB attached: the in-line socket LB is not read back", func(t *testing.T) {
		cw := &readCountingWriter{MemWriter: lb.NewMemWriter(0)}
		s.SetWriter(cw)
		waitFor(t, cw.MemWriter, 10*time.Second, "the resync", func() bool { return cw.Render() == s.render() })
		before := cw.reads.Load()
		if before != 1 {
			t.Errorf("a new writer was read back %d times, want once", before)
		}
		s.mu.Lock()
		var wantNS int
		for _, f := range s.table.Frontends() {
			if northSouth(f) {
				wantNS++
			}
		}
		s.mu.Unlock()
		if wantNS == 0 {
			t.Fatal("the test Services have no NodePort/LoadBalancer/externalIP frontend")
		}
		nsw := lb.NewMemWriter(0)
		s.SetWriter(newTeeWriter(cw, nsw))
		waitFor(t, nsw, 10*time.Second, "the north-south frontends", func() bool {
			fs, _ := nsw.Frontends()
			return len(fs) == wantNS
		})
		if n := cw.reads.Load(); n != before {
			t.Errorf("the socket LB, in line with the table, was read back again (%d reads)", n-before)
		}
		if cw.Render() != s.render() {
			t.Errorf("socket LB and table differ after the tee's resync:\n%s\nvs\n%s", cw.Render(), s.render())
		}
	})
}

// readCountingWriter counts read-backs of a MemWriter.
type readCountingWriter struct {
	*lb.MemWriter
	reads atomic.Int64
}

func (w *readCountingWriter) Frontends() ([]lb.Frontend, error) {
	w.reads.Add(1)
	return w.MemWriter.Frontends()
}

// TestInLine: the resync trusts a writer's content instead of reading it
// back only when nothing could have left it behind the table.
func TestInLine(t *testing.T) {
	w, other := lb.NewMemWriter(0), lb.NewMemWriter(0)
	k := lb.FrontendKey{Addr: netip.MustParseAddr("10.96.0.1"), Port: 80, Proto: lb.TCP}
	tests := []struct {
		name string
		mod  func(*serviceSync)
		w    lb.Writer
		want bool
	}{
		{"compared, one writer change since", func(*serviceSync) {}, w, true},
		{"another writer", func(*serviceSync) {}, other, false},
		{"no writer", func(*serviceSync) {}, nil, false},
		{"two writer changes since", func(s *serviceSync) { s.writerGen++ }, w, false},
		{"never compared", func(s *serviceSync) { s.comparedWriter = nil }, w, false},
		{"a key not written yet", func(s *serviceSync) { s.dirty[k] = "ns/svc" }, w, false},
		{"a failed write", func(s *serviceSync) { s.writeErrs[k] = writeErr{err: errors.New("full"), since: time.Now()} }, w, false},
		{"a Service that did not fit", func(s *serviceSync) { s.notFit["ns/svc"] = "full" }, w, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &serviceSync{dirty: map[lb.FrontendKey]string{}, writeErrs: map[lb.FrontendKey]writeErr{}, notFit: map[string]string{},
				comparedW: 3, writerGen: 4, comparedWriter: w}
			tt.mod(s)
			if got := s.inLineLocked(tt.w); got != tt.want {
				t.Errorf("inLineLocked = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestServicesScale measures the first sync and a single-slice change at
// scale: AXON_SCALE_SERVICES=10000 go test ./internal/agent -run TestServicesScale -v
// (10 endpoints per Service). Skipped unless the variable is set: creating
// 10 000 Services takes a while.
func TestServicesScale(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("AXON_SCALE_SERVICES"))
	if n <= 0 {
		t.Skip("set AXON_SCALE_SERVICES=<count> to run the scale measurement")
	}
	cp := startServiceControlPlane(t)
	arc, err := restConfig(cp.AdminKubeconfig())
	must(t, err)
	arc.QPS, arc.Burst = 2000, 4000 // the default 5 QPS would make the set-up take minutes
	cs, err := kubernetes.NewForConfig(arc)
	must(t, err)
	ctx := t.Context()
	createNode(t, cs, node("node1", []string{"198.18.0.11"}, "10.244.1.0/24"))
	const ns = "scale"
	_, err = cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	must(t, err)
	start := time.Now()
	work := make(chan int)
	errc := make(chan error, 16)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for i := range work {
				name := fmt.Sprintf("svc-%05d", i)
				_, err := cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name},
					Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}}}}, metav1.CreateOptions{})
				if err == nil {
					var eps []testEP
					for j := range 10 {
						eps = append(eps, testEP{addr: fmt.Sprintf("10.%d.%d.%d", 100+j, i/250, 1+i%250), node: "node1", ready: true})
					}
					_, err = cs.DiscoveryV1().EndpointSlices(ns).Create(ctx, endpointSlice(ns, name+"-1", name,
						[]discoveryv1.EndpointPort{slicePort("http", 8080, corev1.ProtocolTCP)}, eps...), metav1.CreateOptions{})
				}
				if err != nil {
					select {
					case errc <- fmt.Errorf("create %s: %w", name, err):
					default:
					}
				}
			}
		})
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	select {
	case err := <-errc:
		t.Fatal(err)
	default:
	}
	t.Logf("created %d Services × 10 endpoints in %s", n, time.Since(start))

	rc := agentRESTConfig(t, cp, "node1")
	rc.QPS, rc.Burst = 50, 100
	s, err := newServiceSync(rc, "node1", slog.New(slog.DiscardHandler))
	must(t, err)
	w := lb.NewMemWriter(0)
	s.SetWriter(w)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	start = time.Now()
	go func() { defer close(done); s.run(runCtx) }()
	t.Cleanup(func() { stop(); <-done })
	waitFor(t, w, 2*time.Minute, "the first sync", func() bool { return s.status().Synced })
	st := s.status()
	t.Logf("first sync: %s from start (list + table + write; table+write alone %s), %d services, %d frontends, %d backends",
		time.Since(start), st.FullSync, st.Services, st.Frontends, st.Backends)
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	t.Logf("test process heap in use after GC: %d MiB (informer caches + table + in-memory writer)", ms.HeapInuse>>20)

	slicesAPI := cs.DiscoveryV1().EndpointSlices(ns)
	es, err := slicesAPI.Get(ctx, "svc-00000-1", metav1.GetOptions{})
	must(t, err)
	var lat, apiLat, watchLat []time.Duration
	for i := range 100 {
		ready := i%2 == 1
		want := fmt.Sprintf("%s:8080          quarantined", es.Endpoints[0].Addresses[0])
		if ready {
			want = fmt.Sprintf("%s:8080          active", es.Endpoints[0].Addresses[0])
		}
		es.Endpoints[0].Conditions.Ready, es.Endpoints[0].Conditions.Serving = ptrTo(ready), ptrTo(ready)
		_, from := w.Ops(0)
		t0 := time.Now()
		es, err = slicesAPI.Update(ctx, es, metav1.UpdateOptions{})
		must(t, err)
		t1 := time.Now()
		waitFor(t, w, 10*time.Second, want, func() bool {
			ops, _ := w.Ops(from)
			for _, op := range ops {
				if strings.Contains(lb.Render([]lb.Frontend{op.Frontend}), want) {
					return true
				}
			}
			return false
		})
		lat, apiLat, watchLat = append(lat, time.Since(t0)), append(apiLat, t1.Sub(t0)), append(watchLat, time.Since(t1))
		if ops, _ := w.Ops(from); len(ops) != 1 {
			t.Errorf("change %d wrote %d frontends, want 1", i, len(ops))
		}
	}
	for _, l := range [][]time.Duration{lat, apiLat, watchLat} {
		slices.Sort(l)
	}
	pct := func(l []time.Duration) string {
		return fmt.Sprintf("p50 %s p90 %s p99 %s max %s", l[len(l)/2], l[len(l)*9/10], l[(len(l)*99+99)/100-1], l[len(l)-1])
	}
	t.Logf("at %d services, over %d changes: EndpointSlice update call → writer %s; update call alone %s; call returned → writer %s",
		n, len(lat), pct(lat), pct(apiLat), pct(watchLat))
}
