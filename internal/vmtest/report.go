package vmtest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"path"
	"regexp"
	"sort"
	"strings"
	"time"
)

// Outcome of one test.
type Outcome string

const (
	Pass Outcome = "PASS"
	Fail Outcome = "FAIL"
	Skip Outcome = "SKIP"
)

// TestResult is one test (or subtest, named "TestX/sub") of a package.
type TestResult struct {
	Name    string
	Outcome Outcome
	Reason  string // skip reason (the t.Skip message), or the last output line of a failure
	Output  string // everything the test printed
	Elapsed time.Duration
}

// PackageResult is one test binary's run on one kernel.
type PackageResult struct {
	Package  string
	Tests    []TestResult
	ExitCode int
	Output   string // output outside any test (build/panic/timeouts land here)
	Elapsed  time.Duration
}

// Counts returns pass, fail, skip over all tests and subtests.
func (p PackageResult) Counts() (pass, fail, skip int) {
	for _, t := range p.Tests {
		switch t.Outcome {
		case Pass:
			pass++
		case Fail:
			fail++
		case Skip:
			skip++
		}
	}
	return
}

// Failed reports a failed test, or a binary that exited non-zero (panic, timeout, no tests
// reported at all).
func (p PackageResult) Failed() bool {
	_, fail, _ := p.Counts()
	return fail > 0 || p.ExitCode != 0 || len(p.Tests) == 0
}

// event is one line of cmd/test2json output.
type event struct {
	Action  string
	Test    string
	Elapsed float64
	Output  string
}

// Test2JSON converts the output of a test binary run with -test.v=test2json into
// test2json events using the Go toolchain's own converter.
func Test2JSON(ctx context.Context, goTool, pkg string, raw []byte) ([]byte, error) {
	cmd := exec.CommandContext(ctx, goTool, "tool", "test2json", "-t", "-p", pkg)
	cmd.Stdin = bytes.NewReader(raw)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go tool test2json: %w: %s", err, stderr.String())
	}
	return out, nil
}

// ParseTestJSON reads test2json events of one package into a PackageResult.
func ParseTestJSON(pkg string, r io.Reader, exitCode int) (PackageResult, error) {
	res := PackageResult{Package: pkg, ExitCode: exitCode}
	outputs := map[string]*strings.Builder{}
	index := map[string]int{}
	var pkgOut strings.Builder
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var ev event
		if err := json.Unmarshal(line, &ev); err != nil {
			pkgOut.Write(line)
			pkgOut.WriteByte('\n')
			continue
		}
		if ev.Test == "" {
			switch ev.Action {
			case "output":
				pkgOut.WriteString(ev.Output)
			case "pass", "fail", "skip":
				res.Elapsed = time.Duration(ev.Elapsed * float64(time.Second))
			}
			continue
		}
		switch ev.Action {
		case "run":
			outputs[ev.Test] = &strings.Builder{}
		case "output":
			if b := outputs[ev.Test]; b != nil {
				b.WriteString(ev.Output)
			} else {
				outputs[ev.Test] = &strings.Builder{}
				outputs[ev.Test].WriteString(ev.Output)
			}
		case "pass", "fail", "skip":
			out := ""
			if b := outputs[ev.Test]; b != nil {
				out = b.String()
			}
			tr := TestResult{
				Name: ev.Test, Outcome: Outcome(strings.ToUpper(ev.Action)), Output: out,
				Elapsed: time.Duration(ev.Elapsed * float64(time.Second)),
			}
			tr.Reason = reasonOf(out)
			if i, ok := index[ev.Test]; ok {
				res.Tests[i] = tr
			} else {
				index[ev.Test] = len(res.Tests)
				res.Tests = append(res.Tests, tr)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return res, fmt.Errorf("read test events of %s: %w", pkg, err)
	}
	// Tests that started but never ended (panic, timeout, VM died) count as failures.
	for name, b := range outputs {
		if _, ok := index[name]; !ok {
			index[name] = len(res.Tests)
			res.Tests = append(res.Tests, TestResult{Name: name, Outcome: Fail, Output: b.String(), Reason: "did not finish (panic, timeout or crash)"})
		}
	}
	res.Output = pkgOut.String()
	return res, nil
}

// reasonOf picks the message of a skip or failure from a test's output: the last message
// logged by the test itself ("    file_test.go:12: needs netkit ..."; its first line when it
// spans several), else the last line that is not framing.
func reasonOf(out string) string {
	var last, logged string
	for _, line := range strings.Split(out, "\n") {
		t := strings.TrimSpace(line)
		if t == "" || strings.HasPrefix(t, "=== ") || strings.HasPrefix(t, "--- ") {
			continue
		}
		last = t
		if m := logLineRe.FindStringSubmatch(t); m != nil {
			logged = m[1]
		}
	}
	if logged != "" {
		return logged
	}
	return last
}

var logLineRe = regexp.MustCompile(`^[\w.-]+\.go:\d+: (.*)$`)

// KernelRun is the result of all packages on one kernel (the host or a VM).
type KernelRun struct {
	Kernel   string // host, debian-6.12, ...
	Release  string // uname -r
	Accel    string // "-" for the host, tcg or kvm
	Fetch    time.Duration
	Cached   bool          // the kernel came from the cache (Fetch is then only the lookup)
	Boot     time.Duration // QEMU start → init running
	Shell    time.Duration // QEMU start → shares mounted, tests starting
	Total    time.Duration
	Packages []PackageResult
	Err      error // the run itself failed (VM panic/hang, build, fetch)
	Console  string
}

// Failed reports whether this kernel's column is red.
func (k KernelRun) Failed() bool {
	if k.Err != nil || len(k.Packages) == 0 {
		return true
	}
	for _, p := range k.Packages {
		if p.Failed() {
			return true
		}
	}
	return false
}

// Counts sums pass, fail, skip over the packages.
func (k KernelRun) Counts() (pass, fail, skip int) {
	for _, p := range k.Packages {
		a, b, c := p.Counts()
		pass, fail, skip = pass+a, fail+b, skip+c
	}
	return
}

func fmtDur(d time.Duration) string {
	switch {
	case d == 0:
		return "-"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	}
	return d.Round(100 * time.Millisecond).String()
}

// quietFailure says why a kernel run failed with no failed test: no package
// ran, a package ran no test (a -run pattern that matches nothing), or a
// test binary exited non-zero outside any test.
func quietFailure(k KernelRun) string {
	if len(k.Packages) == 0 {
		return "no test package ran"
	}
	var none []string
	for _, p := range k.Packages {
		if len(p.Tests) == 0 {
			none = append(none, path.Base(p.Package))
		}
	}
	if len(none) > 0 {
		return "no test ran in " + strings.Join(none, ", ") + " (does -run match a test there?)"
	}
	return "a test binary exited non-zero"
}

// WriteMatrix prints the human report: one line per kernel, then every test whose outcome
// is not PASS on every kernel, then each skip and failure with its reason, and a closing
// "N passed, N failed, N skipped" line.
func WriteMatrix(w io.Writer, runs []KernelRun) {
	fmt.Fprintf(w, "\n== kernel matrix ==\n")
	fmt.Fprintf(w, "%-12s %-24s %-5s %8s %8s %8s %6s %6s %6s  %s\n", "kernel", "release", "accel", "fetch", "to-shell", "total", "pass", "fail", "skip", "result")
	var tp, tf, ts int
	for _, k := range runs {
		p, f, s := k.Counts()
		tp, tf, ts = tp+p, tf+f, ts+s
		verdict := "ok"
		if k.Failed() {
			verdict = "FAIL"
			if k.Err != nil {
				verdict = "FAIL: " + firstLine(k.Err.Error())
			} else if f == 0 {
				verdict = "FAIL: " + quietFailure(k)
			}
		}
		fetch := fmtDur(k.Fetch)
		if k.Cached {
			fetch = "cached"
		}
		fmt.Fprintf(w, "%-12s %-24s %-5s %8s %8s %8s %6d %6d %6d  %s\n", k.Kernel, k.Release, k.Accel,
			fetch, fmtDur(k.Shell), fmtDur(k.Total), p, f, s, verdict)
	}

	fmt.Fprintf(w, "\nper package (wall time inside the kernel):\n")
	for _, k := range runs {
		for _, p := range k.Packages {
			a, b, c := p.Counts()
			fmt.Fprintf(w, "  %-12s %-40s %8s  %d/%d/%d pass/fail/skip, exit %d\n", k.Kernel, p.Package, fmtDur(p.Elapsed), a, b, c, p.ExitCode)
		}
	}

	// Outcome grid of tests that did not pass somewhere they ran ("-": not run there).
	type cell = map[string]TestResult
	grid := map[string]cell{}
	var names []string
	for _, k := range runs {
		for _, p := range k.Packages {
			for _, t := range p.Tests {
				key := shortPkg(p.Package) + "." + t.Name
				if grid[key] == nil {
					grid[key] = cell{}
					names = append(names, key)
				}
				grid[key][k.Kernel] = t
			}
		}
	}
	sort.Strings(names)
	var odd []string
	for _, n := range names {
		for _, k := range runs {
			if t, ok := grid[n][k.Kernel]; ok && t.Outcome != Pass {
				odd = append(odd, n)
				break
			}
		}
	}
	if len(odd) > 0 {
		width := 10
		for _, n := range odd {
			width = max(width, len(n))
		}
		fmt.Fprintf(w, "\ntests not passing everywhere (%d of %d):\n%-*s", len(odd), len(names), width, "test")
		for _, k := range runs {
			fmt.Fprintf(w, " %-12s", k.Kernel)
		}
		fmt.Fprintln(w)
		for _, n := range odd {
			fmt.Fprintf(w, "%-*s", width, n)
			for _, k := range runs {
				o := "-"
				if t, ok := grid[n][k.Kernel]; ok {
					o = string(t.Outcome)
				}
				fmt.Fprintf(w, " %-12s", o)
			}
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "\nreasons:\n")
		for _, k := range runs {
			for _, n := range odd {
				if t, ok := grid[n][k.Kernel]; ok && t.Outcome != Pass {
					fmt.Fprintf(w, "  %-12s %s %s: %s\n", k.Kernel, t.Outcome, n, t.Reason)
				}
			}
		}
		// A failure's reason is one line; what it printed says why (the VM's
		// outputs may be gone by the time a CI log is read).
		for _, k := range runs {
			shown := 0
			for _, n := range odd {
				t, ok := grid[n][k.Kernel]
				if !ok || t.Outcome != Fail || strings.TrimSpace(t.Output) == "" {
					continue
				}
				if shown == maxFailOutputs {
					fmt.Fprintf(w, "\n%s: the output of further failed tests is in %s's outputs\n", k.Kernel, k.Kernel)
					break
				}
				shown++
				fmt.Fprintf(w, "\n%s FAIL %s, its output (last %d lines):\n%s\n", k.Kernel, n, failOutputLines, tail(t.Output, failOutputLines))
			}
		}
	}
	for _, k := range runs {
		if k.Err != nil {
			fmt.Fprintf(w, "\n%s: %v\n", k.Kernel, k.Err)
		}
		for _, p := range k.Packages {
			if p.Failed() && strings.TrimSpace(p.Output) != "" {
				fmt.Fprintf(w, "\n%s %s exited %d; output outside tests:\n%s\n", k.Kernel, p.Package, p.ExitCode, tail(p.Output, 40))
			}
		}
	}
	fmt.Fprintf(w, "\n%d passed, %d failed, %d skipped\n", tp, tf, ts)
}

// WriteMarkdown writes the full grid (every test × kernel) as a Markdown table.
func WriteMarkdown(w io.Writer, runs []KernelRun) {
	fmt.Fprintf(w, "# Kernel matrix\n\n| kernel | release | accel | fetch | boot to shell | total | pass | fail | skip |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, k := range runs {
		p, f, s := k.Counts()
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %d | %d | %d |\n", k.Kernel, k.Release, k.Accel, fmtDur(k.Fetch), fmtDur(k.Shell), fmtDur(k.Total), p, f, s)
	}
	fmt.Fprintf(w, "\n| test |")
	for _, k := range runs {
		fmt.Fprintf(w, " %s |", k.Kernel)
	}
	fmt.Fprintf(w, "\n|---|%s\n", strings.Repeat("---|", len(runs)))
	seen := map[string]bool{}
	var names []string
	res := map[string]map[string]TestResult{}
	for _, k := range runs {
		for _, p := range k.Packages {
			for _, t := range p.Tests {
				key := shortPkg(p.Package) + "." + t.Name
				if !seen[key] {
					seen[key] = true
					names = append(names, key)
					res[key] = map[string]TestResult{}
				}
				res[key][k.Kernel] = t
			}
		}
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "| %s |", n)
		for _, k := range runs {
			t, ok := res[n][k.Kernel]
			switch {
			case !ok:
				fmt.Fprintf(w, " - |")
			case t.Outcome == Pass:
				fmt.Fprintf(w, " pass |")
			default:
				fmt.Fprintf(w, " %s: %s |", strings.ToLower(string(t.Outcome)), strings.ReplaceAll(t.Reason, "|", "\\|"))
			}
		}
		fmt.Fprintln(w)
	}
}

func shortPkg(p string) string {
	if i := strings.LastIndex(p, "/"); i >= 0 {
		return p[i+1:]
	}
	return p
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// The report prints the output of at most maxFailOutputs failed tests per
// kernel, failOutputLines lines each.
const (
	maxFailOutputs  = 6
	failOutputLines = 30
)

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
