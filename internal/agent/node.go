package agent

import (
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
)

// ParsePodCIDRs returns a Node's podCIDRs from spec.podCIDRs, falling back to
// spec.podCIDR, IPv4 first. Duplicates are dropped; an unparsable CIDR is an error.
func ParsePodCIDRs(spec corev1.NodeSpec) ([]netip.Prefix, error) {
	raw := spec.PodCIDRs
	if len(raw) == 0 && spec.PodCIDR != "" {
		raw = []string{spec.PodCIDR}
	}
	var out []netip.Prefix
	for _, s := range raw {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("podCIDR %q: %w", s, err)
		}
		p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()).Masked()
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	slices.SortStableFunc(out, func(a, b netip.Prefix) int {
		switch {
		case a.Addr().Is4() == b.Addr().Is4():
			return 0
		case a.Addr().Is4():
			return -1
		default:
			return 1
		}
	})
	return out, nil
}

// InternalIPs returns the Node's InternalIP addresses in status order.
func InternalIPs(st corev1.NodeStatus) []netip.Addr {
	var out []netip.Addr
	for _, a := range st.Addresses {
		if a.Type != corev1.NodeInternalIP {
			continue
		}
		ip, err := netip.ParseAddr(a.Address)
		if err == nil {
			out = append(out, ip.Unmap())
		}
	}
	return out
}

// nodeInfo converts a Node; an invalid podCIDR is returned as a problem, the
// rest of the node still counts.
func nodeInfo(n *corev1.Node) (NodeInfo, error) {
	cidrs, err := ParsePodCIDRs(n.Spec)
	if err != nil {
		err = fmt.Errorf("node %s: %w", n.Name, err)
	}
	return NodeInfo{Name: n.Name, InternalIPs: InternalIPs(n.Status), PodCIDRs: cidrs}, err
}

// noPodCIDRMessage is the not-ready reason (and Allocate's 503) for a Node without podCIDRs.
func noPodCIDRMessage(node string) string {
	return fmt.Sprintf("node %s has no spec.podCIDRs: assign one (kube-controller-manager --allocate-node-cidrs) or set it on the Node", node)
}
