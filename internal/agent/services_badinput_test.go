package agent

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/axonhq/axon/internal/lb"
)

// waitEvent waits until an Event with reason on the object named name
// exists in namespace ns and returns its message.
func waitEvent(t *testing.T, cs kubernetes.Interface, ns, kind, name, reason string) string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		evs, err := cs.CoreV1().Events(ns).List(t.Context(), metav1.ListOptions{})
		must(t, err)
		for _, e := range evs.Items {
			if e.InvolvedObject.Kind == kind && e.InvolvedObject.Name == name && e.Reason == reason {
				if e.Source.Component != "axon-agent" || e.Source.Host != "node1" {
					t.Errorf("event source %+v, want axon-agent on node1", e.Source)
				}
				return e.Message
			}
		}
		if time.Now().After(deadline) {
			var have []string
			for _, e := range evs.Items {
				have = append(have, fmt.Sprintf("%s/%s %s: %s", e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message))
			}
			t.Fatalf("no %s Event for %s %s/%s within 20s; events: %v", reason, kind, ns, name, have)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestServicesBadInput: against a real kube-apiserver, with a writer sized
// like a small BPF map: a Service with 0 ports, with 10 000 ports and with
// 10 000 endpoints, partly unusable entries, and a Service that does not fit.
// Each gets a clear status line and an Event; no Service is ever written in
// part, and the others keep being served, changes included.
func TestServicesBadInput(t *testing.T) {
	cp := startServiceControlPlane(t)
	arc, err := restConfig(cp.AdminKubeconfig())
	must(t, err)
	arc.QPS, arc.Burst = 500, 1000
	cs, err := kubernetes.NewForConfig(arc)
	must(t, err)
	ctx := t.Context()
	createNode(t, cs, node("node1", []string{"198.18.0.11"}, "10.244.1.0/24"))
	const ns = "bad"
	_, err = cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	must(t, err)

	rc := agentRESTConfig(t, cp, "node1")
	s, err := newServiceSync(rc, "node1", testLogger(t))
	must(t, err)
	w := lb.NewMemWriter(0)
	// 21 000 entries: room for the 10 000-port Service or the 10 000-endpoint
	// one (2 ports: 2 × 10 001 entries), not both
	w.SetCapacity(21000)
	s.SetWriter(w)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); s.run(runCtx) }()
	t.Cleanup(func() { stop(); <-done })
	waitFor(t, w, 30*time.Second, "the initial sync", func() bool { return s.status().Synced })

	svcAPI := cs.CoreV1().Services(ns)
	sliceAPI := cs.DiscoveryV1().EndpointSlices(ns)
	http := []discoveryv1.EndpointPort{slicePort("http", 8080, corev1.ProtocolTCP)}
	okSvc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "ok"}, Spec: corev1.ServiceSpec{ClusterIP: "10.96.2.1",
		Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}}}}
	_, err = svcAPI.Create(ctx, okSvc, metav1.CreateOptions{})
	must(t, err)
	okSlice, err := sliceAPI.Create(ctx, endpointSlice(ns, "ok-1", "ok", http, testEP{addr: "10.244.1.2", node: "node1", ready: true}), metav1.CreateOptions{})
	must(t, err)
	waitFor(t, w, 10*time.Second, "bad/ok programmed", func() bool { return strings.Contains(w.Render(), "10.244.1.2:8080") })

	t.Run("0 ports", func(t *testing.T) {
		_, err := svcAPI.Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "noports"}, Spec: corev1.ServiceSpec{ClusterIP: "10.96.2.2"}}, metav1.CreateOptions{})
		if !apierrors.IsInvalid(err) {
			t.Fatalf("a ClusterIP Service without ports: %v, want the apiserver to refuse it", err)
		}
		// headless without ports is valid: nothing to program, nothing to complain about
		_, err = svcAPI.Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "noports"}, Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone}}, metav1.CreateOptions{})
		must(t, err)
		time.Sleep(500 * time.Millisecond)
		st := s.status()
		for _, p := range append(st.Problems, st.WriteErrors...) {
			if strings.Contains(p, "noports") {
				t.Errorf("headless Service without ports reported: %s", p)
			}
		}
		if strings.Contains(w.Render(), "bad/noports") {
			t.Errorf("headless Service programmed:\n%s", w.Render())
		}
	})

	t.Run("unusable parts: Event, the rest programmed", func(t *testing.T) {
		proxy := corev1.LoadBalancerIPModeProxy
		lbs, err := svcAPI.Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "lbhost"}, Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeLoadBalancer, ClusterIP: "10.96.2.3",
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), NodePort: 30999}}}}, metav1.CreateOptions{})
		must(t, err)
		lbs.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{Hostname: "lb.example.com"}, {IP: "203.0.113.20", IPMode: &proxy}, {IP: "203.0.113.21"}}
		_, err = svcAPI.UpdateStatus(ctx, lbs, metav1.UpdateOptions{})
		must(t, err)
		msg := waitEvent(t, cs, ns, "Service", "lbhost", ReasonServiceEntryIgnored)
		for _, want := range []string{"hostname-only ingress", "ipMode Proxy", "2 part(s)"} {
			if !strings.Contains(msg, want) {
				t.Errorf("event message %q lacks %q", msg, want)
			}
		}
		waitFor(t, w, 10*time.Second, "the usable LoadBalancer IP", func() bool { return strings.Contains(w.Render(), "203.0.113.21:80/TCP") })
		if strings.Contains(w.Render(), "203.0.113.20") {
			t.Errorf("ipMode Proxy ingress programmed:\n%s", w.Render())
		}
	})

	// 10 000 ports without endpoints: 10 000 frontends (one entry each)
	many := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "manyports"}, Spec: corev1.ServiceSpec{ClusterIP: "10.96.2.4"}}
	for i := range 10000 {
		many.Spec.Ports = append(many.Spec.Ports, corev1.ServicePort{Name: fmt.Sprintf("p%d", i), Port: int32(1 + i), TargetPort: intstr.FromInt32(int32(1 + i))})
	}
	t.Run("10 000 ports", func(t *testing.T) {
		t0 := time.Now()
		_, err := svcAPI.Create(ctx, many, metav1.CreateOptions{})
		must(t, err)
		eventually(t, "10 000 frontends of bad/manyports", 30*time.Second, func() error {
			fs, _ := w.Frontends()
			n := 0
			for _, f := range fs {
				if f.Service == ns+"/manyports" {
					n++
				}
			}
			if n != 10000 {
				return fmt.Errorf("%d frontends", n)
			}
			return nil
		})
		t.Logf("10 000-port Service programmed %s after its create call", time.Since(t0).Round(time.Millisecond))
	})

	// 10 000 endpoints in 10 slices, 2 ports: two frontends with 10 000
	// backends each (20 002 entries): does not fit next to the 10 000 ports
	t.Run("10 000 endpoints that do not fit: refused whole, Event, status", func(t *testing.T) {
		ports := []discoveryv1.EndpointPort{slicePort("http", 8080, corev1.ProtocolTCP), slicePort("https", 8443, corev1.ProtocolTCP)}
		for sl := range 10 {
			var eps []testEP
			for i := range 1000 {
				eps = append(eps, testEP{addr: fmt.Sprintf("10.245.%d.%d", sl*4+i/250, 1+i%250), node: "node1", ready: true})
			}
			_, err := sliceAPI.Create(ctx, endpointSlice(ns, fmt.Sprintf("manyeps-%d", sl), "manyeps", ports, eps...), metav1.CreateOptions{})
			must(t, err)
		}
		time.Sleep(time.Second) // the slices are in the agent's cache before their Service appears
		_, err := svcAPI.Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "manyeps"}, Spec: corev1.ServiceSpec{ClusterIP: "10.96.2.5",
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}, {Name: "https", Port: 443, TargetPort: intstr.FromInt32(8443)}}}}, metav1.CreateOptions{})
		must(t, err)
		msg := waitEvent(t, cs, ns, "Service", "manyeps", ReasonServiceNotFit)
		t.Logf("event: %s", msg)
		if !strings.Contains(msg, "full") || !strings.Contains(msg, "other Services are unaffected") {
			t.Errorf("event message %q does not say what happened", msg)
		}
		eventually(t, "status names the refused Service", 10*time.Second, func() error {
			for _, e := range s.status().WriteErrors {
				if strings.Contains(e, "service bad/manyeps not programmed") {
					return nil
				}
			}
			return fmt.Errorf("write errors %v", s.status().WriteErrors)
		})
		if r := w.Render(); strings.Contains(r, "10.96.2.5") || strings.Contains(r, "10.245.") {
			t.Errorf("a refused Service is (partly) in the writer")
		}
		evs, err := cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=manyeps,reason=" + ReasonServiceNotFit})
		must(t, err)
		if len(evs.Items) != 1 || evs.Items[0].Count > 1 {
			t.Errorf("%d refusal events (count %v), want exactly one however often it is retried", len(evs.Items), evs.Items)
		}
	})

	t.Run("the others stay and keep changing", func(t *testing.T) {
		okSlice.Endpoints = append(okSlice.Endpoints, endpointSlice(ns, "", "", nil, testEP{addr: "10.244.1.3", node: "node1", ready: true}).Endpoints...)
		t0 := time.Now()
		okSlice, err = sliceAPI.Update(ctx, okSlice, metav1.UpdateOptions{})
		must(t, err)
		waitFor(t, w, 10*time.Second, "bad/ok's new endpoint", func() bool { return strings.Contains(w.Render(), "10.244.1.3:8080") })
		t.Logf("a change to another Service reached the writer in %s while bad/manyeps is refused", time.Since(t0).Round(time.Millisecond))
	})

	t.Run("room freed: the refused Service is programmed whole", func(t *testing.T) {
		must(t, svcAPI.Delete(ctx, "manyports", metav1.DeleteOptions{}))
		waitFor(t, w, 30*time.Second, "both frontends of bad/manyeps with 10 000 backends each", func() bool {
			fs, _ := w.Frontends()
			n := 0
			for _, f := range fs {
				if f.Service == ns+"/manyeps" && len(f.Backends) == 10000 {
					n++
				}
			}
			return n == 2
		})
		waitEvent(t, cs, ns, "Service", "manyeps", ReasonServiceProgrammed)
		for _, e := range s.status().WriteErrors {
			if strings.Contains(e, "manyeps") {
				t.Errorf("status still reports %s", e)
			}
		}
	})
}
