package lb

// The per-Service choices the
// tc/XDP load balancer needs beyond the socket LB's — backend selection
// algorithm, loadBalancerSourceRanges and healthCheckNodePort.

import (
	"fmt"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// Algorithm is how the north-south load balancer picks a backend for a new flow.
type Algorithm string

const (
	// AlgorithmDefault: the node's default (agent flag --lb-algorithm).
	AlgorithmDefault Algorithm = ""
	// AlgorithmRandom: a random active backend per new flow.
	AlgorithmRandom Algorithm = "random"
	// AlgorithmMaglev: a Maglev consistent-hash table slot per 5-tuple, so every
	// node picks the same backend for the same flow and a backend change moves
	// few flows (internal/maglev).
	AlgorithmMaglev Algorithm = "maglev"
)

// AnnotationAlgorithm selects the algorithm per Service: "maglev" or "random".
// A missing annotation means the node default; any other value is reported
// as a Problem (and an Event) and the default is used.
const AnnotationAlgorithm = "axon.io/lb-algorithm"

// ParseAlgorithm parses an --lb-algorithm flag or annotation value.
func ParseAlgorithm(s string) (Algorithm, error) {
	switch a := Algorithm(strings.ToLower(strings.TrimSpace(s))); a {
	case AlgorithmRandom, AlgorithmMaglev:
		return a, nil
	}
	return AlgorithmDefault, fmt.Errorf("%q is not a load-balancing algorithm: use %q or %q", s, AlgorithmRandom, AlgorithmMaglev)
}

// northSouth is what translateNorthSouth extracts from a Service.
type northSouth struct {
	alg          Algorithm
	sourceRanges []netip.Prefix
	hcPort       uint16
}

// translateNorthSouth reads the annotation, spec.loadBalancerSourceRanges and
// spec.healthCheckNodePort. Bad entries are reported with bad() and skipped.
func translateNorthSouth(svc *corev1.Service, bad func(obj, format string, args ...any)) northSouth {
	var ns northSouth
	if v, ok := svc.Annotations[AnnotationAlgorithm]; ok {
		a, err := ParseAlgorithm(v)
		if err != nil {
			bad("metadata.annotations["+AnnotationAlgorithm+"]", "%v: using the node default", err)
		}
		ns.alg = a
	}
	if svc.Spec.Type == corev1.ServiceTypeLoadBalancer {
		for i, s := range svc.Spec.LoadBalancerSourceRanges {
			p, err := netip.ParsePrefix(strings.TrimSpace(s))
			if err != nil {
				bad(fmt.Sprintf("spec.loadBalancerSourceRanges[%d]", i), "%q is not a CIDR such as 203.0.113.0/24", s)
				continue
			}
			ns.sourceRanges = append(ns.sourceRanges, p.Masked())
		}
		if svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal {
			if p := svc.Spec.HealthCheckNodePort; p > 0 && p <= 65535 {
				ns.hcPort = uint16(p)
			} else if p != 0 {
				bad("spec.healthCheckNodePort", "%d is outside 1..65535", p)
			}
		}
	}
	return ns
}

// apply sets the north-south fields on a frontend of the given kind.
// Source ranges restrict LoadBalancer ingress IPs only (as kube-proxy does);
// the health-check port is carried by every externally reachable frontend
// of an externalTrafficPolicy=Local Service.
func (ns northSouth) apply(f *Frontend) {
	f.Algorithm = ns.alg
	if f.Kind == KindLoadBalancer && len(ns.sourceRanges) > 0 {
		// One list holds both families' ranges; each frontend gets its own
		// family's (as kube-proxy, whose per-family proxiers also treat a
		// family left without ranges as unrestricted).
		f.SourceRanges = nil
		for _, p := range ns.sourceRanges {
			if p.Addr().Is4() == f.Key.Addr.Unmap().Is4() {
				f.SourceRanges = append(f.SourceRanges, p)
			}
		}
	}
	if f.LocalOnly && f.Kind != KindClusterIP {
		f.HealthCheckNodePort = ns.hcPort
	}
}

// LocalEndpoints counts the distinct active backends of a Service's frontends
// that run on node: what the healthCheckNodePort server reports as
// localEndpoints (kube-proxy counts ready local endpoints).
func LocalEndpoints(fs []Frontend, node string) int {
	seen := map[netip.Addr]bool{}
	for _, f := range fs {
		for _, b := range f.Backends {
			if b.State == Active && b.NodeName == node {
				seen[b.Addr] = true
			}
		}
	}
	return len(seen)
}
