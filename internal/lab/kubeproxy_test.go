package lab

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"
)

// Lines as kube-proxy v1.36.3 -v=2 writes them (iptables and nftables modes).
const kubeProxyLogSample = `--- 2026-11-22T06:36:01Z nsenter --net=/run/netns/axonlab-node2 -- kube-proxy --proxy-mode=iptables
I1122 06:36:01.851012   31256 server_linux.go:53] "Using iptables proxy"
I1122 06:36:02.205880   31256 proxier.go:662] "SyncProxyRules complete" ipFamily="IPv4" elapsed="116.250665ms"
I1122 06:36:02.348748   31256 proxier.go:662] "SyncProxyRules complete" ipFamily="IPv6" elapsed="141.52022ms"
W1122 06:36:02.400000   31256 proxier.go:700] "something else" elapsed="1s"
I1122 06:36:03.359696   31256 proxier.go:1828] "SyncProxyRules complete" ipFamily="IPv4" elapsed="2.5s"
I1122 06:36:03.359697   31256 proxier.go:1828] "SyncProxyRules complete" ipFamily="IPv4" elapsed="garbage"
`

func TestParseKubeProxySyncTimes(t *testing.T) {
	got, err := ParseKubeProxySyncTimes(strings.NewReader(kubeProxyLogSample), 2026)
	if err != nil {
		t.Fatal(err)
	}
	want := []SyncTime{
		{time.Date(2026, 11, 22, 6, 36, 2, 205880000, time.UTC), "IPv4", 116250665 * time.Nanosecond},
		{time.Date(2026, 11, 22, 6, 36, 2, 348748000, time.UTC), "IPv6", 141520220 * time.Nanosecond},
		{time.Date(2026, 11, 22, 6, 36, 3, 359696000, time.UTC), "IPv4", 2500 * time.Millisecond},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d sync times, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		if !got[i].At.Equal(want[i].At) || got[i].Family != want[i].Family || got[i].Elapsed != want[i].Elapsed {
			t.Errorf("sync %d = %+v, want %+v", i, got[i], want[i])
		}
	}
}

func TestKubeProxyArgs(t *testing.T) {
	n := newNode("/run/axon-lab", "/sys/fs/cgroup/unified/axon-lab", 1)
	for _, tc := range []struct {
		mode    string
		masqAll bool
	}{{KubeProxyNFTables, false}, {KubeProxyIPTables, true}} {
		args := kubeProxyArgs("/cache/kube-proxy", tc.mode, "/run/axon-lab/controlplane/admin.kubeconfig", n, tc.masqAll)
		for _, want := range []string{
			"--proxy-mode=" + tc.mode, "--hostname-override=node1",
			"--cluster-cidr=10.244.0.0/15,fd00:10:244::/47",
			"--healthz-bind-address=127.0.0.1:10256", "--metrics-bind-address=127.0.0.1:10249",
			// machine-wide conntrack settings stay as they are
			"--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0", "--conntrack-tcp-timeout-close-wait=0",
			"--v=2",
		} {
			if !slices.Contains(args, want) {
				t.Errorf("%s: %s missing from %v", tc.mode, want, args)
			}
		}
		if slices.Contains(args, "--masquerade-all") != tc.masqAll {
			t.Errorf("%s: --masquerade-all present = %v, want %v", tc.mode, !tc.masqAll, tc.masqAll)
		}
	}
	// the cluster CIDRs cover both datapaths' pod ranges
	for _, c := range strings.Split(clusterCIDRs, ",") {
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
		{"", nil},
		{KubeProxyNone, nil},
		{KubeProxyNFTables, []string{"--socket-lb=false", "--nodeport=false", "--host-routing=legacy"}},
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
		{"", KubeProxyNone, ""},
		{"iptables", KubeProxyIPTables, ""},
		{"nftables", KubeProxyNFTables, ""},
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
