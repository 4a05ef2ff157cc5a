package lab

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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
	Elapsed      time.Duration
}

// Failed returns the failed probes as "src → dst proto/addr: err" lines.
func (r *CheckResult) Failed() []string {
	var out []string
	for _, s := range r.Sources {
		for _, d := range r.Destinations {
			for _, p := range r.Cells[[2]string{s, d}] {
				if !p.OK {
					out = append(out, fmt.Sprintf("%s → %s %s: %s", s, d, p.Pod, p.Err))
				}
			}
		}
	}
	return out
}

// Counts returns (passed, total).
func (r *CheckResult) Counts() (ok, total int) {
	for _, ps := range r.Cells {
		for _, p := range ps {
			total++
			if p.OK {
				ok++
			}
		}
	}
	return ok, total
}

// Print writes the compact matrix, the failures and a summary line.
func (r *CheckResult) Print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "FROM \\ TO")
	for _, d := range r.Destinations {
		fmt.Fprint(tw, "\t", d)
	}
	fmt.Fprintln(tw)
	for _, s := range r.Sources {
		fmt.Fprint(tw, s)
		for _, d := range r.Destinations {
			fmt.Fprint(tw, "\t", cellText(r.Cells[[2]string{s, d}], s == d))
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
	for _, f := range r.Failed() {
		fmt.Fprintln(w, "FAIL", f)
	}
	ok, total := r.Counts()
	fmt.Fprintf(w, "%d/%d probes passed (IPv4+IPv6 × TCP/UDP/ICMP; ok = all 6) in %s\n", ok, total, r.Elapsed.Round(time.Millisecond))
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

// Check probes every pod to every other pod and every node, over IPv4 and
// IPv6, with TCP, UDP and ICMP. Probes run inside the source pod's netns
// and cgroup; echo servers run in each destination. It returns an error
// only when the check itself could not run; failed probes are in the result.
func (l *Lab) Check(ctx context.Context, timeout time.Duration) (*CheckResult, error) {
	t0 := time.Now()
	st := l.State()
	if len(st.Pods) == 0 {
		return nil, errors.New("the lab has no pods: `axon lab up --pods-per-node 2`")
	}
	self := filepath.Join(st.BinDir, "axon")
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	type dest struct {
		name string
		ips  []string
	}
	var dests []dest
	for _, p := range st.Pods {
		dests = append(dests, dest{p.Name, addrStrings(p.IPs)})
	}
	for _, n := range st.Nodes {
		dests = append(dests, dest{n.Name, addrStrings(n.IPs)})
	}

	// Echo servers: one per destination; they exit when their stdin closes.
	var closers []io.Closer
	var srvWG sync.WaitGroup
	defer func() {
		for _, c := range closers {
			c.Close()
		}
		srvWG.Wait()
	}()
	srvErr := make([]error, len(dests))
	var startWG sync.WaitGroup
	var cmu sync.Mutex
	for i, d := range dests {
		startWG.Go(func() {
			cmd := l.Command(ctx, d.name, self, "lab", "_echo", "serve", "--port", strconv.Itoa(probe.EchoPort))
			stdin, err := cmd.StdinPipe()
			if err != nil {
				srvErr[i] = err
				return
			}
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				srvErr[i] = err
				return
			}
			var stderr strings.Builder
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				srvErr[i] = fmt.Errorf("start echo server in %s: %w", d.name, err)
				return
			}
			cmu.Lock()
			closers = append(closers, stdin)
			cmu.Unlock()
			srvWG.Go(func() { _ = cmd.Wait() })
			if err := probe.ReadReady(stdout); err != nil {
				srvErr[i] = fmt.Errorf("echo server in %s: %w: %s", d.name, err, strings.TrimSpace(stderr.String()))
			}
		})
	}
	startWG.Wait()
	if err := errors.Join(srvErr...); err != nil {
		return nil, err
	}

	res := &CheckResult{Cells: map[[2]string][]probe.PodResult{}}
	for _, d := range dests {
		res.Destinations = append(res.Destinations, d.name)
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	probeErr := make([]error, len(st.Pods))
	for i, src := range st.Pods {
		res.Sources = append(res.Sources, src.Name)
		args := []string{self, "lab", "_echo", "probe", "--timeout", (timeout).String()}
		owner := map[string]string{} // address → destination
		for _, d := range dests {
			if d.name == src.Name {
				continue
			}
			for _, ip := range d.ips {
				owner[ip] = d.name
				for _, proto := range []string{"tcp", "udp", "icmp"} {
					args = append(args, proto+"/"+ip)
				}
			}
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			cmd := l.Command(ctx, src.Name, args...)
			out, err := cmd.StdoutPipe()
			if err != nil {
				probeErr[i] = err
				return
			}
			var stderr strings.Builder
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				probeErr[i] = fmt.Errorf("start probes in %s: %w", src.Name, err)
				return
			}
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				var r probe.PodResult
				if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
					continue
				}
				key := [2]string{src.Name, owner[r.Addr.String()]}
				mu.Lock()
				res.Cells[key] = append(res.Cells[key], r)
				mu.Unlock()
			}
			if err := cmd.Wait(); err != nil {
				probeErr[i] = fmt.Errorf("probes in %s: %w: %s", src.Name, err, strings.TrimSpace(stderr.String()))
			}
		})
	}
	wg.Wait()
	for _, ps := range res.Cells {
		sort.Slice(ps, func(i, j int) bool { return ps[i].String() < ps[j].String() })
	}
	res.Elapsed = time.Since(t0)
	return res, errors.Join(probeErr...)
}

func addrStrings[T fmt.Stringer](as []T) []string {
	out := make([]string, 0, len(as))
	for _, a := range as {
		out = append(out, a.String())
	}
	return out
}
