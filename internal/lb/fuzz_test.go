package lb

import (
	"encoding/json"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// FuzzTranslate: whatever JSON the apiserver (or a broken client) hands us,
// Translate neither panics nor emits a frontend with a backend of the other
// family. Run longer with: go test ./internal/lb -fuzz FuzzTranslate -fuzztime 60s
func FuzzTranslate(f *testing.F) {
	s, _ := json.Marshal(svc("default", "web", clusterIPs("10.96.0.10", "fd00::10"), typ(corev1.ServiceTypeLoadBalancer)))
	es, _ := json.Marshal([]*discoveryv1.EndpointSlice{slice("a", "web", v4, http80(), ep{addr: "10.244.1.5", node: "node1", zones: []string{"z"}})})
	f.Add(s, es, "node1", "z")
	f.Add([]byte(`{"spec":{"clusterIP":"1.2.3.4","ports":[{"port":-1},{"port":80,"nodePort":99999,"protocol":"UDP"}],"type":"NodePort"}}`),
		[]byte(`[{"addressType":"IPv6","ports":[{"port":0}],"endpoints":[{"addresses":["::1","x"]}]},null]`), "", "")
	f.Fuzz(func(t *testing.T, svcJSON, slicesJSON []byte, node, zone string) {
		var s corev1.Service
		var eps []*discoveryv1.EndpointSlice
		_ = json.Unmarshal(svcJSON, &s)
		_ = json.Unmarshal(slicesJSON, &eps)
		fs, _ := Translate(&s, eps, NodeInfo{Name: node, Zone: zone})
		for _, f := range fs {
			for _, b := range f.Backends {
				if b.Addr.Is6() != f.Key.Addr.Is6() {
					t.Fatalf("frontend %v has backend %v of the other family", f.Key, b.Addr)
				}
			}
		}
		_ = Render(fs)
		NewTable().Apply("x/y", fs)
	})
}
