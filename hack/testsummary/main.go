// Command testsummary reads `go test -json` from stdin, streams a readable log
// (package results, every failure's output, every skip with its reason) and
// ends with the line "N passed, N failed, N skipped". It exits non-zero when
// any test or package failed, so `make test` and .ci/run fail honestly.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
)

type event struct {
	Action  string
	Package string
	Test    string
	Output  string
	Elapsed float64
}

func main() {
	var passed, failed, skipped int
	var failedPkgs []string
	outputs := map[string]*strings.Builder{} // package/test → output so far
	key := func(e event) string { return e.Package + "/" + e.Test }
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if err := json.Unmarshal(line, &e); err != nil {
			// Build errors and other non-JSON lines: show them as they are.
			fmt.Println(string(line))
			continue
		}
		switch e.Action {
		case "output":
			b := outputs[key(e)]
			if b == nil {
				b = &strings.Builder{}
				outputs[key(e)] = b
			}
			b.WriteString(e.Output)
		case "pass", "fail", "skip":
			out := outputs[key(e)]
			delete(outputs, key(e))
			if e.Test == "" { // package result
				status := map[string]string{"pass": "ok  ", "fail": "FAIL", "skip": "skip"}[e.Action]
				fmt.Printf("%s %s (%.1fs)\n", status, e.Package, e.Elapsed)
				if e.Action == "fail" {
					failedPkgs = append(failedPkgs, e.Package)
					if out != nil && !strings.Contains(out.String(), "--- FAIL") {
						fmt.Print(indent(out.String()))
					}
				}
				continue
			}
			switch e.Action {
			case "pass":
				passed++
			case "fail":
				failed++
				fmt.Printf("--- FAIL %s %s (%.1fs)\n", e.Package, e.Test, e.Elapsed)
				if out != nil {
					fmt.Print(indent(out.String()))
				}
			case "skip":
				skipped++
				fmt.Printf("--- SKIP %s %s: %s\n", e.Package, e.Test, skipReason(out))
			}
		}
	}
	sort.Strings(failedPkgs)
	if len(failedPkgs) > 0 {
		fmt.Printf("failed packages: %s\n", strings.Join(failedPkgs, " "))
	}
	fmt.Printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped)
	if failed > 0 || len(failedPkgs) > 0 {
		os.Exit(1)
	}
}

func indent(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = "    " + l
	}
	return strings.Join(lines, "\n") + "\n"
}

// skipReason picks the t.Skip message out of a test's output.
func skipReason(out *strings.Builder) string {
	if out == nil {
		return "(no reason given)"
	}
	var last string
	for _, l := range strings.Split(out.String(), "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "=== ") || strings.HasPrefix(l, "--- SKIP") {
			continue
		}
		last = l
	}
	if last == "" {
		return "(no reason given)"
	}
	return last
}
