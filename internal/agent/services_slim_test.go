package agent

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/axonhq/axon/internal/lb"
)

// The cached copies translate exactly like the objects from the apiserver,
// share their condition values and node names, drop what the agent never
// reads, and leave the originals untouched.
func TestSlimServiceObjects(t *testing.T) {
	ptr := func(b bool) *bool { return &b }
	str := func(s string) *string { return &s }
	port := int32(8080)
	tcp := corev1.ProtocolTCP
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop", ResourceVersion: "7",
			Annotations:   map[string]string{"axon.io/lb-algorithm": "maglev", "kubectl.kubernetes.io/last-applied-configuration": "{...}"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
			Selector: map[string]string{"app": "web"}, SessionAffinity: corev1.ServiceAffinityClientIP,
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, NodePort: 30080, Protocol: tcp, TargetPort: intstr.FromInt32(8080)}}},
	}
	var eps []discoveryv1.Endpoint
	for i, a := range []string{"10.244.1.5", "10.244.2.5", "10.244.1.6"} {
		node := []string{"node1", "node2", "node1"}[i]
		eps = append(eps, discoveryv1.Endpoint{Addresses: []string{a}, NodeName: str(node), Zone: str("z1"),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(i != 2), Serving: ptr(true), Terminating: ptr(i == 2)},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Name: "web-" + a}})
	}
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "web-abc", Namespace: "shop", Labels: map[string]string{discoveryv1.LabelServiceName: "web", "other": "x"}},
		AddressType: discoveryv1.AddressTypeIPv4, Endpoints: eps,
		Ports: []discoveryv1.EndpointPort{{Name: str("http"), Port: &port, Protocol: &tcp}},
	}
	sl := newSlimmer()
	o1, err := sl.slim(svc)
	if err != nil {
		t.Fatal(err)
	}
	o2, err := sl.slim(es)
	if err != nil {
		t.Fatal(err)
	}
	ssvc, ses := o1.(*corev1.Service), o2.(*discoveryv1.EndpointSlice)
	for _, node := range []lb.NodeInfo{{Name: "node1", Zone: "z1"}, {Name: "node2"}} {
		want, _ := lb.Translate(svc, []*discoveryv1.EndpointSlice{es}, node)
		got, _ := lb.Translate(ssvc, []*discoveryv1.EndpointSlice{ses}, node)
		if lb.Render(want) != lb.Render(got) {
			t.Errorf("node %s: slim objects translate differently:\n%s\nvs\n%s", node.Name, lb.Render(want), lb.Render(got))
		}
	}
	if ssvc.Spec.Selector != nil || ssvc.ManagedFields != nil || len(ssvc.Annotations) != 1 || ses.Labels["other"] != "" || ses.Endpoints[0].TargetRef != nil {
		t.Errorf("slim copies keep what the agent does not read: %+v / %+v", ssvc.ObjectMeta, ses.ObjectMeta)
	}
	e := ses.Endpoints
	if e[0].NodeName != e[2].NodeName || e[0].Zone != e[1].Zone || e[0].Conditions.Serving != e[1].Conditions.Serving ||
		e[0].Conditions.Ready != e[1].Conditions.Ready || e[2].Conditions.Ready != e[0].Conditions.Terminating {
		t.Error("equal node names and condition values are not shared")
	}
	if *e[2].Conditions.Ready || !*e[2].Conditions.Terminating || *e[1].NodeName != "node2" {
		t.Error("shared values changed what they say")
	}
	if svc.Spec.Selector == nil || len(svc.ManagedFields) != 1 || es.Endpoints[0].NodeName == e[0].NodeName {
		t.Error("the original objects were modified or aliased")
	}
}
