package lab

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/axonhq/axon/internal/lab/probe"
)

// CheckResult is the connectivity matrix of `axon lab check`.
type CheckResult struct {
	Sources      []string                        // pods
	Destinations []string                        // pods, then nodes
	Cells        map[[2]string][]probe.PodResult // (source, destination) → results
	Families     string                          // "IPv4+IPv6", or "IPv4" where the pods have no IPv6
	Elapsed      time.Duration
}

// Failed returns the failed probes as "src → dst proto/addr: err" lines.
func (r *CheckResult) Failed() []string {
	return failedCells(r.Sources, r.Destinations, r.Cells, func(p probe.PodResult) bool { return !p.OK },
		func(s, d string, p probe.PodResult) string {
			return fmt.Sprintf("%s → %s %s: %s", s, d, p.Pod, p.Err)
		})
}

// Counts returns (passed, total).
func (r *CheckResult) Counts() (ok, total int) {
	ok, total, _ = countCells(r.Cells, func(p probe.PodResult) outcome { return passedIf(p.OK) })
	return ok, total
}

// The checks of `axon lab check` (pods, Services, external) each hold a
// matrix of cells, (row, column) → the results of the probes of that cell;
// failedCells and countCells read any of them.

// outcome is what became of one probe.
type outcome int

const (
	passed outcome = iota
	failed
	notApplicable // planned, not run
)

func passedIf(ok bool) outcome {
	if ok {
		return passed
	}
	return failed
}

// failedCells returns line(row, col, c) for each cell result c that failed,
// in the order of rows, then cols.
func failedCells[C any](rows, cols []string, cells map[[2]string][]C, fail func(C) bool, line func(row, col string, c C) string) []string {
	var out []string
	for _, r := range rows {
		for _, c := range cols {
			for _, x := range cells[[2]string{r, c}] {
				if fail(x) {
					out = append(out, line(r, c, x))
				}
			}
		}
	}
	return out
}

// countCells counts the results in cells: passed, ran (passed or failed)
// and not applicable.
func countCells[C any](cells map[[2]string][]C, of func(C) outcome) (ok, ran, na int) {
	for _, xs := range cells {
		for _, x := range xs {
			switch of(x) {
			case passed:
				ok++
				ran++
			case failed:
				ran++
			case notApplicable:
				na++
			}
		}
	}
	return ok, ran, na
}

// Print writes the compact matrix, the failures and a summary line.
func (r *CheckResult) Print(w io.Writer) {
	printMatrix(w, "FROM \\ TO", r.Sources, r.Destinations, func(s, d string) string { return cellText(r.Cells[[2]string{s, d}], s == d) })
	for _, f := range r.Failed() {
		fmt.Fprintln(w, "FAIL", f)
	}
	ok, total := r.Counts()
	fmt.Fprintf(w, "%d/%d probes passed (%s × TCP/UDP/ICMP; ok = all %d) in %s\n", ok, total, r.Families, 3*(strings.Count(r.Families, "+")+1), r.Elapsed.Round(time.Millisecond))
}

func cellText(ps []probe.PodResult, self bool) string {
	if self {
		return "-"
	}
	if len(ps) == 0 {
		return "?"
	}
	var bad []string
	for _, p := range ps {
		if !p.OK {
			fam := "v4"
			if p.Addr.Is6() {
				fam = "v6"
			}
			bad = append(bad, fam+p.Proto)
		}
	}
	if len(bad) == 0 {
		return "ok"
	}
	sort.Strings(bad)
	return "FAIL(" + strings.Join(bad, ",") + ")"
}

// checkTarget is a pod or node of the pod matrix: its name as a lab target (Command) and its
// addresses.
type checkTarget struct {
	name, node string
	ips        []netip.Addr
}

// checkPods are the sources of the pod matrix: the lab's pods, or, in a --kubelet lab (no pods
// of its own), the check's probe pods that kubelet runs, two per node (kubeletpods.go).
func (l *Lab) checkPods(ctx context.Context) ([]checkTarget, error) {
	st := l.State()
	var out []checkTarget
	if !st.Kubelet {
		if len(st.Pods) == 0 {
			return nil, errors.New("the lab has no pods: `axon lab up --pods-per-node 2`")
		}
		for _, p := range st.Pods {
			out = append(out, checkTarget{p.Name, p.Node, p.IPs})
		}
		return out, nil
	}
	kube, err := l.Kube()
	if err != nil {
		return nil, err
	}
	pods, err := ensureCheckPods(ctx, kube, len(st.Nodes))
	if err != nil {
		return nil, err
	}
	for _, p := range pods {
		t := checkTarget{name: p.Namespace + "/" + p.Name, node: p.Spec.NodeName}
		for _, ip := range p.Status.PodIPs {
			a, err := netip.ParseAddr(ip.IP)
			if err != nil {
				return nil, fmt.Errorf("pod %s: address %q: %w", t.name, ip.IP, err)
			}
			t.ips = append(t.ips, a)
		}
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out, nil
}

// hasFamily reports whether ips hold an address of a's family.
func hasFamily(ips []netip.Addr, a netip.Addr) bool {
	for _, ip := range ips {
		if ip.Is4() == a.Is4() {
			return true
		}
	}
	return false
}

// families names the address families the sources probe: those of every pod.
func families(pods []checkTarget) string {
	v4, v6 := true, true
	for _, p := range pods {
		v4 = v4 && hasFamily(p.ips, netip.IPv4Unspecified())
		v6 = v6 && hasFamily(p.ips, netip.IPv6Unspecified())
	}
	switch {
	case v4 && v6:
		return "IPv4+IPv6"
	case v6:
		return "IPv6"
	}
	return "IPv4"
}

// Check probes every pod to every other pod and every node, over IPv4 and
// IPv6 (the families the source pod has), with TCP, UDP and ICMP. Probes run inside the source pod's netns
// and cgroup; echo servers run in each destination. It returns an error
// only when the check itself could not run; failed probes are in the result.
func (l *Lab) Check(ctx context.Context, timeout time.Duration) (*CheckResult, error) {
	t0 := time.Now()
	st := l.State()
	pods, err := l.checkPods(ctx)
	if err != nil {
		return nil, err
	}
	self := filepath.Join(st.BinDir, "axon")
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	dests := append([]checkTarget(nil), pods...)
	for _, n := range st.Nodes {
		dests = append(dests, checkTarget{n.Name, n.Name, n.IPs})
	}

	// Echo servers: one per destination; they exit when their stdin closes.
	names := make([]string, len(dests))
	for i, d := range dests {
		names[i] = d.name
	}
	stop, err := l.startServers(ctx, names, self, "lab", "_echo", "serve", "--port", strconv.Itoa(probe.EchoPort))
	if err != nil {
		return nil, err
	}
	defer stop()

	res := &CheckResult{Cells: map[[2]string][]probe.PodResult{}, Families: families(pods)}
	for _, d := range dests {
		res.Destinations = append(res.Destinations, d.name)
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	probeErr := make([]error, len(pods))
	for i, src := range pods {
		res.Sources = append(res.Sources, src.name)
		args := []string{self, "lab", "_echo", "probe", "--timeout", (timeout).String()}
		owner := map[string]string{} // address → destination
		for _, d := range dests {
			if d.name == src.name {
				continue
			}
			for _, ip := range d.ips {
				if !hasFamily(src.ips, ip) { // a pod without IPv6 (--kubelet) probes IPv4 only
					continue
				}
				owner[ip.String()] = d.name
				for _, proto := range []string{"tcp", "udp", "icmp"} {
					args = append(args, proto+"/"+ip.String())
				}
			}
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			probeErr[i] = runProbes(l.Command(ctx, src.name, args...), "probes in "+src.name, func(r probe.PodResult) {
				key := [2]string{src.name, owner[r.Addr.String()]}
				mu.Lock()
				res.Cells[key] = append(res.Cells[key], r)
				mu.Unlock()
			})
		})
	}
	wg.Wait()
	for _, ps := range res.Cells {
		sort.Slice(ps, func(i, j int) bool { return ps[i].String() < ps[j].String() })
	}
	res.Elapsed = time.Since(t0)
	return res, errors.Join(probeErr...)
}

// runProbes runs cmd, a prober that prints one JSON result a line, and
// hands each result to each as it comes. what names the probes in errors
// ("probes in pod1"); a failed run's error carries the prober's stderr.
func runProbes[R any](cmd *exec.Cmd, what string, each func(R)) error {
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", what, err)
	}
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		var r R
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			continue
		}
		each(r)
	}
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("%s: %w: %s", what, err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// startServers starts argv in each target (a server that prints "ready"
// and exits when its stdin closes); stop ends them.
func (l *Lab) startServers(ctx context.Context, targets []string, argv ...string) (stop func(), err error) {
	var closers []io.Closer
	var srvWG sync.WaitGroup
	var mu sync.Mutex
	stop = func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range closers {
			c.Close()
		}
		srvWG.Wait()
	}
	errs := make([]error, len(targets))
	var wg sync.WaitGroup
	for i, t := range targets {
		wg.Go(func() {
			cmd := l.Command(ctx, t, argv...)
			stdin, err := cmd.StdinPipe()
			if err != nil {
				errs[i] = err
				return
			}
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				errs[i] = err
				return
			}
			var stderr strings.Builder
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				errs[i] = fmt.Errorf("start %s in %s: %w", strings.Join(argv, " "), t, err)
				return
			}
			mu.Lock()
			closers = append(closers, stdin)
			srvWG.Go(func() { _ = cmd.Wait() })
			mu.Unlock()
			if err := probe.ReadReady(stdout); err != nil {
				errs[i] = fmt.Errorf("server in %s: %w: %s", t, err, strings.TrimSpace(stderr.String()))
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		stop()
		return nil, err
	}
	return stop, nil
}

// printMatrix writes a table of the checks: a header row of cols after
// corner, then one row per row with cell(row, col) in each column.
func printMatrix(w io.Writer, corner string, rows, cols []string, cell func(row, col string) string) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, corner)
	for _, c := range cols {
		fmt.Fprint(tw, "\t", c)
	}
	fmt.Fprintln(tw)
	for _, r := range rows {
		fmt.Fprint(tw, r)
		for _, c := range cols {
			fmt.Fprint(tw, "\t", cell(r, c))
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
}
