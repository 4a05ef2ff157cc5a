package lab

import (
	"bytes"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/axonhq/axon/internal/lab/kubeproxy"
	"github.com/axonhq/axon/internal/lab/probe"
)

func testState(datapath, kubeProxy string) *State {
	st := &State{Datapath: datapath, KubeProxy: kubeProxy}
	for i := 1; i <= 2; i++ {
		st.Nodes = append(st.Nodes, newNode("/run/axon-lab", "/cg", i))
	}
	st.Pods = []Pod{
		{Name: "node1-pod1", Namespace: "default", Node: "node1", Datapath: datapath,
			IPs: []netip.Addr{netip.MustParseAddr("10.244.1.2"), netip.MustParseAddr("fd00:10:244:1::2")}},
		{Name: "node2-pod1", Namespace: "default", Node: "node2", Datapath: datapath,
			IPs: []netip.Addr{netip.MustParseAddr("10.244.2.2"), netip.MustParseAddr("fd00:10:244:2::2")}},
		{Name: "bench-x", Namespace: "default", Node: "node2", Datapath: "other",
			IPs: []netip.Addr{netip.MustParseAddr("10.245.2.9")}},
	}
	return st
}

func TestPlanServiceProbes(t *testing.T) {
	tests := []struct {
		name, datapath, kubeProxy string
		wantImpl                  string
		wantNA                    map[string]int // reason substring → probes
	}{
		{"axon socket LB", DatapathAxon, "", "axon socket LB", nil},
		{"nftables", DatapathBaseline, kubeproxy.NFTables, "kube-proxy nftables",
			map[string]int{"nftables does not serve NodePorts on loopback": 2 * 4}},
		{"iptables", DatapathBaseline, kubeproxy.IPTables, "kube-proxy iptables",
			map[string]int{"localhost NodePorts for IPv4 only": 2 * 2}},
		{"axon datapath with kube-proxy", DatapathAxon, kubeproxy.NFTables, "kube-proxy nftables",
			map[string]int{"nftables does not serve NodePorts on loopback": 2 * 4}},
		{"nothing serves Services", DatapathBaseline, kubeproxy.None, "", map[string]int{"no Service implementation": -1}},
	}
	// per pod: ClusterIP 2 addrs + NodePort 2 nodes × 2 addrs + externalIP 2 + LB 2 = 10, × tcp/udp
	// per node: the same + 2 loopback addresses
	// HostPort: node1's 2 addresses from every source, + 2 loopback from node1
	const total = 3*10*2 + 2*12*2 + 5*2*2 + 2*2
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := testState(tc.datapath, tc.kubeProxy)
			if got := serviceImpl(st); got != tc.wantImpl {
				t.Errorf("serviceImpl = %q, want %q", got, tc.wantImpl)
			}
			plan := planServiceProbes(st)
			if len(plan) != total {
				t.Errorf("%d probes planned, want %d", len(plan), total)
			}
			na := map[string]int{}
			for _, p := range plan {
				if p.NA == "" {
					continue
				}
				if p.Type == SvcTypeHostPort && !strings.Contains(p.NA, "no Service implementation") {
					if tc.kubeProxy == kubeproxy.None || !strings.Contains(p.NA, "kube-proxy does not implement hostPort") {
						t.Errorf("HostPort n/a %q with kube-proxy %q", p.NA, tc.kubeProxy)
					}
					continue // kube-proxy serves no hostPort (check_external_hostport_test.go)
				}
				for r := range tc.wantNA {
					if strings.Contains(p.NA, r) {
						na[r]++
					}
				}
				if tc.wantNA == nil {
					t.Errorf("unexpected n/a: %+v", p)
				}
				if !p.Probe.Addr.Addr().IsLoopback() && !strings.Contains(p.NA, "no Service implementation") {
					t.Errorf("n/a for a non-loopback address: %+v", p)
				}
			}
			for r, n := range tc.wantNA {
				if n == -1 {
					n = total
				}
				if na[r] != n {
					t.Errorf("%d probes n/a for %q, want %d", na[r], r, n)
				}
			}
		})
	}
}

func TestDemoServicesObjects(t *testing.T) {
	st := testState(DatapathAxon, "")
	backends := demoBackends(st)
	if len(backends) != 2 {
		t.Fatalf("backends = %v, want the 2 pods of the lab's datapath", backends)
	}
	seenIP := map[netip.Addr]string{}
	for _, d := range DemoServices() {
		svc := d.object()
		if len(svc.Spec.ClusterIPs) != 2 || svc.Spec.ClusterIP != svc.Spec.ClusterIPs[0] || len(svc.Spec.Ports) != 2 {
			t.Errorf("%s: %+v", d.Name, svc.Spec)
		}
		for _, cidr := range []string{"10.96.0.0/16", "fd00:10:96::/112"} {
			ok := false
			for _, ip := range d.ClusterIPs {
				ok = ok || netip.MustParsePrefix(cidr).Contains(ip)
			}
			if !ok {
				t.Errorf("%s has no ClusterIP in %s", d.Name, cidr)
			}
		}
		for _, ip := range append(append(append([]netip.Addr{}, d.ClusterIPs...), d.ExternalIPs...), d.LBIngress...) {
			if other, dup := seenIP[ip]; dup {
				t.Errorf("%s and %s share %s", d.Name, other, ip)
			}
			seenIP[ip] = d.Name
		}
		for _, p := range svc.Spec.Ports {
			if p.Port != DemoPort || p.TargetPort.IntValue() != probe.EchoPort || p.NodePort != d.NodePort {
				t.Errorf("%s port %+v", d.Name, p)
			}
		}
		slices := d.endpointSlices(backends)
		if len(slices) != 2 {
			t.Fatalf("%s: %d slices", d.Name, len(slices))
		}
		for _, s := range slices {
			if s.Labels[discoveryv1.LabelServiceName] != d.Name || len(s.Endpoints) != 2 || len(s.Ports) != 2 {
				t.Errorf("%s slice %s: %+v", d.Name, s.Name, s)
			}
			for _, e := range s.Endpoints {
				a := netip.MustParseAddr(e.Addresses[0])
				if a.Is4() != (s.AddressType == discoveryv1.AddressTypeIPv4) || !*e.Conditions.Ready || e.NodeName == nil {
					t.Errorf("%s slice %s endpoint %+v", d.Name, s.Name, e)
				}
			}
		}
	}
	lb := DemoServices()[3]
	if lb.Type != corev1.ServiceTypeLoadBalancer || len(lb.LBIngress) != 2 {
		t.Errorf("LoadBalancer demo: %+v", lb)
	}
	// externalIPs and LB IPs are on the wire subnets (on-link for every node) and owned by nobody
	wire := []netip.Prefix{netip.MustParsePrefix("198.18.0.0/24"), netip.MustParsePrefix("fd00:198:18::/64")}
	owned := map[netip.Addr]bool{}
	for _, n := range st.Nodes {
		for _, ip := range n.IPs {
			owned[ip] = true
		}
	}
	for _, ip := range newExternal().IPs {
		owned[ip] = true
	}
	for _, d := range DemoServices() {
		for _, ip := range append(append([]netip.Addr{}, d.ExternalIPs...), d.LBIngress...) {
			if !wire[0].Contains(ip) && !wire[1].Contains(ip) || owned[ip] {
				t.Errorf("%s: %s must be an unowned wire address", d.Name, ip)
			}
		}
	}
}

func TestServiceCheckResultPrint(t *testing.T) {
	r := &ServiceCheckResult{
		Impl: "kube-proxy nftables", Sources: []string{"node1-pod1", "node1"}, Types: svcTypes,
		Cells: map[[2]string][]probe.ServiceResult{
			{"node1-pod1", SvcTypeClusterIP}: {{Service: probe.Service{Proto: "tcp", Addr: netip.MustParseAddrPort("10.96.100.10:80")}, OK: true}},
			{"node1", SvcTypeClusterIP}:      {{Service: probe.Service{Proto: "udp", Addr: netip.MustParseAddrPort("10.96.100.10:80")}, Err: "no UDP echo"}},
			{"node1", SvcTypeNodePort}:       {{Service: probe.Service{Proto: "tcp", Addr: netip.MustParseAddrPort("198.18.0.11:30080")}, OK: true}},
		},
		NA: map[[2]string][]plannedProbe{
			{"node1", SvcTypeNodePort}: {{Source: "node1", Type: SvcTypeNodePort, NA: "n/a (kube-proxy nftables does not serve NodePorts on loopback)",
				Probe: probe.Service{Proto: "tcp", Addr: netip.MustParseAddrPort("127.0.0.1:30080")}}},
		},
	}
	var b bytes.Buffer
	r.Print(&b)
	out := b.String()
	for _, want := range []string{
		"served by kube-proxy nftables",
		"node1-pod1   ok 1/1",
		"FAIL 0/1",
		"ok 1/1 (+1 n/a)",
		"FAIL node1 → ClusterIP udp/10.96.100.10:80: no UDP echo",
		"n/a  NodePort 127.0.0.1: n/a (kube-proxy nftables does not serve NodePorts on loopback) [1 probes]",
		"2/3 service probes passed, 1 n/a",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if ok, ran, na := r.Counts(); ok != 2 || ran != 3 || na != 1 {
		t.Errorf("Counts = %d %d %d", ok, ran, na)
	}
}
