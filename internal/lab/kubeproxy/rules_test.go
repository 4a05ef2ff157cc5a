package kubeproxy

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Excerpts of what kube-proxy v1.36 wrote in a lab node (iptables-save -t nat,
// ip6tables-save -t nat, nft list table ip kube-proxy).
const (
	iptablesV4Dump = `*nat
:KUBE-NODEPORTS - [0:0]
-A KUBE-EXT-PQFWVUXNXY7AWVV6 -m comment --comment "masquerade traffic for default/demo-nodeport:tcp external destinations" -j KUBE-MARK-MASQ
-A KUBE-NODEPORTS -p tcp -m comment --comment "default/demo-nodeport:tcp" -m tcp --dport 30080 -j KUBE-EXT-PQFWVUXNXY7AWVV6
-A KUBE-SEP-3HWG3QT7QZGR7BUN -s 10.245.2.2/32 -m comment --comment "default/demo-nodeport:tcp" -j KUBE-MARK-MASQ
-A KUBE-SEP-3HWG3QT7QZGR7BUN -p tcp -m comment --comment "default/demo-nodeport:tcp" -m tcp -j DNAT --to-destination 10.245.2.2:5657
-A KUBE-SEP-HMPQBH7P26AXXFLE -p tcp -m comment --comment "default/demo-nodeport:tcp" -m tcp -j DNAT --to-destination 10.245.1.3:5657
-A KUBE-SERVICES -d 10.96.100.11/32 -p tcp -m comment --comment "default/demo-nodeport:tcp cluster IP" -m tcp --dport 80 -j KUBE-SVC-X
COMMIT
`
	iptablesV6Dump = `*nat
-A KUBE-SEP-HWEZIRZ3FOD3NDT6 -p tcp -m comment --comment "default/demo-clusterip:tcp" -m tcp -j DNAT --to-destination [fd00:10:245:1::3]:5657
-A KUBE-SERVICES -d fd00:10:96::10/128 -p tcp -m comment --comment "default/demo-clusterip:tcp cluster IP" -m tcp --dport 80 -j KUBE-SVC-Y
COMMIT
`
	nftV4Dump = `table ip kube-proxy {
	map service-ips {
		type ipv4_addr . inet_proto . inet_service : verdict
		elements = { 10.96.100.10 . tcp . 80 : goto service-ILHLD23R-default/demo-clusterip/tcp/tcp,
			     198.18.0.200 . tcp . 80 : goto external-PNSSO2H5-default/demo-loadbalancer/tcp/tcp }
	}

	map service-nodeports {
		type inet_proto . inet_service : verdict
		elements = { tcp . 30080 : goto external-GYG2YXFH-default/demo-nodeport/tcp/tcp }
	}

	chain service-GYG2YXFH-default/demo-nodeport/tcp/tcp {
		meta l4proto tcp dnat ip to numgen random mod 2 map { 0 : 10.245.1.2 . 5657, 1 : 10.245.2.3 . 5657 }
	}

	chain external-GYG2YXFH-default/demo-nodeport/tcp/tcp {
		meta mark set meta mark | 0x00004000 comment "masquerade"
		goto service-GYG2YXFH-default/demo-nodeport/tcp/tcp
	}

	chain service-ILHLD23R-default/demo-clusterip/tcp/tcp {
		meta l4proto tcp dnat ip to 10.245.1.2:5657
	}
}
`
)

func TestKubeProxyRulesMissing(t *testing.T) {
	ap := netip.MustParseAddrPort
	a := netip.MustParseAddr
	tests := []struct {
		name, mode, dump string
		v6               bool
		want             Want
		wantWhy          string // "" = all there
	}{
		{"iptables: endpoints and node port", IPTables, iptablesV4Dump, false,
			Want{Service: "default/demo-nodeport", Port: "tcp", Proto: "tcp", NodePort: 30080,
				Frontends: []netip.Addr{a("10.96.100.11"), a("fd00:10:96::11")},
				Endpoints: []netip.AddrPort{ap("10.245.2.2:5657"), ap("10.245.1.3:5657"), ap("[fd00::1]:5657")}}, ""},
		{"iptables: an endpoint not programmed yet", IPTables, iptablesV4Dump, false,
			Want{Service: "default/demo-nodeport", Port: "tcp", Proto: "tcp",
				Endpoints: []netip.AddrPort{ap("10.245.2.2:5657"), ap("10.245.2.3:5657")}}, "no DNAT to endpoint 10.245.2.3:5657"},
		{"iptables: an endpoint of another Service port", IPTables, iptablesV4Dump, false,
			Want{Service: "default/demo-nodeport", Port: "udp", Proto: "udp",
				Endpoints: []netip.AddrPort{ap("10.245.2.2:5657")}}, "default/demo-nodeport:udp: no DNAT"},
		{"iptables: node port of another Service", IPTables, iptablesV4Dump, false,
			Want{Service: "default/demo-other", Port: "tcp", Proto: "tcp", NodePort: 30080}, "no rule for node port 30080"},
		{"iptables: a frontend is matched as a whole address", IPTables, iptablesV4Dump, false,
			Want{Service: "default/demo-nodeport", Port: "tcp", Proto: "tcp",
				Frontends: []netip.Addr{a("10.96.100.1")}}, "no rule for frontend 10.96.100.1"},
		{"ip6tables: bracketed endpoints", IPTables, iptablesV6Dump, true,
			Want{Service: "default/demo-clusterip", Port: "tcp", Proto: "tcp",
				Frontends: []netip.Addr{a("10.96.100.10"), a("fd00:10:96::10")},
				Endpoints: []netip.AddrPort{ap("[fd00:10:245:1::3]:5657")}}, ""},
		{"ip6tables: frontend missing", IPTables, iptablesV6Dump, true,
			Want{Service: "default/demo-clusterip", Port: "tcp", Proto: "tcp",
				Frontends: []netip.Addr{a("fd00:10:96::1")}}, "no rule for frontend fd00:10:96::1"},
		{"nftables: numgen map, node port, LB address", NFTables, nftV4Dump, false,
			Want{Service: "default/demo-nodeport", Port: "tcp", Proto: "tcp", NodePort: 30080,
				Frontends: []netip.Addr{a("198.18.0.200")},
				Endpoints: []netip.AddrPort{ap("10.245.1.2:5657"), ap("10.245.2.3:5657")}}, ""},
		{"nftables: one endpoint", NFTables, nftV4Dump, false,
			Want{Service: "default/demo-clusterip", Port: "tcp", Proto: "tcp",
				Frontends: []netip.Addr{a("10.96.100.10")}, Endpoints: []netip.AddrPort{ap("10.245.1.2:5657")}}, ""},
		{"nftables: endpoints of another chain do not count", NFTables, nftV4Dump, false,
			Want{Service: "default/demo-clusterip", Port: "tcp", Proto: "tcp",
				Endpoints: []netip.AddrPort{ap("10.245.2.3:5657")}}, "no DNAT to endpoint 10.245.2.3:5657"},
		{"nftables: node port missing", NFTables, nftV4Dump, false,
			Want{Service: "default/demo-nodeport", Port: "tcp", Proto: "tcp", NodePort: 30081}, "no rule for node port 30081"},
		{"nftables: LB address missing", NFTables, nftV4Dump, false,
			Want{Service: "default/demo-loadbalancer", Port: "tcp", Proto: "tcp",
				Frontends: []netip.Addr{a("198.18.0.20")}}, "no rule for frontend 198.18.0.20"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			why := tc.want.missing(tc.mode, parseRules(tc.mode, tc.dump), tc.v6)
			if (tc.wantWhy == "") != (why == "") || !strings.Contains(why, tc.wantWhy) {
				t.Errorf("missing = %q, want %q", why, tc.wantWhy)
			}
		})
	}
}

func TestKubeProxyWants(t *testing.T) {
	yes, no := true, false
	name, port := "tcp", int32(5657)
	proto := corev1.ProtocolTCP
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec: corev1.ServiceSpec{ClusterIPs: []string{"10.96.0.10", "fd00::10"}, ExternalIPs: []string{"198.18.0.100"},
			Ports: []corev1.ServicePort{{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: 80, NodePort: 30080}}},
		Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: "198.18.0.200"}}}},
	}
	slice := &discoveryv1.EndpointSlice{
		Ports: []discoveryv1.EndpointPort{{Name: &name, Protocol: &proto, Port: &port}},
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.244.1.2"}, Conditions: discoveryv1.EndpointConditions{Ready: &yes}},
			{Addresses: []string{"10.244.1.3"}, Conditions: discoveryv1.EndpointConditions{Ready: &no}},
		},
	}
	got := Wants(svc, []*discoveryv1.EndpointSlice{slice})
	if len(got) != 1 {
		t.Fatalf("%d wants, want 1: %+v", len(got), got)
	}
	w := got[0]
	if w.Service != "default/web" || w.Port != "tcp" || w.Proto != "tcp" || w.NodePort != 30080 {
		t.Errorf("want %+v", w)
	}
	if got := fmt.Sprint(w.Frontends); got != "[10.96.0.10 fd00::10 198.18.0.100 198.18.0.200]" {
		t.Errorf("frontends %s, want cluster, external and LB ingress IPs", got)
	}
	if len(w.Endpoints) != 1 || w.Endpoints[0] != netip.MustParseAddrPort("10.244.1.2:5657") {
		t.Errorf("endpoints %v, want only the ready one", w.Endpoints)
	}
}
