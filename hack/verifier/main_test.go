package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
	if os.Geteuid() != 0 {
		t.Skip("needs root: loads BPF programs into the kernel")
	}
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
