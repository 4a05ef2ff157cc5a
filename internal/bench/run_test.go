package bench

import (
	"bufio"
	"context"
	"encoding/csv"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/testutil"
)

func requireRootAndTools(t *testing.T) {
	t.Helper()
	testutil.RequireRoot(t, "creates network namespaces, veths and cgroups")
	for _, tool := range []string{"ip", "iperf3", "sockperf", "taskset", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not installed (run `make deps`): %v", tool, err)
		}
	}
}

func run(t *testing.T, argv ...string) {
	t.Helper()
	if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(argv, " "), err, out)
	}
}

// lab is two network namespaces joined by a veth, 198.18.99.1 ↔ 198.18.99.2.
type lab struct {
	a, b   string // netns paths
	ipA    netip.Addr
	ipB    netip.Addr
	cgroup string // a cgroup v2 dir for this test, with children client/ and server/
}

func newLab(t *testing.T) *lab {
	t.Helper()
	id := "axt-bench-" + testutil.RandSuffix(t)
	na, nb := testutil.NewNetns(t, "axt-bench-a-"), testutil.NewNetns(t, "axt-bench-b-")
	run(t, "ip", "-n", na, "link", "add", "veth0", "type", "veth", "peer", "name", "veth0", "netns", nb)
	for _, c := range []struct{ ns, ip string }{{na, "198.18.99.1/24"}, {nb, "198.18.99.2/24"}} {
		run(t, "ip", "-n", c.ns, "addr", "add", c.ip, "dev", "veth0")
		run(t, "ip", "-n", c.ns, "link", "set", "veth0", "up")
	}
	l := &lab{a: netnsutil.Path(na), b: netnsutil.Path(nb),
		ipA: netip.MustParseAddr("198.18.99.1"), ipB: netip.MustParseAddr("198.18.99.2")}
	if root := cgroup2Mount(t); root != "" {
		l.cgroup = filepath.Join(root, id)
		for _, d := range []string{"client", "server"} {
			if err := os.MkdirAll(filepath.Join(l.cgroup, d), 0o755); err != nil {
				t.Fatalf("create test cgroup: %v", err)
			}
		}
		t.Cleanup(func() {
			for _, d := range []string{"client", "server", ""} {
				if err := os.Remove(filepath.Join(l.cgroup, d)); err != nil && !errors.Is(err, os.ErrNotExist) {
					t.Errorf("remove test cgroup (a process leaked into it?): %v", err)
				}
			}
		})
	}
	return l
}

func cgroup2Mount(t *testing.T) string {
	f, err := os.Open("/proc/self/mounts")
	if err != nil {
		t.Fatalf("read mounts: %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fl := strings.Fields(sc.Text())
		if len(fl) >= 3 && fl[2] == "cgroup2" {
			return fl[1]
		}
	}
	return ""
}

func procsIn(cgroupDir string) []string {
	b, _ := os.ReadFile(filepath.Join(cgroupDir, "cgroup.procs"))
	return strings.Fields(string(b))
}

func TestRunTwoPaths(t *testing.T) {
	requireRootAndTools(t)
	l := newLab(t)
	if l.cgroup == "" {
		t.Fatal("no cgroup2 mount found in /proc/self/mounts")
	}
	out := t.TempDir()

	// Watch the server cgroup during the run: processes must land there.
	var sawServerInCgroup atomic.Bool
	stopWatch := make(chan struct{})
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		for {
			select {
			case <-stopWatch:
				return
			case <-time.After(20 * time.Millisecond):
			}
			if len(procsIn(filepath.Join(l.cgroup, "server"))) > 0 {
				sawServerInCgroup.Store(true)
			}
		}
	}()

	var progress strings.Builder
	cfg := Config{
		Paths: []Path{
			{Name: "a-to-b", Client: Endpoint{Name: "a", Netns: l.a, IP: l.ipA}, Server: Endpoint{Name: "b", Netns: l.b, IP: l.ipB}},
			{Name: "b-to-a in cgroups",
				Client: Endpoint{Name: "b", Netns: l.b, IP: l.ipB, Cgroup: filepath.Join(l.cgroup, "client")},
				Server: Endpoint{Name: "a", Netns: l.a, IP: l.ipA, Cgroup: filepath.Join(l.cgroup, "server")}},
		},
		Reps:     2,
		Duration: time.Second,
		OutDir:   out,
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
		Progress: &progress,
		// Ports away from defaults so a concurrent lab bench does not collide.
		IperfPort: 25201, SockperfPort: 21111,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := Run(ctx, cfg)
	close(stopWatch)
	<-watchDone
	t.Logf("progress:\n%s", progress.String())
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if !sawServerInCgroup.Load() {
		t.Error("no server process was ever seen in the server cgroup")
	}
	for _, d := range []string{"client", "server"} {
		if p := procsIn(filepath.Join(l.cgroup, d)); len(p) > 0 {
			t.Errorf("processes left in %s cgroup after Run: %v", d, p)
		}
	}

	for _, res := range rep.Results {
		for n := 0; n < cfg.Reps; n++ {
			tp, p50, p99 := res.Throughput[n], res.RTTP50[n], res.RTTP99[n]
			if !(tp > 1e6) {
				t.Errorf("%s rep %d: throughput %v bit/s, want > 1 Mbit/s", res.Path, n+1, tp)
			}
			if !(p50 > 0) || !(p99 >= p50) || p50 > 100_000 {
				t.Errorf("%s rep %d: RTT p50 %v µs p99 %v µs: want 0 < p50 <= p99, p50 < 100 ms", res.Path, n+1, p50, p99)
			}
			if res.Retransmits[n] < 0 {
				t.Errorf("%s rep %d: retransmits %v", res.Path, n+1, res.Retransmits[n])
			}
			// A segment the receiver got twice was sent twice: DSACK'd segments
			// are a subset of the retransmits (the client netns has no other flow).
			if d := res.DSACKSegs[n]; !(d >= 0 && d <= res.Retransmits[n]) {
				t.Errorf("%s rep %d: %v DSACK'd segments for %v retransmits", res.Path, n+1, d, res.Retransmits[n])
			}
		}
		if len(res.Errors) > 0 {
			t.Errorf("%s: errors %v", res.Path, res.Errors)
		}
	}
	if got := rep.Ratio("a-to-b", MetricThroughput); got != 1 {
		t.Errorf("reference ratio = %v, want 1", got)
	}
	if got := rep.Ratio("b-to-a in cgroups", MetricRTTP50); !(got > 0) {
		t.Errorf("second path p50 ratio = %v, want > 0", got)
	}
	// Interleaving: measurements go a, a, b, b, a, a, b, b (iperf3 then sockperf per path).
	var order []string
	for _, m := range rep.Measurements {
		order = append(order, fmt.Sprintf("%d:%s:%s", m.Rep, m.Path, m.Tool))
		if len(m.Client) == 0 || m.Client[0] == "" || !strings.HasSuffix(m.Client[0], "nsenter") {
			t.Errorf("client command %q does not start with nsenter", m.Client)
		}
	}
	want := []string{"1:a-to-b:iperf3", "1:a-to-b:sockperf", "1:b-to-a in cgroups:iperf3", "1:b-to-a in cgroups:sockperf",
		"2:a-to-b:iperf3", "2:a-to-b:sockperf", "2:b-to-a in cgroups:iperf3", "2:b-to-a in cgroups:sockperf"}
	if strings.Join(order, ",") != strings.Join(want, ",") {
		t.Errorf("measurement order\n got %v\nwant %v", order, want)
	}

	// Files: written by Run because OutDir was set.
	for _, f := range []string{"results.csv", "results.md", "chart.svg", "results.json", "raw/rep1-a-to-b-iperf3.json", "raw/rep2-b-to-a-in-cgroups-sockperf.txt"} {
		st, err := os.Stat(filepath.Join(out, f))
		if err != nil || st.Size() == 0 {
			t.Errorf("output %s missing or empty: %v", f, err)
		}
	}
	csvData, _ := os.ReadFile(filepath.Join(out, "results.csv"))
	rows, err := csv.NewReader(strings.NewReader(string(csvData))).ReadAll()
	if err != nil {
		t.Fatalf("results.csv: %v", err)
	}
	count := map[string]int{}
	for _, r := range rows[1:] {
		count[r[2]]++
	}
	for _, m := range []string{MetricThroughput, MetricRTTP50, MetricRTTP99, "iperf3.psi_before", "sockperf.psi_after"} {
		if count[m] != 4 {
			t.Errorf("results.csv has %d %s rows, want 4 (2 paths × 2 reps)", count[m], m)
		}
	}
	svg, _ := os.ReadFile(filepath.Join(out, "chart.svg"))
	if err := xmlWellFormed(svg); err != nil {
		t.Errorf("chart.svg: %v", err)
	}
	md, _ := os.ReadFile(filepath.Join(out, "results.md"))
	for _, want := range []string{"a-to-b (reference)", "round-trip time", "--full-rtt", "/proc/pressure/cpu", "nsenter --net=" + l.b} {
		if !strings.Contains(string(md), want) {
			t.Errorf("results.md lacks %q", want)
		}
	}
	t.Logf("results.md:\n%s", md)
}

// A path whose server address is not configured fails with a clear error,
// while the other path is still measured and reported.
func TestRunBadPathKeepsOthers(t *testing.T) {
	requireRootAndTools(t)
	l := newLab(t)
	cfg := Config{
		Paths: []Path{
			{Name: "good", Client: Endpoint{Netns: l.a, IP: l.ipA}, Server: Endpoint{Netns: l.b, IP: l.ipB}},
			{Name: "unconfigured", Client: Endpoint{Netns: l.a, IP: l.ipA}, Server: Endpoint{Netns: l.b, IP: netip.MustParseAddr("198.18.99.77")}},
		},
		Reps: 1, Duration: time.Second, IperfPort: 26201, SockperfPort: 22111,
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rep, err := Run(ctx, cfg)
	if err == nil {
		t.Fatal("Run succeeded with an unconfigured server address")
	}
	if !strings.Contains(err.Error(), "unconfigured") || !strings.Contains(err.Error(), "198.18.99.77") {
		t.Errorf("error does not name the path and address: %v", err)
	}
	if rep == nil {
		t.Fatal("report is nil: the good path's numbers were lost")
	}
	if tp := rep.Result("good").Throughput[0]; !(tp > 0) {
		t.Errorf("good path throughput = %v, want > 0", tp)
	}
	if !strings.Contains(rep.Markdown(), "Failed measurements") {
		t.Error("Markdown does not list the failed measurements")
	}
}

// Cancelling the context stops the run promptly and leaves no server behind.
func TestRunCancel(t *testing.T) {
	requireRootAndTools(t)
	l := newLab(t)
	if l.cgroup == "" {
		t.Fatal("no cgroup2 mount found")
	}
	srvCg := filepath.Join(l.cgroup, "server")
	cfg := Config{
		Paths: []Path{{Name: "long", Client: Endpoint{Netns: l.a, IP: l.ipA},
			Server: Endpoint{Netns: l.b, IP: l.ipB, Cgroup: srvCg}}},
		Reps: 1, Duration: 30 * time.Second, IperfPort: 27201, SockperfPort: 23111,
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		// Cancel once the iperf3 server is up.
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) && len(procsIn(srvCg)) == 0 {
			time.Sleep(20 * time.Millisecond)
		}
		time.Sleep(500 * time.Millisecond)
		cancel()
	}()
	t0 := time.Now()
	_, err := Run(ctx, cfg)
	if !errors.Is(err, context.Canceled) && (err == nil || !strings.Contains(err.Error(), "interrupted")) {
		t.Errorf("Run after cancel: err = %v, want interrupted/canceled", err)
	}
	if d := time.Since(t0); d > 15*time.Second {
		t.Errorf("Run took %s after cancel, want prompt stop", d)
	}
	if p := procsIn(srvCg); len(p) > 0 {
		t.Errorf("server processes left after cancel: %v", p)
	}
}

func xmlWellFormed(data []byte) error {
	d := xml.NewDecoder(strings.NewReader(string(data)))
	for {
		_, err := d.Token()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}
