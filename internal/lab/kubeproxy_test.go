package lab

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/axonhq/axon/internal/lab/kubeproxy"
)

func TestKubeProxyArgs(t *testing.T) {
	n := newNode("/run/axon-lab", "/sys/fs/cgroup/unified/axon-lab", 1)
	for _, tc := range []struct {
		mode    string
		masqAll bool
	}{{kubeproxy.NFTables, false}, {kubeproxy.IPTables, true}} {
		args := kubeProxyArgs("/cache/kube-proxy", tc.mode, "/run/axon-lab/controlplane/admin.kubeconfig", n, tc.masqAll)
		for _, want := range []string{
			"--proxy-mode=" + tc.mode, "--hostname-override=node1",
			"--cluster-cidr=10.244.0.0/15,fd00:10:244::/47",
			"--healthz-bind-address=127.0.0.1:10256", "--metrics-bind-address=127.0.0.1:10249",
			// machine-wide conntrack settings stay as they are
			"--conntrack-max-per-core=0", "--conntrack-min=0",
			"--v=2",
		} {
			if !slices.Contains(args, want) {
				t.Errorf("%s: %s missing from %v", tc.mode, want, args)
			}
		}
		// the per-netns TCP timeouts keep kube-proxy's defaults (its CLOSE_WAIT spec checks them)
		for _, a := range args {
			if strings.HasPrefix(a, "--conntrack-tcp-timeout") {
				t.Errorf("%s: %s: the TCP timeouts are per netns, kube-proxy's defaults apply", tc.mode, a)
			}
		}
		if slices.Contains(args, "--masquerade-all") != tc.masqAll {
			t.Errorf("%s: --masquerade-all present = %v, want %v", tc.mode, !tc.masqAll, tc.masqAll)
		}
	}
	// the cluster CIDRs cover both datapaths' pod ranges
	for _, c := range strings.Split(kubeproxy.ClusterCIDRs, ",") {
		p := netip.MustParsePrefix(c)
		for _, r := range append(podCIDRs(7), baselineCIDRs(7)...) {
			if r.Addr().Is4() == p.Addr().Is4() && !p.Contains(r.Addr()) {
				t.Errorf("cluster CIDR %s does not cover %s", p, r)
			}
		}
	}
}

func TestAgentExtraArgs(t *testing.T) {
	tests := []struct {
		kubeProxy string
		want      []string
	}{
		{"", []string{"--kube-proxy-healthz-addr=127.0.0.1:10256", "--kube-proxy-metrics-addr=127.0.0.1:10249"}},
		{kubeproxy.None, []string{"--kube-proxy-healthz-addr=127.0.0.1:10256", "--kube-proxy-metrics-addr=127.0.0.1:10249"}},
		{kubeproxy.NFTables, []string{"--socket-lb=false", "--nodeport=false", "--host-routing=legacy"}},
	}
	for _, tc := range tests {
		if got := agentExtraArgs(&State{KubeProxy: tc.kubeProxy}); !slices.Equal(got, tc.want) {
			t.Errorf("kube-proxy %q: %v, want %v", tc.kubeProxy, got, tc.want)
		}
	}
}

func TestUpOptionsKubeProxy(t *testing.T) {
	tests := []struct {
		in, want, wantErr string
	}{
		{"", kubeproxy.None, ""},
		{"iptables", kubeproxy.IPTables, ""},
		{"nftables", kubeproxy.NFTables, ""},
		{"ipvs", "", `--kube-proxy "ipvs": want one of none, iptables, nftables`},
	}
	for _, tc := range tests {
		o := UpOptions{Nodes: 1, Datapath: DatapathBaseline, BinDir: "bin", KubeProxy: tc.in}
		err := o.validate()
		switch {
		case tc.wantErr != "" && (err == nil || err.Error() != tc.wantErr):
			t.Errorf("%q: err %v, want %q", tc.in, err, tc.wantErr)
		case tc.wantErr == "" && (err != nil || o.KubeProxy != tc.want):
			t.Errorf("%q: %v, mode %q, want %q", tc.in, err, o.KubeProxy, tc.want)
		}
	}
}
