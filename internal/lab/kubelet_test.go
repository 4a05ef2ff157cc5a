package lab

import (
	"slices"
	"strings"
	"testing"
)

// TestUpOptionsKubelet: --kubelet runs no lab pods or agents, so the options that shape them are
// refused (naming the ones to use), and the demo Services (they select the lab's pods) are off.
func TestUpOptionsKubelet(t *testing.T) {
	for _, tc := range []struct {
		name    string
		o       UpOptions
		wantErr string
	}{
		{"ok", UpOptions{Nodes: 2, Datapath: DatapathAxon, BinDir: "bin", Kubelet: true}, ""},
		{"lab pods", UpOptions{Nodes: 2, PodsPerNode: 2, Datapath: DatapathAxon, BinDir: "bin", Kubelet: true}, "--pods-per-node 0"},
		{"baseline", UpOptions{Nodes: 2, Datapath: DatapathBaseline, BinDir: "bin", Kubelet: true}, "--datapath axon"},
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
