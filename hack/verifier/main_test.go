package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/axonhq/axon/internal/testutil"
)

func TestRunUsage(t *testing.T) {
	cases := []struct {
		desc string
		args []string
	}{
		{"unknown flag", []string{"-nope"}},
		{"stray argument", []string{"extra"}},
		{"bad number", []string{"-max-growth", "ten"}},
	}
	for _, c := range cases {
		var out, errb bytes.Buffer
		if code := run(c.args, &out, &errb); code != 2 {
			t.Errorf("%s: exit %d, want 2 (stderr %q)", c.desc, code, errb.String())
		}
	}
}

// TestRunUpdateAndGrowth records a baseline in a scratch file, checks a
// clean run against it, then a run whose growth limit every program exceeds.
func TestRunUpdateAndGrowth(t *testing.T) {
	testutil.RequireRoot(t, "loads BPF programs into the kernel")
	dir := t.TempDir()
	base := filepath.Join(dir, "baseline.json")
	results := filepath.Join(dir, "results")
	steps := []struct {
		desc     string
		args     []string
		code     int
		inStdout string
		inStderr string
	}{
		{"record", []string{"-baseline", base, "-update-baseline"}, 0, "| ok |", "baseline for kernel"},
		{"compare", []string{"-baseline", base, "-results", results}, 0, "+0.0", "wrote"},
		{"growth beyond a negative limit", []string{"-baseline", base, "-max-growth", "-1"}, 1, "| growth |", "-update-baseline"},
		{"json", []string{"-baseline", base, "-json"}, 0, `"status": "ok"`, ""},
	}
	for _, s := range steps {
		var out, errb bytes.Buffer
		code := run(s.args, &out, &errb)
		if code != s.code || !strings.Contains(out.String(), s.inStdout) || !strings.Contains(errb.String(), s.inStderr) {
			t.Errorf("%s: exit %d (want %d)\nstdout:\n%s\nstderr:\n%s", s.desc, code, s.code, out.String(), errb.String())
		}
	}
	if ents, err := os.ReadDir(results); err != nil || len(ents) != 2 {
		t.Errorf("results dir: %v, %v", ents, err)
	}
}

// TestRunFrom records counts from a report measured elsewhere (a VM) without loading
// anything, keeps the other kernels' entries, and refuses files that are not reports.
func TestRunFrom(t *testing.T) {
	dir := t.TempDir()
	base := filepath.Join(dir, "baseline.json")
	if err := os.WriteFile(base, []byte(`{"6.18": {"axon_pod_egress": 700}}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	rep := filepath.Join(dir, "verifier-6.1.json")
	if err := os.WriteFile(rep, []byte(`{"kernel": "6.1", "release": "6.1.0-56-amd64", "results": [
		{"kernel": "6.1", "object": "podegress", "program": "axon_pod_egress", "type": "SchedCLS", "loads": true, "insns": 726},
		{"kernel": "6.1", "object": "socklb", "program": "axon_sock_destroy", "type": "Tracing", "loads": false, "status": "unsupported", "detail": "kernel feature missing"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"kernel": "latest"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := run([]string{"-baseline", base, "-from", rep, "-update-baseline"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out.String(), errb.String())
	}
	got, _ := os.ReadFile(base)
	for _, want := range []string{`"6.18"`, `"axon_pod_egress": 700`, `"6.1"`, `"axon_pod_egress": 726`} {
		if !strings.Contains(string(got), want) {
			t.Errorf("baseline lacks %s:\n%s", want, got)
		}
	}
	if strings.Contains(string(got), "axon_sock_destroy") {
		t.Errorf("an unsupported program got a baseline entry:\n%s", got)
	}
	if !strings.Contains(out.String(), "unsupported: kernel feature missing") {
		t.Errorf("report does not show the unsupported program:\n%s", out.String())
	}
	for _, f := range []string{bad, filepath.Join(dir, "missing.json")} {
		out.Reset()
		errb.Reset()
		if code := run([]string{"-baseline", base, "-from", f}, &out, &errb); code != 2 {
			t.Errorf("-from %s: exit %d, want 2 (%s)", f, code, errb.String())
		}
	}
}
