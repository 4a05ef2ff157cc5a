package lab

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// TestUpOptionsKubelet: --kubelet runs no lab pods or agents, so the options that shape them are
// refused (naming the ones to use), and the demo Services (they select the lab's pods) are off.
// axon replaces kube-proxy; the baseline needs it.
func TestUpOptionsKubelet(t *testing.T) {
	for _, tc := range []struct {
		name    string
		o       UpOptions
		wantErr string
	}{
		{"ok", UpOptions{Nodes: 2, Datapath: DatapathAxon, BinDir: "bin", Kubelet: true}, ""},
		{"lab pods", UpOptions{Nodes: 2, PodsPerNode: 2, Datapath: DatapathAxon, BinDir: "bin", Kubelet: true}, "--pods-per-node 0"},
		{"VM pods", UpOptions{Nodes: 2, VMPods: 1, Datapath: DatapathAxon, BinDir: "bin", Kubelet: true}, "--kubelet runs real kubelets and no lab pods"},
		{"baseline without kube-proxy", UpOptions{Nodes: 2, Datapath: DatapathBaseline, BinDir: "bin", Kubelet: true}, "--kube-proxy iptables or nftables"},
		{"baseline iptables", UpOptions{Nodes: 2, Datapath: DatapathBaseline, KubeProxy: "iptables", BinDir: "bin", Kubelet: true}, ""},
		{"baseline nftables", UpOptions{Nodes: 2, Datapath: DatapathBaseline, KubeProxy: "nftables", BinDir: "bin", Kubelet: true}, ""},
		{"kube-proxy", UpOptions{Nodes: 2, Datapath: DatapathAxon, KubeProxy: "iptables", BinDir: "bin", Kubelet: true}, "--kube-proxy none"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.o.validate()
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatal(err)
			case tc.wantErr == "" && !tc.o.NoDemo:
				t.Error("--kubelet left the demo Services on")
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("err %v, want one saying %q", err, tc.wantErr)
			}
		})
	}
}

// TestChartValuesKeepTheSocketLBInTheNode: the chart's hostCgroupRoot is the node's own cgroup2
// subtree (bound inside the node), never the machine's cgroup2 root, and the agent reaches the
// apiserver through the forwarder inside its node netns.
func TestChartValuesKeepTheSocketLBInTheNode(t *testing.T) {
	v := chartValues(6443)
	want := []string{"k8sServiceHost=127.0.0.1", "k8sServicePort=6443", "hostCgroupRoot=" + kubeletNodeCgroupV2}
	if !slices.Equal(v, want) {
		t.Fatalf("chart values %v, want %v", v, want)
	}
	if !slices.ContainsFunc(kubeletNodePrivateDirs, func(p string) bool { return strings.HasPrefix(kubeletNodeCgroupV2, p+"/") }) {
		t.Errorf("hostCgroupRoot %s is not below one of the node's private dirs %v", kubeletNodeCgroupV2, kubeletNodePrivateDirs)
	}
	for _, bad := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		if kubeletNodeCgroupV2 == bad {
			t.Errorf("hostCgroupRoot is the machine's cgroup2 root %s", bad)
		}
	}
}

// TestEgressProxyArgs: the forwarder's CONNECT proxy dials from node1's netns and allows
// exactly the nodes' IPs and their pod ranges, axon's and the baseline's (kubelets and pods),
// nothing else.
func TestEgressProxyArgs(t *testing.T) {
	st := &State{StateDir: "/run/axon-lab"}
	for i := 1; i <= 2; i++ {
		st.Nodes = append(st.Nodes, newNode(st.StateDir, "/sys/fs/cgroup/axon-lab", i))
	}
	got := strings.Join(egressProxyArgs(st), " ")
	want := "--connect-socket /run/axon-lab/egress.sock --connect-netns /run/netns/" + st.Nodes[0].Netns
	for _, n := range st.Nodes {
		want += " --connect-allow " + n.IP.String() + "/32"
		for _, p := range append(n.PodCIDRs, n.BaselineCIDRs...) {
			want += " --connect-allow " + p.String()
		}
	}
	if got != want {
		t.Errorf("egressProxyArgs:\n got %s\nwant %s", got, want)
	}
	if !strings.Contains(got, "/32 --connect-allow 10.244.") || !strings.Contains(got, " --connect-allow 10.245.2.0/24") {
		t.Errorf("egressProxyArgs %s: want node /32s followed by the 10.244.x and 10.245.x pod ranges", got)
	}
	if egressProxyArgs(&State{}) != nil {
		t.Error("egressProxyArgs of a lab without nodes is not empty")
	}
}

// TestAPIServerEndpoints: the `kubernetes` Service gets Endpoints (skip-mirror, as the
// apiserver's reconciler labels them) and an EndpointSlice named kubernetes, both listing
// the nodes' IPv4 addresses at the apiserver port; a second call updates instead of failing.
func TestAPIServerEndpoints(t *testing.T) {
	c := fake.NewClientset()
	nodes := []Node{newNode("/run/axon-lab", "/sys/fs/cgroup/axon-lab", 1), newNode("/run/axon-lab", "/sys/fs/cgroup/axon-lab", 2)}
	for range 2 {
		if err := apiServerEndpoints(t.Context(), c, nodes, 6443); err != nil {
			t.Fatal(err)
		}
	}
	ep, err := c.CoreV1().Endpoints("default").Get(t.Context(), "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ep.Labels["endpointslice.kubernetes.io/skip-mirror"] != "true" || len(ep.Subsets) != 1 || len(ep.Subsets[0].Addresses) != 2 ||
		ep.Subsets[0].Addresses[1].IP != nodes[1].IP.String() || ep.Subsets[0].Ports[0].Port != 6443 {
		t.Errorf("Endpoints %+v %+v: want skip-mirror, both node IPs at port 6443", ep.Labels, ep.Subsets)
	}
	sl, err := c.DiscoveryV1().EndpointSlices("default").List(t.Context(), metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=kubernetes"})
	if err != nil {
		t.Fatal(err)
	}
	if len(sl.Items) != 1 || len(sl.Items[0].Endpoints) != 2 || sl.Items[0].Endpoints[0].Addresses[0] != nodes[0].IP.String() || *sl.Items[0].Ports[0].Port != 6443 {
		t.Errorf("EndpointSlices %+v: want one with both node IPs at 6443", sl.Items)
	}
	if err := apiServerEndpoints(t.Context(), c, nil, 6443); err == nil {
		t.Error("no nodes: want an error")
	}
}

func TestKubernetesServiceSANs(t *testing.T) {
	var got []string
	for _, ip := range kubernetesServiceSANs("10.96.0.0/16,fd00:10:96::/112") {
		got = append(got, ip.String())
	}
	if want := []string{"10.96.0.1", "fd00:10:96::1"}; !slices.Equal(got, want) {
		t.Errorf("kubernetesServiceSANs = %v, want %v", got, want)
	}
}

// TestKubeletBaselineConfList: a baseline kubelet node's CNI config is the lab's ptp +
// host-local on the node's baseline ranges, then portmap taking the pods' port mappings.
func TestKubeletBaselineConfList(t *testing.T) {
	n := newNode("/run/axon-lab", "/cg", 2)
	list := kubeletBaselineConfList("/run/axon-lab", n)
	plugins := list["plugins"].([]map[string]any)
	if len(plugins) != 2 || plugins[0]["type"] != "ptp" || plugins[1]["type"] != "portmap" {
		t.Fatalf("plugins %v: want ptp then portmap", plugins)
	}
	if caps, _ := plugins[1]["capabilities"].(map[string]bool); !caps["portMappings"] {
		t.Errorf("portmap capabilities %v: want portMappings", plugins[1]["capabilities"])
	}
	ranges := plugins[0]["ipam"].(map[string]any)["ranges"].([][]map[string]string)
	if len(ranges) != 2 || ranges[0][0]["subnet"] != "10.245.2.0/24" || ranges[1][0]["subnet"] != "fd00:10:245:2::/64" {
		t.Errorf("host-local ranges %v: want node2's baseline ranges", ranges)
	}
	if slices.Contains(kubeletDeps(DatapathBaseline), "helm") || !slices.Contains(kubeletDeps(DatapathBaseline), "portmap") {
		t.Errorf("baseline deps %v: want portmap, no helm", kubeletDeps(DatapathBaseline))
	}
}

// TestDualStackNode: a kubelet node gets one podCIDR per family, IPv4 first (what the apiserver
// accepts for a dual-stack Node), and its wire IPv6 as kubelet's second --node-ip.
func TestDualStackNode(t *testing.T) {
	v4, v6 := netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:10:244:1::/64")
	for _, tc := range []struct {
		name   string
		ranges []netip.Prefix
		want   []string
	}{
		{"v4 then v6", []netip.Prefix{v4, v6}, []string{"10.244.1.0/24", "fd00:10:244:1::/64"}},
		{"v6 listed first", []netip.Prefix{v6, v4}, []string{"10.244.1.0/24", "fd00:10:244:1::/64"}},
		{"IPv4 only", []netip.Prefix{v4}, []string{"10.244.1.0/24"}},
		{"two of a family: the first", []netip.Prefix{v4, netip.MustParsePrefix("10.245.1.0/24"), v6}, []string{"10.244.1.0/24", "fd00:10:244:1::/64"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := dualStackCIDRs(tc.ranges); !slices.Equal(got, tc.want) {
				t.Errorf("dualStackCIDRs(%v) = %v, want %v", tc.ranges, got, tc.want)
			}
		})
	}
	n := Node{IPs: []netip.Addr{netip.MustParseAddr("198.18.0.11"), netip.MustParseAddr("fd00:198:18::11")}}
	if got := nodeIPv6(n); got.String() != "fd00:198:18::11" {
		t.Errorf("nodeIPv6 = %v, want fd00:198:18::11", got)
	}
	if got := nodeIPv6(Node{IPs: n.IPs[:1]}); got != nil {
		t.Errorf("nodeIPv6 of an IPv4-only node = %v, want nil (single-stack --node-ip)", got)
	}
}
