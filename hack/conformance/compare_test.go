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
			{dir: "r/n", spec: nft, result: map[string]string{"A": "pass"}, counts: counts{pass: 1}},
		}, []string{
			"| a | axon (its chart, no kube-proxy) | 2 | 0 | 0 |",
			"| i | baseline (ptp + host-local + portmap, kube-proxy iptables) | 1 | 1 | 0 |",
			"| test | axon | kube-proxy iptables | kube-proxy nftables |",
			"| B | pass | fail | - |",
			"**axon passed every test a baseline passed.**",
		}, []string{"did not pass"}},
		{"axon behind", []comparedRun{
			{dir: "r/a", spec: axon, result: map[string]string{"A": "fail", "B": "skip"}},
			{dir: "r/i", spec: ipt, result: map[string]string{"A": "pass", "B": "pass"}},
		}, []string{"**axon did not pass 2 test(s) a baseline passed:**", "- A\n", "- B\n"}, []string{"passed every test"}},
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
		{runSpec{"axon", "none"}, ""},
		{runSpec{"axon", "iptables"}, "leave --kube-proxy at none"},
		{runSpec{"baseline", "nftables"}, ""},
		{runSpec{"baseline", "none"}, "want iptables or nftables"},
		{runSpec{"cilium", "none"}, "want axon or baseline"},
	} {
		err := tc.rs.validate()
		if (tc.wantErr == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("%+v: err %v, want %q", tc.rs, err, tc.wantErr)
		}
	}
}
