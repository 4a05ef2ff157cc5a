// Command teststreams runs `go test -json` over packages in two streams at once and writes both
// streams' events to stdout as they come, whole lines only, for hack/testsummary:
//
//	go run ./hack/teststreams -flags '-count=1 -p 1' -beside ./internal/vmtest -nice 19 ./... | go run ./hack/testsummary
//
// The packages named by -beside (and also matched by the package patterns) run in their own
// `go test` under nice(1), beside the others: `make test` runs the kernel matrix's VMs this way,
// so they take whatever CPU the host packages leave idle instead of waiting for them
// (docs/testing.md, "CI time"). Every other package runs in the main stream, with -flags as given
// (-p 1 keeps them one at a time); the second stream gets -beside-flags on top. The exit status is
// 1 when either `go test` failed.
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
)

func main() {
	goBin := flag.String("go", "go", "the go command")
	testFlags := flag.String("flags", "", "go test flags for both streams, space-separated (e.g. '-count=1 -p 1 -timeout 40m')")
	beside := flag.String("beside", "", "comma-separated package patterns to run in the second stream (empty: one stream)")
	niceN := flag.Int("nice", 19, "nice(1) adjustment of the second stream (0: none)")
	besideFlags := flag.String("beside-flags", "", "go test flags added for the second stream only (e.g. '-parallel 4')")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: teststreams [-flags '...'] [-beside PKG,...] [-nice N] PACKAGES...\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	streams := streamFlags{first: strings.Fields(*testFlags), second: append(strings.Fields(*testFlags), strings.Fields(*besideFlags)...)}
	if err := run(context.Background(), *goBin, streams, flag.Args(), splitList(*beside), *niceN, os.Stdout, log); err != nil {
		log.Error("teststreams", "error", err)
		os.Exit(1)
	}
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// streamFlags are the go test flags of each stream.
type streamFlags struct{ first, second []string }

// run lists the packages, splits them into the two streams and runs both to the end.
func run(ctx context.Context, goBin string, testFlags streamFlags, patterns, beside []string, niceN int, out io.Writer, log *slog.Logger) error {
	if len(patterns) == 0 {
		patterns = []string{"."}
	}
	all, err := list(ctx, goBin, patterns)
	if err != nil {
		return err
	}
	var second []string
	if len(beside) > 0 {
		if second, err = list(ctx, goBin, beside); err != nil {
			return err
		}
	}
	first, side := partition(all, second)
	streams := []*exec.Cmd{}
	if len(first) > 0 {
		streams = append(streams, testCmd(ctx, goBin, testFlags.first, first, 0))
	}
	if len(side) > 0 {
		streams = append(streams, testCmd(ctx, goBin, testFlags.second, side, niceN))
		log.Info("second stream", "packages", side, "nice", niceN)
	}
	w := &lineWriter{w: out}
	errs := make([]error, len(streams))
	var wg sync.WaitGroup
	for i, c := range streams {
		stdout, err := c.StdoutPipe()
		if err != nil {
			return fmt.Errorf("go test: %w", err)
		}
		c.Stderr = os.Stderr
		if err := c.Start(); err != nil {
			return fmt.Errorf("start %s: %w", c, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			copyErr := w.copyLines(stdout)
			if err := c.Wait(); err != nil {
				errs[i] = fmt.Errorf("%s: %w", strings.Join(c.Args, " "), err)
			} else if copyErr != nil {
				errs[i] = fmt.Errorf("read %s: %w", strings.Join(c.Args, " "), copyErr)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// list resolves package patterns to import paths with go list.
func list(ctx context.Context, goBin string, patterns []string) ([]string, error) {
	var stderr bytes.Buffer
	c := exec.CommandContext(ctx, goBin, append([]string{"list", "-e", "-f", "{{.ImportPath}}"}, patterns...)...)
	c.Stderr = &stderr
	b, err := c.Output()
	if err != nil {
		return nil, fmt.Errorf("go list %s: %w: %s", strings.Join(patterns, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.Fields(string(b)), nil
}

// partition splits all into the packages that are not in beside (the first stream, in
// all's order) and those that are (the second stream). A package of beside that is
// not in all does not run.
func partition(all, beside []string) (first, side []string) {
	in := map[string]bool{}
	for _, p := range beside {
		in[p] = true
	}
	for _, p := range all {
		if in[p] {
			side = append(side, p)
		} else {
			first = append(first, p)
		}
	}
	return first, side
}

// testCmd is `go test FLAGS -json PKGS`, under `nice -n N` when niceN is not 0.
func testCmd(ctx context.Context, goBin string, testFlags, pkgs []string, niceN int) *exec.Cmd {
	args := append(append(append([]string{"test"}, testFlags...), "-json"), pkgs...)
	if niceN == 0 {
		return exec.CommandContext(ctx, goBin, args...)
	}
	return exec.CommandContext(ctx, "nice", append([]string{"-n", strconv.Itoa(niceN), goBin}, args...)...)
}

// lineWriter writes whole lines from several readers to one writer: a line is never
// interleaved with another stream's.
type lineWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lineWriter) copyLines(r io.Reader) error {
	br := bufio.NewReaderSize(r, 64*1024)
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			if line[len(line)-1] != '\n' {
				line = append(line, '\n')
			}
			l.mu.Lock()
			_, werr := l.w.Write(line)
			l.mu.Unlock()
			if werr != nil {
				// keep reading: a go test blocked on a full pipe would never exit
				_, _ = io.Copy(io.Discard, br)
				return werr
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}
