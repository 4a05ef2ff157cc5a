package main

import (
	"strings"
	"testing"
)

// TestCompare: one row per test with each run's result ("-" where a run lacks it), the runs'
// labels, and the claim that matters: axon passed every test a baseline passed, or which not.
func TestCompare(t *testing.T) {
	axon := runSpec{Datapath: "axon", KubeProxy: "none"}
	ipt := runSpec{Datapath: "baseline", KubeProxy: "iptables"}
	nft := runSpec{Datapath: "baseline", KubeProxy: "nftables"}
	for _, tc := range []struct {
		name string
		runs []comparedRun
		want []string
		not  []string
	}{
		{"axon passes what the baselines pass", []comparedRun{
			{dir: "r/a", spec: axon, result: map[string]string{"A": "pass", "B": "pass"}, counts: counts{pass: 2}},
			{dir: "r/i", spec: ipt, result: map[string]string{"A": "pass", "B": "fail"}, counts: counts{pass: 1, fail: 1}},
			{dir: "r/n", spec: nft, result: map[string]string{"A": "pass"}, counts: counts{pass: 1},
				sandbox: []sandboxStats{{Node: "node1", Count: 40, Mean: 0.2, P50: 0.15, P99: 0.9}}},
		}, []string{
			"kube-proxy nftables (n):\n\n| node | sandboxes | mean ms | p50 ms | p99 ms |",
			"| node1 | 40 | 200 | 150 | 900 |",
			"| a | axon (its chart, no kube-proxy) | 2 | 0 | 0 |",
			"| i | baseline (ptp + host-local + portmap, kube-proxy iptables) | 1 | 1 | 0 |",
			"| test | axon | kube-proxy iptables | kube-proxy nftables |",
			"| B | pass | fail | - |",
			"**axon passed every test a baseline passed.**",
		}, []string{"did not pass"}},
		{"axon behind", []comparedRun{
			{dir: "r/a", spec: axon, result: map[string]string{"A": "fail", "B": "skip"}},
			{dir: "r/i", spec: ipt, result: map[string]string{"A": "pass", "B": "pass"}},
		}, []string{"**axon did not pass 2 test(s) a baseline passed:**", "- A\n", "- B\n"}, []string{"passed every test", "Pod sandbox creation"}},
		{"axon skips kube-proxy's own spec by design", []comparedRun{
			{dir: "r/a", spec: axon, result: map[string]string{"A": "pass", "K": "skip", "S": "skip"},
				byDesign: map[string]string{"K": "kube-proxy's ports"}},
			{dir: "r/i", spec: ipt, result: map[string]string{"A": "pass", "K": "pass", "S": "skip"}},
		}, []string{"**axon passed every test a baseline passed but 1 it skips by design:**", "- K: kube-proxy's ports\n"},
			[]string{"did not pass", "- S"}},
		{"a skip by design does not hide a failure", []comparedRun{
			{dir: "r/a", spec: axon, result: map[string]string{"A": "fail", "K": "skip"}, byDesign: map[string]string{"K": "why"}},
			{dir: "r/i", spec: ipt, result: map[string]string{"A": "pass", "K": "pass"}},
		}, []string{"**axon did not pass 1 test(s) a baseline passed:**", "- A\n", "and skips 1 by design:\n\n- K: why\n"}, []string{"passed every test", "- K\n"}},
		{"no baseline: no claim", []comparedRun{
			{dir: "r/a", spec: axon, result: map[string]string{"A": "pass"}},
			{dir: "r/b", spec: axon, result: map[string]string{"A": "fail"}},
		}, []string{"| A | pass | fail |"}, []string{"passed every test", "did not pass"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			md := compareMarkdown(tc.runs)
			for _, w := range tc.want {
				if !strings.Contains(md, w) {
					t.Errorf("compare.md lacks %q:\n%s", w, md)
				}
			}
			for _, n := range tc.not {
				if strings.Contains(md, n) {
					t.Errorf("compare.md says %q:\n%s", n, md)
				}
			}
		})
	}
}

// TestRunSpec: axon runs without kube-proxy, the baseline with iptables or nftables.
func TestRunSpec(t *testing.T) {
	for _, tc := range []struct {
		rs      runSpec
		wantErr string
	}{
		{runSpec{Datapath: "axon", KubeProxy: "none"}, ""},
		{runSpec{Datapath: "axon", KubeProxy: "iptables"}, "leave --kube-proxy at none"},
		{runSpec{Datapath: "baseline", KubeProxy: "nftables"}, ""},
		{runSpec{Datapath: "baseline", KubeProxy: "none"}, "want iptables or nftables"},
		{runSpec{Datapath: "cilium", KubeProxy: "none"}, "want axon or baseline"},
	} {
		err := tc.rs.validate()
		if (tc.wantErr == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("%+v: err %v, want %q", tc.rs, err, tc.wantErr)
		}
	}
}

// TestSandboxOf: kubelet's RunPodSandbox histogram summed over runtime
// handlers, with the PromQL quantile estimates; a kubelet without it fails.
func TestSandboxOf(t *testing.T) {
	const text = `# TYPE kubelet_run_podsandbox_duration_seconds histogram
kubelet_run_podsandbox_duration_seconds_bucket{runtime_handler="",le="0.1"} 2
kubelet_run_podsandbox_duration_seconds_bucket{runtime_handler="",le="0.5"} 8
kubelet_run_podsandbox_duration_seconds_bucket{runtime_handler="",le="+Inf"} 9
kubelet_run_podsandbox_duration_seconds_sum{runtime_handler=""} 2.5
kubelet_run_podsandbox_duration_seconds_count{runtime_handler=""} 9
kubelet_run_podsandbox_duration_seconds_bucket{runtime_handler="runc",le="0.1"} 0
kubelet_run_podsandbox_duration_seconds_bucket{runtime_handler="runc",le="0.5"} 1
kubelet_run_podsandbox_duration_seconds_bucket{runtime_handler="runc",le="+Inf"} 1
kubelet_run_podsandbox_duration_seconds_sum{runtime_handler="runc"} 0.5
kubelet_run_podsandbox_duration_seconds_count{runtime_handler="runc"} 1
`
	s, err := sandboxOf("node1", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	// 10 sandboxes: rank 5 is the 3rd of the 7 in (0.1, 0.5]
	if s.Count != 10 || s.Mean != 0.3 || s.P50 < 0.2713 || s.P50 > 0.2715 || s.P99 != 0.5 {
		t.Errorf("stats %+v: want 10, mean 0.3, p50 ≈ 0.2714, p99 0.5", s)
	}
	if _, err := sandboxOf("node2", []byte("# TYPE other counter\nother 1\n")); err == nil || !strings.Contains(err.Error(), "exports no kubelet_run_podsandbox_duration_seconds") {
		t.Errorf("a kubelet without the metric: %v", err)
	}
}
