package lab

// Demo hostPorts: the lab's first pod declares hostPorts in
// its Pod spec, as a DaemonSet's pod would, and `axon lab check` probes them:
// from every pod and node through the socket LB (and, from other nodes, the
// entry node's north-south LB), and from the external namespace through the
// north-south LB of the pod's node. The axon agent translates Pod hostPorts
// into HostPort frontends (internal/agent/hostport.go); kube-proxy does not
// implement hostPort at all (kubelet's CNI portmap plugin does, which the
// lab does not chain), so those labs show n/a with the reason.

import (
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"

	"github.com/axonhq/axon/internal/lab/kubeproxy"
	"github.com/axonhq/axon/internal/lab/probe"
)

// Demo hostPorts, TCP and UDP each, on DemoHostPortPod.
const (
	// DemoHostPortPod is the pod that declares the hostPorts: the first pod
	// of the first node (pods are named <node>-pod<i>; nodes node1..N).
	DemoHostPortPod = "node1-pod1"
	// DemoHostPort → EchoPort (the plain echo every demo backend runs during
	// a check): probed from pods, nodes and the external namespace.
	DemoHostPort = 30900
	// DemoHostPortPeer → PeerEchoPort (the peer echo, which reports the
	// client address it saw): the external check asserts the client IP is kept.
	DemoHostPortPeer = 30901
)

// demoHostPorts are the container ports of pod p's container: the demo
// hostPorts for DemoHostPortPod, none for every other pod.
func demoHostPorts(p Pod) []corev1.ContainerPort {
	if p.Name != DemoHostPortPod {
		return nil
	}
	var out []corev1.ContainerPort
	for _, proto := range []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP} {
		sfx := ""
		if proto == corev1.ProtocolUDP {
			sfx = "-udp"
		}
		out = append(out,
			corev1.ContainerPort{Name: "echo" + sfx, ContainerPort: probe.EchoPort, HostPort: DemoHostPort, Protocol: proto},
			corev1.ContainerPort{Name: "peer" + sfx, ContainerPort: probe.PeerEchoPort, HostPort: DemoHostPortPeer, Protocol: proto})
	}
	return out
}

// hostPortPod returns the lab's pod with the demo hostPorts, when it exists
// and is of the lab's datapath (so the checks run their echo servers in it).
func hostPortPod(st *State) (Pod, bool) {
	for _, p := range st.Pods {
		if p.Name == DemoHostPortPod && p.Datapath == st.Datapath {
			return p, true
		}
	}
	return Pod{}, false
}

// hostPortNA says why the lab's hostPorts are not served, "" when they are.
func hostPortNA(st *State) string {
	if _, ok := hostPortPod(st); !ok {
		return fmt.Sprintf("n/a (no pod declares a hostPort: the lab has no pod %s of its datapath; use --pods-per-node 1 or more)", DemoHostPortPod)
	}
	switch {
	case kubeProxyModeOf(st) != kubeproxy.None:
		return "n/a (kube-proxy does not implement hostPort: kubelet's CNI portmap plugin does, and the lab does not chain it)"
	case st.Datapath != DatapathAxon:
		return "n/a (--datapath baseline runs the reference plugins without portmap: nothing serves hostPorts)"
	}
	return ""
}

// planHostPortExternal adds the external HostPort probes through both
// (planExternalProbes' helper): on the pod's node, the peer-echo hostPort
// with the client address kept and the echo hostPort; on every other node
// the peer-echo hostPort must not answer (hostPorts belong to their node).
func planHostPortExternal(st *State, both func(c string, a netip.Addr, port uint16, expect, why string)) {
	pod, ok := hostPortPod(st)
	why := hostPortNA(st)
	for _, n := range st.Nodes {
		switch {
		case !ok:
			for _, ip := range n.IPs {
				both("HostPort "+n.Name, ip, DemoHostPortPeer, ExpectOK, why)
			}
		case n.Name == pod.Node:
			for _, ip := range n.IPs {
				both(fmt.Sprintf("HostPort %s :%d (pod %s, client IP kept)", n.Name, DemoHostPortPeer, pod.Name), ip, DemoHostPortPeer, ExpectClientIP, why)
			}
			for _, ip := range n.IPs {
				both(fmt.Sprintf("HostPort %s :%d (pod %s)", n.Name, DemoHostPort, pod.Name), ip, DemoHostPort, ExpectOK, why)
			}
		default:
			for _, ip := range n.IPs {
				both(fmt.Sprintf("HostPort %s :%d (pod on %s: not served here)", n.Name, DemoHostPortPeer, pod.Node), ip, DemoHostPortPeer, ExpectBlocked, why)
			}
		}
	}
}

// hostPortTarget is one in-cluster HostPort probe address and, when not
// applicable, why.
type hostPortTarget struct {
	addr netip.Addr
	na   string
}

// hostPortServiceTargets are the addresses the Service check probes on
// DemoHostPort from source: the hostPort pod's node addresses, and from that
// node itself also loopback (a hostPort answers on every local address, as
// with kubelet's portmap).
func hostPortServiceTargets(st *State, source string, isNode bool) []hostPortTarget {
	why := hostPortNA(st)
	pod, ok := hostPortPod(st)
	var out []hostPortTarget
	if !ok {
		if len(st.Nodes) > 0 {
			for _, ip := range st.Nodes[0].IPs {
				out = append(out, hostPortTarget{ip, why})
			}
		}
		return out
	}
	n, found := st.Node(pod.Node)
	if !found {
		return nil
	}
	for _, ip := range n.IPs {
		out = append(out, hostPortTarget{ip, why})
	}
	if isNode && source == pod.Node {
		for _, lo := range []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.IPv6Loopback()} {
			out = append(out, hostPortTarget{lo, why})
		}
	}
	return out
}
