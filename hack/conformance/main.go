// Command conformance runs the upstream sig-network conformance tests (the e2e.test binary of
// `make conformance-deps`) against a real-kubelet lab (`axon lab up --kubelet --pods-per-node
// 0`, brought up unless one runs) and writes the results into one directory:
//
//	e2e.log      e2e.test's output
//	junit/       its JUnit XML (--report-dir)
//	run.json     the datapath under test (--datapath, --kube-proxy)
//	results.md   test name → pass/fail/skip and duration, the command and the counts
//
// With --datapath baseline --kube-proxy iptables|nftables the lab's nodes run the reference
// ptp + host-local + portmap chain and kube-proxy instead of axon; --compare renders runs side
// by side (compare.md), test by test; a spec the skip list (--skips) skips for axon only is
// listed as skipped by design, not as a test axon failed.
//
// Skips come from a file (skips.txt): one regular expression per line, each with its reason
// after " # "; a line without a reason is an error. A line that starts with "@axon " or
// "@baseline " skips only on that datapath (a spec of the other's own machinery). `make conformance` runs it; it is not part
// of `make test` (a run takes tens of minutes). Needs root, like the lab.
package main

import (
	"context"
	"encoding/xml"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/axonhq/axon/internal/lab"
	"github.com/axonhq/axon/internal/lab/controlplane"
)

// DefaultFocus selects the sig-network conformance tests.
const DefaultFocus = `\[sig-network\].*\[Conformance\]`

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "conformance:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		binDir   = flag.String("bin-dir", "bin", "directory holding axon (for `axon lab up`)")
		stateDir = flag.String("state-dir", lab.DefaultStateDir, "the lab's state directory")
		e2e      = flag.String("e2e", filepath.Join(lab.DepsDir(), "k8s-"+lab.K8sVersion, "e2e.test"), "the e2e.test binary (make conformance-deps)")
		skips    = flag.String("skips", "hack/conformance/skips.txt", "skip list: `regex # reason` per line")
		focus    = flag.String("focus", DefaultFocus, "ginkgo focus regex")
		timeout  = flag.Duration("timeout", 90*time.Minute, "bound on the whole e2e.test run (ginkgo.timeout)")
		out      = flag.String("out", "", "results directory (default results/conformance-<UTC date and time>)")
		noUp     = flag.Bool("no-up", false, "do not run `axon lab up --kubelet`: use the lab that runs")
		extra    = flag.String("e2e-args", "", "more e2e.test arguments, space separated (e.g. --dns-domain=x)")
		procs    = flag.Int("procs", 3, "parallel e2e.test processes, through the ginkgo CLI next to e2e.test (1: e2e.test alone)")
		render   = flag.Bool("render", false, "run nothing: write results.md from the JUnit already in --out (e.g. after an interrupted run)")
		datapath = flag.String("datapath", lab.DatapathAxon, "the lab's datapath: axon (its chart, no kube-proxy) or baseline (ptp chain + --kube-proxy)")
		kproxy   = flag.String("kube-proxy", "none", "with --datapath baseline: iptables or nftables")
		compare  = flag.String("compare", "", "run nothing: write compare.md into --out from these result directories (comma separated), test by test")
	)
	flag.Parse()
	if *out == "" {
		*out = filepath.Join("results", "conformance-"+time.Now().UTC().Format("20060102-1504"))
	}
	// absolute: the ginkgo CLI runs e2e.test in e2e.test's own directory
	abs, err := filepath.Abs(*out)
	if err != nil {
		return fmt.Errorf("results dir: %w", err)
	}
	*out = abs
	if *compare != "" {
		return writeCompare(*out, strings.Split(*compare, ","), *skips)
	}
	rs := runSpec{Datapath: *datapath, KubeProxy: *kproxy}
	if *focus != DefaultFocus {
		if _, err := regexp.Compile(*focus); err != nil {
			return fmt.Errorf("--focus %q: %w", *focus, err)
		}
		rs.Focus = *focus
	}
	if err := rs.validate(); err != nil {
		return err
	}
	if *render {
		cases, err := readJUnit(filepath.Join(*out, "junit"))
		if err != nil {
			return err
		}
		st, _ := os.Stat(filepath.Join(*out, "e2e.log"))
		var t0 time.Time
		if st != nil {
			t0 = st.ModTime().UTC()
		}
		focus := rs.Focus
		rs = readRunSpec(*out)
		if focus != "" { // --focus given again: a run.json from before it recorded its focus
			rs.Focus = focus
		}
		sk, err := readSkips(*skips, rs.Datapath)
		if err != nil {
			return err
		}
		md := resultsMarkdown(cases, sk, rs, "(the command is the first line of e2e.log)", t0, 0)
		return os.WriteFile(filepath.Join(*out, "results.md"), []byte(md), 0o644)
	}
	if _, err := os.Stat(*e2e); err != nil {
		return fmt.Errorf("e2e.test: %w: run `make conformance-deps`", err)
	}
	kubectl, err := lab.DepPath("kubectl")
	if err != nil {
		return err
	}
	sk, err := readSkips(*skips, rs.Datapath)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(*out, "junit"), 0o755); err != nil {
		return err
	}
	if err := rs.write(*out); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if !*noUp {
		up := exec.CommandContext(ctx, filepath.Join(*binDir, "axon"), "lab", "up", "--state-dir", *stateDir, "--bin-dir", *binDir,
			"--kubelet", "--nodes", "2", "--pods-per-node", "0", "--datapath", rs.Datapath, "--kube-proxy", rs.KubeProxy)
		up.Stdout, up.Stderr = os.Stdout, os.Stderr
		fmt.Println("+", strings.Join(up.Args, " "))
		if err := up.Run(); err != nil {
			return fmt.Errorf("axon lab up --kubelet: %w", err)
		}
	}
	kubeconfig := controlplane.AdminKubeconfigPath(filepath.Join(*stateDir, "controlplane"))
	args := e2eArgs(kubeconfig, kubectl, filepath.Join(*out, "junit"))
	if *extra != "" {
		args = append(args, strings.Fields(*extra)...)
	}
	ginkgo := filepath.Join(filepath.Dir(*e2e), "ginkgo")
	if _, err := os.Stat(ginkgo); err != nil && *procs > 1 {
		fmt.Printf("conformance: no %s (make conformance-deps builds it): running e2e.test alone\n", ginkgo)
		*procs = 1
	}
	bin := *e2e
	if *procs > 1 {
		bin, args = ginkgo, ginkgoArgs(*procs, *focus, skipRegex(sk), *timeout, *e2e, args)
	} else {
		args = append(args, ginkgoFlags("--ginkgo.", *focus, skipRegex(sk), *timeout)...)
	}
	logf, err := os.Create(filepath.Join(*out, "e2e.log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout = io.MultiWriter(os.Stdout, logf)
	cmd.Stderr = cmd.Stdout
	cmd.WaitDelay = 30 * time.Second
	command := bin + " " + strings.Join(quoteArgs(args), " ")
	fmt.Println("+", command)
	t0 := time.Now().UTC()
	runErr := cmd.Run() // a failing test makes e2e.test exit 1: the report says which
	cases, err := readJUnit(filepath.Join(*out, "junit"))
	if err != nil {
		return errors.Join(fmt.Errorf("e2e.test: %v", runErr), err)
	}
	took := time.Since(t0)
	sandbox, err := collectSandbox(ctx, kubectl, kubeconfig, *out)
	if err != nil {
		fmt.Println("conformance: no pod sandbox times:", err)
	}
	md := resultsMarkdown(cases, sk, rs, command, t0, took)
	if len(sandbox) > 0 {
		md += "\n## Pod sandbox creation (kubelet's " + sandboxMetric + ", whole run)\n\n" + sandboxMarkdown(sandbox)
	}
	if err := os.WriteFile(filepath.Join(*out, "results.md"), []byte(md), 0o644); err != nil {
		return err
	}
	c := count(cases, rs.focusRE())
	fmt.Printf("conformance: %d passed, %d failed, %d skipped (%s): %s\n", c.pass, c.fail, c.skip, took.Round(time.Second), filepath.Join(*out, "results.md"))
	if c.fail > 0 {
		return fmt.Errorf("%d tests failed: see %s", c.fail, filepath.Join(*out, "results.md"))
	}
	return nil
}

// e2eArgs are e2e.test's own arguments for the lab: two nodes, all Ready; no cloud provider;
// no log dump (it would ssh into nodes); kubectl from the lab's cache.
func e2eArgs(kubeconfig, kubectl, reportDir string) []string {
	return []string{
		"--kubeconfig=" + kubeconfig,
		"--kubectl-path=" + kubectl,
		"--provider=skeleton",
		"--num-nodes=2",
		"--allowed-not-ready-nodes=0",
		"--disable-log-dump",
		"--report-dir=" + reportDir,
	}
}

// ginkgoFlags select and bound the specs: prefix "--ginkgo." for e2e.test, "--" for the CLI.
func ginkgoFlags(prefix, focus, skip string, timeout time.Duration) []string {
	f := []string{prefix + "focus=" + focus, prefix + "timeout=" + timeout.String(), prefix + "no-color", prefix + "v"}
	if skip != "" {
		f = append(f, prefix+"skip="+skip)
	}
	return f
}

// ginkgoArgs run e2e.test in procs parallel processes through the ginkgo CLI (specs marked
// [Serial] still run alone, at the end).
func ginkgoArgs(procs int, focus, skip string, timeout time.Duration, e2e string, e2eArgs []string) []string {
	args := append([]string{"--procs=" + strconv.Itoa(procs)}, ginkgoFlags("--", focus, skip, timeout)...)
	args = append(args, e2e, "--")
	return append(args, e2eArgs...)
}

func quoteArgs(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		if strings.ContainsAny(a, ` \[]()|*'"$`) {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		out[i] = a
	}
	return out
}

// skip is one line of the skip list.
type skip struct {
	re     *regexp.Regexp
	reason string
}

// readSkips parses the skip list for a run on datapath: `regex # reason` per line, or
// `@<datapath> regex # reason` for a skip of that datapath only; blank lines and lines starting
// with '#' are comments.
func readSkips(path, datapath string) ([]skip, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("skip list: %w", err)
	}
	return parseSkips(string(b), path, datapath)
}

func parseSkips(text, name, datapath string) ([]skip, error) {
	var out []skip
	for i, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		only := ""
		if rest, ok := strings.CutPrefix(line, "@"); ok {
			only, line, _ = strings.Cut(rest, " ")
			if only != lab.DatapathAxon && only != lab.DatapathBaseline {
				return nil, fmt.Errorf("%s:%d: @%s: a datapath-only skip names %s or %s", name, i+1, only, lab.DatapathAxon, lab.DatapathBaseline)
			}
		}
		expr, reason, ok := strings.Cut(line, " # ")
		expr, reason = strings.TrimSpace(expr), strings.TrimSpace(reason)
		if !ok || reason == "" {
			return nil, fmt.Errorf("%s:%d: %q has no reason: write `regex # why it is skipped`", name, i+1, line)
		}
		re, err := regexp.Compile(expr)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", name, i+1, err)
		}
		if only != "" && only != datapath {
			continue
		}
		out = append(out, skip{re: re, reason: reason})
	}
	return out, nil
}

// skipRegex is ginkgo's --ginkgo.skip: the alternation of every skip.
func skipRegex(sk []skip) string {
	parts := make([]string, len(sk))
	for i, s := range sk {
		parts[i] = "(" + s.re.String() + ")"
	}
	return strings.Join(parts, "|")
}

// skipReason is the reason of the first skip matching name, or "".
func skipReason(sk []skip, name string) string {
	for _, s := range sk {
		if s.re.MatchString(name) {
			return s.reason
		}
	}
	return ""
}

// testCase is one JUnit test case.
type testCase struct {
	Name    string  `xml:"name,attr"`
	Time    float64 `xml:"time,attr"`
	Status  string  `xml:"status,attr"`
	Skipped *struct {
		Message string `xml:"message,attr"`
	} `xml:"skipped"`
	Failure *struct {
		Message string `xml:"message,attr"`
		Text    string `xml:",chardata"`
	} `xml:"failure"`
	Error *struct {
		Message string `xml:"message,attr"`
	} `xml:"error"`
}

func (c testCase) result() string {
	switch {
	case c.Failure != nil || c.Error != nil:
		return "fail"
	case c.Skipped != nil || c.Status == "skipped" || c.Status == "pending":
		return "skip"
	default:
		return "pass"
	}
}

func (c testCase) message() string {
	m := ""
	switch {
	case c.Failure != nil:
		m = c.Failure.Message
		if m == "" {
			m = c.Failure.Text
		}
	case c.Error != nil:
		m = c.Error.Message
	}
	m = strings.Join(strings.Fields(m), " ")
	if len(m) > 300 {
		m = m[:300] + "…"
	}
	return m
}

// readJUnit reads every *.xml in dir (ginkgo writes junit_01.xml).
func readJUnit(dir string) ([]testCase, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.xml"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no JUnit report in %s: e2e.test did not run its suite (see e2e.log)", dir)
	}
	var all []testCase
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		cs, err := parseJUnit(b)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		all = append(all, cs...)
	}
	return all, nil
}

func parseJUnit(b []byte) ([]testCase, error) {
	var doc struct {
		Suites []struct {
			Cases []testCase `xml:"testcase"`
		} `xml:"testsuite"`
		Cases []testCase `xml:"testcase"` // a bare <testsuite> root
	}
	if err := xml.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("parse JUnit: %w", err)
	}
	out := doc.Cases
	for _, s := range doc.Suites {
		out = append(out, s.Cases...)
	}
	return out, nil
}

type counts struct{ pass, fail, skip int }

// count counts the focused tests: ginkgo lists every spec of the binary in its JUnit, the
// unfocused ones as skipped; the suite's setup nodes ([SynchronizedBeforeSuite] …) too.
func count(cases []testCase, focus *regexp.Regexp) counts {
	var c counts
	for _, tc := range focused(cases, focus) {
		switch tc.result() {
		case "pass":
			c.pass++
		case "fail":
			c.fail++
		default:
			c.skip++
		}
	}
	return c
}

var focusRE = regexp.MustCompile(DefaultFocus)

// focused keeps the specs the run's focus selects (ginkgo reports every spec, unfocused ones
// as skipped) and failures of anything else (e.g. the suite's setup).
func focused(cases []testCase, focus *regexp.Regexp) []testCase {
	var out []testCase
	for _, c := range cases {
		if focus.MatchString(c.Name) || c.result() == "fail" {
			out = append(out, c)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// resultsMarkdown is results.md: counts, the command, and a row per focused test.
func resultsMarkdown(cases []testCase, sk []skip, rs runSpec, command string, start time.Time, took time.Duration) string {
	c := count(cases, rs.focusRE())
	var b strings.Builder
	fmt.Fprintf(&b, "# sig-network conformance on `axon lab up --kubelet`: %s\n\n", rs.label())
	dur := ""
	if took > 0 {
		dur = ", " + took.Round(time.Second).String()
	}
	fmt.Fprintf(&b, "Run %s UTC%s. **%d passed, %d failed, %d skipped.**\n\n", start.Format("2006-01-02 15:04"), dur, c.pass, c.fail, c.skip)
	fmt.Fprintf(&b, "```\n%s\n```\n\n", command)
	fmt.Fprintf(&b, "| test | result | seconds | note |\n|---|---|---|---|\n")
	for _, tc := range focused(cases, rs.focusRE()) {
		note := ""
		switch tc.result() {
		case "fail":
			note = tc.message()
		case "skip":
			note = skipReason(sk, tc.Name)
			if note == "" && tc.Skipped != nil { // the suite's own skip, e.g. "Requires more than one zone"
				note = "skipped by the suite: " + strings.TrimPrefix(tc.Skipped.Message, "skipped - ")
			}
		}
		fmt.Fprintf(&b, "| %s | %s | %.1f | %s |\n", mdCell(tc.Name), tc.result(), tc.Time, mdCell(note))
	}
	return b.String()
}

func mdCell(s string) string {
	return strings.NewReplacer("|", `\|`, "\n", " ").Replace(s)
}
