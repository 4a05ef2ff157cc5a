// Command testsummary reads `go test -json` on stdin and prints a readable report: one line per
// package, every skipped test and subtest with its reason (grouped by package), the output of
// every failed test, and a closing line "N passed, N failed, N skipped". The counts are go test's
// own: every test and every subtest that ended, one per "--- PASS/FAIL/SKIP" line of `go test -v`.
// It exits 1 when a test or a package (build error, panic, timeout) failed, or when no test ran.
//
//	go test -json ./... | go run ./hack/testsummary
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strings"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
	// Since Go 1.24 the compiler's errors arrive as "build-output" events of ImportPath, and the
	// package's "fail" event names the failed build in FailedBuild.
	ImportPath  string
	FailedBuild string
}

type key struct{ pkg, test string }

type summary struct {
	passed, failed, skipped int
	failedTests             []key
	skippedTests            []key
	pkgResult               map[string]string // package → pass/fail/skip
	pkgElapsed              map[string]float64
	output                  map[key]*strings.Builder
	nonJSON                 []string                    // build errors etc. printed by go test outside JSON
	buildOutput             map[string]*strings.Builder // build-output by ImportPath
	failedBuild             map[string]string           // package → the ImportPath of its failed build
}

func summarize(r io.Reader) (*summary, error) {
	s := &summary{pkgResult: map[string]string{}, pkgElapsed: map[string]float64{}, output: map[key]*strings.Builder{},
		buildOutput: map[string]*strings.Builder{}, failedBuild: map[string]string{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1024*1024), 64*1024*1024)
	for sc.Scan() {
		line := sc.Bytes()
		var ev event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &ev) != nil {
			s.nonJSON = append(s.nonJSON, string(line))
			continue
		}
		k := key{ev.Package, ev.Test}
		switch ev.Action {
		case "build-output":
			b := s.buildOutput[ev.ImportPath]
			if b == nil {
				b = &strings.Builder{}
				s.buildOutput[ev.ImportPath] = b
			}
			b.WriteString(ev.Output)
		case "output":
			b := s.output[k]
			if b == nil {
				b = &strings.Builder{}
				s.output[k] = b
			}
			b.WriteString(ev.Output)
		case "pass", "fail", "skip":
			if ev.Test == "" {
				if ev.FailedBuild != "" {
					s.failedBuild[ev.Package] = ev.FailedBuild
				}
				s.pkgResult[ev.Package] = ev.Action
				s.pkgElapsed[ev.Package] = ev.Elapsed
				continue
			}
			// Subtests count like tests, as go test reports them: a subtest's skip
			// would otherwise hide behind its passing parent.
			switch ev.Action {
			case "pass":
				s.passed++
			case "fail":
				s.failed++
				s.failedTests = append(s.failedTests, k)
			case "skip":
				s.skipped++
				s.skippedTests = append(s.skippedTests, k)
			}
		}
	}
	return s, sc.Err()
}

func (s *summary) report(w io.Writer) (ok bool) {
	pkgs := make([]string, 0, len(s.pkgResult))
	for p := range s.pkgResult {
		pkgs = append(pkgs, p)
	}
	sort.Strings(pkgs)
	// A package that failed with no failed test (build error, panic, timeout) counts as one
	// failure, so the closing line never reads "0 failed" for a failed run.
	withFailedTest := map[string]bool{}
	for _, k := range s.failedTests {
		withFailedTest[k.pkg] = true
	}
	failedPkgs := 0
	for _, p := range pkgs {
		res := s.pkgResult[p]
		if res == "fail" && !withFailedTest[p] {
			failedPkgs++
		}
		fmt.Fprintf(w, "%-4s %s (%.1fs)\n", strings.ToUpper(res), p, s.pkgElapsed[p])
	}
	// Every skip, of a test or a subtest, is shown with its reason (the t.Skip message), so a
	// skip can never hide a missing facility silently. Grouped by package, sorted by name.
	skips := map[string][]string{}
	for _, k := range s.skippedTests {
		skips[k.pkg] = append(skips[k.pkg], k.test)
	}
	skipPkgs := make([]string, 0, len(skips))
	for p := range skips {
		skipPkgs = append(skipPkgs, p)
	}
	sort.Strings(skipPkgs)
	for _, p := range skipPkgs {
		tests := skips[p]
		sort.Strings(tests)
		fmt.Fprintf(w, "\nSKIP %s: %d skipped\n", p, len(tests))
		for _, t := range tests {
			fmt.Fprintf(w, "--- SKIP: %s %s: %s\n", p, t, skipReason(s.output[key{p, t}]))
		}
	}
	for _, k := range s.failedTests {
		fmt.Fprintf(w, "\n--- FAIL: %s %s\n", k.pkg, k.test)
		if b := s.output[k]; b != nil {
			fmt.Fprint(w, b.String())
		}
	}
	// Package-level output of failed packages (build errors, panics, timeouts outside a test).
	for _, p := range pkgs {
		if s.pkgResult[p] == "fail" {
			if b := s.output[key{p, ""}]; b != nil && !strings.Contains(b.String(), "--- FAIL") {
				fmt.Fprintf(w, "\n--- FAIL: package %s\n%s", p, b.String())
			}
			if b := s.buildOutput[s.failedBuild[p]]; b != nil {
				fmt.Fprint(w, b.String())
			}
		}
	}
	if len(s.nonJSON) > 0 {
		fmt.Fprintf(w, "\n%s\n", strings.Join(s.nonJSON, "\n"))
	}
	fmt.Fprintf(w, "\n%d passed, %d failed, %d skipped\n", s.passed, s.failed+failedPkgs, s.skipped)
	switch {
	case s.failed > 0 || failedPkgs > 0:
		return false
	case s.passed == 0:
		fmt.Fprintln(w, "testsummary: no test ran")
		return false
	}
	return true
}

func main() {
	s, err := summarize(os.Stdin)
	if err != nil {
		fmt.Fprintf(os.Stderr, "testsummary: read go test -json: %v\n", err)
		os.Exit(2)
	}
	if !s.report(os.Stdout) {
		os.Exit(1)
	}
}

// logLine matches the first line of a t.Log/t.Skip message: "    file_test.go:12: text".
var logLine = regexp.MustCompile(`^\s*[^\s:]+\.go:\d+: `)

// skipReason picks the t.Skip message out of a skipped test's output: the last logged message
// (its "file.go:N:" line and the continuation lines after it, joined by " / "), else the last
// line that is not go test's own "=== RUN"/"=== PAUSE"/"--- SKIP" bookkeeping.
func skipReason(out *strings.Builder) string {
	if out == nil {
		return "(no reason given)"
	}
	var msg []string // the last logged message so far
	var last string  // the last non-bookkeeping line
	for _, raw := range strings.Split(out.String(), "\n") {
		l := strings.TrimSpace(raw)
		if l == "" || strings.HasPrefix(l, "=== ") || strings.HasPrefix(l, "--- ") {
			continue
		}
		last = l
		switch {
		case logLine.MatchString(raw):
			msg = []string{l}
		case msg != nil:
			msg = append(msg, l)
		}
	}
	switch {
	case msg != nil:
		return strings.Join(msg, " / ")
	case last != "":
		return last
	}
	return "(no reason given)"
}
