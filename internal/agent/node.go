package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"path/filepath"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/axonhq/axon/internal/atomicfile"
)

// This node as the reconcile sees it: its uplink, its pools (podCIDRs), the
// routes to the other nodes' pods and what it remembers across restarts.
// The results are kept in nodeStatus (status.go) and the routes in
// routeTable (routes.go); only the reconcile loop runs these.

// errWaitUplink: the uplink can only be found from the Node's InternalIP.
var errWaitUplink = errors.New("no default route in this netns and the Node's InternalIP is not known yet (waiting for kube-apiserver): pass --uplink to start without it")

// nodeState is what the agent remembers across restarts (state-dir/node.json)
// so that a restart without kube-apiserver still knows its pools and uplink.
type nodeState struct {
	PodCIDRs []netip.Prefix `json:"podCIDRs"`
	Uplink   string         `json:"uplink"`
}

// resolveUplink picks the uplink once: --uplink; else the device of the
// default route; else the device holding the Node's InternalIP; else, while
// kube-apiserver is not synced, the uplink saved by the previous run.
func (a *Agent) resolveUplink() (string, error) {
	up, saved := a.st.uplinks()
	if up != "" {
		if _, ok := lookupLink(a.nl, up); !ok {
			return "", fmt.Errorf("uplink device %q not found in this network namespace: check --uplink", up)
		}
		return up, nil
	}
	up, how, err := a.detectUplink(saved)
	if err != nil {
		return "", err
	}
	a.st.setUplink(up)
	a.log.Info("uplink detected", "device", up, "from", how)
	return up, nil
}

func (a *Agent) detectUplink(saved string) (dev, how string, err error) {
	if dev, err = defaultRouteDevice(a.nl); err != nil || dev != "" {
		return dev, "default route", err
	}
	k := a.st.kubeClient()
	if k == nil || !k.isSynced() {
		if _, ok := lookupLink(a.nl, saved); saved != "" && ok {
			return saved, "state of the previous run (kube-apiserver not synced yet)", nil
		}
		return "", "", errWaitUplink
	}
	n, err := k.nodes.Get(a.cfg.NodeName)
	if err != nil {
		return "", "", fmt.Errorf("no default route, and own Node %s: %w: pass --uplink", a.cfg.NodeName, err)
	}
	if dev, err = deviceWithAddr(a.nl, InternalIPs(n.Status)); err != nil {
		return "", "", err
	}
	if dev == "" {
		return "", "", fmt.Errorf("no default route and no device holds Node %s's InternalIP %v: pass --uplink", a.cfg.NodeName, InternalIPs(n.Status))
	}
	return dev, "Node InternalIP", nil
}

// reconcileNodes updates pools from the own Node, the north-south LB's
// cluster ranges from every Node and routes to the others. Called only
// once the Node cache is synced (an empty cache must never delete routes).
func (a *Agent) reconcileNodes(k *kube) error {
	list, err := k.nodes.List(labels.Everything())
	if err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	var nodes []NodeInfo
	var problems []string
	var own *NodeInfo
	for _, n := range list {
		ni, err := nodeInfo(n)
		if err != nil {
			problems = append(problems, err.Error())
		}
		nodes = append(nodes, ni)
		if n.Name == a.cfg.NodeName {
			own = &ni
		}
	}
	var errs []error
	switch {
	case own == nil:
		a.setCIDRs(nil, fmt.Sprintf("node %s not found in kube-apiserver: check --node-name, or create the Node", a.cfg.NodeName))
	case len(own.PodCIDRs) == 0:
		a.setCIDRs(nil, noPodCIDRMessage(a.cfg.NodeName))
	default:
		if err := a.ipam.SetPools(own.PodCIDRs); err != nil {
			msg := fmt.Sprintf("node %s podCIDRs %v unusable: %v", a.cfg.NodeName, own.PodCIDRs, err)
			a.setCIDRs(nil, msg)
			errs = append(errs, errors.New(msg))
		} else if a.setCIDRs(own.PodCIDRs, "") {
			a.log.Info("podCIDRs set", "node", a.cfg.NodeName, "podCIDRs", own.PodCIDRs)
			a.saveNodeState()
		}
	}

	a.nport.setClusterPrefixes(nodes) // north-south LB: in-cluster clients get SNAT, not DSR

	up := a.st.uplinkInUse()
	if up == "" {
		if up, err = a.resolveUplink(); err != nil {
			return errors.Join(append(errs, err)...)
		}
	}
	li, ok := lookupLink(a.nl, up)
	if !ok {
		return errors.Join(append(errs, fmt.Errorf("uplink %s not found: routes not programmed", up))...)
	}
	var ownCIDRs []netip.Prefix
	if own != nil {
		ownCIDRs = own.PodCIDRs
	}
	if err := a.rt.sync(a.cfg.NodeName, ownCIDRs, nodes, li.Index, problems); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// setCIDRs records the pools or why they are unknown (logged once); true
// when they changed.
func (a *Agent) setCIDRs(cidrs []netip.Prefix, why string) bool {
	changed, newWhy := a.st.setCIDRs(cidrs, why)
	if newWhy {
		a.log.Warn(why)
	}
	return changed
}

func (a *Agent) statePath() string { return filepath.Join(a.cfg.StateDir, "node.json") }

func (a *Agent) readNodeState() (nodeState, error) {
	var st nodeState
	if err := atomicfile.ReadJSON(a.statePath(), &st); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nodeState{}, err
	}
	return st, nil
}

func (a *Agent) saveNodeState() {
	if err := atomicfile.WriteJSON(a.statePath(), a.st.saved(), 0o600); err != nil {
		a.log.Warn("save node state", "error", err)
	}
}

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
