package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/axonhq/axon/internal/lab"
)

// runSpec is the datapath a run tested (run.json in its results directory).
type runSpec struct {
	Datapath  string `json:"datapath"`        // lab.DatapathAxon or lab.DatapathBaseline
	KubeProxy string `json:"kubeProxy"`       // none (axon) or iptables / nftables (baseline)
	Focus     string `json:"focus,omitempty"` // --focus; "" = DefaultFocus
}

// focusRE is the run's --focus: the specs its results count and list.
func (r runSpec) focusRE() *regexp.Regexp {
	if r.Focus == "" {
		return focusRE
	}
	re, err := regexp.Compile(r.Focus)
	if err != nil {
		return focusRE
	}
	return re
}

func (r runSpec) validate() error {
	switch {
	case r.Datapath == lab.DatapathAxon && r.KubeProxy == "none":
		return nil
	case r.Datapath == lab.DatapathAxon:
		return fmt.Errorf("--datapath %s replaces kube-proxy: leave --kube-proxy at none", lab.DatapathAxon)
	case r.Datapath == lab.DatapathBaseline && (r.KubeProxy == "iptables" || r.KubeProxy == "nftables"):
		return nil
	case r.Datapath == lab.DatapathBaseline:
		return fmt.Errorf("--datapath %s: --kube-proxy %q, want iptables or nftables", lab.DatapathBaseline, r.KubeProxy)
	}
	return fmt.Errorf("--datapath %q: want %s or %s", r.Datapath, lab.DatapathAxon, lab.DatapathBaseline)
}

// label names the datapath in results.md and compare.md.
func (r runSpec) label() string {
	if r.Datapath == lab.DatapathBaseline {
		return "baseline (ptp + host-local + portmap, kube-proxy " + r.KubeProxy + ")"
	}
	return "axon (its chart, no kube-proxy)"
}

// column is label's short form for a table header.
func (r runSpec) column() string {
	if r.Datapath == lab.DatapathBaseline {
		return "kube-proxy " + r.KubeProxy
	}
	return "axon"
}

func (r runSpec) write(dir string) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "run.json"), append(b, '\n'), 0o644)
}

// readRunSpec reads dir's run.json; runs from before it existed tested axon.
func readRunSpec(dir string) runSpec {
	rs := runSpec{Datapath: lab.DatapathAxon, KubeProxy: "none"}
	if b, err := os.ReadFile(filepath.Join(dir, "run.json")); err == nil {
		_ = json.Unmarshal(b, &rs)
	}
	return rs
}

// comparedRun is one results directory of a comparison.
type comparedRun struct {
	dir      string
	spec     runSpec
	result   map[string]string // focused test → pass/fail/skip
	byDesign map[string]string // test → reason: skipped by a skip of this run's datapath only (@axon)
	counts   counts
	sandbox  []sandboxStats // sandbox.json; nil when the run has none
}

// writeCompare writes compare.md into out from the runs in dirs; skipsPath is the skip list,
// whose datapath-only lines tell a skip by design from a common one.
func writeCompare(out string, dirs []string, skipsPath string) error {
	text, err := os.ReadFile(skipsPath)
	if err != nil {
		return fmt.Errorf("--compare: skip list: %w", err)
	}
	common, err := parseSkips(string(text), skipsPath, "")
	if err != nil {
		return err
	}
	var runs []comparedRun
	for _, d := range dirs {
		d = strings.TrimSpace(d)
		cases, err := readJUnit(filepath.Join(d, "junit"))
		if err != nil {
			return fmt.Errorf("--compare %s: %w", d, err)
		}
		spec := readRunSpec(d)
		r := comparedRun{dir: d, spec: spec, result: map[string]string{}, counts: count(cases, spec.focusRE()), sandbox: readSandbox(d)}
		own, err := parseSkips(string(text), skipsPath, spec.Datapath)
		if err != nil {
			return err
		}
		for _, c := range focused(cases, spec.focusRE()) {
			r.result[c.Name] = c.result()
			if why := skipReason(own, c.Name); r.result[c.Name] == "skip" && why != "" && skipReason(common, c.Name) == "" {
				if r.byDesign == nil {
					r.byDesign = map[string]string{}
				}
				r.byDesign[c.Name] = why
			}
		}
		runs = append(runs, r)
	}
	if len(runs) < 2 {
		return errors.New("--compare: give at least two result directories")
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	p := filepath.Join(out, "compare.md")
	if err := os.WriteFile(p, []byte(compareMarkdown(runs)), 0o644); err != nil {
		return err
	}
	fmt.Println("conformance: wrote", p)
	return nil
}

// compareMarkdown is compare.md: a row per run, a row per test with each run's result, and
// whether axon passed every test a baseline passed.
func compareMarkdown(runs []comparedRun) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# sig-network conformance, side by side\n\n")
	fmt.Fprintf(&b, "| run | datapath | passed | failed | skipped |\n|---|---|---|---|---|\n")
	names := map[string]bool{}
	for _, r := range runs {
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %d |\n", filepath.Base(r.dir), r.spec.label(), r.counts.pass, r.counts.fail, r.counts.skip)
		for n := range r.result {
			names[n] = true
		}
	}
	sorted := make([]string, 0, len(names))
	for n := range names {
		sorted = append(sorted, n)
	}
	sort.Strings(sorted)
	fmt.Fprintf(&b, "\n| test |")
	for _, r := range runs {
		fmt.Fprintf(&b, " %s |", r.spec.column())
	}
	fmt.Fprintf(&b, "\n|---|%s\n", strings.Repeat("---|", len(runs)))
	var behind []string             // passed by a baseline, not by an axon run
	designed := map[string]string{} // of those, skipped on axon by design: why
	for _, n := range sorted {
		fmt.Fprintf(&b, "| %s |", mdCell(n))
		baselinePass, axonFail := false, false
		for _, r := range runs {
			res := r.result[n]
			if res == "" {
				res = "-"
			}
			fmt.Fprintf(&b, " %s |", res)
			if r.spec.Datapath == lab.DatapathBaseline && res == "pass" {
				baselinePass = true
			}
			if r.spec.Datapath == lab.DatapathAxon && res != "pass" {
				if why, ok := r.byDesign[n]; ok {
					designed[n] = why
				} else {
					axonFail = true
				}
			}
		}
		b.WriteString("\n")
		if baselinePass && axonFail {
			behind = append(behind, n)
		}
		if !baselinePass {
			delete(designed, n)
		}
	}
	var hasAxon, hasBaseline bool
	for _, r := range runs {
		hasAxon = hasAxon || r.spec.Datapath == lab.DatapathAxon
		hasBaseline = hasBaseline || r.spec.Datapath == lab.DatapathBaseline
	}
	if hasAxon && hasBaseline {
		if len(behind) == 0 && len(designed) == 0 {
			fmt.Fprintf(&b, "\n**axon passed every test a baseline passed.**\n")
		} else if len(behind) == 0 {
			fmt.Fprintf(&b, "\n**axon passed every test a baseline passed but %d it skips by design:**\n\n", len(designed))
			for _, n := range slices.Sorted(maps.Keys(designed)) {
				fmt.Fprintf(&b, "- %s: %s\n", n, designed[n])
			}
		} else {
			fmt.Fprintf(&b, "\n**axon did not pass %d test(s) a baseline passed:**\n\n", len(behind))
			for _, n := range behind {
				fmt.Fprintf(&b, "- %s\n", n)
			}
			if len(designed) > 0 {
				fmt.Fprintf(&b, "\nand skips %d by design:\n\n", len(designed))
				for _, n := range slices.Sorted(maps.Keys(designed)) {
					fmt.Fprintf(&b, "- %s: %s\n", n, designed[n])
				}
			}
		}
	}
	sandbox := ""
	for _, r := range runs {
		if s := sandboxMarkdown(r.sandbox); s != "" {
			sandbox += fmt.Sprintf("\n%s (%s):\n\n%s", r.spec.column(), filepath.Base(r.dir), s)
		}
	}
	if sandbox != "" {
		fmt.Fprintf(&b, "\n## Pod sandbox creation per run\n\nkubelet's `%s` over each whole run; its buckets are 5 ms … 10 s, so the quantiles are estimates inside a bucket.\n%s", sandboxMetric, sandbox)
	}
	return b.String()
}
