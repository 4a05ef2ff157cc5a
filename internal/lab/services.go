package lab

// Demo Services created by `axon lab up` (unless --no-demo): one of each
// type, TCP and UDP, dual-stack, backed by the lab's pods on the check's
// echo port. The lab runs no kube-controller-manager, so the lab writes the
// EndpointSlices itself from its pod list (and the LoadBalancer status).

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/lab/kubeproxy"
	"github.com/axonhq/axon/internal/lab/probe"
)

// Demo Service names, addresses and ports. Every demo Service forwards
// port DemoPort (TCP and UDP) to EchoPort on the pods of the lab's datapath.
const (
	DemoNamespace     = "default"
	DemoClusterIP     = "demo-clusterip"
	DemoNodePort      = "demo-nodeport"
	DemoExternalIP    = "demo-externalip"
	DemoLoadBalancer  = "demo-loadbalancer"
	DemoPort          = 80
	DemoNodePortPort  = 30080 // the NodePort of demo-nodeport (TCP and UDP)
	demoManagedBy     = "axon-lab"
	demoSelectorKey   = "axon.dev/demo-backend"
	demoSelectorValue = "true"
)

// DemoService describes one demo Service as the lab creates it and as the
// check probes it.
type DemoService struct {
	Name       string
	Type       corev1.ServiceType
	ClusterIPs []netip.Addr
	// ExternalIPs (demo-externalip) and LoadBalancer ingress IPs
	// (demo-loadbalancer) live on the wire's subnets, so that every node has
	// an on-link route to them (a socket's route lookup happens before
	// kube-proxy's DNAT in OUTPUT), and no machine owns them.
	ExternalIPs []netip.Addr
	LBIngress   []netip.Addr
	NodePort    int32 // 0 = none
}

// DemoServices returns the demo Services, in a fixed order.
func DemoServices() []DemoService {
	a := netip.MustParseAddr
	return []DemoService{
		{Name: DemoClusterIP, Type: corev1.ServiceTypeClusterIP,
			ClusterIPs: []netip.Addr{a("10.96.100.10"), a("fd00:10:96::10")}},
		{Name: DemoNodePort, Type: corev1.ServiceTypeNodePort,
			ClusterIPs: []netip.Addr{a("10.96.100.11"), a("fd00:10:96::11")}, NodePort: DemoNodePortPort},
		{Name: DemoExternalIP, Type: corev1.ServiceTypeClusterIP,
			ClusterIPs:  []netip.Addr{a("10.96.100.12"), a("fd00:10:96::12")},
			ExternalIPs: []netip.Addr{a("198.18.0.100"), a("fd00:198:18::100")}},
		{Name: DemoLoadBalancer, Type: corev1.ServiceTypeLoadBalancer,
			ClusterIPs: []netip.Addr{a("10.96.100.13"), a("fd00:10:96::13")},
			LBIngress:  []netip.Addr{a("198.18.0.200"), a("fd00:198:18::200")}},
	}
}

func (d DemoService) object() *corev1.Service {
	dual := corev1.IPFamilyPolicyRequireDualStack
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{
			Name: d.Name, Namespace: DemoNamespace,
			Labels: map[string]string{"app.kubernetes.io/managed-by": demoManagedBy, "axon.dev/demo": "true"},
		},
		Spec: corev1.ServiceSpec{
			Type:           d.Type,
			Selector:       map[string]string{demoSelectorKey: demoSelectorValue},
			IPFamilyPolicy: &dual,
			IPFamilies:     []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol},
		},
	}
	for _, ip := range d.ClusterIPs {
		svc.Spec.ClusterIPs = append(svc.Spec.ClusterIPs, ip.String())
	}
	svc.Spec.ClusterIP = svc.Spec.ClusterIPs[0]
	for _, ip := range d.ExternalIPs {
		svc.Spec.ExternalIPs = append(svc.Spec.ExternalIPs, ip.String())
	}
	if d.Type == corev1.ServiceTypeLoadBalancer {
		no := false
		svc.Spec.AllocateLoadBalancerNodePorts = &no // only the ingress IPs are demonstrated here
	}
	for _, proto := range []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP} {
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{
			Name: portName(proto), Protocol: proto, Port: DemoPort,
			TargetPort: intstr.FromInt32(probe.EchoPort), NodePort: d.NodePort,
		})
	}
	return svc
}

func portName(p corev1.Protocol) string {
	if p == corev1.ProtocolUDP {
		return "udp"
	}
	return "tcp"
}

// demoBackends are the pods that back the demo Services: the lab's pods of
// its own datapath (pods added later, e.g. by the benchmark, are not backends).
func demoBackends(st *State) []Pod {
	var out []Pod
	for _, p := range st.Pods {
		if p.Datapath == st.Datapath {
			out = append(out, p)
		}
	}
	return out
}

// endpointSlices builds one slice per family for svc from pods.
func (d DemoService) endpointSlices(pods []Pod) []*discoveryv1.EndpointSlice {
	var out []*discoveryv1.EndpointSlice
	for _, fam := range []discoveryv1.AddressType{discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6} {
		s := &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{
				Name:      d.Name + "-" + map[discoveryv1.AddressType]string{discoveryv1.AddressTypeIPv4: "v4", discoveryv1.AddressTypeIPv6: "v6"}[fam],
				Namespace: DemoNamespace,
				Labels: map[string]string{
					discoveryv1.LabelServiceName: d.Name,
					discoveryv1.LabelManagedBy:   demoManagedBy,
				},
			},
			AddressType: fam,
		}
		for _, proto := range []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP} {
			name, port := portName(proto), int32(probe.EchoPort)
			s.Ports = append(s.Ports, discoveryv1.EndpointPort{Name: &name, Protocol: &proto, Port: &port})
		}
		for _, p := range pods {
			for _, ip := range p.IPs {
				if ip.Is4() != (fam == discoveryv1.AddressTypeIPv4) {
					continue
				}
				yes, node := true, p.Node
				s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
					Addresses:  []string{ip.String()},
					Conditions: discoveryv1.EndpointConditions{Ready: &yes, Serving: &yes, Terminating: new(bool)},
					NodeName:   &node,
					TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: p.Namespace, Name: p.Name},
				})
			}
		}
		out = append(out, s)
	}
	return out
}

// ensureDemoServices creates (or brings back in line) the demo Services,
// their EndpointSlices (from the lab's pods) and the LoadBalancer status.
// It labels the backend pods so that the Services' selector is truthful.
func ensureDemoServices(ctx context.Context, kube kubernetes.Interface, st *State) error {
	backends := demoBackends(st)
	for _, p := range backends {
		patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, demoSelectorKey, demoSelectorValue)
		if _, err := kube.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, "application/merge-patch+json", []byte(patch), metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("label pod %s as a demo backend: %w", p.Name, err)
		}
	}
	for _, d := range DemoServices() {
		if err := ensureService(ctx, kube, d); err != nil {
			return err
		}
		for _, s := range d.endpointSlices(backends) {
			if err := ensureEndpointSlice(ctx, kube, s); err != nil {
				return err
			}
		}
	}
	return nil
}

// lbIngress is a Service's status.loadBalancer.ingress for the addresses ips.
func lbIngress(ips []netip.Addr) []corev1.LoadBalancerIngress {
	var out []corev1.LoadBalancerIngress
	for _, ip := range ips {
		out = append(out, corev1.LoadBalancerIngress{IP: ip.String()})
	}
	return out
}

// demoKubeProxyWants is what the demo Services ask of every kube-proxy.
func demoKubeProxyWants(st *State) []kubeproxy.Want {
	var out []kubeproxy.Want
	backends := demoBackends(st)
	for _, d := range DemoServices() {
		svc := d.object()
		svc.Status.LoadBalancer.Ingress = lbIngress(d.LBIngress)
		out = append(out, kubeproxy.Wants(svc, d.endpointSlices(backends))...)
	}
	return out
}

func ensureService(ctx context.Context, kube kubernetes.Interface, d DemoService) error {
	want := d.object()
	svcs := kube.CoreV1().Services(DemoNamespace)
	cur, err := svcs.Get(ctx, d.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		cur, err = svcs.Create(ctx, want, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create demo service %s: %w", d.Name, err)
		}
	case err != nil:
		return fmt.Errorf("get demo service %s: %w", d.Name, err)
	case !slices.Equal(cur.Spec.ClusterIPs, want.Spec.ClusterIPs) || cur.Spec.Type != want.Spec.Type:
		return fmt.Errorf("service %s/%s exists with clusterIPs %v type %s (want %v %s): delete it or run `axon lab down`",
			DemoNamespace, d.Name, cur.Spec.ClusterIPs, cur.Spec.Type, want.Spec.ClusterIPs, want.Spec.Type)
	}
	if len(d.LBIngress) == 0 {
		return nil
	}
	ing := lbIngress(d.LBIngress)
	if fmt.Sprint(cur.Status.LoadBalancer.Ingress) == fmt.Sprint(ing) {
		return nil
	}
	cur.Status.LoadBalancer.Ingress = ing
	if _, err := svcs.UpdateStatus(ctx, cur, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("set status.loadBalancer.ingress of %s: %w", d.Name, err)
	}
	return nil
}

func ensureEndpointSlice(ctx context.Context, kube kubernetes.Interface, want *discoveryv1.EndpointSlice) error {
	eps := kube.DiscoveryV1().EndpointSlices(want.Namespace)
	cur, err := eps.Get(ctx, want.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		if _, err := eps.Create(ctx, want, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create endpointslice %s: %w", want.Name, err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("get endpointslice %s: %w", want.Name, err)
	}
	if fmt.Sprint(endpointAddrs(cur)) == fmt.Sprint(endpointAddrs(want)) && len(cur.Ports) == len(want.Ports) {
		return nil
	}
	want.ResourceVersion = cur.ResourceVersion
	if _, err := eps.Update(ctx, want, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update endpointslice %s: %w", want.Name, err)
	}
	return nil
}

func endpointAddrs(s *discoveryv1.EndpointSlice) []string {
	var out []string
	for _, e := range s.Endpoints {
		out = append(out, e.Addresses...)
	}
	slices.Sort(out)
	return out
}

// EnsureDemoServices (re)creates the demo Services and rewrites their
// EndpointSlices from the lab's current pods of its datapath.
func (l *Lab) EnsureDemoServices(ctx context.Context) error {
	return l.mutate(func(st *State) error {
		kube, err := l.Kube()
		if err != nil {
			return err
		}
		if err := ensureDemoServices(ctx, kube, st); err != nil {
			return err
		}
		st.DemoServices = true
		return nil
	})
}

// demoFrontendText is how a demo frontend appears in `axon bpf lb list`
// (used to wait for the agents to program the demo Services).
func demoFrontendText(d DemoService) string {
	return netip.AddrPortFrom(d.ClusterIPs[0], DemoPort).String() + "/TCP"
}

// upDemoServices creates the demo Services and waits (up to 20-30 s) until
// whatever serves Services has them: every kube-proxy's rules hold their
// frontends and endpoints, or every agent's BPF maps hold what its Service
// watch wants.
func upDemoServices(ctx context.Context, st *State, kube kubernetes.Interface, log *slog.Logger) error {
	if err := ensureDemoServices(ctx, kube, st); err != nil {
		return err
	}
	st.DemoServices = true
	if kubeProxyModeOf(st) != kubeproxy.None {
		return waitKubeProxyRules(ctx, st, demoKubeProxyWants(st), 30*time.Second)
	}
	if st.Datapath != DatapathAxon {
		return nil
	}
	if err := waitAgentsProgrammed(ctx, st.Nodes, 20*time.Second); err != nil {
		// Not fatal: the agent may run without socket LB (its status says why).
		log.Warn("demo services not programmed by every agent yet", "err", err)
	}
	return nil
}

// waitAgentsProgrammed waits until each agent's BPF maps equal its desired
// table and include the demo ClusterIP frontend, and, where the agent runs
// the north-south LB, until that LB holds the table too: it loads after the
// socket LB (up to 10 s after the agent starts), and until then another
// node's pods reach this node's NodePorts untranslated (TCP: refused).
func waitAgentsProgrammed(ctx context.Context, nodes []Node, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	want := demoFrontendText(DemoServices()[0])
	nodePortSvc := DemoNamespace + "/" + DemoNodePort
	var errs []error
	for _, n := range nodes {
		c := api.NewClient(n.Socket)
		var last error
		for {
			sr, err := c.Services(ctx)
			if err == nil {
				var mr api.LBMapsReply
				if mr, err = c.LBMaps(ctx); err == nil {
					switch {
					case !mr.Enabled:
						err = fmt.Errorf("socket LB not enabled: %s", mr.Reason)
					case !strings.Contains(mr.Text, want) || mr.Text != sr.Text:
						err = fmt.Errorf("maps do not hold %s yet", want)
					}
				}
			}
			if err == nil {
				var ns string
				ns, _, err = NodePortDecision(ctx, n.Socket, 0)
				_, written := sr.Programmed[nodePortSvc]
				switch {
				case err != nil:
				case ns == "pending":
					err = errors.New("north-south LB not loaded yet")
				case ns != "" && ns != "disabled" && (!sr.NorthSouth || !written):
					err = fmt.Errorf("north-south LB (%s) does not hold %s yet", ns, nodePortSvc)
				}
			}
			if last = err; last == nil {
				break
			}
			if ctx.Err() != nil {
				errs = append(errs, fmt.Errorf("agent of %s: %w", n.Name, last))
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return errors.Join(errs...)
}
