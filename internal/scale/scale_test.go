package scale

import (
	"context"
	"net/netip"
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes/fake"
)

func TestEndpointAddr(t *testing.T) {
	tests := []struct {
		i, j, per int
		want      string
	}{
		{0, 0, 11, "100.64.0.0"},
		{0, 10, 11, "100.64.0.10"},
		{1, 0, 11, "100.64.0.11"},
		{23, 5, 11, "100.64.1.2"}, // 23*11+5 = 258
		{9999, 10, 11, "100.65.173.175"},
	}
	for _, tt := range tests {
		if got := EndpointAddr(tt.i, tt.j, tt.per); got.String() != tt.want {
			t.Errorf("EndpointAddr(%d,%d,%d) = %s, want %s", tt.i, tt.j, tt.per, got, tt.want)
		}
	}
	// Unique and inside 100.64.0.0/10 for 10 000 Services × (10+1).
	cgnat := netip.MustParsePrefix("100.64.0.0/10")
	seen := map[netip.Addr]bool{}
	for i := range 10000 {
		for j := range 11 {
			a := EndpointAddr(i, j, 11)
			if seen[a] || !cgnat.Contains(a) {
				t.Fatalf("address %s of (%d,%d) repeated or outside %s", a, i, j, cgnat)
			}
			seen[a] = true
		}
	}
}

func TestSpecObjects(t *testing.T) {
	s, err := Spec{Services: 3, Endpoints: 10}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	svc := s.Service(7)
	if svc.Name != "svc-7" || svc.Namespace != "svcbench" || svc.Labels[ManagedByLabel] != ManagedBy ||
		len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != ServicePort || svc.Spec.Ports[0].TargetPort.IntValue() != TargetPort {
		t.Errorf("service: %+v", svc)
	}
	if errs := validation.IsDNS1035Label(svc.Name); len(errs) > 0 {
		t.Errorf("service name %q: %v", svc.Name, errs)
	}
	es := s.EndpointSlice(7, 11)
	if es.Labels[discoveryv1.LabelServiceName] != "svc-7" || es.AddressType != discoveryv1.AddressTypeIPv4 || len(es.Endpoints) != 11 {
		t.Fatalf("slice: %+v", es)
	}
	for _, ep := range es.Endpoints {
		if len(ep.Addresses) != 1 || ep.Conditions.Ready == nil || !*ep.Conditions.Ready {
			t.Errorf("endpoint not ready or without one address: %+v", ep)
		}
	}
	// The extra endpoint of a change is distinct from the next Service's first.
	if a, b := es.Endpoints[10].Addresses[0], s.EndpointSlice(8, 1).Endpoints[0].Addresses[0]; a == b {
		t.Errorf("Service 7's 11th endpoint %s collides with Service 8's first", a)
	}
}

func TestSpecValidation(t *testing.T) {
	tests := []struct {
		name string
		s    Spec
		ok   bool
	}{
		{"ok", Spec{Services: 10000, Endpoints: 10}, true},
		{"zero endpoints", Spec{Services: 1}, false},
		{"too many endpoints per slice", Spec{Services: 1, Endpoints: 1001}, false},
		{"negative", Spec{Services: -1, Endpoints: 1}, false},
		{"address space", Spec{Services: 1 << 20, Endpoints: 10}, false},
	}
	for _, tt := range tests {
		if _, err := tt.s.withDefaults(); (err == nil) != tt.ok {
			t.Errorf("%s: err = %v, want ok=%v", tt.name, err, tt.ok)
		}
	}
}

// TestApplyChangeDelete runs the object logic against client-go's fake
// clientset (pure logic: the real apiserver run is the root e2e test of
// internal/bench).
func TestApplyChangeDelete(t *testing.T) {
	ctx := context.Background()
	kube := fake.NewClientset()
	s := Spec{Services: 25, Endpoints: 3}
	res, err := Apply(ctx, kube, s, 4, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Created != 50 || res.Existing != 0 || len(res.ClusterIPs) != 25 {
		t.Errorf("first apply: %+v", res)
	}
	// Growing: the first 25 exist, 25 more are created.
	res, err = Apply(ctx, kube, Spec{Services: 50, Endpoints: 3}, 4, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Created != 50 || res.Existing != 50 {
		t.Errorf("second apply: created %d existing %d, want 50 50", res.Created, res.Existing)
	}
	if err := SetEndpoints(ctx, kube, s, 3, 4); err != nil {
		t.Fatal(err)
	}
	es, err := kube.DiscoveryV1().EndpointSlices("svcbench").Get(ctx, "svc-3", metav1GetOptions)
	if err != nil || len(es.Endpoints) != 4 {
		t.Fatalf("after SetEndpoints: %v, %v", es, err)
	}
	if err := SetEndpoints(ctx, kube, s, 3, 9); err == nil {
		t.Error("SetEndpoints beyond Endpoints+1: want an error")
	}
	n, err := Delete(ctx, kube, "svcbench", 4)
	if err != nil {
		t.Fatal(err)
	}
	if n != 100 {
		t.Errorf("deleted %d, want 100", n)
	}
	svcs, _ := kube.CoreV1().Services("svcbench").List(ctx, metav1ListOptions)
	slices, _ := kube.DiscoveryV1().EndpointSlices("svcbench").List(ctx, metav1ListOptions)
	if len(svcs.Items)+len(slices.Items) != 0 {
		t.Errorf("left behind: %d services, %d slices", len(svcs.Items), len(slices.Items))
	}
}

var (
	metav1GetOptions  = metav1.GetOptions{}
	metav1ListOptions = metav1.ListOptions{}
)
