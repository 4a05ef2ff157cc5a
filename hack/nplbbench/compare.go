package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/axonhq/axon/internal/bench"
	"github.com/axonhq/axon/internal/stats"
)

// benchRun is one nplbbench output (<dir>/<build>.<rep>.md).
type benchRun struct {
	build                   string
	rep                     int
	psiBefore, psiAfter     string
	ns                      map[string]map[string]float64 // scenario -> hook -> median ns
	scenarios               []string                      // in table order
	verifiedTC, verifiedXDP string
}

var (
	rowRE    = regexp.MustCompile(`^\| (\w+) \| (\d+|–)[^|]*\| (\d+|–)[^|]*\|`)
	psiRE    = regexp.MustCompile(`CPU pressure avg10 ([\d.]+|n/a)[ %]* before, ([\d.]+|n/a)[ %]* after`)
	verifyRE = regexp.MustCompile(`verified instructions: axon_lb_ingress (\d+), axon_lb_xdp (\d+)`)
)

func parseRun(r io.Reader, build string, rep int) (benchRun, error) {
	out := benchRun{build: build, rep: rep, ns: map[string]map[string]float64{}}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if m := psiRE.FindStringSubmatch(line); m != nil {
			out.psiBefore, out.psiAfter = m[1], m[2]
		}
		if m := verifyRE.FindStringSubmatch(line); m != nil {
			out.verifiedTC, out.verifiedXDP = m[1], m[2]
		}
		m := rowRE.FindStringSubmatch(line)
		if m == nil || m[1] == "scenario" {
			continue
		}
		out.ns[m[1]] = map[string]float64{}
		out.scenarios = append(out.scenarios, m[1])
		for i, hook := range []string{"tc", "xdp"} {
			if m[2+i] == "–" {
				continue
			}
			v, err := strconv.ParseFloat(m[2+i], 64)
			if err != nil {
				return out, err
			}
			out.ns[m[1]][hook] = v
		}
	}
	if len(out.scenarios) == 0 {
		return out, fmt.Errorf("%s.%d: no result table", build, rep)
	}
	return out, sc.Err()
}

// compare reads dir/<build>.<rep>.md of every build (repetitions 1..n,
// run alternately by run.sh), writes every sample to csvPath (when not
// empty) and prints the
// paired comparison of each build against the first, and the XDP CT hit
// against the trivial forwarder of the same run.
func compare(dir string, builds []string, csvPath string, stdout io.Writer) error {
	runs := map[string][]benchRun{}
	for _, b := range builds {
		for rep := 1; ; rep++ {
			f, err := os.Open(filepath.Join(dir, fmt.Sprintf("%s.%d.md", b, rep)))
			if os.IsNotExist(err) {
				break
			}
			if err != nil {
				return err
			}
			r, err := parseRun(f, b, rep)
			f.Close()
			if err != nil {
				return fmt.Errorf("%s: %w", f.Name(), err)
			}
			runs[b] = append(runs[b], r)
		}
		if len(runs[b]) == 0 {
			return fmt.Errorf("no %s.<rep>.md in %s", b, dir)
		}
	}
	if csvPath != "" {
		if err := writeCSV(csvPath, builds, runs); err != nil {
			return err
		}
	}
	// series: a build's per-repetition values of one scenario and hook
	series := func(b, sc, hook string) []float64 {
		var xs []float64
		for _, r := range runs[b] {
			v, ok := r.ns[sc][hook]
			if !ok {
				return nil
			}
			xs = append(xs, v)
		}
		return xs
	}
	net := func(b, sc, hook string) []float64 {
		xs, h := series(b, sc, hook), series(b, "empty_program", hook)
		for i := range xs {
			xs[i] -= h[i]
		}
		return xs
	}
	for _, b := range builds {
		r := runs[b][0]
		fmt.Fprintf(stdout, "%s: %d runs; verified instructions axon_lb_ingress %s, axon_lb_xdp %s; CPU pressure avg10 before/after each run: %s\n",
			b, len(runs[b]), r.verifiedTC, r.verifiedXDP, psiList(runs[b]))
	}
	old := builds[0]
	for _, nb := range builds[1:] {
		fmt.Fprintf(stdout, "\n%s against %s, paired by repetition\n\n", nb, old)
		fmt.Fprintln(stdout, "| scenario | hook | old ns | new ns | old − harness | new − harness | new/old, paired (95 % CI) |")
		fmt.Fprintln(stdout, "|---|---|---:|---:|---:|---:|---:|")
		for _, sc := range runs[nb][0].scenarios {
			if sc == "empty_program" {
				continue
			}
			for _, hook := range []string{"tc", "xdp"} {
				o, n := series(old, sc, hook), series(nb, sc, hook)
				if len(n) == 0 {
					continue
				}
				on, nn := "–", fmt.Sprintf("%.0f", stats.Median(net(nb, sc, hook)))
				ov, ratio := "–", "–"
				if len(o) > 0 {
					ov, on = fmt.Sprintf("%.0f", stats.Median(o)), fmt.Sprintf("%.0f", stats.Median(net(old, sc, hook)))
					ratio = bench.FormatPaired(bench.Pair(n, o))
				}
				fmt.Fprintf(stdout, "| %s | %s | %s | %.0f | %s | %s | %s |\n", sc, hookName(hook), ov, stats.Median(n), on, nn, ratio)
			}
		}
	}
	for _, b := range builds {
		fw := series(b, "xdp_forwarder", "xdp")
		if len(fw) == 0 {
			continue
		}
		// gross, harness included: the forwarder's own cost is at or below
		// the test run's timer resolution, so its net value is ~0
		hit, hitNet, fwNet := series(b, "ct_hit", "xdp"), net(b, "ct_hit", "xdp"), net(b, "xdp_forwarder", "xdp")
		fmt.Fprintf(stdout, "\n%s: XDP ct_hit against the trivial forwarder of the same run: %.0f ns against %.0f ns (harness subtracted: %.0f against %.0f); "+
			"ct_hit/forwarder, paired, harness included: %s (target ≤ 1/0.7 = 1.43)\n", b, stats.Median(hit), stats.Median(fw),
			stats.Median(hitNet), stats.Median(fwNet), bench.FormatPaired(bench.Pair(hit, fw)))
	}
	return nil
}

func hookName(h string) string {
	if h == "xdp" {
		return "XDP"
	}
	return h
}

func psiList(rs []benchRun) string {
	var s []string
	for _, r := range rs {
		s = append(s, r.psiBefore+"/"+r.psiAfter)
	}
	return strings.Join(s, ", ")
}

func writeCSV(path string, builds []string, runs map[string][]benchRun) error {
	var b strings.Builder
	b.WriteString("build,repetition,scenario,hook,median_ns,psi_before,psi_after\n")
	for _, name := range builds {
		for _, r := range runs[name] {
			for _, sc := range r.scenarios {
				hooks := make([]string, 0, 2)
				for h := range r.ns[sc] {
					hooks = append(hooks, h)
				}
				slices.Sort(hooks)
				for _, h := range hooks {
					fmt.Fprintf(&b, "%s,%d,%s,%s,%.0f,%s,%s\n", name, r.rep, sc, h, r.ns[sc][h], r.psiBefore, r.psiAfter)
				}
			}
		}
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}
