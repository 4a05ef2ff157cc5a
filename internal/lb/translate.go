package lb

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// NodeInfo is what Translate needs to know about the node it translates for.
type NodeInfo struct {
	Name string // Node name: matches EndpointSlice endpoints' nodeName and forNodes hints
	Zone string // topology.kubernetes.io/zone label; "" = no zone (zone hints ignored)
}

// ZoneLabel is the Node label Translate's NodeInfo.Zone comes from.
const ZoneLabel = "topology.kubernetes.io/zone"

// ServiceNameLabel links an EndpointSlice to its Service.
const ServiceNameLabel = discoveryv1.LabelServiceName

// DefaultAffinityTimeout is Kubernetes' default sessionAffinity ClientIP timeout.
const DefaultAffinityTimeout = 10800 * time.Second

// maxAffinitySeconds is the API's upper bound for timeoutSeconds.
const maxAffinitySeconds = 86400

// Problem is one part of a Service or EndpointSlice that Translate skipped,
// and why. Everything else of the Service is still translated.
type Problem struct {
	Service string // namespace/name
	Object  string // what was skipped, e.g. "spec.ports[2]" or "EndpointSlice web-abc endpoints[3]"
	Reason  string
}

func (p Problem) String() string {
	return fmt.Sprintf("service %s: %s skipped: %s", p.Service, p.Object, p.Reason)
}

// ServiceKey is the namespace/name key of a Service.
func ServiceKey(namespace, name string) string { return namespace + "/" + name }

// candidate is a deduplicated endpoint address + port for one service port
// and family, before traffic policies are applied.
type candidate struct {
	Backend
	forZones []string
	forNodes []string
	hinted   bool // has zone hints
	nhinted  bool // has node hints
}

type portFamily struct {
	port  int // index into spec.ports
	is6   bool
	proto Proto
}

// Translate turns one Service and its EndpointSlices into the frontends this
// node programs, sorted by key, each with its backends sorted by address and
// port. Headless and ExternalName Services give nothing. Invalid parts are
// skipped and reported as Problems; Translate never panics on bad input.
//
// Policies applied: internalTrafficPolicy=Local on ClusterIP frontends,
// externalTrafficPolicy=Local on NodePort, ExternalIP and LoadBalancer
// frontends (only backends on node.Name are kept), topology hints (forNodes,
// then forZones) on frontends with the Cluster policy, sessionAffinity ClientIP.
func Translate(svc *corev1.Service, eps []*discoveryv1.EndpointSlice, node NodeInfo) ([]Frontend, []Problem) {
	if svc == nil {
		return nil, nil
	}
	key := ServiceKey(svc.Namespace, svc.Name)
	var probs []Problem
	bad := func(obj, format string, args ...any) {
		probs = append(probs, Problem{Service: key, Object: obj, Reason: fmt.Sprintf(format, args...)})
	}
	spec := &svc.Spec
	if spec.Type == corev1.ServiceTypeExternalName {
		return nil, nil
	}
	if spec.ClusterIP == corev1.ClusterIPNone {
		return nil, nil // headless: DNS only
	}

	// Addresses, per family.
	clusterIPs := spec.ClusterIPs
	if len(clusterIPs) == 0 && spec.ClusterIP != "" {
		clusterIPs = []string{spec.ClusterIP}
	}
	var cips []netip.Addr
	fams := map[bool]bool{} // is6 → present
	for i, s := range clusterIPs {
		a, err := parseIP(s)
		if err != nil {
			bad(fmt.Sprintf("spec.clusterIPs[%d]", i), "%v", err)
			continue
		}
		if !slices.Contains(cips, a) {
			cips = append(cips, a)
			fams[a.Is6()] = true
		}
	}
	if len(fams) == 0 { // no usable cluster IP: take the families from spec.ipFamilies
		for _, f := range spec.IPFamilies {
			fams[f == corev1.IPv6Protocol] = true
		}
	}
	if len(fams) == 0 {
		fams[false] = true
	}
	famOK := func(a netip.Addr) error {
		if !fams[a.Is6()] {
			return fmt.Errorf("%s is of an IP family the service does not have (spec.ipFamilies %v)", a, spec.IPFamilies)
		}
		return nil
	}
	var extIPs []netip.Addr
	for i, s := range spec.ExternalIPs {
		a, err := parseIP(s)
		if err == nil {
			err = famOK(a)
		}
		if err != nil {
			bad(fmt.Sprintf("spec.externalIPs[%d]", i), "%v", err)
			continue
		}
		extIPs = append(extIPs, a)
	}
	var lbIPs []netip.Addr
	if spec.Type == corev1.ServiceTypeLoadBalancer {
		for i, ing := range svc.Status.LoadBalancer.Ingress {
			obj := fmt.Sprintf("status.loadBalancer.ingress[%d]", i)
			if ing.IP == "" {
				bad(obj, "hostname-only ingress %q has no IP to program", ing.Hostname)
				continue
			}
			if ing.IPMode != nil && *ing.IPMode == corev1.LoadBalancerIPModeProxy {
				bad(obj, "ipMode Proxy: traffic to %s goes through the load balancer", ing.IP)
				continue
			}
			a, err := parseIP(ing.IP)
			if err == nil {
				err = famOK(a)
			}
			if err != nil {
				bad(obj, "%v", err)
				continue
			}
			lbIPs = append(lbIPs, a)
		}
	}
	nodePorts := spec.Type == corev1.ServiceTypeNodePort || spec.Type == corev1.ServiceTypeLoadBalancer

	var affinity time.Duration
	if spec.SessionAffinity == corev1.ServiceAffinityClientIP {
		affinity = DefaultAffinityTimeout
		if c := spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
			if t := *c.ClientIP.TimeoutSeconds; t > 0 && t <= maxAffinitySeconds {
				affinity = time.Duration(t) * time.Second
			} else {
				bad("spec.sessionAffinityConfig.clientIP.timeoutSeconds", "%d is outside 1..%d: using the default %s", t, maxAffinitySeconds, DefaultAffinityTimeout)
			}
		}
	}
	itpLocal := spec.InternalTrafficPolicy != nil && *spec.InternalTrafficPolicy == corev1.ServiceInternalTrafficPolicyLocal
	etpLocal := spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
	ns := translateNorthSouth(svc, bad) // algorithm, source ranges, health-check port

	index := indexSlices(key, eps, bad)

	seen := map[FrontendKey]bool{}
	var out []Frontend
	for i := range spec.Ports {
		sp := &spec.Ports[i]
		obj := func() string { return fmt.Sprintf("spec.ports[%d]", i) } // only when something is wrong
		proto, ok := protoOf(sp.Protocol)
		if !ok {
			bad(obj(), "protocol %q is not TCP, UDP or SCTP", sp.Protocol)
			continue
		}
		if sp.Port <= 0 || sp.Port > 65535 {
			bad(obj(), "port %d is outside 1..65535", sp.Port)
			continue
		}
		cands := map[bool][]candidate{} // per family, built lazily
		backends := func(is6, local bool) []Backend {
			c, ok := cands[is6]
			if !ok {
				c = index.candidates(sp.Name, proto, is6)
				cands[is6] = c
			}
			return choose(c, node, local)
		}
		add := func(addr netip.Addr, port int32, kind Kind, scope Scope, local bool) {
			k := FrontendKey{Addr: addr, Port: uint16(port), Proto: proto, Scope: scope}
			if seen[k] {
				bad(fmt.Sprintf("%s %s %s", obj(), kind, fmtKey(k)), "duplicate of another frontend of this service")
				return
			}
			seen[k] = true
			out = append(out, Frontend{
				Key: k, Kind: kind, Service: key, PortName: sp.Name,
				Backends: backends(addr.Is6(), local), Affinity: affinity, LocalOnly: local,
			})
		}
		for _, a := range cips {
			add(a, sp.Port, KindClusterIP, ScopeCluster, itpLocal)
		}
		for _, a := range extIPs {
			add(a, sp.Port, KindExternalIP, ScopeCluster, etpLocal)
		}
		for _, a := range lbIPs {
			add(a, sp.Port, KindLoadBalancer, ScopeCluster, etpLocal)
		}
		if nodePorts && sp.NodePort != 0 {
			if sp.NodePort < 0 || sp.NodePort > 65535 {
				bad(obj(), "nodePort %d is outside 1..65535", sp.NodePort)
				continue
			}
			for _, is6 := range []bool{false, true} {
				if fams[is6] {
					add(unspecified(is6), sp.NodePort, KindNodePort, ScopeNodePort, etpLocal)
				}
			}
		}
	}
	for i := range out {
		ns.apply(&out[i])
	}
	slices.SortFunc(out, func(a, b Frontend) int { return CompareKeys(a.Key, b.Key) })
	return out, probs
}

// CompareKeys orders frontend keys: IPv4 before IPv6, then address, port,
// protocol, scope.
func CompareKeys(a, b FrontendKey) int {
	return cmp.Or(a.Addr.Compare(b.Addr), cmp.Compare(a.Port, b.Port), cmp.Compare(a.Proto, b.Proto), cmp.Compare(a.Scope, b.Scope))
}

// CompareBackends orders backends by address, then port: the order of
// Frontend.Backends everywhere (translation, golden text, map read-back).
func CompareBackends(a, b Backend) int {
	return cmp.Or(a.Addr.Compare(b.Addr), cmp.Compare(a.Port, b.Port))
}

func unspecified(is6 bool) netip.Addr {
	if is6 {
		return netip.IPv6Unspecified()
	}
	return netip.IPv4Unspecified()
}

func parseIP(s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(strings.TrimSpace(s))
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%q is not an IP address", s)
	}
	if a.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("%q has a zone: not a service address", s)
	}
	if a.IsUnspecified() || a.IsMulticast() {
		return netip.Addr{}, fmt.Errorf("%s is not a unicast address", a)
	}
	return a.Unmap(), nil
}

func protoOf(p corev1.Protocol) (Proto, bool) {
	switch p {
	case corev1.ProtocolTCP, "":
		return TCP, true
	case corev1.ProtocolUDP:
		return UDP, true
	case corev1.ProtocolSCTP:
		return SCTP, true
	}
	return 0, false
}

// sliceIndex holds every usable endpoint of a Service's slices, by
// (port name, protocol, family), sorted by address and port, each address
// and port once.
type sliceIndex map[sliceKey][]candidate

type sliceKey struct {
	name  string
	proto Proto
	is6   bool
}

func indexSlices(svc string, eps []*discoveryv1.EndpointSlice, bad func(obj, f string, a ...any)) sliceIndex {
	idx := sliceIndex{}
	n := 0 // endpoints of all slices: room for each port's list at once
	for _, es := range eps {
		if es != nil {
			n += len(es.Endpoints)
		}
	}
	for _, es := range eps {
		if es == nil {
			continue
		}
		var is6 bool
		switch es.AddressType {
		case discoveryv1.AddressTypeIPv4:
		case discoveryv1.AddressTypeIPv6:
			is6 = true
		default:
			continue // FQDN slices carry no addresses to program
		}
		type sport struct {
			key  sliceKey
			port uint16
		}
		var ports []sport
		for j, p := range es.Ports {
			obj := func() string { return fmt.Sprintf("EndpointSlice %s ports[%d]", es.Name, j) }
			proto := corev1.ProtocolTCP
			if p.Protocol != nil {
				proto = *p.Protocol
			}
			pr, ok := protoOf(proto)
			if !ok {
				bad(obj(), "protocol %q is not TCP, UDP or SCTP", proto)
				continue
			}
			if p.Port == nil || *p.Port <= 0 || *p.Port > 65535 {
				bad(obj(), "port is missing or outside 1..65535")
				continue
			}
			var name string
			if p.Name != nil {
				name = *p.Name
			}
			ports = append(ports, sport{sliceKey{name, pr, is6}, uint16(*p.Port)})
		}
		if len(ports) == 0 {
			continue
		}
		for j := range es.Endpoints {
			ep := &es.Endpoints[j]
			c := candidate{Backend: Backend{State: stateOf(ep.Conditions)}}
			if ep.NodeName != nil {
				c.NodeName = *ep.NodeName
			}
			if ep.Zone != nil {
				c.Zone = *ep.Zone
			}
			if h := ep.Hints; h != nil {
				for _, z := range h.ForZones {
					c.forZones = append(c.forZones, z.Name)
				}
				for _, n := range h.ForNodes {
					c.forNodes = append(c.forNodes, n.Name)
				}
				c.hinted, c.nhinted = len(c.forZones) > 0, len(c.forNodes) > 0
			}
			for k, s := range ep.Addresses {
				a, err := parseIP(s)
				if err == nil && a.Is6() != is6 {
					err = fmt.Errorf("%s does not match the slice's addressType %s", a, es.AddressType)
				}
				if err != nil {
					bad(fmt.Sprintf("EndpointSlice %s endpoints[%d].addresses[%d]", es.Name, j, k), "%v", err)
					continue
				}
				for _, p := range ports {
					cc := c
					cc.Addr, cc.Port = a, p.port
					l, ok := idx[p.key]
					if !ok {
						l = make([]candidate, 0, n)
					}
					idx[p.key] = append(l, cc)
				}
			}
		}
	}
	// Sorted by address and port; a duplicate across slices (e.g. during a
	// slice split) keeps its best state.
	for k, cs := range idx {
		slices.SortFunc(cs, func(a, b candidate) int {
			return cmp.Or(CompareBackends(a.Backend, b.Backend), cmp.Compare(a.State, b.State))
		})
		idx[k] = slices.CompactFunc(cs, func(a, b candidate) bool { return a.Addr == b.Addr && a.Port == b.Port })
	}
	return idx
}

// candidates returns the endpoints for one port (shared: do not modify).
func (idx sliceIndex) candidates(portName string, proto Proto, is6 bool) []candidate {
	return idx[sliceKey{portName, proto, is6}]
}

// stateOf maps EndpointSlice conditions as kube-proxy reads them: ready
// (nil = ready) → Active, terminating or not (the EndpointSlice controller
// keeps a terminating pod ready only for a Service with
// publishNotReadyAddresses, whose clients must reach it); serving and
// terminating → Terminating; anything else → Quarantined.
func stateOf(c discoveryv1.EndpointConditions) BackendState {
	ready := c.Ready == nil || *c.Ready
	serving := ready
	if c.Serving != nil {
		serving = *c.Serving
	}
	terminating := c.Terminating != nil && *c.Terminating
	switch {
	case ready:
		return Active
	case serving && terminating:
		return Terminating
	}
	return Quarantined
}

// choose applies the traffic policy (local: only backends on this node) or,
// for the Cluster policy, topology hints.
func choose(cands []candidate, node NodeInfo, local bool) []Backend {
	keep := func(f func(candidate) bool) []Backend {
		out := make([]Backend, 0, len(cands))
		for _, c := range cands {
			if f(c) {
				out = append(out, c.Backend)
			}
		}
		return out
	}
	if local {
		return keep(func(c candidate) bool { return c.NodeName != "" && c.NodeName == node.Name })
	}
	// Hints are used only when every active endpoint carries them and at
	// least one is meant for this node (as kube-proxy does); forNodes first.
	if node.Name != "" && usable(cands, func(c candidate) bool { return c.nhinted }, func(c candidate) bool { return slices.Contains(c.forNodes, node.Name) }) {
		return keep(func(c candidate) bool { return slices.Contains(c.forNodes, node.Name) })
	}
	if node.Zone != "" && usable(cands, func(c candidate) bool { return c.hinted }, func(c candidate) bool { return slices.Contains(c.forZones, node.Zone) }) {
		return keep(func(c candidate) bool { return slices.Contains(c.forZones, node.Zone) })
	}
	return keep(func(candidate) bool { return true })
}

func usable(cands []candidate, has, forMe func(candidate) bool) bool {
	mine := false
	for _, c := range cands {
		if c.State != Active {
			continue
		}
		if !has(c) {
			return false
		}
		mine = mine || forMe(c)
	}
	return mine
}
