package lb

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

var (
	yes = ptr(true)
	no  = ptr(false)
	v4  = discoveryv1.AddressTypeIPv4
	v6  = discoveryv1.AddressTypeIPv6
	tcp = corev1.ProtocolTCP
	udp = corev1.ProtocolUDP
)

func http80() []discoveryv1.EndpointPort { return []discoveryv1.EndpointPort{eport("http", 8080, tcp)} }

// renderWithProblems is what the golden files hold: the frontends, then the
// problems Translate reported.
func renderWithProblems(fs []Frontend, probs []Problem) string {
	var b strings.Builder
	b.WriteString(Render(fs))
	for _, p := range probs {
		b.WriteString("problem: " + p.String() + "\n")
	}
	return b.String()
}

func TestTranslate(t *testing.T) {
	node1 := NodeInfo{Name: "node1", Zone: "zone-a"}
	sp := func(name string, port, nodePort int32, proto corev1.Protocol, target intstr.IntOrString) corev1.ServicePort {
		return corev1.ServicePort{Name: name, Port: port, NodePort: nodePort, Protocol: proto, TargetPort: target}
	}
	lbIngress := func(s *corev1.Service) {
		s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{
			{IP: "203.0.113.10"},
			{IP: "2001:db8::10"},
			{Hostname: "lb.example.com"},
			{IP: "203.0.113.11", IPMode: ptr(corev1.LoadBalancerIPModeProxy)},
			{IP: "203.0.113.12", IPMode: ptr(corev1.LoadBalancerIPModeVIP)},
		}
	}
	mixed := slice("web-a", "web", v4, http80(),
		ep{addr: "10.244.1.5", node: "node1"},                                            // ready nil = ready
		ep{addr: "10.244.2.7", node: "node2", ready: yes, serving: yes},                  // ready
		ep{addr: "10.244.2.8", node: "node2", ready: no, serving: yes, terminating: yes}, // terminating
		ep{addr: "10.244.1.9", node: "node1", ready: no, serving: no, terminating: yes},  // not serving
		ep{addr: "10.244.1.10", node: "node1", ready: no},                                // not ready
	)
	cases := []struct {
		name   string
		svc    *corev1.Service
		slices []*discoveryv1.EndpointSlice
		node   NodeInfo
		nprob  int // problems expected
	}{
		{name: "clusterip-conditions", svc: svc("default", "web"), slices: []*discoveryv1.EndpointSlice{mixed}},
		{name: "clusterip-no-endpoints", svc: svc("default", "web")},
		{name: "dualstack", svc: svc("default", "web", clusterIPs("10.96.0.10", "fd00:10:96::10")), slices: []*discoveryv1.EndpointSlice{
			slice("web-4", "web", v4, http80(), ep{addr: "10.244.1.5", node: "node1"}),
			slice("web-6", "web", v6, http80(), ep{addr: "fd00:10:244:1::5", node: "node1"}, ep{addr: "fd00:10:244:2::7", node: "node2"}),
		}},
		{name: "ipv6-single", svc: svc("default", "web", clusterIPs("fd00:10:96::10")), slices: []*discoveryv1.EndpointSlice{
			slice("web-4", "web", v4, http80(), ep{addr: "10.244.1.5", node: "node1"}), // other family: unused
			slice("web-6", "web", v6, http80(), ep{addr: "fd00:10:244:1::5", node: "node1"}),
		}},
		{name: "named-targetport-udp-tcp", svc: svc("kube-system", "kube-dns", ports(
			sp("dns", 53, 0, udp, intstr.FromString("dns")),
			sp("dns-tcp", 53, 0, tcp, intstr.FromString("dns-tcp")),
			sp("metrics", 9153, 0, tcp, intstr.FromInt32(9153)),
		)), slices: []*discoveryv1.EndpointSlice{
			// The named port resolves per slice: pods of slice a listen on 53, of slice b on 5353.
			slice("dns-a", "kube-dns", v4, []discoveryv1.EndpointPort{eport("dns", 53, udp), eport("dns-tcp", 53, tcp), eport("metrics", 9153, tcp)},
				ep{addr: "10.244.1.5", node: "node1"}),
			slice("dns-b", "kube-dns", v4, []discoveryv1.EndpointPort{eport("dns", 5353, udp), eport("dns-tcp", 5353, tcp), eport("metrics", 9153, tcp)},
				ep{addr: "10.244.2.7", node: "node2"}),
		}},
		{name: "sctp-unnamed-port", svc: svc("default", "sig", ports(sp("", 3868, 0, corev1.ProtocolSCTP, intstr.FromInt32(3869)))), slices: []*discoveryv1.EndpointSlice{
			slice("sig-a", "sig", v4, []discoveryv1.EndpointPort{{Port: ptr(int32(3869)), Protocol: ptr(corev1.ProtocolSCTP)}}, ep{addr: "10.244.1.5", node: "node1"}),
		}},
		{name: "nodeport-dualstack", svc: svc("default", "web", typ(corev1.ServiceTypeNodePort), clusterIPs("10.96.0.10", "fd00:10:96::10"),
			ports(sp("http", 80, 30080, tcp, intstr.FromInt32(8080)))), slices: []*discoveryv1.EndpointSlice{
			slice("web-4", "web", v4, http80(), ep{addr: "10.244.1.5", node: "node1"}, ep{addr: "10.244.2.7", node: "node2"}),
			slice("web-6", "web", v6, http80(), ep{addr: "fd00:10:244:1::5", node: "node1"}),
		}},
		{name: "loadbalancer", svc: svc("default", "web", typ(corev1.ServiceTypeLoadBalancer), clusterIPs("10.96.0.10", "fd00:10:96::10"),
			ports(sp("http", 80, 30080, tcp, intstr.FromInt32(8080))), lbIngress), slices: []*discoveryv1.EndpointSlice{
			slice("web-4", "web", v4, http80(), ep{addr: "10.244.1.5", node: "node1"}),
			slice("web-6", "web", v6, http80(), ep{addr: "fd00:10:244:1::5", node: "node1"}),
		}, nprob: 2},
		{name: "loadbalancer-no-nodeports", svc: svc("default", "web", typ(corev1.ServiceTypeLoadBalancer), lbIngress, func(s *corev1.Service) {
			s.Spec.AllocateLoadBalancerNodePorts = no
		}), slices: []*discoveryv1.EndpointSlice{slice("web-4", "web", v4, http80(), ep{addr: "10.244.1.5", node: "node1"})}, nprob: 3},
		{name: "externalips", svc: svc("default", "web", func(s *corev1.Service) {
			s.Spec.ExternalIPs = []string{"198.51.100.7", "2001:db8::7", "not-an-ip"}
		}), slices: []*discoveryv1.EndpointSlice{slice("web-4", "web", v4, http80(), ep{addr: "10.244.1.5", node: "node1"})}, nprob: 2},
		{name: "internal-traffic-local", svc: svc("default", "web", typ(corev1.ServiceTypeNodePort), ports(sp("http", 80, 30080, tcp, intstr.FromInt32(8080))), func(s *corev1.Service) {
			s.Spec.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicyLocal)
		}), slices: []*discoveryv1.EndpointSlice{mixed}},
		{name: "external-traffic-local", svc: svc("default", "web", typ(corev1.ServiceTypeLoadBalancer), ports(sp("http", 80, 30080, tcp, intstr.FromInt32(8080))), func(s *corev1.Service) {
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			s.Spec.ExternalIPs = []string{"198.51.100.7"}
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "203.0.113.10"}}
		}), slices: []*discoveryv1.EndpointSlice{mixed}},
		{name: "local-no-local-endpoints", svc: svc("default", "web", func(s *corev1.Service) {
			s.Spec.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicyLocal)
		}), slices: []*discoveryv1.EndpointSlice{slice("web-4", "web", v4, http80(), ep{addr: "10.244.2.7", node: "node2"})}},
		{name: "affinity-default", svc: svc("default", "web", func(s *corev1.Service) { s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP }),
			slices: []*discoveryv1.EndpointSlice{slice("web-4", "web", v4, http80(), ep{addr: "10.244.1.5", node: "node1"})}},
		{name: "affinity-timeout", svc: svc("default", "web", func(s *corev1.Service) {
			s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr(int32(60))}}
		}), slices: []*discoveryv1.EndpointSlice{slice("web-4", "web", v4, http80(), ep{addr: "10.244.1.5", node: "node1"})}},
		{name: "affinity-bad-timeout", svc: svc("default", "web", func(s *corev1.Service) {
			s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr(int32(-5))}}
		}), nprob: 1},
		{name: "zone-hints", node: node1, svc: svc("default", "web"), slices: []*discoveryv1.EndpointSlice{slice("web-4", "web", v4, http80(),
			ep{addr: "10.244.1.5", node: "node1", zone: "zone-a", zones: []string{"zone-a"}},
			ep{addr: "10.244.2.7", node: "node2", zone: "zone-a", zones: []string{"zone-a"}},
			ep{addr: "10.244.3.7", node: "node3", zone: "zone-b", zones: []string{"zone-b"}},
		)}},
		{name: "zone-hints-none-for-my-zone", node: NodeInfo{Name: "node4", Zone: "zone-c"}, svc: svc("default", "web"), slices: []*discoveryv1.EndpointSlice{slice("web-4", "web", v4, http80(),
			ep{addr: "10.244.1.5", node: "node1", zone: "zone-a", zones: []string{"zone-a"}},
			ep{addr: "10.244.3.7", node: "node3", zone: "zone-b", zones: []string{"zone-b"}},
		)}},
		{name: "zone-hints-incomplete", node: node1, svc: svc("default", "web"), slices: []*discoveryv1.EndpointSlice{slice("web-4", "web", v4, http80(),
			ep{addr: "10.244.1.5", node: "node1", zone: "zone-a", zones: []string{"zone-a"}},
			ep{addr: "10.244.3.7", node: "node3", zone: "zone-b"}, // no hint: hints are not used
		)}},
		{name: "zone-hints-ignored-with-local-policy", node: node1, svc: svc("default", "web", func(s *corev1.Service) {
			s.Spec.InternalTrafficPolicy = ptr(corev1.ServiceInternalTrafficPolicyLocal)
		}), slices: []*discoveryv1.EndpointSlice{slice("web-4", "web", v4, http80(),
			ep{addr: "10.244.1.5", node: "node1", zone: "zone-a", zones: []string{"zone-b"}},
			ep{addr: "10.244.3.7", node: "node3", zone: "zone-b", zones: []string{"zone-b"}},
		)}},
		{name: "node-hints", node: node1, svc: svc("default", "web"), slices: []*discoveryv1.EndpointSlice{slice("web-4", "web", v4, http80(),
			ep{addr: "10.244.1.5", node: "node1", zone: "zone-a", zones: []string{"zone-a"}, nodes: []string{"node1"}},
			ep{addr: "10.244.2.7", node: "node2", zone: "zone-a", zones: []string{"zone-a"}, nodes: []string{"node2"}},
			ep{addr: "10.244.3.7", node: "node3", zone: "zone-b", zones: []string{"zone-b"}, nodes: []string{"node3"}},
		)}},
		{name: "headless", svc: svc("default", "web", func(s *corev1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "None", []string{"None"} }),
			slices: []*discoveryv1.EndpointSlice{mixed}},
		{name: "externalname", svc: svc("default", "web", typ(corev1.ServiceTypeExternalName)), slices: []*discoveryv1.EndpointSlice{mixed}},
		{name: "zero-ports", svc: svc("default", "web", ports()), slices: []*discoveryv1.EndpointSlice{mixed}},
		{name: "duplicates-across-slices", svc: svc("default", "web"), slices: []*discoveryv1.EndpointSlice{
			slice("web-a", "web", v4, http80(), ep{addr: "10.244.1.5", node: "node1", ready: no, serving: yes, terminating: yes}, ep{addr: "10.244.2.7", node: "node2"}),
			slice("web-b", "web", v4, http80(), ep{addr: "10.244.1.5", node: "node1"}, ep{addr: "10.244.2.7", node: "node2"}),
			nil,
		}},
		{name: "garbage", nprob: 11, svc: svc("default", "web", clusterIPs("10.96.0.10", "10.96.0.300"), ports(
			sp("http", 80, 0, tcp, intstr.FromInt32(8080)),
			sp("http-dup", 80, 0, tcp, intstr.FromInt32(8081)),
			sp("zero", 0, 0, tcp, intstr.FromInt32(1)),
			sp("big", 70000, 0, tcp, intstr.FromInt32(1)),
			sp("icmp", 1, 0, "ICMP", intstr.FromInt32(1)),
		), func(s *corev1.Service) { s.Spec.ExternalIPs = []string{"0.0.0.0", "fe80::1%eth0"} }), slices: []*discoveryv1.EndpointSlice{
			slice("web-a", "web", v4, []discoveryv1.EndpointPort{eport("http", 8080, tcp), {Name: ptr("http-dup")}, eport("http-dup", 8081, "ICMP")},
				ep{addr: "10.244.1.5", node: "node1"}, ep{addr: "fd00::1"}, ep{addr: "banana"}),
			{AddressType: discoveryv1.AddressTypeFQDN, Ports: http80(), Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"example.com"}}}},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			node := tc.node
			if node == (NodeInfo{}) {
				node = NodeInfo{Name: "node1"}
			}
			fs, probs := Translate(tc.svc, tc.slices, node)
			if len(probs) != tc.nprob {
				t.Errorf("got %d problems, want %d: %v", len(probs), tc.nprob, probs)
			}
			for _, f := range fs {
				if f.Service != ServiceKey(tc.svc.Namespace, tc.svc.Name) {
					t.Errorf("frontend %v has service %q", f.Key, f.Service)
				}
				for _, b := range f.Backends {
					if b.Addr.Is6() != f.Key.Addr.Is6() {
						t.Errorf("frontend %v has a backend of the other family: %v", f.Key, b.Addr)
					}
				}
			}
			golden(t, "translate/"+tc.name, renderWithProblems(fs, probs))
		})
	}
}

func TestStateOf(t *testing.T) {
	cases := []struct {
		ready, serving, terminating *bool
		want                        BackendState
	}{
		{nil, nil, nil, Active},
		{yes, nil, nil, Active},
		{yes, yes, no, Active},
		{no, nil, nil, Quarantined},
		{no, yes, nil, Quarantined}, // serving but neither ready nor terminating: not used
		{no, yes, yes, Terminating},
		{no, no, yes, Quarantined},
		{nil, no, yes, Active},  // ready unset means ready (the API's rule, kube-proxy's)
		{yes, yes, yes, Active}, // ready wins, as in kube-proxy: publishNotReadyAddresses keeps a terminating pod ready
		{yes, no, yes, Active},  // … also when its readiness probe fails (the conformance suite's tolerate-unready case)
	}
	for _, c := range cases {
		got := stateOf(discoveryv1.EndpointConditions{Ready: c.ready, Serving: c.serving, Terminating: c.terminating})
		if got != c.want {
			t.Errorf("ready=%v serving=%v terminating=%v: got %v, want %v", fmtB(c.ready), fmtB(c.serving), fmtB(c.terminating), got, c.want)
		}
	}
}

func fmtB(b *bool) string {
	if b == nil {
		return "nil"
	}
	return fmt.Sprint(*b)
}

// TestTranslateDeterministic: input order of slices and endpoints never changes the output.
func TestTranslateDeterministic(t *testing.T) {
	s := svc("default", "web", clusterIPs("10.96.0.10", "fd00:10:96::10"))
	a := slice("web-a", "web", v4, http80(), ep{addr: "10.244.2.7", node: "node2"}, ep{addr: "10.244.1.5", node: "node1"})
	b := slice("web-b", "web", v6, http80(), ep{addr: "fd00::9"}, ep{addr: "fd00::1"})
	c := slice("web-c", "web", v4, http80(), ep{addr: "10.244.1.5", node: "node1"}, ep{addr: "10.244.0.1", node: "node0"})
	first := Render(must(Translate(s, []*discoveryv1.EndpointSlice{a, b, c}, NodeInfo{})))
	for _, order := range [][]*discoveryv1.EndpointSlice{{c, b, a}, {b, a, c}, {a, c, b}} {
		if got := Render(must(Translate(s, order, NodeInfo{}))); got != first {
			t.Fatalf("order changed the output:\n%s\nvs\n%s", first, got)
		}
	}
	if strings.Count(first, "10.244.1.5:8080") != 1 {
		t.Errorf("duplicate endpoint not merged:\n%s", first)
	}
}

func must(fs []Frontend, _ []Problem) []Frontend { return fs }

// TestTranslateHuge: 10 000 ports and 1 000 endpoints translate quickly and
// without problems; nil and empty input give nothing.
func TestTranslateHuge(t *testing.T) {
	var sps []corev1.ServicePort
	var eps []discoveryv1.EndpointPort
	for i := range 10000 {
		name := fmt.Sprintf("p%d", i)
		sps = append(sps, corev1.ServicePort{Name: name, Port: int32(1 + i), Protocol: tcp, TargetPort: intstr.FromInt32(int32(20000 + i))})
		if i < 100 {
			eps = append(eps, eport(name, int32(20000+i), tcp))
		}
	}
	var es []ep
	for i := range 1000 {
		es = append(es, ep{addr: netip.AddrFrom4([4]byte{10, 244, byte(i / 250), byte(1 + i%250)}).String(), node: "node1"})
	}
	start := time.Now()
	fs, probs := Translate(svc("default", "big", ports(sps...)), []*discoveryv1.EndpointSlice{slice("big-a", "big", v4, eps, es...)}, NodeInfo{Name: "node1"})
	took := time.Since(start)
	if len(probs) != 0 {
		t.Fatalf("problems: %v", probs[:min(3, len(probs))])
	}
	if len(fs) != 10000 {
		t.Fatalf("got %d frontends, want 10000", len(fs))
	}
	withBackends := 0
	for _, f := range fs {
		if len(f.Backends) > 0 {
			withBackends++
			if len(f.Backends) != 1000 {
				t.Fatalf("%v: %d backends, want 1000", f.Key, len(f.Backends))
			}
		}
	}
	if withBackends != 100 {
		t.Errorf("%d frontends with backends, want 100", withBackends)
	}
	t.Logf("10 000 ports × 1 000 endpoints (100 ports with endpoints) translated in %s", took)
	if took > 5*time.Second {
		t.Errorf("translation took %s", took)
	}

	if fs, probs := Translate(nil, nil, NodeInfo{}); fs != nil || probs != nil {
		t.Errorf("nil service: %v %v", fs, probs)
	}
	if fs, _ := Translate(&corev1.Service{}, []*discoveryv1.EndpointSlice{{}}, NodeInfo{}); len(fs) != 0 {
		t.Errorf("empty service gave %v", fs)
	}
}
