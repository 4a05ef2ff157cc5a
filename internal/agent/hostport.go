package agent

// Pod hostPorts → HostPort frontends.
//
// Every container port with a hostPort of a Running pod on this node, with a
// pod IP, becomes a frontend of kind HostPort that translates to the pod's
// IP:containerPort, one per pod IP family:
//
//   - hostIP empty: the wildcard frontend of each family of the pod's IPs
//     (lb.ScopeHostPort: every address of the node and loopback, as
//     NodePorts), 0.0.0.0:<hostPort> and [::]:<hostPort>;
//   - hostIP 0.0.0.0 or ::: the wildcard of that family only;
//   - any other hostIP: that address only (an exact frontend: lb.ScopeCluster
//     with kind HostPort, matched before NodePorts).
//
// The frontends go into the Service watch's table under the key
// "pod/<namespace>/<name>", so they reach the socket LB and the north-south
// LB through the same writers, incrementally, and show in `axon service list`
// and `axon bpf lb list`. Two pods asking for the same hostIP:hostPort/proto:
// the one that had it keeps it and the other gets a Warning Event
// (HostPortConflict); when the first goes, the other takes over. A hostPort
// that a NodePort Service also uses gets a Warning Event (HostPortShadowed):
// NodePorts are matched before wildcard hostPorts, so on this node's
// addresses the Service wins. hostNetwork pods need no translation and are
// skipped.

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/axonhq/axon/internal/lb"
)

// queueHostPort asks the Service watch to recompute the HostPort frontends.
const queueHostPort = "@hostport"

// HostPortKeyPrefix prefixes the table key (and the name shown by `axon
// service list`) of a pod's HostPort frontends: "pod/<namespace>/<name>".
// No Service key has two slashes, so the two never collide.
const HostPortKeyPrefix = "pod/"

// Event reasons of the HostPort source (Warning).
const (
	ReasonHostPortConflict = "HostPortConflict" // another pod on this node already has the hostIP:hostPort/proto
	ReasonHostPortShadowed = "HostPortShadowed" // a NodePort Service uses the same port on this node
	ReasonHostPortInvalid  = "HostPortInvalid"  // a container port that cannot be programmed (bad hostIP, no pod IP of its family)
)

// hostPorts is the HostPort source of a serviceSync.
type hostPorts struct {
	pods    listersv1.PodLister
	synced  cache.InformerSynced
	applied map[string]bool // table keys holding frontends now
}

// watchHostPorts makes the Service watch also translate the hostPorts of
// the pods k watches (this node's). Call before run: run then waits for the
// Pod cache too, so the first sync never drops a previous run's HostPort
// frontends.
func (s *serviceSync) watchHostPorts(k *kube) error {
	podInf := k.podFactory.Core().V1().Pods().Informer() // the shared informer kube already runs
	h := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { s.hostPortPodChanged(nil, o) },
		UpdateFunc: func(old, o any) { s.hostPortPodChanged(old, o) },
		DeleteFunc: func(o any) { s.hostPortPodChanged(nil, o) },
	}
	if _, err := podInf.AddEventHandler(h); err != nil {
		return fmt.Errorf("hostPort: add pod event handler: %w", err)
	}
	// A NodePort Service created or changed later may collide with a hostPort.
	svcInf := s.factory.Core().V1().Services().Informer()
	if _, err := svcInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { s.hostPortServiceChanged(o) },
		UpdateFunc: func(_, o any) { s.hostPortServiceChanged(o) },
		DeleteFunc: func(o any) { s.hostPortServiceChanged(o) },
	}); err != nil {
		return fmt.Errorf("hostPort: add service event handler: %w", err)
	}
	s.mu.Lock()
	s.hp = &hostPorts{pods: k.pods, synced: podInf.HasSynced, applied: map[string]bool{}}
	s.mu.Unlock()
	s.hasSynced = append(s.hasSynced, podInf.HasSynced)
	return nil
}

func (s *serviceSync) hostPortPodChanged(old, o any) {
	if hasHostPorts(old) || hasHostPorts(o) || s.hostPortApplied(o) {
		s.queue.Add(queueHostPort)
	}
}

func (s *serviceSync) hostPortServiceChanged(o any) {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = d.Obj
	}
	svc, ok := o.(*corev1.Service)
	if !ok {
		return
	}
	for _, p := range svc.Spec.Ports {
		if p.NodePort != 0 {
			s.queue.Add(queueHostPort)
			return
		}
	}
}

// hostPortApplied says whether o (a Pod) has frontends in the table now.
func (s *serviceSync) hostPortApplied(o any) bool {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = d.Obj
	}
	p, ok := o.(*corev1.Pod)
	if !ok {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hp != nil && s.hp.applied[hostPortKey(p)]
}

func hasHostPorts(o any) bool {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = d.Obj
	}
	p, ok := o.(*corev1.Pod)
	if !ok || p == nil {
		return false
	}
	for _, c := range p.Spec.Containers {
		for _, cp := range c.Ports {
			if cp.HostPort != 0 {
				return true
			}
		}
	}
	return false
}

func hostPortKey(p *corev1.Pod) string {
	return HostPortKeyPrefix + p.Namespace + "/" + p.Name
}

// slimHostPorts copies what the HostPort source needs from a Pod into the
// agent's slim cached copy (kube.go slimPod): container ports with a
// hostPort, hostNetwork, phase, pod IPs and the creation/deletion times.
func slimHostPorts(p, slim *corev1.Pod) {
	if !hasHostPorts(p) {
		return
	}
	slim.CreationTimestamp = p.CreationTimestamp
	slim.DeletionTimestamp = p.DeletionTimestamp
	slim.Spec.HostNetwork = p.Spec.HostNetwork
	for _, c := range p.Spec.Containers {
		var ports []corev1.ContainerPort
		for _, cp := range c.Ports {
			if cp.HostPort != 0 {
				ports = append(ports, cp)
			}
		}
		if len(ports) > 0 {
			slim.Spec.Containers = append(slim.Spec.Containers, corev1.Container{Name: c.Name, Ports: ports})
		}
	}
	slim.Status.Phase = p.Status.Phase
	slim.Status.PodIP = p.Status.PodIP
	slim.Status.PodIPs = p.Status.PodIPs
}

// hostPortProblem is a container port that is skipped, and why.
type hostPortProblem struct {
	port   string // e.g. "container app port 30900/TCP"
	reason string
}

// translateHostPorts returns the HostPort frontends of one pod (pure
// logic): none unless the pod is Running, not hostNetwork and has an IP.
func translateHostPorts(p *corev1.Pod, node string) ([]lb.Frontend, []hostPortProblem) {
	if p == nil || p.Spec.HostNetwork || p.Status.Phase != corev1.PodRunning {
		return nil, nil
	}
	var ips []netip.Addr
	for _, ip := range p.Status.PodIPs {
		if a, err := netip.ParseAddr(ip.IP); err == nil {
			ips = append(ips, a.Unmap())
		}
	}
	if len(ips) == 0 {
		if a, err := netip.ParseAddr(p.Status.PodIP); err == nil {
			ips = append(ips, a.Unmap())
		}
	}
	if len(ips) == 0 {
		return nil, nil
	}
	state := lb.Active
	if p.DeletionTimestamp != nil {
		state = lb.Terminating
	}
	var fs []lb.Frontend
	var probs []hostPortProblem
	seen := map[lb.FrontendKey]bool{}
	for _, c := range p.Spec.Containers {
		for _, cp := range c.Ports {
			if cp.HostPort == 0 {
				continue
			}
			proto := cp.Protocol
			if proto == "" {
				proto = corev1.ProtocolTCP
			}
			what := fmt.Sprintf("container %s hostPort %d/%s", c.Name, cp.HostPort, proto)
			bad := func(format string, args ...any) {
				probs = append(probs, hostPortProblem{port: what, reason: fmt.Sprintf(format, args...)})
			}
			var lp lb.Proto
			switch proto {
			case corev1.ProtocolTCP:
				lp = lb.TCP
			case corev1.ProtocolUDP:
				lp = lb.UDP
			case corev1.ProtocolSCTP:
				lp = lb.SCTP
			default:
				bad("protocol %q is not TCP, UDP or SCTP", proto)
				continue
			}
			if cp.HostPort < 1 || cp.HostPort > 65535 || cp.ContainerPort < 1 || cp.ContainerPort > 65535 {
				bad("hostPort %d / containerPort %d outside 1..65535", cp.HostPort, cp.ContainerPort)
				continue
			}
			// The addresses this port listens on: the wildcard of each
			// family (hostIP empty), one family's wildcard, or one address.
			var fronts []netip.Addr
			hostIP := strings.TrimSpace(cp.HostIP)
			switch {
			case hostIP == "":
				fronts = []netip.Addr{netip.IPv4Unspecified(), netip.IPv6Unspecified()}
			default:
				a, err := netip.ParseAddr(hostIP)
				if err != nil {
					bad("hostIP %q is not an IP address: leave it empty for every node address", cp.HostIP)
					continue
				}
				fronts = []netip.Addr{a.Unmap()}
			}
			matched := false
			for _, fa := range fronts {
				for _, ip := range ips {
					if ip.Is4() != fa.Is4() {
						continue
					}
					matched = true
					scope := lb.ScopeHostPort
					if !fa.IsUnspecified() {
						scope = lb.ScopeCluster
					}
					k := lb.FrontendKey{Addr: fa, Port: uint16(cp.HostPort), Proto: lp, Scope: scope}
					if seen[k] {
						continue // a second pod IP of the same family: the first serves
					}
					seen[k] = true
					fs = append(fs, lb.Frontend{Key: k, Kind: lb.KindHostPort, PortName: cp.Name,
						Backends: []lb.Backend{{Addr: ip, Port: uint16(cp.ContainerPort), State: state, NodeName: node}}})
				}
			}
			if !matched && hostIP != "" {
				bad("hostIP %s has no pod IP of its family (pod IPs %v)", hostIP, ips)
			}
		}
	}
	slices.SortFunc(fs, func(a, b lb.Frontend) int { return lb.CompareKeys(a.Key, b.Key) })
	return fs, probs
}

// syncHostPorts recomputes every pod's HostPort frontends and writes what
// changed. Pods are few per node, so all are recomputed on any change.
func (s *serviceSync) syncHostPorts() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	changed := s.applyHostPortsLocked()
	var errs []error
	for _, key := range changed {
		if err := s.flushLocked(key); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// applyHostPortsLocked puts the HostPort frontends of the cached pods into
// the table (oldest pod first, so on a fresh start the oldest keeps a
// contested port), marks what changed dirty and reports conflicts. It
// returns the keys that changed the table. Called with mu held; does
// nothing until the Pod cache has synced.
func (s *serviceSync) applyHostPortsLocked() []string {
	hp := s.hp
	if hp == nil || !hp.synced() {
		return nil
	}
	pods, err := hp.pods.List(labels.Everything())
	if err != nil {
		s.log.Warn("hostPort: list pods from cache", "error", err)
		return nil
	}
	slices.SortFunc(pods, func(a, b *corev1.Pod) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return strings.Compare(hostPortKey(a), hostPortKey(b))
	})
	want := map[string]bool{}
	var changed []string
	byKey := map[string]*corev1.Pod{}
	apply := func(key string, fs []lb.Frontend) {
		up, del := s.table.Apply(key, fs)
		for _, f := range up {
			s.dirty[f.Key] = key
		}
		for _, k := range del {
			s.dirty[k] = key
		}
		if len(up)+len(del) > 0 {
			changed = append(changed, key)
		}
	}
	wanted := map[string][]lb.Frontend{}
	for _, p := range pods {
		if p.Spec.NodeName != "" && p.Spec.NodeName != s.node {
			continue
		}
		key := hostPortKey(p)
		fs, probs := translateHostPorts(p, s.node)
		for _, pr := range probs {
			s.ev.emit(p, "pod "+p.Namespace+"/"+p.Name, corev1.EventTypeWarning, ReasonHostPortInvalid,
				fmt.Sprintf("%s not programmed: %s", pr.port, pr.reason))
		}
		if len(fs) == 0 && !hp.applied[key] {
			continue
		}
		byKey[key] = p
		wanted[key] = fs
		if len(fs) > 0 {
			want[key] = true
		}
		apply(key, fs)
	}
	for key := range hp.applied {
		if _, still := wanted[key]; !still {
			apply(key, nil) // pod gone
		}
	}
	hp.applied = want
	s.reportHostPortsLocked(byKey, wanted)
	return changed
}

// reportHostPortsLocked emits the conflict and NodePort-collision Events.
func (s *serviceSync) reportHostPortsLocked(pods map[string]*corev1.Pod, wanted map[string][]lb.Frontend) {
	for _, c := range s.table.Conflicts() {
		p := pods[c.Service]
		if p == nil {
			continue
		}
		owner := "Service " + c.Owner
		if strings.HasPrefix(c.Owner, HostPortKeyPrefix) {
			owner = "pod " + strings.TrimPrefix(c.Owner, HostPortKeyPrefix)
		}
		s.ev.emit(p, "pod "+p.Namespace+"/"+p.Name, corev1.EventTypeWarning, ReasonHostPortConflict,
			fmt.Sprintf("hostPort %s on node %s is already used by %s: not programmed for this pod; it takes over when %s no longer uses it",
				hostPortText(c.Key), s.node, owner, owner))
	}
	for key, fs := range wanted {
		p := pods[key]
		for _, f := range fs {
			np := lb.FrontendKey{Addr: f.Key.Addr, Port: f.Key.Port, Proto: f.Key.Proto, Scope: lb.ScopeNodePort}
			if f.Key.Scope == lb.ScopeCluster { // an exact hostIP: the NodePort of its family
				np.Addr = netip.IPv4Unspecified()
				if f.Key.Addr.Is6() {
					np.Addr = netip.IPv6Unspecified()
				}
			}
			svc, ok := s.table.Get(np)
			if !ok {
				continue
			}
			var msg string
			if f.Key.Scope == lb.ScopeHostPort {
				msg = fmt.Sprintf("hostPort %s collides with NodePort %d/%s of Service %s: on node %s's addresses the NodePort is matched first, so this hostPort is not reachable; choose a hostPort outside the NodePort range (kube-apiserver --service-node-port-range, default 30000-32767)",
					hostPortText(f.Key), np.Port, np.Proto, svc.Service, s.node)
			} else {
				msg = fmt.Sprintf("hostPort %s collides with NodePort %d/%s of Service %s: on %s this hostPort is matched first, so the Service's NodePort is not reachable on that address; choose a hostPort outside the NodePort range (kube-apiserver --service-node-port-range, default 30000-32767)",
					hostPortText(f.Key), np.Port, np.Proto, svc.Service, f.Key.Addr)
			}
			s.ev.emit(p, "pod "+p.Namespace+"/"+p.Name, corev1.EventTypeWarning, ReasonHostPortShadowed, msg)
		}
	}
}

// hostPortText prints a HostPort frontend key as the user wrote it.
func hostPortText(k lb.FrontendKey) string {
	if k.Addr.IsUnspecified() {
		fam := "IPv4"
		if k.Addr.Is6() {
			fam = "IPv6"
		}
		return fmt.Sprintf("%d/%s (%s, every node address)", k.Port, k.Proto, fam)
	}
	return netip.AddrPortFrom(k.Addr, k.Port).String() + "/" + k.Proto.String()
}
