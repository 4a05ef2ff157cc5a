package lab

// The bandwidth manager in the lab: `axon lab up --bandwidth-manager on|off|cni-plugin`.
//
//   - on: the axon agents enforce the Pod annotations kubernetes.io/
//     {egress,ingress}-bandwidth (EDT + fq on the uplink, ingress token
//     bucket). Egress needs sch_fq, which this machine's 6.18 kernel lacks:
//     the end-to-end proof runs in the 6.12 VM (internal/bwm).
//   - cni-plugin: the baseline. Every pod's CNI ADD chains the reference
//     `bandwidth` plugin (TBF + ifb) after the pod's plugin, with the Pod's
//     annotations passed the way kubelet and the container runtime do:
//     capabilities {"bandwidth": true} and runtimeConfig.bandwidth
//     {ingressRate, ingressBurst, egressRate, egressBurst}. The TBF qdiscs
//     sit on the pod's host veth, which BPF host routing bypasses
//     (bpf_redirect_peer skips the veth's egress qdisc, the pod program
//     redirects before the legacy ingress filter that feeds the ifb), so
//     the agents run with --host-routing=legacy: the kernel routes pods,
//     as under the reference plugins.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/vishvananda/netlink"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/axonhq/axon/internal/netnsutil"
)

// Bandwidth Manager modes of the lab.
const (
	BandwidthOff       = "off"
	BandwidthOn        = "on"
	BandwidthCNIPlugin = "cni-plugin"
)

// The Pod annotations kubelet reads (k8s.io/kubernetes pkg/util/bandwidth).
const (
	egressBandwidthAnnotation  = "kubernetes.io/egress-bandwidth"
	ingressBandwidthAnnotation = "kubernetes.io/ingress-bandwidth"
)

func validateBandwidthMode(m string) error {
	switch m {
	case "", BandwidthOff, BandwidthOn:
		return nil
	case BandwidthCNIPlugin:
		if _, err := DepPath("bandwidth"); err != nil {
			return fmt.Errorf("--bandwidth-manager cni-plugin chains the reference bandwidth plugin: %w", err)
		}
		return nil
	}
	return fmt.Errorf("--bandwidth-manager %q: want on, off or cni-plugin", m)
}

// bandwidthAgentArgs are the agent flags for the lab's Bandwidth Manager mode.
func bandwidthAgentArgs(st *State) []string {
	switch st.BandwidthManager {
	case BandwidthOn:
		return []string{"--bandwidth-manager"}
	case BandwidthCNIPlugin:
		// TBF on the host veth only sees kernel-routed pod traffic
		return []string{"--host-routing=legacy"}
	}
	return nil
}

// PodBandwidth is runtimeConfig.bandwidth of the CNI conventions, what the
// container runtime passes to plugins with the "bandwidth" capability:
// rates in bits per second, bursts in bits; 0 = that direction unlimited.
type PodBandwidth struct {
	IngressRate  uint64 `json:"ingressRate,omitempty"`
	IngressBurst uint64 `json:"ingressBurst,omitempty"`
	EgressRate   uint64 `json:"egressRate,omitempty"`
	EgressBurst  uint64 `json:"egressBurst,omitempty"`
}

// TBFBurst is the burst the lab passes with a rate, in bits: 64 KiB (one
// GSO packet) or 10 ms of traffic, whichever is larger — the same as the
// VM baseline (internal/bwm). containerd passes 2^32-1 bits (512 MiB), a
// bucket that would let a 10 s test at 10 Mbit/s through unshaped.
func TBFBurst(bits uint64) uint64 { return max(64<<10*8, bits/100) }

// PodBandwidthFromAnnotations reads the Pod annotations as kubelet does
// (ExtractPodBandwidthResources): Kubernetes quantities between 1k and 1P;
// an invalid value is an error (kubelet then fails the pod's sandbox).
// nil when the pod has no limit.
func PodBandwidthFromAnnotations(ann map[string]string) (*PodBandwidth, error) {
	parse := func(key string) (uint64, error) {
		v, ok := ann[key]
		if !ok {
			return 0, nil
		}
		q, err := resource.ParseQuantity(v)
		if err != nil {
			return 0, fmt.Errorf("annotation %s=%q: not a Kubernetes quantity (use e.g. 10M): %w", key, v, err)
		}
		if q.Cmp(resource.MustParse("1k")) < 0 || q.Cmp(resource.MustParse("1P")) > 0 {
			return 0, fmt.Errorf("annotation %s=%q: want 1k..1P", key, v)
		}
		return uint64(q.Value()), nil
	}
	in, err1 := parse(ingressBandwidthAnnotation)
	eg, err2 := parse(egressBandwidthAnnotation)
	if err := errors.Join(err1, err2); err != nil {
		return nil, err
	}
	if in == 0 && eg == 0 {
		return nil, nil
	}
	bw := &PodBandwidth{IngressRate: in, EgressRate: eg}
	if in > 0 {
		bw.IngressBurst = TBFBurst(in)
	}
	if eg > 0 {
		bw.EgressBurst = TBFBurst(eg)
	}
	return bw, nil
}

// bandwidthPluginConfig is the chained plugin's network config as libcni
// builds it: the list's name and version, the capability args of the
// runtime as runtimeConfig, the previous plugin's result as prevResult.
func bandwidthPluginConfig(bw *PodBandwidth, prevResult any) ([]byte, error) {
	conf := map[string]any{
		"cniVersion":   "1.1.0",
		"name":         "axon", // the network name of axon-cni's config: the ifb name is derived from it
		"type":         "bandwidth",
		"capabilities": map[string]bool{"bandwidth": true},
	}
	if bw != nil {
		conf["runtimeConfig"] = map[string]any{"bandwidth": bw}
	}
	if prevResult != nil {
		conf["prevResult"] = prevResult
	}
	return json.Marshal(conf)
}

// podPrevResult is the result of the pod's own plugin as the bandwidth
// plugin needs it (the host-side interface, the pod interface with its
// sandbox, the pod's addresses), read from the live devices: the same
// shape axon-cni and ptp return.
func podPrevResult(n Node, p Pod) (map[string]any, error) {
	pnl, ph, err := netlinkAt(p.Netns)
	if err != nil {
		return nil, err
	}
	defer ph.Close()
	defer pnl.Close()
	podLink, err := pnl.LinkByName(p.IfName)
	if err != nil {
		return nil, fmt.Errorf("pod %s: interface %s: %w", p.Name, p.IfName, err)
	}
	if _, ok := podLink.(*netlink.Veth); !ok {
		return nil, fmt.Errorf("pod %s: %s is a %s device: the reference bandwidth plugin needs a veth pair (use --device veth)", p.Name, p.IfName, podLink.Type())
	}
	peer := podLink.Attrs().ParentIndex
	nnl, nh, err := netlinkAt(n.Netns)
	if err != nil {
		return nil, err
	}
	defer nh.Close()
	defer nnl.Close()
	host, err := nnl.LinkByIndex(peer)
	if err != nil {
		return nil, fmt.Errorf("pod %s: host side of %s (ifindex %d on %s): %w", p.Name, p.IfName, peer, n.Name, err)
	}
	one := 1
	var ips []map[string]any
	for _, a := range p.IPs {
		ips = append(ips, map[string]any{"address": fmt.Sprintf("%s/%d", a, a.BitLen()), "interface": one})
	}
	return map[string]any{
		"cniVersion": "1.1.0",
		"interfaces": []map[string]any{
			{"name": host.Attrs().Name, "mac": host.Attrs().HardwareAddr.String()},
			{"name": p.IfName, "mac": podLink.Attrs().HardwareAddr.String(), "sandbox": netnsutil.Path(p.Netns)},
		},
		"ips": ips,
	}, nil
}

func bandwidthPlugin(conf []byte) (cniPlugin, error) {
	path, err := DepPath("bandwidth")
	if err != nil {
		return cniPlugin{}, err
	}
	return cniPlugin{path: path, cniPath: filepath.Dir(path), config: conf}, nil
}

// bandwidthChainAdd runs the chained bandwidth plugin's ADD for a pod that
// its own plugin just wired (cni-plugin mode only), with the Pod's
// annotations from the API server as runtimeConfig.bandwidth.
func bandwidthChainAdd(ctx context.Context, st *State, kube kubernetes.Interface, n Node, p Pod) error {
	if st.BandwidthManager != BandwidthCNIPlugin {
		return nil
	}
	obj, err := kube.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("bandwidth plugin for pod %s: read the Pod: %w", p.Name, err)
	}
	bw, err := PodBandwidthFromAnnotations(obj.Annotations)
	if err != nil {
		return fmt.Errorf("bandwidth plugin for pod %s: %w", p.Name, err)
	}
	prev, err := podPrevResult(n, p)
	if err != nil {
		return fmt.Errorf("bandwidth plugin for pod %s: %w", p.Name, err)
	}
	conf, err := bandwidthPluginConfig(bw, prev)
	if err != nil {
		return err
	}
	plugin, err := bandwidthPlugin(conf)
	if err != nil {
		return err
	}
	_, err = plugin.invoke(ctx, "ADD", n, p)
	return err
}

// bandwidthChainDel runs the chained bandwidth plugin's DEL (removes the
// pod's ifb; the TBF on the host veth goes with the veth). Chained plugins
// are deleted in reverse order: call it before the pod's own plugin's DEL.
func bandwidthChainDel(ctx context.Context, st *State, n Node, p Pod) error {
	if st.BandwidthManager != BandwidthCNIPlugin {
		return nil
	}
	conf, err := bandwidthPluginConfig(nil, nil)
	if err != nil {
		return err
	}
	plugin, err := bandwidthPlugin(conf)
	if err != nil {
		return err
	}
	_, err = plugin.invoke(ctx, "DEL", n, p)
	return err
}

// ReapplyPodBandwidth re-runs the chained bandwidth plugin for a pod with
// the Pod's current annotations, as when the kubelet recreates the pod's
// sandbox: the reference plugin reads the annotations only at ADD, so an
// annotation changed on a running pod does nothing until then (axon's own
// Bandwidth Manager applies it live). cni-plugin mode only.
func (l *Lab) ReapplyPodBandwidth(ctx context.Context, pod string) error {
	st := l.State()
	if st.BandwidthManager != BandwidthCNIPlugin {
		return fmt.Errorf("reapply pod bandwidth: the lab runs --bandwidth-manager %q; the bandwidth plugin is chained only with cni-plugin", st.BandwidthManager)
	}
	p, ok := st.pod(pod)
	if !ok {
		return fmt.Errorf("reapply pod bandwidth: no pod %q in the lab", pod)
	}
	n, ok := st.Node(p.Node)
	if !ok {
		return fmt.Errorf("reapply pod bandwidth: node %s of pod %s is not in the lab", p.Node, pod)
	}
	kube, err := l.Kube()
	if err != nil {
		return err
	}
	// bad annotations fail here, before the pod's current limits are touched
	obj, err := kube.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("reapply pod bandwidth: read the Pod: %w", err)
	}
	if _, err := PodBandwidthFromAnnotations(obj.Annotations); err != nil {
		return fmt.Errorf("reapply pod bandwidth for %s (its current limits stay): %w", pod, err)
	}
	if err := bandwidthChainDel(ctx, &st, *n, *p); err != nil {
		return err
	}
	// DEL leaves the ingress TBF on the host veth (it goes with the veth):
	// remove it so that ADD can install the new one.
	if err := clearHostRootQdisc(*n, *p); err != nil {
		return err
	}
	return bandwidthChainAdd(ctx, &st, kube, *n, *p)
}

// clearHostRootQdisc deletes the bandwidth plugin's root TBF from the pod's
// host-side interface (back to the kernel default); none there is fine.
func clearHostRootQdisc(n Node, p Pod) error {
	prev, err := podPrevResult(n, p)
	if err != nil {
		return err
	}
	host := prev["interfaces"].([]map[string]any)[0]["name"].(string)
	nl, h, err := netlinkAt(n.Netns)
	if err != nil {
		return err
	}
	defer h.Close()
	defer nl.Close()
	l, err := nl.LinkByName(host)
	if err != nil {
		return fmt.Errorf("pod %s: host interface %s: %w", p.Name, host, err)
	}
	qs, err := nl.QdiscList(l)
	if err != nil {
		return fmt.Errorf("list qdiscs of %s: %w", host, err)
	}
	for _, q := range qs {
		if q.Attrs().Parent == netlink.HANDLE_ROOT && q.Type() == "tbf" { // the plugin's; a veth's default noqueue stays
			if err := nl.QdiscDel(q); err != nil {
				return fmt.Errorf("delete root qdisc %s of %s: %w", q.Type(), host, err)
			}
		}
	}
	return nil
}
