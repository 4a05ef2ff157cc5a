package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

func TestPartition(t *testing.T) {
	for _, tc := range []struct {
		name                string
		all, beside         []string
		wantFirst, wantSide []string
	}{
		{"no second stream", []string{"a", "b"}, nil, []string{"a", "b"}, nil},
		{"one beside", []string{"a", "m/vmtest", "z"}, []string{"m/vmtest"}, []string{"a", "z"}, []string{"m/vmtest"}},
		{"beside not selected does not run", []string{"a"}, []string{"m/vmtest"}, []string{"a"}, nil},
		{"only beside", []string{"m/vmtest"}, []string{"m/vmtest"}, nil, []string{"m/vmtest"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			first, side := partition(tc.all, tc.beside)
			if !slices.Equal(first, tc.wantFirst) || !slices.Equal(side, tc.wantSide) {
				t.Errorf("partition(%v, %v) = %v, %v; want %v, %v", tc.all, tc.beside, first, side, tc.wantFirst, tc.wantSide)
			}
		})
	}
}

// Lines of several writers arrive whole, each stream's in its order.
func TestLineWriterKeepsLinesWhole(t *testing.T) {
	var out bytes.Buffer
	w := &lineWriter{w: &out}
	const streams, lines = 4, 2000
	var wg sync.WaitGroup
	for s := 0; s < streams; s++ {
		pr, pw := io.Pipe()
		wg.Add(2)
		go func() {
			defer wg.Done()
			for i := 0; i < lines; i++ {
				// written in two pieces, so a line crosses reads
				fmt.Fprintf(pw, `{"stream":%d,`, s)
				fmt.Fprintf(pw, `"line":%d,"pad":"%s"}`+"\n", i, strings.Repeat("x", i%300))
			}
			fmt.Fprintf(pw, `{"stream":%d,"last":true}`, s) // no final newline
			pw.Close()
		}()
		go func() {
			defer wg.Done()
			if err := w.copyLines(pr); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	next := make([]int, streams)
	last := 0
	for _, l := range strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n") {
		var ev struct {
			Stream, Line int
			Last         bool
		}
		if err := json.Unmarshal([]byte(l), &ev); err != nil {
			t.Fatalf("line not whole: %q: %v", l, err)
		}
		if ev.Last {
			last++
			continue
		}
		if ev.Line != next[ev.Stream] {
			t.Fatalf("stream %d: line %d after %d", ev.Stream, ev.Line, next[ev.Stream]-1)
		}
		next[ev.Stream]++
	}
	for s, n := range next {
		if n != lines {
			t.Errorf("stream %d: %d lines, want %d", s, n, lines)
		}
	}
	if last != streams {
		t.Errorf("%d unterminated last lines arrived, want %d", last, streams)
	}
}

// TestNiceHelper is run by TestRunTwoStreams in the second stream: it fails
// unless this process runs at the nice value in $AXON_TESTSTREAMS_NICE.
func TestNiceHelper(t *testing.T) {
	want := os.Getenv("AXON_TESTSTREAMS_NICE")
	if want == "" {
		t.Skip("helper of TestRunTwoStreams: runs only in the go test it starts")
	}
	prio, err := syscall.Getpriority(syscall.PRIO_PROCESS, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := strconv.Itoa(20 - prio); got != want { // the raw syscall returns 20 - nice
		t.Fatalf("nice %s, want %s", got, want)
	}
}

// Two real go test streams: both packages' events arrive, the second stream
// runs under nice, and a failure in the second stream fails the run.
func TestRunTwoStreams(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs go test")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command on PATH: %v", err)
	}
	const self, other = "github.com/axonhq/axon/hack/teststreams", "github.com/axonhq/axon/hack/testsummary"
	flags := []string{"-count=1", "-run", "^(TestNiceHelper|TestSummarize)$"}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	prio, err := syscall.Getpriority(syscall.PRIO_PROCESS, 0)
	if err != nil {
		t.Fatal(err)
	}
	base := 20 - prio // nice(1) adds to the nice value this test runs at
	if base+7 > 19 {
		t.Skipf("this test runs at nice %d: nice -n 7 cannot be told from the maximum, 19", base)
	}
	t.Setenv("AXON_TESTSTREAMS_NICE", strconv.Itoa(base+7))
	var out bytes.Buffer
	if err := run(context.Background(), goBin, streamFlags{flags, flags}, []string{self, other}, []string{self}, 7, &out, log); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	passed := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var ev struct{ Action, Package, Test string }
		if err := json.Unmarshal([]byte(l), &ev); err != nil {
			t.Fatalf("not a go test -json line: %q", l)
		}
		if ev.Action == "pass" && ev.Test != "" {
			passed[ev.Package+" "+ev.Test] = true
		}
	}
	for _, want := range []string{self + " TestNiceHelper", other + " TestSummarize"} {
		if !passed[want] {
			t.Errorf("%s did not pass; passed: %v", want, passed)
		}
	}

	// the same helper at another nice value fails, and so does the run
	t.Setenv("AXON_TESTSTREAMS_NICE", strconv.Itoa(base+3))
	out.Reset()
	if err := run(context.Background(), goBin, streamFlags{flags, flags}, []string{self, other}, []string{self}, 7, &out, log); err == nil {
		t.Errorf("a failed test in the second stream did not fail the run:\n%s", out.String())
	} else if !strings.Contains(out.String(), fmt.Sprintf("nice %d, want %d", base+7, base+3)) {
		t.Errorf("run failed (%v), but not for the helper's nice check:\n%s", err, out.String())
	}
}
