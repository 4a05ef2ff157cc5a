// Command verifier prints the verifier report of the running kernel: for
// every BPF program embedded in internal/datapath, whether it loads and how
// many instructions the verifier processed, compared with the committed
// baseline (internal/verifier/baseline.json) of this kernel family. It exits
// 1 when a program is rejected although the kernel supports its program
// type, or grew more than -max-growth percent; 2 on usage or setup errors.
// Needs root.
//
//	go run ./hack/verifier                    # Markdown table on stdout
//	go run ./hack/verifier -json              # JSON report on stdout
//	go run ./hack/verifier -results results/  # also verifier-<kernel>.{md,json}
//	go run ./hack/verifier -update-baseline   # record this kernel's counts
//	go run ./hack/verifier -from results/kernels/debian-6.1/verifier-6.1.json -update-baseline
//	                                          # record counts measured in a kernel-matrix VM
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/verifier"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("verifier", flag.ContinueOnError)
	fs.SetOutput(stderr)
	baselinePath := fs.String("baseline", "", "baseline file to compare with and update (default: "+verifier.BaselineFile+
		" of the checkout containing the working directory, else the copy embedded in this binary)")
	update := fs.Bool("update-baseline", false, "write this kernel's counts into the baseline file (other kernels are kept)")
	maxGrowth := fs.Float64("max-growth", verifier.DefaultMaxGrowth, "allowed instruction-count growth over the baseline, in percent")
	asJSON := fs.Bool("json", false, "print the report as JSON instead of a Markdown table")
	results := fs.String("results", os.Getenv("AXON_RESULTS"), "also write verifier-<kernel>.md and .json into this directory (default $AXON_RESULTS)")
	from := fs.String("from", "", "comma-separated verifier-<kernel>.json reports (written in the kernel-matrix VMs, results/kernels/<kernel>/) "+
		"to compare and record instead of measuring on this kernel; needs no root")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "verifier: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if *from == "" && os.Geteuid() != 0 {
		fmt.Fprintln(stderr, "verifier: needs root to load BPF programs: run it with sudo (or pass -from REPORT.json)")
		return 2
	}

	path := *baselinePath
	if path == "" {
		if root, err := moduleRoot(); err == nil {
			path = filepath.Join(root, verifier.BaselineFile)
		} else if *update {
			fmt.Fprintf(stderr, "verifier: -update-baseline: %v; pass -baseline FILE\n", err)
			return 2
		}
	}
	var base verifier.Baseline
	var err error
	if path != "" {
		base, err = verifier.ReadBaseline(path)
	} else {
		path = "(embedded)"
		base, err = verifier.EmbeddedBaseline()
	}
	if err != nil {
		fmt.Fprintf(stderr, "verifier: %v\n", err)
		return 2
	}

	var reps []verifier.Report
	if *from != "" {
		for _, f := range strings.Split(*from, ",") {
			rep, err := readReport(strings.TrimSpace(f))
			if err != nil {
				fmt.Fprintf(stderr, "verifier: %v\n", err)
				return 2
			}
			reps = append(reps, rep)
		}
	} else {
		objs, err := datapath.Objects()
		if err != nil {
			fmt.Fprintf(stderr, "verifier: %v\n", err)
			return 2
		}
		rep, err := verifier.Measure(objs)
		if err != nil {
			fmt.Fprintf(stderr, "verifier: %v\n", err)
			return 2
		}
		reps = append(reps, rep)
	}

	code := 0
	for _, rep := range reps {
		if c := report(rep, &base, path, *update, *maxGrowth, *asJSON, *results, stdout, stderr); c > code {
			code = c
		}
	}
	return code
}

// report compares rep with the baseline, records it when update is set, prints it and
// returns the exit code.
func report(rep verifier.Report, base *verifier.Baseline, path string, update bool, maxGrowth float64, asJSON bool, results string, stdout, stderr io.Writer) int {
	rep.Compare(*base, maxGrowth)
	if update {
		for _, r := range rep.Results {
			if r.Status == verifier.StatusRejected {
				fmt.Fprintf(stderr, "verifier: not updating %s: %s/%s is rejected on %s (%s)\n", path, r.Object, r.Program, rep.Release, r.Detail)
				return 1
			}
		}
		// Re-read right before writing: another run may have recorded another kernel meanwhile.
		cur, err := verifier.ReadBaseline(path)
		if err != nil {
			fmt.Fprintf(stderr, "verifier: %v\n", err)
			return 2
		}
		*base = cur.With(rep)
		if err := verifier.WriteBaseline(path, *base); err != nil {
			fmt.Fprintf(stderr, "verifier: %v\n", err)
			return 2
		}
		rep.Compare(*base, maxGrowth)
		fmt.Fprintf(stderr, "verifier: baseline for kernel %s written to %s\n", rep.Kernel, path)
	}

	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			fmt.Fprintf(stderr, "verifier: %v\n", err)
			return 2
		}
	} else {
		fmt.Fprintf(stdout, "verifier report, kernel %s, baseline %s\n\n%s\n", rep.Release, path, rep.Markdown())
	}
	if results != "" {
		paths, err := verifier.WriteResults(results, rep)
		if err != nil {
			fmt.Fprintf(stderr, "verifier: %v\n", err)
			return 2
		}
		fmt.Fprintf(stderr, "verifier: wrote %s\n", strings.Join(paths, ", "))
	}
	if len(rep.Failures) > 0 {
		fmt.Fprintf(stderr, "verifier: FAIL on kernel %s:\n  %s\n", rep.Release, strings.Join(rep.Failures, "\n  "))
		return 1
	}
	return 0
}

// readReport reads a verifier-<kernel>.json written by -results or the VM runner.
func readReport(path string) (verifier.Report, error) {
	var rep verifier.Report
	b, err := os.ReadFile(path)
	if err != nil {
		return rep, fmt.Errorf("-from: %w", err)
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		return rep, fmt.Errorf("-from %s: not a verifier report: %w", path, err)
	}
	if _, err := verifier.Family(rep.Kernel); err != nil || len(rep.Results) == 0 {
		return rep, fmt.Errorf("-from %s: not a verifier report (kernel %q, %d results)", path, rep.Kernel, len(rep.Results))
	}
	return rep, nil
}

// moduleRoot walks up from the working directory to axon's go.mod.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.Contains(string(data), "module github.com/axonhq/axon\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the axon checkout (no go.mod of github.com/axonhq/axon above the working directory)")
		}
		dir = parent
	}
}
