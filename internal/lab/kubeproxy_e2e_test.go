package lab_test

// `axon lab up --kube-proxy`: the real kube-proxy as the Service baseline,
// the demo Services, and the Service part of `axon lab check`.

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/axonhq/axon/internal/lab"
	"github.com/axonhq/axon/internal/lab/kubeproxy"
)

// rootNetnsSnapshot is what kube-proxy could change outside its node netns
// if it escaped it: the root netns' firewall and conntrack settings.
func rootNetnsSnapshot(t *testing.T) map[string]string {
	t.Helper()
	snap := map[string]string{}
	for _, f := range []string{
		"/proc/sys/net/ipv4/conf/all/route_localnet",
		"/proc/sys/net/netfilter/nf_conntrack_max",
		"/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_established",
		"/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_close_wait",
		"/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal",
		"/sys/module/nf_conntrack/parameters/hashsize",
	} {
		b, err := os.ReadFile(f)
		if err != nil {
			b = []byte("unreadable: " + err.Error())
		}
		snap[f] = strings.TrimSpace(string(b))
	}
	if nft, err := exec.LookPath("nft"); err == nil {
		out, err := exec.Command(nft, "list", "ruleset").CombinedOutput()
		if err != nil {
			t.Fatalf("nft list ruleset: %v\n%s", err, out)
		}
		snap["nft list ruleset"] = string(out)
	}
	return snap
}

func TestLabKubeProxy(t *testing.T) {
	need(t, "axon", "axon-agent", "axon-cni")
	if _, err := lab.DepPath("kube-proxy"); err != nil {
		t.Skipf("kube-proxy not built: %v", err)
	}
	for _, tool := range []string{"nft", "iptables-restore", "ip6tables-restore"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed (kube-proxy needs it): apt-get install nftables iptables", tool)
		}
	}
	tests := []struct {
		datapath, kubeProxy string
		wantNA              []string // n/a reasons the check must print
	}{
		{lab.DatapathBaseline, kubeproxy.NFTables, []string{"n/a  NodePort 127.0.0.1: n/a (kube-proxy nftables does not serve NodePorts on loopback) [4 probes]", "n/a  NodePort ::1"}},
		{lab.DatapathBaseline, kubeproxy.IPTables, []string{"n/a  NodePort ::1: n/a (kube-proxy iptables serves localhost NodePorts for IPv4 only) [4 probes]"}},
		{lab.DatapathAxon, kubeproxy.None, nil},
		{lab.DatapathAxon, kubeproxy.NFTables, []string{"kube-proxy nftables does not serve NodePorts on loopback"}},
	}
	for _, tc := range tests {
		t.Run(tc.datapath+"/"+tc.kubeProxy, func(t *testing.T) {
			before := rootNetnsSnapshot(t)
			defer func() { // after down (cleanups of this subtest ran)
				for k, v := range rootNetnsSnapshot(t) {
					if before[k] != v {
						t.Errorf("root netns changed after down: %s was %q, is %q", k, before[k], v)
					}
				}
			}()
			l := up(t, "--nodes", "2", "--pods-per-node", "2", "--datapath", tc.datapath, "--kube-proxy", tc.kubeProxy)
			for k, v := range rootNetnsSnapshot(t) {
				if before[k] != v {
					t.Errorf("root netns changed by up: %s was %q, is %q", k, before[k], v)
				}
			}
			st := l.State()
			if got := l.KubeProxyMode(); got != tc.kubeProxy {
				t.Errorf("lab.json kube-proxy mode %q, want %q", got, tc.kubeProxy)
			}
			if !st.DemoServices {
				t.Error("lab.json: demoServices not recorded")
			}

			out, err := axonErr(t, "check")
			t.Logf("axon lab check:\n%s", out)
			if err != nil {
				t.Errorf("axon lab check failed: %v", err)
			}
			for _, want := range append([]string{"service probes passed"}, tc.wantNA...) {
				if !strings.Contains(out, want) {
					t.Errorf("check output lacks %q", want)
				}
			}

			status := axon(t, "status")
			if !strings.Contains(status, "kube-proxy: "+tc.kubeProxy) {
				t.Errorf("status lacks the kube-proxy mode:\n%s", status)
			}
			if tc.kubeProxy == kubeproxy.None {
				for _, n := range st.Nodes {
					if n.KubeProxy != nil {
						t.Errorf("%s runs a kube-proxy (pid %d) without --kube-proxy", n.Name, n.KubeProxy.PID)
					}
				}
				return
			}
			if strings.Count(status, "healthz: 200 OK") != len(st.Nodes) {
				t.Errorf("status: want every kube-proxy healthy:\n%s", status)
			}
			for _, n := range st.Nodes {
				if !n.KubeProxy.Alive() {
					t.Fatalf("kube-proxy of %s (%+v) is not running", n.Name, n.KubeProxy)
				}
				if filepath.Dir(n.KubeProxy.Log) != filepath.Join(lab.DefaultStateDir, "nodes", n.Name) {
					t.Errorf("kube-proxy log %s not under the node's state dir", n.KubeProxy.Log)
				}
				syncs, err := l.KubeProxySyncTimes(n.Name)
				if err != nil {
					t.Fatal(err)
				}
				fams := map[string]int{}
				for _, s := range syncs {
					fams[s.Family]++
					if s.Elapsed <= 0 || s.Elapsed > time.Minute || time.Since(s.At) > 10*time.Minute || time.Since(s.At) < -time.Minute {
						t.Errorf("%s: implausible sync %+v", n.Name, s)
					}
				}
				if fams["IPv4"] == 0 || fams["IPv6"] == 0 {
					t.Errorf("%s: sync times per family %v, want both", n.Name, fams)
				}
				t.Logf("%s: %d kube-proxy syncs, last %+v", n.Name, len(syncs), syncs[len(syncs)-1])
			}
			if tc.datapath == lab.DatapathAxon {
				for _, n := range st.Nodes {
					ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
					agent, err := l.Agent(n.Name)
					if err != nil {
						t.Fatal(err)
					}
					s, err := agent.Status(ctx)
					cancel()
					if err != nil {
						t.Fatal(err)
					}
					for _, d := range s.Datapath {
						if d.Name == "socket_lb" && d.Value != "disabled" {
							t.Errorf("%s: socket_lb %s with kube-proxy, want disabled", n.Name, d.Value)
						}
					}
				}
			}

			t.Run("bad input keeps the lab", func(t *testing.T) {
				before := axon(t, "list", "-o", "json")
				for _, args := range [][]string{
					{"up", "--kube-proxy", "ipvs"},
					{"up", "--nodes", "2", "--pods-per-node", "2", "--datapath", tc.datapath, "--kube-proxy", kubeproxy.None},
				} {
					out, err := axonErr(t, args...)
					if err == nil {
						t.Errorf("axon lab %s succeeded on a running %s lab", strings.Join(args, " "), tc.kubeProxy)
					}
					if !strings.Contains(out, "--kube-proxy \"ipvs\": want one of none, iptables, nftables") && !strings.Contains(out, "already up") {
						t.Errorf("axon lab %s: unclear error:\n%s", strings.Join(args, " "), out)
					}
				}
				if after := axon(t, "list", "-o", "json"); after != before {
					t.Errorf("lab changed by rejected input:\n%s\n%s", before, after)
				}
				for _, n := range l.Nodes() {
					if !n.KubeProxy.Alive() {
						t.Errorf("kube-proxy of %s died after rejected input", n.Name)
					}
				}
			})
		})
	}
}
