package lb

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current output")

// golden compares got with testdata/<name>.golden (rewritten with -update).
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read golden file (run go test -run %s -update to create it): %v", t.Name(), err)
	}
	if string(want) != got {
		t.Errorf("%s differs from the output (run with -update to accept):\n--- want\n%s--- got\n%s", path, want, got)
	}
}

func ptr[T any](v T) *T { return &v }

type svcOpt func(*corev1.Service)

func svc(ns, name string, opts ...svcOpt) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.ServiceSpec{
			Type:      corev1.ServiceTypeClusterIP,
			ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
			IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
			Ports:      []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(8080)}},
		},
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

func clusterIPs(ips ...string) svcOpt {
	return func(s *corev1.Service) {
		s.Spec.ClusterIP, s.Spec.ClusterIPs, s.Spec.IPFamilies = ips[0], ips, nil
		for _, ip := range ips {
			if strings.Contains(ip, ":") {
				s.Spec.IPFamilies = append(s.Spec.IPFamilies, corev1.IPv6Protocol)
			} else {
				s.Spec.IPFamilies = append(s.Spec.IPFamilies, corev1.IPv4Protocol)
			}
		}
	}
}

func ports(ps ...corev1.ServicePort) svcOpt {
	return func(s *corev1.Service) { s.Spec.Ports = ps }
}

func typ(t corev1.ServiceType) svcOpt { return func(s *corev1.Service) { s.Spec.Type = t } }

type ep struct {
	addr        string
	node, zone  string
	ready       *bool
	serving     *bool
	terminating *bool
	zones       []string
	nodes       []string
}

func slice(name, svcName string, fam discoveryv1.AddressType, sps []discoveryv1.EndpointPort, eps ...ep) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: name, Labels: map[string]string{ServiceNameLabel: svcName}},
		AddressType: fam,
		Ports:       sps,
	}
	for _, e := range eps {
		x := discoveryv1.Endpoint{
			Addresses:  []string{e.addr},
			Conditions: discoveryv1.EndpointConditions{Ready: e.ready, Serving: e.serving, Terminating: e.terminating},
		}
		if e.node != "" {
			x.NodeName = ptr(e.node)
		}
		if e.zone != "" {
			x.Zone = ptr(e.zone)
		}
		if len(e.zones)+len(e.nodes) > 0 {
			x.Hints = &discoveryv1.EndpointHints{}
			for _, z := range e.zones {
				x.Hints.ForZones = append(x.Hints.ForZones, discoveryv1.ForZone{Name: z})
			}
			for _, n := range e.nodes {
				x.Hints.ForNodes = append(x.Hints.ForNodes, discoveryv1.ForNode{Name: n})
			}
		}
		es.Endpoints = append(es.Endpoints, x)
	}
	return es
}

func eport(name string, port int32, proto corev1.Protocol) discoveryv1.EndpointPort {
	return discoveryv1.EndpointPort{Name: ptr(name), Port: ptr(port), Protocol: ptr(proto)}
}
