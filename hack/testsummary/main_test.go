package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

func TestSummarize(t *testing.T) {
	for _, tc := range []struct {
		name     string
		input    string
		wantOK   bool
		wantLine string
		wantText []string
	}{
		{
			name: "all pass with subtests and a skip",
			input: `{"Action":"run","Package":"p","Test":"TestA"}
{"Action":"output","Package":"p","Test":"TestA","Output":"=== RUN TestA\n"}
{"Action":"pass","Package":"p","Test":"TestA/sub","Elapsed":0}
{"Action":"pass","Package":"p","Test":"TestA","Elapsed":0.1}
{"Action":"skip","Package":"p","Test":"TestB","Elapsed":0}
{"Action":"pass","Package":"p","Elapsed":0.2}
`,
			wantOK:   true,
			wantLine: "2 passed, 0 failed, 1 skipped", // the subtest counts, as in go test -v
			wantText: []string{"PASS p (0.2s)"},
		},
		{
			name: "a skip prints its reason",
			input: `{"Action":"run","Package":"p","Test":"TestNetkit"}
{"Action":"output","Package":"p","Test":"TestNetkit","Output":"=== RUN   TestNetkit\n"}
{"Action":"output","Package":"p","Test":"TestNetkit","Output":"    x_test.go:9: netkit: not supported\n"}
{"Action":"output","Package":"p","Test":"TestNetkit","Output":"--- SKIP: TestNetkit (0.00s)\n"}
{"Action":"skip","Package":"p","Test":"TestNetkit","Elapsed":0}
{"Action":"pass","Package":"p","Test":"TestB","Elapsed":0}
{"Action":"pass","Package":"p","Elapsed":0.1}
`,
			wantOK:   true,
			wantLine: "1 passed, 0 failed, 1 skipped",
			wantText: []string{"--- SKIP: p TestNetkit: x_test.go:9: netkit: not supported"},
		},
		{
			name: "failed test shows its output",
			input: `{"Action":"output","Package":"p","Test":"TestC","Output":"    c_test.go:9: boom\n"}
{"Action":"fail","Package":"p","Test":"TestC","Elapsed":0}
{"Action":"pass","Package":"p","Test":"TestD","Elapsed":0}
{"Action":"fail","Package":"p","Elapsed":0.3}
`,
			wantLine: "1 passed, 1 failed, 0 skipped",
			wantText: []string{"--- FAIL: p TestC", "c_test.go:9: boom", "FAIL p"},
		},
		{
			name: "build failure outside JSON",
			input: `# example.com/q
q/q.go:3:1: syntax error
{"Action":"output","Package":"q","Output":"FAIL\tq [build failed]\n"}
{"Action":"fail","Package":"q","Elapsed":0}
{"Action":"pass","Package":"p","Test":"TestE","Elapsed":0}
`,
			wantLine: "1 passed, 1 failed, 0 skipped",
			wantText: []string{"syntax error", "--- FAIL: package q"},
		},
		{
			name:     "no test ran",
			input:    `{"Action":"skip","Package":"p","Elapsed":0}` + "\n",
			wantLine: "0 passed, 0 failed, 0 skipped",
			wantText: []string{"no test ran"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := summarize(strings.NewReader(tc.input))
			if err != nil {
				t.Fatal(err)
			}
			var out strings.Builder
			ok := s.report(&out)
			if ok != tc.wantOK {
				t.Errorf("ok = %v, want %v\n%s", ok, tc.wantOK, out.String())
			}
			lines := strings.Split(strings.TrimSpace(out.String()), "\n")
			found := false
			for _, l := range lines {
				found = found || l == tc.wantLine
			}
			if !found {
				t.Errorf("no line %q in:\n%s", tc.wantLine, out.String())
			}
			for _, want := range tc.wantText {
				if !strings.Contains(out.String(), want) {
					t.Errorf("output lacks %q:\n%s", want, out.String())
				}
			}
		})
	}
}

// skipModule is a tiny package whose tests skip at every level: a top-level test, parallel
// subtests of a table (with a two-line reason), and a sub-subtest under a passing subtest.
// go test -v reports 4 "--- PASS" and 4 "--- SKIP" lines for it.
var skipModule = map[string]string{
	"go.mod": "module example.com/skipdemo\n\ngo 1.22\n",
	"demo_test.go": `package skipdemo

import "testing"

func TestPass(t *testing.T) {}

func TestSkipTop(t *testing.T) { t.Skip("top-level reason") }

func TestTable(t *testing.T) {
	for _, name := range []string{"runs", "skips", "also skips"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if name != "runs" {
				t.Logf("preparing %s", name)
				t.Skipf("no facility for %s\nsecond line", name)
			}
		})
	}
	t.Run("nested", func(t *testing.T) {
		t.Run("deeper", func(t *testing.T) { t.Skip("deep reason") })
	})
}
`,
}

// TestSummarizeRealSkips feeds the summary the real `go test -json` stream of skipModule, so
// the test follows whatever test2json really writes for subtests (framing, PAUSE/CONT lines,
// attribution of output to subtests) rather than a hand-written imitation of it.
func TestSummarizeRealSkips(t *testing.T) {
	stream, err := goTestJSON(t, skipModule)
	if err != nil {
		t.Fatalf("go test -json: %v\n%s", err, stream)
	}
	s, err := summarize(bytes.NewReader(stream))
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if !s.report(&out) {
		t.Errorf("report says the run failed:\n%s", out.String())
	}
	const pkg = "example.com/skipdemo"
	for _, want := range []string{
		"SKIP " + pkg + ": 4 skipped",
		"--- SKIP: " + pkg + " TestSkipTop: demo_test.go:7: top-level reason",
		"--- SKIP: " + pkg + " TestTable/skips: demo_test.go:15: no facility for skips / second line",
		"--- SKIP: " + pkg + " TestTable/also_skips: demo_test.go:15: no facility for also skips / second line",
		"--- SKIP: " + pkg + " TestTable/nested/deeper: demo_test.go:20: deep reason",
		// TestPass, TestTable, TestTable/runs, TestTable/nested: as go test -v counts them.
		"4 passed, 0 failed, 4 skipped",
	} {
		if !strings.Contains(out.String(), want+"\n") {
			t.Errorf("summary lacks the line %q:\n%s\ngo test -json was:\n%s", want, out.String(), stream)
		}
	}
}

// TestSummarizeRealBuildFailure: since Go 1.24 the compiler's errors come as "build-output"
// events, not as plain lines; the summary must still show them for the failed package.
func TestSummarizeRealBuildFailure(t *testing.T) {
	stream, _ := goTestJSON(t, map[string]string{ // fails: that is the point
		"go.mod":    "module example.com/broken\n\ngo 1.22\n",
		"broken.go": "package broken\n\nfunc X() { undefinedName() }\n",
		"x_test.go": "package broken\n\nimport \"testing\"\n\nfunc TestX(t *testing.T) {}\n",
	})
	s, err := summarize(bytes.NewReader(stream))
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if s.report(&out) {
		t.Errorf("report says a run with a build failure passed:\n%s", out.String())
	}
	for _, want := range []string{"FAIL example.com/broken", "undefined: undefinedName", "0 passed, 1 failed, 0 skipped"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("summary lacks %q:\n%s\ngo test -json was:\n%s", want, out.String(), stream)
		}
	}
}

// goTestJSON writes files as a module in a temporary directory and returns what
// `go test -json` prints there (stderr appended), and go test's error.
func goTestJSON(t *testing.T, files map[string]string) ([]byte, error) {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	dir := t.TempDir()
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(goBin, "test", "-json", "-count=1", ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=", "GOWORK=off", "GOTOOLCHAIN=local")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stream, err := cmd.Output()
	if err != nil {
		err = fmt.Errorf("go test -json in %s: %w (stderr: %s)", dir, err, stderr.String())
	}
	return stream, err
}
