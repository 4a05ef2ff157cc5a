package main

import (
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
			wantLine: "1 passed, 0 failed, 1 skipped",
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
