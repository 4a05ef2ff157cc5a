package clusterdns

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/scheme"
)

func TestServiceIPs(t *testing.T) {
	for _, tc := range []struct {
		cidrs, want, err string
	}{
		{"10.96.0.0/16,fd00:10:96::/112", "10.96.0.10 fd00:10:96::a", ""},
		{"10.96.0.5/16", "10.96.0.10", ""}, // masked first
		{"10.0.0.0/29", "", "too small"},
		{"10.96.0.0/16,nope", "", `service CIDR "nope"`},
	} {
		got, err := ServiceIPs(tc.cidrs)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ServiceIPs(%q) = %v, %v; want an error with %q", tc.cidrs, got, err, tc.err)
			}
			continue
		}
		var s []string
		for _, a := range got {
			s = append(s, a.String())
		}
		if err != nil || strings.Join(s, " ") != tc.want {
			t.Errorf("ServiceIPs(%q) = %v, %v; want %s", tc.cidrs, got, err, tc.want)
		}
	}
}

// decode parses the manifest's documents with the client's scheme, as the apiserver would.
func decode(t *testing.T, b []byte) []runtime.Object {
	t.Helper()
	var out []runtime.Object
	for _, doc := range strings.Split(string(b), "\n---\n") {
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode([]byte(doc), nil, nil)
		if err != nil {
			t.Fatalf("decode %q: %v", doc, err)
		}
		out = append(out, obj)
	}
	return out
}

func TestManifest(t *testing.T) {
	v4, v6 := netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd00:10:96::a")
	const img = "registry.k8s.io/e2e-test-images/agnhost:2.63.0"
	for _, tc := range []struct {
		name   string
		ips    []netip.Addr
		policy corev1.IPFamilyPolicy
	}{
		{"dual-stack", []netip.Addr{v4, v6}, corev1.IPFamilyPolicyRequireDualStack},
		{"IPv4 only", []netip.Addr{v4}, corev1.IPFamilyPolicySingleStack},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := Manifest(Config{Image: img, ServiceIPs: tc.ips})
			if err != nil {
				t.Fatal(err)
			}
			var kinds []string
			for _, obj := range decode(t, b) {
				kinds = append(kinds, obj.GetObjectKind().GroupVersionKind().Kind)
				switch o := obj.(type) {
				case *corev1.ConfigMap:
					if o.Name != Deployment || o.Namespace != Namespace || !strings.Contains(o.Data["Corefile"], "kubernetes cluster.local in-addr.arpa ip6.arpa {") {
						t.Errorf("ConfigMap %s/%s, Corefile %q: want kube-system/coredns serving cluster.local", o.Namespace, o.Name, o.Data["Corefile"])
					}
				case *appsv1.Deployment:
					c := o.Spec.Template.Spec.Containers[0]
					if o.Name != Deployment || o.Namespace != Namespace || *o.Spec.Replicas != Replicas ||
						o.Spec.Template.Labels["k8s-app"] != Service || c.Image != img ||
						!slices.Equal(c.Command, []string{"/coredns"}) || o.Spec.Template.Spec.DNSPolicy != corev1.DNSDefault {
						t.Errorf("Deployment %s/%s: replicas %d, labels %v, container %s %v, dnsPolicy %s",
							o.Namespace, o.Name, *o.Spec.Replicas, o.Spec.Template.Labels, c.Image, c.Command, o.Spec.Template.Spec.DNSPolicy)
					}
				case *corev1.Service:
					var want []string
					for _, a := range tc.ips {
						want = append(want, a.String())
					}
					if o.Name != Service || o.Spec.ClusterIP != want[0] || !slices.Equal(o.Spec.ClusterIPs, want) || *o.Spec.IPFamilyPolicy != tc.policy ||
						o.Spec.Selector["k8s-app"] != Service || len(o.Spec.Ports) != 2 {
						t.Errorf("Service %s: clusterIP %s, clusterIPs %v (want %v, the first as clusterIP), policy %s (want %s), selector %v, %d ports",
							o.Name, o.Spec.ClusterIP, o.Spec.ClusterIPs, want, *o.Spec.IPFamilyPolicy, tc.policy, o.Spec.Selector, len(o.Spec.Ports))
					}
				}
			}
			if want := []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap", "Deployment", "Service"}; !slices.Equal(kinds, want) {
				t.Errorf("objects %v, want %v", kinds, want)
			}
		})
	}
}

func TestManifestRejects(t *testing.T) {
	v4 := netip.MustParseAddr("10.96.0.10")
	for _, c := range []Config{
		{Image: "", ServiceIPs: []netip.Addr{v4}},
		{Image: "x\n  evil: 1", ServiceIPs: []netip.Addr{v4}},
		{Image: "agnhost"},
		{Image: "agnhost", ServiceIPs: []netip.Addr{v4, netip.MustParseAddr("10.96.0.11")}},
	} {
		if b, err := Manifest(c); err == nil {
			t.Errorf("Manifest(%+v) rendered %d bytes, want an error", c, len(b))
		}
	}
}
