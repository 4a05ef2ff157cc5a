// Command progstats measures how long loaded BPF programs run per packet, in
// place, while a command runs. It turns the kernel's run-time statistics on
// for the command's duration only (BPF_ENABLE_STATS: released when the
// returned descriptor closes; no sysctl is changed), reads every program's
// run count and run time before and after, and prints the difference per
// program name (programs of one name, e.g. one per lab node, are added up).
//
//	go run ./hack/progstats [-match axon_] [-per N] -- <command...>
//
// -per N also divides the runs and the time by N (e.g. the round trips the
// command reported). The times include the statistics' own two clock reads
// per run, so compare programs measured the same way, not with
// BPF_PROG_TEST_RUN numbers. Needs root and Linux >= 5.8.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// usage is one program name's accumulated statistics.
type usage struct {
	Runs  uint64
	Time  time.Duration
	Progs int // programs of this name
}

func main() {
	match := flag.String("match", "axon_", "only programs whose name contains this")
	per := flag.Float64("per", 0, "also divide runs and time by this count (e.g. round trips)")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: progstats [-match S] [-per N] -- <command...>")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(os.Stdout, *match, *per, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "progstats:", err)
		os.Exit(1)
	}
}

func run(w io.Writer, match string, per float64, argv []string) error {
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		return fmt.Errorf("enable BPF run-time statistics (needs root, Linux >= 5.8): %w", err)
	}
	defer stats.Close()
	before, err := snapshot(match)
	if err != nil {
		return err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	runErr := cmd.Run()
	after, err := snapshot(match)
	if err != nil {
		return err
	}
	fmt.Fprint(w, render(diff(before, after), per))
	if runErr != nil {
		return fmt.Errorf("command %q: %w", strings.Join(argv, " "), runErr)
	}
	return nil
}

// snapshot reads every loaded program whose name contains match.
func snapshot(match string) (map[string]usage, error) {
	out := map[string]usage{}
	var id ebpf.ProgramID
	for {
		next, err := ebpf.ProgramGetNextID(id)
		if errors.Is(err, os.ErrNotExist) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("list programs: %w", err)
		}
		id = next
		p, err := ebpf.NewProgramFromID(id)
		if errors.Is(err, os.ErrNotExist) {
			continue // unloaded meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("open program %d: %w", id, err)
		}
		info, ierr := p.Info()
		st, serr := p.Stats()
		p.Close()
		if ierr != nil || serr != nil {
			return nil, fmt.Errorf("program %d: %w", id, errors.Join(ierr, serr))
		}
		if !strings.Contains(info.Name, match) {
			continue
		}
		u := out[info.Name]
		u.Runs += st.RunCount
		u.Time += st.Runtime
		u.Progs++
		out[info.Name] = u
	}
}

// diff is after minus before per name; names that did not run are left out.
func diff(before, after map[string]usage) map[string]usage {
	out := map[string]usage{}
	for name, a := range after {
		b := before[name]
		if a.Runs <= b.Runs {
			continue
		}
		out[name] = usage{Runs: a.Runs - b.Runs, Time: a.Time - b.Time, Progs: a.Progs}
	}
	return out
}

// render prints one line per program name, busiest first.
func render(d map[string]usage, per float64) string {
	names := make([]string, 0, len(d))
	for n := range d {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool {
		return d[names[i]].Time > d[names[j]].Time || (d[names[i]].Time == d[names[j]].Time && names[i] < names[j])
	})
	var b strings.Builder
	if per > 0 {
		fmt.Fprintf(&b, "%-28s %12s %9s %10s %12s\n", "program", "runs", "ns/run", "runs/unit", "ns/unit")
	} else {
		fmt.Fprintf(&b, "%-28s %12s %9s\n", "program", "runs", "ns/run")
	}
	for _, n := range names {
		u := d[n]
		nsPerRun := float64(u.Time.Nanoseconds()) / float64(u.Runs)
		if per > 0 {
			fmt.Fprintf(&b, "%-28s %12d %9.0f %10.2f %12.0f\n", n, u.Runs, nsPerRun, float64(u.Runs)/per, float64(u.Time.Nanoseconds())/per)
		} else {
			fmt.Fprintf(&b, "%-28s %12d %9.0f\n", n, u.Runs, nsPerRun)
		}
	}
	return b.String()
}
