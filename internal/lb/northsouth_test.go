package lb

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestTranslateNorthSouth: the north-south load balancer's fields (algorithm annotation,
// loadBalancerSourceRanges, healthCheckNodePort) land on the right frontends,
// and bad values are Problems that leave the rest translated.
func TestTranslateNorthSouth(t *testing.T) {
	lbSvc := func(ann string, etp corev1.ServiceExternalTrafficPolicy, ranges ...string) *corev1.Service {
		s := svc("default", "web", func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeLoadBalancer
			s.Spec.Ports[0].NodePort = 30080
			s.Spec.ExternalTrafficPolicy = etp
			s.Spec.LoadBalancerSourceRanges = ranges
			if etp == corev1.ServiceExternalTrafficPolicyLocal {
				s.Spec.HealthCheckNodePort = 32000
			}
			if ann != "" {
				s.Annotations = map[string]string{AnnotationAlgorithm: ann}
			}
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "203.0.113.10"}}
		})
		return s
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: "web-1", Labels: map[string]string{ServiceNameLabel: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8080)), Protocol: ptr(corev1.ProtocolTCP)}},
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.244.1.5"}, NodeName: ptr("node1")},
			{Addresses: []string{"10.244.1.6"}, NodeName: ptr("node1"), Conditions: discoveryv1.EndpointConditions{Ready: ptr(false)}},
			{Addresses: []string{"10.244.2.7"}, NodeName: ptr("node2")},
		},
	}
	type want struct {
		alg      Algorithm
		ranges   []netip.Prefix // on the LoadBalancer frontend
		hc       uint16         // on external frontends
		problems []string
	}
	for _, tc := range []struct {
		name string
		svc  *corev1.Service
		want want
	}{
		{"defaults", lbSvc("", corev1.ServiceExternalTrafficPolicyCluster), want{}},
		{"maglev", lbSvc("Maglev", corev1.ServiceExternalTrafficPolicyCluster), want{alg: AlgorithmMaglev}},
		{"random", lbSvc("random", corev1.ServiceExternalTrafficPolicyCluster), want{alg: AlgorithmRandom}},
		{"malformed annotation", lbSvc("round-robin", corev1.ServiceExternalTrafficPolicyCluster),
			want{problems: []string{`metadata.annotations[axon.io/lb-algorithm] skipped: "round-robin" is not a load-balancing algorithm`}}},
		{"source ranges", lbSvc("", corev1.ServiceExternalTrafficPolicyCluster, "198.18.0.250/32", " 10.1.2.3/8", "nonsense"),
			want{ranges: []netip.Prefix{netip.MustParsePrefix("198.18.0.250/32"), netip.MustParsePrefix("10.0.0.0/8")},
				problems: []string{`spec.loadBalancerSourceRanges[2] skipped: "nonsense" is not a CIDR`}}},
		{"source ranges of both families: the IPv4 frontend gets the IPv4 ones", lbSvc("", corev1.ServiceExternalTrafficPolicyCluster, "2001:db8::/32", "198.18.0.250/32"),
			want{ranges: []netip.Prefix{netip.MustParsePrefix("198.18.0.250/32")}}},
		{"etp local health check", lbSvc("", corev1.ServiceExternalTrafficPolicyLocal), want{hc: 32000}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs, probs := Translate(tc.svc, []*discoveryv1.EndpointSlice{slice}, NodeInfo{Name: "node1"})
			if len(probs) != len(tc.want.problems) {
				t.Fatalf("problems = %v, want %d: %v", probs, len(tc.want.problems), tc.want.problems)
			}
			for i, p := range probs {
				if !strings.Contains(p.String(), tc.want.problems[i]) {
					t.Errorf("problem %d = %q, want it to contain %q", i, p, tc.want.problems[i])
				}
			}
			if len(fs) != 3 { // ClusterIP, LoadBalancer IP, NodePort
				t.Fatalf("got %d frontends, want 3:\n%s", len(fs), Render(fs))
			}
			for _, f := range fs {
				if f.Algorithm != tc.want.alg {
					t.Errorf("%s %s: algorithm %q, want %q", f.Kind, f.Key, f.Algorithm, tc.want.alg)
				}
				wantRanges := []netip.Prefix(nil)
				if f.Kind == KindLoadBalancer {
					wantRanges = tc.want.ranges
				}
				if !slices.Equal(f.SourceRanges, wantRanges) {
					t.Errorf("%s %s: source ranges %v, want %v", f.Kind, f.Key, f.SourceRanges, wantRanges)
				}
				wantHC := tc.want.hc
				if f.Kind == KindClusterIP {
					wantHC = 0
				}
				if f.HealthCheckNodePort != wantHC {
					t.Errorf("%s %s: healthCheckNodePort %d, want %d", f.Kind, f.Key, f.HealthCheckNodePort, wantHC)
				}
			}
			wantLocal := 1 // 10.244.1.5 (10.244.1.6 is not ready)
			if got := LocalEndpoints(fs, "node1"); got != wantLocal {
				t.Errorf("LocalEndpoints(node1) = %d, want %d", got, wantLocal)
			}
		})
	}
}

func TestParseAlgorithm(t *testing.T) {
	for in, want := range map[string]Algorithm{"maglev": AlgorithmMaglev, " RANDOM ": AlgorithmRandom} {
		if got, err := ParseAlgorithm(in); err != nil || got != want {
			t.Errorf("ParseAlgorithm(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "rr", "maglev2"} {
		if _, err := ParseAlgorithm(in); err == nil {
			t.Errorf("ParseAlgorithm(%q) accepted", in)
		}
	}
}
