package main

import (
	"strings"
	"testing"
	"time"
)

func TestParseSkips(t *testing.T) {
	for _, tc := range []struct {
		name, text, wantErr string
		want                int
		last                string // the last skip's expression, if set
	}{
		{"ok", "# comment\n\n\\[sig-network\\] DNS  # no cluster DNS\nLoadBalancer # no cloud\n", "", 2, ""},
		{"datapath only", "LoadBalancer # no cloud\n@axon kube-proxy urls # no kube-proxy\n@baseline Sockmap # axon's own\n", "", 2, ""},
		{"unknown datapath", "@cilium kube-proxy urls # no kube-proxy\n", "datapath-only skip names axon or baseline", 0, ""},
		{"datapath only without reason", "@axon kube-proxy urls\n", "has no reason", 0, ""},
		{"no reason", "\\[sig-network\\] DNS\n", "has no reason", 0, ""},
		{"empty reason", "DNS # \n", "has no reason", 0, ""},
		{"bad regex", "DNS( # why\n", "missing closing", 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sk, err := parseSkips(tc.text, "skips.txt", "axon")
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want one saying %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || len(sk) != tc.want {
				t.Fatalf("got %d skips, err %v; want %d", len(sk), err, tc.want)
			}
			if tc.last != "" && sk[len(sk)-1].re.String() != tc.last {
				t.Fatalf("last skip %q, want %q (the run's datapath only)", sk[len(sk)-1].re, tc.last)
			}
		})
	}
}

const junitSample = `<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="5">
  <testsuite name="Kubernetes e2e suite">
    <testcase name="[SynchronizedBeforeSuite]" status="passed" time="1.5"></testcase>
    <testcase name="[It] [sig-network] Services should serve a basic endpoint from pods [Conformance]" status="passed" time="12.25"></testcase>
    <testcase name="[It] [sig-network] Proxy version v1 should proxy through a service and a pod [Conformance]" status="failed" time="30">
      <failure message="error dialing backend: | pipe">long text</failure>
    </testcase>
    <testcase name="[It] [sig-network] DNS should provide DNS for the cluster [Conformance]" status="skipped" time="0"><skipped message="skipped"></skipped></testcase>
    <testcase name="[It] [sig-storage] Volumes should work" status="skipped" time="0"><skipped message="skipped"></skipped></testcase>
  </testsuite>
</testsuites>`

// TestResults: the JUnit's focused specs become the table (the unfocused sig-storage spec and
// the passed suite node do not), with the failure message and the skip's reason.
func TestResults(t *testing.T) {
	cases, err := parseJUnit([]byte(junitSample))
	if err != nil {
		t.Fatal(err)
	}
	if len(cases) != 5 {
		t.Fatalf("parsed %d cases, want 5", len(cases))
	}
	if c := count(cases, focusRE); c != (counts{pass: 1, fail: 1, skip: 1}) {
		t.Errorf("counts %+v, want 1 pass, 1 fail, 1 skip", c)
	}
	// a run with its own focus counts what it focused on: here every sig-network spec and the
	// storage one; a non-conformance pass counted once the focus takes it in
	broad := runSpec{Datapath: "axon", KubeProxy: "none", Focus: `\[sig-(network|storage)\]`}
	if c := count(cases, broad.focusRE()); c != (counts{pass: 1, fail: 1, skip: 2}) {
		t.Errorf("counts with --focus %s: %+v, want 1 pass, 1 fail, 2 skips", broad.Focus, c)
	}
	sk, err := parseSkips(`\[sig-network\] DNS # no cluster DNS server`, "skips.txt", "axon")
	if err != nil {
		t.Fatal(err)
	}
	md := resultsMarkdown(cases, sk, runSpec{Datapath: "axon", KubeProxy: "none"}, "e2e.test --x", time.Date(2026, 11, 27, 23, 0, 0, 0, time.UTC), time.Minute)
	for _, want := range []string{
		"**1 passed, 1 failed, 1 skipped.**",
		"| [It] [sig-network] Services should serve a basic endpoint from pods [Conformance] | pass | 12.2 |",
		`| fail | 30.0 | error dialing backend: \| pipe |`,
		"| skip | 0.0 | no cluster DNS server |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("results.md lacks %q:\n%s", want, md)
		}
	}
	for _, not := range []string{"sig-storage", "SynchronizedBeforeSuite"} {
		if strings.Contains(md, not) {
			t.Errorf("results.md lists %s:\n%s", not, md)
		}
	}
	if skipRegex(sk) != `(\[sig-network\] DNS)` {
		t.Errorf("skipRegex = %q", skipRegex(sk))
	}
}

// TestGinkgoArgs: through the CLI the selection flags are ginkgo's and the framework's flags
// follow e2e.test after "--"; alone they are e2e.test's --ginkgo.* flags.
func TestGinkgoArgs(t *testing.T) {
	got := strings.Join(ginkgoArgs(3, "F", "S", time.Hour, "/c/e2e.test", []string{"--num-nodes=2"}), " ")
	if want := "--procs=3 --focus=F --timeout=1h0m0s --no-color --v --skip=S /c/e2e.test -- --num-nodes=2"; got != want {
		t.Errorf("ginkgoArgs:\n got %s\nwant %s", got, want)
	}
	if got := strings.Join(ginkgoFlags("--ginkgo.", "F", "", time.Minute), " "); got != "--ginkgo.focus=F --ginkgo.timeout=1m0s --ginkgo.no-color --ginkgo.v" {
		t.Errorf("ginkgoFlags without skips: %s", got)
	}
}
