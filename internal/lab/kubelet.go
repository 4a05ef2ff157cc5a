package lab

// `axon lab up --kubelet`: every lab node runs a real containerd + runc + kubelet
// (internal/lab/kubenode) and axon installs itself from its Helm chart as on a real cluster. The
// lab starts no agents and writes no Pods, EndpointSlices or Node status in this mode; it only
// gives each Node its podCIDRs (what a cluster's node IPAM does), docs/kubelet.md "The lab mode".

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/axonhq/axon/deploy/image/e2eref"
	"github.com/axonhq/axon/internal/lab/clusterdns"
	"github.com/axonhq/axon/internal/lab/controlplane"
	"github.com/axonhq/axon/internal/lab/kubenode"
	"github.com/axonhq/axon/internal/lab/kubeproxy"
	"github.com/axonhq/axon/internal/netnsutil"
)

// Paths of a kubelet node, as its processes (and the axon DaemonSet's hostPath volumes) see
// them inside the node's mount namespace. /run/axon and /var/lib/axon are the node's own
// (kubenode PrivateDirs); /run/kubenode/cgroup2 is the node's own cgroup2 subtree, the chart's
// hostCgroupRoot: the socket LB attaches there, never to the machine's cgroup2 root.
const (
	kubeletNodeCgroupV2 = "/run/kubenode/cgroup2"
	// AxonNamespace is where `up --kubelet` installs the chart.
	AxonNamespace = "kube-system"
	// AxonDaemonSet is the chart's DaemonSet.
	AxonDaemonSet = "axon-agent"
	// AxonAgentSelector selects the DaemonSet's pods (the namespace holds CoreDNS's too).
	AxonAgentSelector = "app.kubernetes.io/name=" + AxonDaemonSet
)

var kubeletNodePrivateDirs = []string{"/run/axon", "/var/lib/axon", "/run/kubenode"}

// AgnhostImage is the name agnhost is imported under (`make images`, deploy/image/e2eref).
const AgnhostImage = e2eref.Agnhost

// ImagesDir holds the archives of `make images`.
func ImagesDir() string { return filepath.Join(DepsDir(), "images-k8s-"+K8sVersion) }

// kubeletImages are the archives of `make images` every kubelet node imports (the lab has no
// registry): the required ones (pause, agnhost: preflightKubelet checks them) and those of the
// other e2e images that are there (the e2e specs that use them pull them).
func kubeletImages() []string {
	var images []string
	for _, img := range e2eref.Images {
		if f := filepath.Join(ImagesDir(), e2eref.Archive(img.Ref)); img.Required || fileExists(f) {
			images = append(images, f)
		}
	}
	return images
}

// axonImageArchive is UpOptions.Image or `make image`'s docker archive in BinDir
// (ghcr.io/axonhq/axon:<appVersion>, the tag the chart runs).
func axonImageArchive(o UpOptions) string {
	if o.Image != "" {
		return o.Image
	}
	return filepath.Join(o.BinDir, "image", "axon-image.tar")
}

// KubeletNodeCgroup is node's cgroup2 directory in a --kubelet lab: kubelet's cgroupRoot, the
// cgroup2 root of the node's axon (its socket LB hooks attach there). A process that should
// see the node as its own processes do (e.g. a probe from the node) must run below it.
func KubeletNodeCgroup(node string) (string, error) {
	cg2, err := cgroup2Mount()
	if err != nil {
		return "", err
	}
	return filepath.Join(cg2, kubenodeCgroupRoot(node)), nil
}

// validateKubelet checks the options `up --kubelet` accepts: axon from its chart with no
// kube-proxy, or the baseline (reference ptp chain) with kube-proxy; never lab pods.
func validateKubelet(o *UpOptions) error {
	switch {
	case o.PodsPerNode != 0: // --vm-pods: validateVMPods
		return errors.New("--kubelet runs no lab pods (kubelet runs the cluster's): use it with --pods-per-node 0")
	case o.Datapath == DatapathAxon && o.KubeProxy != kubeproxy.None:
		return fmt.Errorf("--kubelet --datapath %s installs axon from its chart as the kube-proxy replacement: use --kube-proxy none", DatapathAxon)
	case o.Datapath == DatapathBaseline && o.KubeProxy == kubeproxy.None:
		return fmt.Errorf("--kubelet --datapath %s has nothing serving Services without kube-proxy: add --kube-proxy iptables or nftables", DatapathBaseline)
	}
	return nil
}

// kubeletDeps are the cache artifacts `up --kubelet` needs besides the control plane's.
func kubeletDeps(datapath string) []string {
	deps := []string{"kubelet", "kube-scheduler", "kube-controller-manager", "containerd",
		"containerd-shim-runc-v2", "ctr", "runc-debian", "kubectl", "ptp"}
	if datapath == DatapathBaseline {
		return append(deps, "host-local", "portmap")
	}
	return append(deps, "helm")
}

// preflightKubelet says what `up --kubelet` misses and how to get it.
func preflightKubelet(o UpOptions) []error {
	var errs []error
	for _, d := range kubeletDeps(o.Datapath) {
		if _, err := DepPath(d); err != nil {
			errs = append(errs, err)
		}
	}
	for _, img := range e2eref.Images {
		if f := filepath.Join(ImagesDir(), e2eref.Archive(img.Ref)); img.Required && !fileExists(f) {
			errs = append(errs, fmt.Errorf("image archive %s missing: run `make images`", f))
		}
	}
	if o.Datapath != DatapathAxon {
		return errs
	}
	if _, err := os.Stat(axonImageArchive(o)); err != nil {
		errs = append(errs, fmt.Errorf("axon image %s missing: run `make image` (or pass --image)", axonImageArchive(o)))
	}
	if _, err := chartDir(); err != nil {
		errs = append(errs, err)
	}
	return errs
}

// chartDir finds deploy/helm/axon: $AXON_CHART, or walking up from the working directory.
func chartDir() (string, error) {
	if d := os.Getenv("AXON_CHART"); d != "" {
		return d, nil
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := wd; ; d = filepath.Dir(d) {
		c := filepath.Join(d, "deploy", "helm", "axon")
		if _, err := os.Stat(filepath.Join(c, "Chart.yaml")); err == nil {
			return c, nil
		}
		if d == filepath.Dir(d) {
			return "", fmt.Errorf("axon's chart (deploy/helm/axon) not found above %s: run from the repository or set AXON_CHART", wd)
		}
	}
}

// kubenodeDir is node n's kubenode state dir (short: containerd's socket path must fit in 108 bytes).
func kubenodeDir(stateDir string, n Node) string {
	return filepath.Join(stateDir, "nodes", n.Name, "kn")
}

// kubeletAgentSocket is where the agent's API socket (/run/axon/axon.sock inside the node) is
// on the host: the node's private /run/axon is a plain directory of kubenode's.
func kubeletAgentSocket(stateDir string, n Node) string {
	return filepath.Join(kubenodeDir(stateDir, n), "private", "run_axon", "axon.sock")
}

// upKubelet is `up --kubelet` once the control plane, the wire and the forwarder run: nodes,
// their podCIDRs, axon from its chart, then the wait for the DaemonSet and the Nodes.
func upKubelet(ctx context.Context, st *State, cp *controlplane.ControlPlane, kube kubernetes.Interface, o UpOptions, save func() error, t0 time.Time) error {
	log := o.Logger
	err := upKubeletNodes(ctx, st, cp, o, log)
	if serr := save(); serr != nil {
		err = errors.Join(err, serr)
	}
	if err != nil {
		return err
	}
	log.Info("kubelets healthy", "elapsed", time.Since(t0).Round(time.Millisecond))
	if err := assignPodCIDRs(ctx, kube, st.Nodes, st.Datapath, o.readyTimeout()); err != nil {
		return err
	}
	if err := apiServerEndpoints(ctx, kube, st.Nodes, st.ControlPlane.APIPort); err != nil {
		return err
	}
	if st.Datapath == DatapathBaseline { // the reference chain is in every node's CNI dir already
		if err := upKubeProxies(ctx, st, save); err != nil { // kubeproxy.go
			return err
		}
		if err := waitNodesReady(ctx, kube, st.Nodes, 2*o.readyTimeout()); err != nil {
			return fmt.Errorf("baseline nodes not ready: %w (kubelet and containerd logs: %s/nodes/<node>/kn/logs)", err, st.StateDir)
		}
		if err := upClusterDNS(ctx, st, kube, o); err != nil {
			return err
		}
		st.Ready = true
		if err := save(); err != nil {
			return err
		}
		log.Info("lab up with kubelets, baseline (ptp + kube-proxy) Ready on every node", "nodes", len(st.Nodes), "kubeProxy", st.KubeProxy, "elapsed", time.Since(t0).Round(time.Millisecond))
		return nil
	}
	if err := installAxon(ctx, st, log); err != nil {
		return err
	}
	if err := waitAxonReady(ctx, kube, st.Nodes, 2*o.readyTimeout()); err != nil {
		return fmt.Errorf("axon not ready: %w (kubelet and containerd logs: %s/nodes/<node>/kn/logs)", err, st.StateDir)
	}
	if err := upClusterDNS(ctx, st, kube, o); err != nil {
		return err
	}
	st.Ready = true
	if err := save(); err != nil {
		return err
	}
	log.Info("lab up with kubelets, axon Ready on every node", "nodes", len(st.Nodes), "elapsed", time.Since(t0).Round(time.Millisecond))
	return nil
}

// kubeletBaselineConfList is the baseline's CNI config for a kubelet node: the lab's ptp +
// host-local (baselineConfList) followed by portmap, which serves hostPorts the way a reference
// installation does (kubelet hands the runtime the pod's port mappings as a capability).
func kubeletBaselineConfList(stateDir string, n Node) map[string]any {
	list := baselineConfList(stateDir, n)
	list["plugins"] = append(list["plugins"].([]map[string]any),
		map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}})
	return list
}

// writeKubeletCNIConf puts the baseline's conflist in a node's CNI config dir (axon's DaemonSet
// writes its own there in the axon datapath).
func writeKubeletCNIConf(confDir, stateDir string, n Node) error {
	b, err := json.MarshalIndent(kubeletBaselineConfList(stateDir, n), "", "  ")
	if err != nil {
		return err
	}
	p := filepath.Join(confDir, "10-baseline.conflist")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	return nil
}

// waitNodesReady waits until every Node is Ready (its kubelet found a CNI config).
func waitNodesReady(ctx context.Context, c kubernetes.Interface, nodes []Node, timeout time.Duration) error {
	return pollUntil(ctx, timeout, func() (bool, error) {
		err := nodesReady(ctx, c, nodes)
		return err == nil, err
	})
}

// nodesReady is nil when every Node is Ready, else says which is not.
func nodesReady(ctx context.Context, c kubernetes.Interface, nodes []Node) error {
	for _, n := range nodes {
		obj, err := c.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !nodeReady(obj) {
			return fmt.Errorf("node %s is not Ready", n.Name)
		}
	}
	return nil
}

// upKubeletNodes starts containerd + kubelet in every node (in parallel: image imports dominate).
func upKubeletNodes(ctx context.Context, st *State, cp *controlplane.ControlPlane, o UpOptions, log *slog.Logger) error {
	dep := func(name string) string { p, _ := DepPath(name); return p } // preflight checked them
	bins := kubenode.Binaries{
		Containerd: dep("containerd"), ShimDir: filepath.Dir(dep("containerd-shim-runc-v2")),
		Ctr: dep("ctr"), Runc: dep("runc-debian"), Kubelet: dep("kubelet"),
	}
	dnsIPs, err := clusterdns.ServiceIPs(kubeproxy.ServiceCIDRs)
	if err != nil {
		return err
	}
	dnsIP := dnsIPs[0] // kubelet's clusterDNS: the kube-dns Service's IPv4 address
	images := kubeletImages()
	if st.Datapath == DatapathAxon {
		images = append(images, axonImageArchive(o))
	}
	errs := make([]error, len(st.Nodes))
	done := make(chan struct{}, len(st.Nodes))
	for i := range st.Nodes {
		n := &st.Nodes[i]
		n.KubeNodeDir = kubenodeDir(st.StateDir, *n)
		n.Socket = kubeletAgentSocket(st.StateDir, *n)
		go func() {
			defer func() { done <- struct{}{} }()
			kc, err := cp.KubeletKubeconfig(n.Name)
			if err != nil {
				errs[i] = err
				return
			}
			confDir := filepath.Join(st.StateDir, "nodes", n.Name, "cni-net.d")
			if err := os.MkdirAll(confDir, 0o755); err != nil {
				errs[i] = fmt.Errorf("create %s: %w", confDir, err)
				return
			}
			if st.Datapath == DatapathBaseline {
				if err := writeKubeletCNIConf(confDir, st.StateDir, *n); err != nil {
					errs[i] = err
					return
				}
			}
			_, err = kubenode.Start(ctx, kubenode.Config{
				Name: n.Name, NetnsPath: netnsutil.Path(n.Netns), NodeIP: net.IP(n.IP.AsSlice()), NodeIPv6: nodeIPv6(*n),
				Kubeconfig: kc, ClientCAFile: cp.CAFile(), Binaries: bins,
				CNIBinDir: filepath.Dir(dep("ptp")), CNIConfDir: confDir,
				PrivateDirs: kubeletNodePrivateDirs, CgroupV2Dir: kubeletNodeCgroupV2,
				Dir: n.KubeNodeDir, CgroupRoot: kubenodeCgroupRoot(n.Name), Images: images,
				Logger: log, ReadyTimeout: o.readyTimeout(),
				ServeOnNodeIP: true, // the apiserver reaches it through the egress proxy
				ClusterDNS:    net.IP(dnsIP.AsSlice()), ClusterDomain: clusterdns.DefaultDomain,
			})
			if err != nil {
				errs[i] = err
			}
		}()
	}
	for range st.Nodes {
		<-done
	}
	return errors.Join(errs...)
}

// egressSocketName is the apiserver's egress proxy socket in the lab's state dir.
const egressSocketName = "egress.sock"

func egressSocket(stateDir string) string { return filepath.Join(stateDir, egressSocketName) }

// egressProxyArgs make `axon lab _forward` also serve the apiserver's cluster egress: HTTP
// CONNECT on the egress socket, dialed from node1's netns (it routes to every node's wire IP,
// where kubelets listen, and to every node's pods), to the nodes' IPs and pod ranges only (axon's
// and the baseline's: `up --kubelet --datapath baseline` gives pods the latter).
func egressProxyArgs(st *State) []string {
	if len(st.Nodes) == 0 {
		return nil
	}
	args := []string{"--connect-socket", egressSocket(st.StateDir), "--connect-netns", netnsutil.Path(st.Nodes[0].Netns)}
	for _, n := range st.Nodes {
		args = append(args, "--connect-allow", netip.PrefixFrom(n.IP, n.IP.BitLen()).String())
		for _, p := range append(slices.Clone(n.PodCIDRs), n.BaselineCIDRs...) {
			args = append(args, "--connect-allow", p.String())
		}
	}
	return args
}

// apiServerEndpoints gives the `kubernetes` Service its Endpoints and EndpointSlice, which the
// apiserver does not write in the lab (--endpoint-reconciler-type=none: it listens on
// 127.0.0.1 of the root netns, no pod can reach that). The lab's forwarder listens on every
// node's IP at the apiserver's port, so pods reach the apiserver at 10.96.0.1:443 through
// the Service → a node IP → the forwarder, as they reach a real cluster's apiservers.
func apiServerEndpoints(ctx context.Context, c kubernetes.Interface, nodes []Node, port int) error {
	const name, ns = "kubernetes", metav1.NamespaceDefault
	var addrs []corev1.EndpointAddress
	var sliceEps []discoveryv1.Endpoint
	ready := true
	for _, n := range nodes {
		if !n.IP.Is4() {
			continue
		}
		addrs = append(addrs, corev1.EndpointAddress{IP: n.IP.String()})
		sliceEps = append(sliceEps, discoveryv1.Endpoint{Addresses: []string{n.IP.String()}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}})
	}
	if len(addrs) == 0 {
		return errors.New("the `kubernetes` Service's endpoints: no node has an IPv4 address")
	}
	p32, portName, proto := int32(port), "https", corev1.ProtocolTCP
	ep := &corev1.Endpoints{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
			// as the apiserver's own reconciler: the mirroring controller leaves it alone
			Labels: map[string]string{discoveryv1.LabelSkipMirror: "true"}},
		Subsets: []corev1.EndpointSubset{{Addresses: addrs, Ports: []corev1.EndpointPort{{Name: portName, Port: p32, Protocol: proto}}}},
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
			Labels: map[string]string{discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: "axon-lab"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   sliceEps,
		Ports:       []discoveryv1.EndpointPort{{Name: &portName, Port: &p32, Protocol: &proto}},
	}
	if _, err := c.CoreV1().Endpoints(ns).Create(ctx, ep, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
		_, err = c.CoreV1().Endpoints(ns).Update(ctx, ep, metav1.UpdateOptions{})
		if err != nil {
			return fmt.Errorf("update Endpoints %s/%s: %w", ns, name, err)
		}
	} else if err != nil {
		return fmt.Errorf("create Endpoints %s/%s: %w", ns, name, err)
	}
	if _, err := c.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
		_, err = c.DiscoveryV1().EndpointSlices(ns).Update(ctx, slice, metav1.UpdateOptions{})
		if err != nil {
			return fmt.Errorf("update EndpointSlice %s/%s: %w", ns, name, err)
		}
	} else if err != nil {
		return fmt.Errorf("create EndpointSlice %s/%s: %w", ns, name, err)
	}
	return nil
}

// kubernetesServiceSANs are the `kubernetes` Service's ClusterIPs (the first address of each
// service CIDR), which in-cluster clients dial and verify the apiserver's certificate against.
func kubernetesServiceSANs(serviceCIDRs string) []net.IP {
	var out []net.IP
	for _, c := range strings.Split(serviceCIDRs, ",") {
		p, err := netip.ParsePrefix(strings.TrimSpace(c))
		if err != nil {
			continue
		}
		out = append(out, net.IP(p.Masked().Addr().Next().AsSlice()))
	}
	return out
}

// RestartKubelet restarts node's kubelet in place (--kubelet labs): containerd, the agent and
// the pods keep running; it waits for kubelet's healthz.
func (l *Lab) RestartKubelet(ctx context.Context, node string) error {
	st := l.State()
	n, ok := st.Node(node)
	if !ok {
		return fmt.Errorf("no node %q in the lab (have %s)", node, l.nodeNames())
	}
	if n.KubeNodeDir == "" {
		return fmt.Errorf("node %s runs no kubelet: bring the lab up with `axon lab up --kubelet`", node)
	}
	return kubenode.RestartKubelet(ctx, n.KubeNodeDir, 60*time.Second)
}

// kubenodeCgroupRoot is the node's cgroup (every hierarchy): its kubelet's cgroupRoot.
func kubenodeCgroupRoot(node string) string { return "/axon-lab-kubenode-" + node }

// stopKubeletNodes stops every node's kubelet, containerd and containers (kubenode.Stop).
func stopKubeletNodes(st *State) []error {
	var errs []error
	for _, n := range st.Nodes {
		if n.KubeNodeDir == "" {
			continue
		}
		if err := kubenode.Stop(n.KubeNodeDir); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("stop kubelet node %s: %w", n.Name, err))
		}
	}
	return errs
}

// assignPodCIDRs waits for every kubelet to register its Node and gives it the lab's pod CIDRs,
// IPv4 and IPv6 (kubelet's --node-ip is the dual-stack pair), as a cluster's node IPAM would.
// axon's IPAM allocates pod IPs from them; the baseline's host-local from the node's baseline
// ranges.
func assignPodCIDRs(ctx context.Context, c kubernetes.Interface, nodes []Node, datapath string, timeout time.Duration) error {
	for _, n := range nodes {
		ranges := n.PodCIDRs
		if datapath == DatapathBaseline {
			ranges = n.BaselineCIDRs
		}
		cidrs := dualStackCIDRs(ranges)
		if len(cidrs) == 0 {
			return fmt.Errorf("node %s has no pod ranges in lab.json: `axon lab down`, then up again", n.Name)
		}
		cidr := strings.Join(cidrs, ",")
		patch, _ := json.Marshal(map[string]any{"spec": map[string]any{"podCIDR": cidrs[0], "podCIDRs": cidrs}})
		err := pollUntil(ctx, timeout, func() (bool, error) {
			obj, err := c.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return false, fmt.Errorf("kubelet of %s has not registered its Node", n.Name)
			}
			if err != nil {
				return false, err
			}
			if len(obj.Spec.PodCIDRs) > 0 {
				if !slices.Equal(obj.Spec.PodCIDRs, cidrs) {
					return false, fmt.Errorf("node %s has podCIDRs %v, the lab wants %s: run `axon lab down` first", n.Name, obj.Spec.PodCIDRs, cidr)
				}
				return true, nil
			}
			_, err = c.CoreV1().Nodes().Patch(ctx, n.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
			return err == nil, err
		})
		if err != nil {
			return fmt.Errorf("assign podCIDR %s to node %s: %w", cidr, n.Name, err)
		}
	}
	return nil
}

// dualStackCIDRs are a node's podCIDRs as the Node carries them: IPv4 first, then IPv6 (one of
// each, what the apiserver accepts for a dual-stack node).
func dualStackCIDRs(ranges []netip.Prefix) []string {
	var v4, v6 []string
	for _, p := range ranges {
		if p.Addr().Is4() {
			v4 = append(v4, p.String())
		} else {
			v6 = append(v6, p.String())
		}
	}
	return append(v4[:min(len(v4), 1)], v6[:min(len(v6), 1)]...)
}

// nodeIPv6 is n's IPv6 wire address, kubelet's second --node-ip (nil without one).
func nodeIPv6(n Node) net.IP {
	for _, a := range n.IPs {
		if a.Is6() && !a.Is4In6() {
			return net.IP(a.AsSlice())
		}
	}
	return nil
}

// pollUntil calls f every 500 ms until it returns true or timeout passes (then f's last error).
func pollUntil(ctx context.Context, timeout time.Duration, f func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		ok, err := f()
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			if err == nil {
				err = ctx.Err()
			}
			return fmt.Errorf("after %s: %w", timeout, err)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// chartValues are the only values a lab node needs: the apiserver through the lab's forwarder
// (127.0.0.1:<APIPort> inside every node netns; the pods are on the host network) and the node's
// own cgroup2 subtree for the socket LB.
func chartValues(apiPort int) []string {
	return []string{
		"k8sServiceHost=127.0.0.1",
		"k8sServicePort=" + strconv.Itoa(apiPort),
		"hostCgroupRoot=" + kubeletNodeCgroupV2,
	}
}

// installAxon renders the chart with `helm template` and applies it with kubectl.
func installAxon(ctx context.Context, st *State, log *slog.Logger) error {
	chart, err := chartDir()
	if err != nil {
		return err
	}
	helm, err := DepPath("helm")
	if err != nil {
		return err
	}
	args := []string{"template", "axon", chart, "--namespace", AxonNamespace}
	for _, v := range chartValues(st.ControlPlane.APIPort) {
		args = append(args, "--set", v)
	}
	var manifest, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, helm, args...)
	cmd.Stdout, cmd.Stderr = &manifest, &stderr
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+filepath.Join(st.StateDir, "helm"), "HELM_CONFIG_HOME="+filepath.Join(st.StateDir, "helm"), "HELM_DATA_HOME="+filepath.Join(st.StateDir, "helm"))
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("helm %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	if err := kubectlApply(ctx, st, "axon.yaml", manifest.Bytes()); err != nil {
		return fmt.Errorf("axon's chart: %w", err)
	}
	log.Info("axon applied from its chart", "chart", chart, "values", chartValues(st.ControlPlane.APIPort))
	return nil
}

// kubectlApply writes manifest to name in the lab's state dir (where a reader finds what the lab
// applied) and applies it with kubectl.
func kubectlApply(ctx context.Context, st *State, name string, manifest []byte) error {
	kubectl, err := DepPath("kubectl")
	if err != nil {
		return err
	}
	p := filepath.Join(st.StateDir, name)
	if err := os.WriteFile(p, manifest, 0o644); err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, kubectl, "--kubeconfig", st.ControlPlane.Kubeconfig, "apply", "-f", p)
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("kubectl apply -f %s: %w: %s", p, err, stderr.String())
	}
	return nil
}

// upClusterDNS applies the cluster DNS add-on (CoreDNS, internal/lab/clusterdns) once the
// datapath serves pods and Services, and waits for its replicas: pods resolve through it, and
// the e2e suite waits for kube-system's pods before it starts.
func upClusterDNS(ctx context.Context, st *State, kube kubernetes.Interface, o UpOptions) error {
	t0 := time.Now()
	ips, err := clusterdns.ServiceIPs(kubeproxy.ServiceCIDRs)
	if err != nil {
		return err
	}
	m, err := clusterdns.Manifest(clusterdns.Config{Image: AgnhostImage, ServiceIPs: ips})
	if err != nil {
		return err
	}
	if err := kubectlApply(ctx, st, "coredns.yaml", m); err != nil {
		return fmt.Errorf("cluster DNS: %w", err)
	}
	if err := clusterdns.WaitReady(ctx, kube, 2*o.readyTimeout()); err != nil {
		return fmt.Errorf("%w (kubectl -n %s describe pods -l k8s-app=%s)", err, clusterdns.Namespace, clusterdns.Service)
	}
	o.Logger.Info("cluster DNS ready", "coredns", clusterdns.Replicas, "service", ips, "elapsed", time.Since(t0).Round(time.Millisecond))
	return nil
}

// waitAxonReady waits until the DaemonSet has a Ready pod on every node and every Node is Ready.
func waitAxonReady(ctx context.Context, c kubernetes.Interface, nodes []Node, timeout time.Duration) error {
	return pollUntil(ctx, timeout, func() (bool, error) {
		ds, err := c.AppsV1().DaemonSets(AxonNamespace).Get(ctx, AxonDaemonSet, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if why := daemonSetNotReady(ds, len(nodes)); why != "" {
			return false, errors.New(why + podProblems(ctx, c))
		}
		err = nodesReady(ctx, c, nodes)
		return err == nil, err
	})
}

func daemonSetNotReady(ds *appsv1.DaemonSet, nodes int) string {
	s := ds.Status
	if int(s.DesiredNumberScheduled) != nodes || int(s.NumberReady) != nodes || int(s.UpdatedNumberScheduled) != nodes {
		return fmt.Sprintf("DaemonSet %s/%s: %d of %d pods Ready (desired %d, updated %d)", ds.Namespace, ds.Name,
			s.NumberReady, nodes, s.DesiredNumberScheduled, s.UpdatedNumberScheduled)
	}
	return ""
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// podProblems summarises the axon pods' states for a timeout error.
func podProblems(ctx context.Context, c kubernetes.Interface) string {
	pods, err := c.CoreV1().Pods(AxonNamespace).List(ctx, metav1.ListOptions{LabelSelector: AxonAgentSelector})
	if err != nil {
		return ""
	}
	var b strings.Builder
	for _, p := range pods.Items {
		fmt.Fprintf(&b, "; pod %s on %s: %s", p.Name, p.Spec.NodeName, p.Status.Phase)
		for _, cs := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
			switch {
			case cs.State.Waiting != nil:
				fmt.Fprintf(&b, " %s waiting (%s: %s)", cs.Name, cs.State.Waiting.Reason, cs.State.Waiting.Message)
			case cs.State.Terminated != nil && cs.State.Terminated.ExitCode != 0:
				fmt.Fprintf(&b, " %s exited %d (%s)", cs.Name, cs.State.Terminated.ExitCode, cs.State.Terminated.Reason)
			case cs.State.Running != nil && !cs.Ready:
				fmt.Fprintf(&b, " %s running, not ready (restarts %d)", cs.Name, cs.RestartCount)
			}
		}
	}
	return b.String()
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }
