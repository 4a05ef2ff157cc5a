package connrate

import (
	"context"
	"encoding/json"
	"io"
	"math"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/testutil"
)

func TestParseConnRate(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		rate    float64
		p50     float64
		wantErr string
	}{
		{name: "ok", in: `{"target":"10.96.0.10:80","conns":30000,"errors":1,"seconds":3,"connPerSec":10000,"connectP50Us":31.5,"connectP99Us":80,"cycleP50Us":90,"cycleP99Us":200}`,
			rate: 10000, p50: 31.5},
		{name: "log lines before the result", in: "warning: something\n" + `{"target":"1.2.3.4:80","conns":1,"seconds":1,"connPerSec":1,"connectP50Us":5,"connectP99Us":5,"cycleP50Us":6,"cycleP99Us":6}` + "\n",
			rate: 1, p50: 5},
		{name: "no connection: null percentiles", in: `{"target":"1.2.3.4:80","conns":0,"errors":1000,"firstError":"connect: connection refused","seconds":0.1,"connPerSec":0,"connectP50Us":null,"connectP99Us":null,"cycleP50Us":null,"cycleP99Us":null}`,
			rate: 0, p50: math.NaN()},
		{name: "empty", in: "", wantErr: "printed nothing"},
		{name: "garbage", in: "segfault", wantErr: "parse connrate output"},
		{name: "no target", in: `{"conns":1}`, wantErr: "no target"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := Parse([]byte(tt.in))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if r.Rate != tt.rate || !(r.ConnectP50 == tt.p50 || math.IsNaN(tt.p50) && math.IsNaN(r.ConnectP50)) {
				t.Errorf("rate %v p50 %v, want %v %v", r.Rate, r.ConnectP50, tt.rate, tt.p50)
			}
		})
	}
}

func TestConnRateResultJSONRoundTrip(t *testing.T) {
	in := Result{Target: "1.2.3.4:80", Conns: 0, Errors: 3, FirstError: "refused", ConnectP50: math.NaN(), ConnectP99: math.NaN(),
		CycleP50: math.NaN(), CycleP99: math.NaN()}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatalf("NaN percentiles must marshal as null: %v", err)
	}
	if !strings.Contains(string(b), `"connectP50Us":null`) {
		t.Errorf("want null p50 in %s", b)
	}
	out, err := Parse(b)
	if err != nil || out.Errors != 3 || !math.IsNaN(out.CycleP99) {
		t.Errorf("round trip: %+v, %v", out, err)
	}
}

func TestPercentileUs(t *testing.T) {
	tests := []struct {
		ns   []int64
		p    float64
		want float64
	}{
		{nil, 50, math.NaN()},
		{[]int64{5000}, 99, 5},
		// linear between order statistics (stats.Quantile), no longer nearest rank
		{[]int64{4000, 1000, 3000, 2000}, 50, 2.5},
		{[]int64{4000, 1000, 3000, 2000}, 99, 3.97},
		{[]int64{1000, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000, 10000}, 90, 9.1},
	}
	for _, tt := range tests {
		got := percentileUs(append([]int64(nil), tt.ns...), tt.p)
		if !(math.Abs(got-tt.want) < 1e-9 || math.IsNaN(got) && math.IsNaN(tt.want)) {
			t.Errorf("percentileUs(%v, %v) = %v, want %v", tt.ns, tt.p, got, tt.want)
		}
	}
}

func TestConnRateConfigValidation(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"defaults", Config{Target: netip.MustParseAddrPort("10.0.0.1:80")}, true},
		{"no target", Config{}, false},
		{"port 0", Config{Target: netip.MustParseAddrPort("10.0.0.1:0")}, false},
		{"huge request", Config{Target: netip.MustParseAddrPort("10.0.0.1:80"), Request: 1 << 20}, false},
		{"negative duration", Config{Target: netip.MustParseAddrPort("10.0.0.1:80"), Duration: -time.Second}, false},
	}
	for _, tt := range tests {
		c, err := tt.cfg.withDefaults()
		if (err == nil) != tt.ok {
			t.Errorf("%s: err = %v, want ok=%v", tt.name, err, tt.ok)
		}
		if tt.ok && (c.Duration != 3*time.Second || c.Request != 32 || c.MaxErrors != 1000) {
			t.Errorf("%s: defaults not applied: %+v", tt.name, c)
		}
	}
}

// TestConnRateLoopback runs the real client against the real server on
// loopback of this process's namespace (no root needed).
func TestConnRateLoopback(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	ready := make(chan struct{})
	done := make(chan error, 1)
	addr := netip.MustParseAddrPort("127.0.0.1:0")
	// Find a free port first: the server takes a fixed address.
	port := freePort(t)
	addr = netip.AddrPortFrom(addr.Addr(), port)
	go func() { done <- Serve(ctx, addr, func() { close(ready) }) }()
	select {
	case <-ready:
	case err := <-done:
		t.Fatal(err)
	}
	res, err := Run(t.Context(), Config{Target: addr, Duration: 300 * time.Millisecond})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Errorf("server: %v", err)
	}
	if res.Conns < 50 || res.Errors != 0 || !(res.ConnectP50 > 0) || res.ConnectP99 < res.ConnectP50 || res.Rate <= 0 {
		t.Errorf("implausible result: %+v", res)
	}
	// A closed port: every cycle fails, the run stops after MaxErrors.
	res, err = Run(t.Context(), Config{Target: addr, Duration: 5 * time.Second, MaxErrors: 10})
	if err != nil || res.Conns != 0 || res.Errors != 10 || !strings.Contains(res.FirstError, "refused") {
		t.Errorf("closed port: %+v, %v", res, err)
	}
}

// TestConnRateServerSignals: signals landing on the server while it waits
// for a request (Go's async preemption sends SIGURG) must not cost the
// connection. With a receive timeout set, read(2) fails with EINTR instead
// of restarting (signal(7)); the server then closed with the request unread
// and the kernel answered with a reset (CI, 2026-11-25: one "connection
// reset by peer" in 14 000 connections of TestConnRatePairedPlaces).
func TestConnRateServerSignals(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	addr := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), freePort(t))
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, addr, func() { close(ready) }) }()
	<-ready
	// SIGURG to every thread of this process, every 100 µs: Go's runtime
	// takes it for a preemption request and ignores it where there is none
	quit := make(chan struct{})
	var sent atomic.Int64
	go func() {
		pid := unix.Getpid()
		for {
			select {
			case <-quit:
				return
			default:
			}
			tids, _ := os.ReadDir("/proc/self/task")
			for _, d := range tids {
				if tid, err := strconv.Atoi(d.Name()); err == nil && unix.Tgkill(pid, tid, unix.SIGURG) == nil {
					sent.Add(1)
				}
			}
			time.Sleep(100 * time.Microsecond)
		}
	}()
	defer close(quit)
	const conns = 100
	for i := range conns {
		c, err := net.Dial("tcp", addr.String())
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		time.Sleep(2 * time.Millisecond) // the server waits in read(2) meanwhile
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write([]byte("ping")); err != nil {
			t.Fatalf("connection %d: write: %v", i, err)
		}
		got, err := io.ReadAll(c)
		c.Close()
		if err != nil || string(got) != "ping" {
			t.Fatalf("connection %d (%d signals sent so far): answer %q, %v; want the request echoed", i, sent.Load(), got, err)
		}
	}
	t.Logf("%d connections echoed under %d signals", conns, sent.Load())
	cancel()
	if err := <-done; err != nil {
		t.Errorf("server: %v", err)
	}
}

// TestConnRatePairedLoopback: two servers on loopback measured in
// alternating slices; the same kind of server on both sides gives a ratio
// near 1, with every cycle accounted to its side.
//
// Two things made two alike servers unlike (medians of 0.5 to 3.6 in 2 of 5
// runs on a quiet machine):
//   - The client and both servers each block in system calls on a locked OS
//     thread. In `axon lab bench` they are separate processes; here they
//     share one, and with GOMAXPROCS at 2 (a 2-core runner) the three threads
//     competed for two Ps on every return from a system call, and a server
//     that lost a handoff waited for the runtime's next check. One P per
//     blocking thread plus the test's own makes the sides alike.
//   - The servers close first, so each cycle leaves a TIME_WAIT socket on
//     the server's port, and the root netns's loopback holds those of every
//     earlier run and test (116 000 after 20 runs of this one). Once the
//     client's ephemeral ports wrap, a SYN that lands on one is answered with
//     an ACK and retransmitted a second later, in whichever side's slice it
//     fell. A netns of the test's own starts empty.
func TestConnRatePairedLoopback(t *testing.T) {
	testutil.RequireRoot(t, "the run gets a network namespace of its own (an empty TIME_WAIT table)")
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(max(4, runtime.GOMAXPROCS(0))))
	ns := testutil.NewNetns(t, "axt-connrate-")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var addrs [2]netip.AddrPort
	for i := range addrs {
		addrs[i] = netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(5001+i))
		ready, served := make(chan struct{}), make(chan error, 1)
		go func() {
			served <- netnsutil.Do(ns, func() error { return Serve(ctx, addrs[i], func() { close(ready) }) })
		}()
		select {
		case <-ready:
		case err := <-served:
			t.Fatalf("server %s: %v", addrs[i], err)
		}
	}
	in := Place{Netns: netnsutil.Path(ns)}
	res, err := RunPaired(t.Context(), Config{Target: addrs[0], Duration: 1200 * time.Millisecond}, addrs[1], 100*time.Millisecond, [2]Place{in, in})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("pairs %d, ratio median %.3f (IQR %.3f–%.3f), A %.0f/s, B %.0f/s", res.Pairs, res.RatioMedian, res.RatioP25, res.RatioP75, res.A.Rate, res.B.Rate)
	if res.Pairs < 4 || res.A.Conns == 0 || res.B.Conns == 0 || res.A.Errors+res.B.Errors != 0 {
		t.Errorf("implausible result: %+v", res)
	}
	if res.A.Target != addrs[0].String() || res.B.Target != addrs[1].String() {
		t.Errorf("targets %s / %s, want %s / %s", res.A.Target, res.B.Target, addrs[0], addrs[1])
	}
	if !(res.RatioP25 <= res.RatioMedian && res.RatioMedian <= res.RatioP75) || res.RatioMedian < 0.5 || res.RatioMedian > 2 {
		t.Errorf("ratio median %.3f (IQR %.3f–%.3f): want ≈ 1 for two alike servers", res.RatioMedian, res.RatioP25, res.RatioP75)
	}
	if _, err := RunPaired(t.Context(), Config{Target: addrs[0], Duration: time.Second}, addrs[1], time.Second, [2]Place{}); err == nil {
		t.Error("a slice longer than half the duration was accepted")
	}
}

// TestPairedResultJSON: NaN statistics survive a JSON round trip as null.
func TestPairedResultJSON(t *testing.T) {
	in := PairedResult{Pairs: 3, RatioMedian: 1.01, RatioP25: 1, RatioP75: 1.02, RatioCILo: math.NaN(), RatioCIHi: math.NaN(), Ratios: []float64{1, 1.01, 1.02}}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var back PairedResult
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"ratioCI95Lo":null`) || !math.IsNaN(back.RatioCILo) || back.RatioMedian != 1.01 || len(back.Ratios) != 3 {
		t.Errorf("round trip: %s -> %+v", b, back)
	}
}

func freePort(t *testing.T) uint16 {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return uint16(l.Addr().(*net.TCPAddr).Port)
}
