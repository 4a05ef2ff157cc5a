package agent

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/axonhq/axon/internal/datapath/podpath"
	"github.com/axonhq/axon/internal/datapath/socklb"
	"github.com/axonhq/axon/internal/lb"
	"github.com/axonhq/axon/internal/testutil"
)

const monitorHelperEnv = "AXON_MONITOR_TEST_HELPER"

// TestMonitorHelperProcess connects to the TCP address in its request
// (run inside a test cgroup by TestMonitorSocketLBRefusal) and prints the
// errno name.
func TestMonitorHelperProcess(t *testing.T) {
	var in struct {
		Netns string
		Addr  string
	}
	testutil.HelperStart(t, monitorHelperEnv, "client helper of TestMonitorSocketLBRefusal: runs only when re-executed by it", &in)
	ap := netip.MustParseAddrPort(in.Addr)
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0)
	if err != nil {
		os.Stdout.WriteString("socket: " + err.Error() + "\n")
		os.Exit(1)
	}
	err = unix.Connect(fd, &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()})
	var errno syscall.Errno
	switch {
	case err == nil:
		os.Stdout.WriteString("RESULT connected\n")
	case errors.As(err, &errno):
		os.Stdout.WriteString("RESULT " + unix.ErrnoName(errno) + "\n")
	default:
		os.Stdout.WriteString("RESULT " + err.Error() + "\n")
	}
	os.Exit(0)
}

// TestMonitorSocketLBRefusal: a connect to a ClusterIP without endpoints,
// refused by the real socket LB program, reaches a client of the agent's
// GET /v1/monitor over a unix socket (the stream `axon monitor` reads) with
// its reason, program and Service tuple, and moves axon_drop_count_total;
// the filters hold back what they do not match; when the stream ends the
// programs stop writing events.
func TestMonitorSocketLBRefusal(t *testing.T) {
	dptest.RequireRoot(t)
	pin := dptest.NewPinDir(t, datapath.BPFFSRoot, datapath.EnsureBPFFS, podpath.Uninstall)
	cg, cgFD := testutil.NewCgroup(t, "axt-mon-")
	log := dptest.Logger(t)
	l, err := socklb.Load(pin, cg, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	svc := netip.MustParseAddrPort("10.96.0.77:80")
	if err := l.UpsertFrontend(lb.Frontend{Key: lb.FrontendKey{Addr: svc.Addr(), Port: svc.Port(), Proto: lb.TCP}, Kind: lb.KindClusterIP}); err != nil {
		t.Fatal(err)
	}

	reg, err := openRegistry(t.TempDir(), log)
	if err != nil {
		t.Fatal(err)
	}
	a := &Agent{cfg: Config{BPFRoot: pin}, log: log, reg: reg, st: &nodeStatus{}, drops: newDropMonitor(pin, log)}
	t.Cleanup(a.drops.close)
	sock := filepath.Join(t.TempDir(), "axon.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: api.NewMux(a, log)}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	client := api.NewClient(sock)

	connect := func() string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), testutil.Stretch(t, 30*time.Second))
		defer cancel()
		out, err := testutil.HelperCommand(ctx, "TestMonitorHelperProcess", monitorHelperEnv,
			[]byte(`{"Addr":"`+svc.String()+`"}`), cgFD).Output()
		if err != nil {
			t.Fatalf("client process: %v: %s", err, out)
		}
		for _, line := range strings.Split(string(out), "\n") {
			if r, ok := strings.CutPrefix(line, "RESULT "); ok {
				return r
			}
		}
		t.Fatalf("client process printed no result: %s", out)
		return ""
	}
	dropCount := func() float64 {
		t.Helper()
		r := prometheus.NewRegistry()
		r.MustRegister(dropCollector{a: a})
		mfs, err := r.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "axon_drop_count_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				lbl := map[string]string{}
				for _, p := range m.GetLabel() {
					lbl[p.GetName()] = p.GetValue()
				}
				if lbl["reason"] == "drop_no_backend" && lbl["direction"] == "egress" {
					return m.GetCounter().GetValue()
				}
			}
		}
		t.Fatal("no axon_drop_count_total{reason=drop_no_backend,direction=egress} on /metrics")
		return 0
	}

	// two streams: one for the reason, one filtered on a protocol the
	// refusal is not (it must get nothing)
	type stream struct {
		msgs chan api.MonitorMessage
		done chan error
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	open := func(f api.MonitorFilter) stream {
		s := stream{msgs: make(chan api.MonitorMessage, 16), done: make(chan error, 1)}
		go func() {
			s.done <- client.Monitor(ctx, f, func(m api.MonitorMessage) error { s.msgs <- m; return nil })
		}()
		select { // the first line says the stream listens
		case m := <-s.msgs:
			if m.Lost == nil {
				t.Fatalf("first line of the stream %+v, want the lost counts", m)
			}
		case err := <-s.done:
			t.Fatalf("monitor stream: %v", err)
		case <-time.After(testutil.Stretch(t, 5*time.Second)):
			t.Fatal("monitor stream did not start")
		}
		return s
	}
	byReason := open(api.MonitorFilter{Reasons: []string{"drop_no_backend"}, Protocol: "tcp"})
	udpOnly := open(api.MonitorFilter{Protocol: "udp"})

	before := dropCount()
	if got := connect(); got != "ECONNREFUSED" {
		t.Fatalf("connect to %s without endpoints: %s, want ECONNREFUSED", svc, got)
	}
	select {
	case m := <-byReason.msgs:
		if m.Event == nil {
			t.Fatalf("message %+v, want an event", m)
		}
		e := *m.Event
		e.Time = time.Time{}
		want := api.DropEvent{Prog: "sock_lb", Reason: "drop_no_backend", Direction: "egress", Proto: "tcp", Dst: svc.Addr(), DstPort: svc.Port()}
		if e != want {
			t.Errorf("event %+v\nwant  %+v", e, want)
		}
	case <-time.After(testutil.Stretch(t, 5*time.Second)):
		t.Fatal("the refused connect did not reach the monitor stream within 5 s")
	}
	if after := dropCount(); after != before+1 {
		t.Errorf("axon_drop_count_total{drop_no_backend,egress} %v -> %v, want +1", before, after)
	}
	select {
	case m := <-udpOnly.msgs:
		if m.Event != nil {
			t.Errorf("a --protocol udp stream got %+v", *m.Event)
		}
	case <-time.After(200 * time.Millisecond):
	}

	// streams closed: listener count back to 0, no event written
	cancel()
	for _, s := range []stream{byReason, udpOnly} {
		if err := <-s.done; err != nil {
			t.Errorf("monitor stream ended with %v", err)
		}
	}
	mp, _, err := a.drops.open()
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(testutil.Stretch(t, 5*time.Second))
	for n, _ := mp.Listeners(); n != 0; n, _ = mp.Listeners() {
		if time.Now().After(deadline) {
			t.Fatalf("listener count %d after both streams closed, want 0", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	rs0, _ := mp.ReadRingStats()
	if got := connect(); got != "ECONNREFUSED" {
		t.Fatalf("second connect: %s", got)
	}
	if rs1, _ := mp.ReadRingStats(); rs1.Emitted != rs0.Emitted {
		t.Errorf("events emitted %d -> %d with nobody listening, want no change", rs0.Emitted, rs1.Emitted)
	}
	if after := dropCount(); after != before+2 {
		t.Errorf("axon_drop_count_total{drop_no_backend,egress} %v after two refusals, want %v", after, before+2)
	}
}

// TestMonitorFilterRefused: bad filters are refused before any stream
// starts, with a message that says what to use.
func TestMonitorFilterRefused(t *testing.T) {
	reg, err := openRegistry(t.TempDir(), dptest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	a := &Agent{log: dptest.Logger(t), reg: reg, drops: newDropMonitor(t.TempDir(), dptest.Logger(t))}
	for _, c := range []struct {
		f    api.MonitorFilter
		code int
	}{
		{api.MonitorFilter{Reasons: []string{"drop_everything"}}, http.StatusBadRequest},
		{api.MonitorFilter{Pod: "default/nope"}, http.StatusNotFound},
		// the drop maps are not pinned in an empty directory
		{api.MonitorFilter{}, http.StatusServiceUnavailable},
	} {
		err := a.Monitor(context.Background(), c.f, func(api.MonitorMessage) error { return nil })
		var se *api.StatusError
		if !errors.As(err, &se) || se.Code != c.code {
			t.Errorf("filter %+v: %v, want HTTP %d", c.f, err, c.code)
		}
	}
	for _, f := range []api.MonitorFilter{{Pod: "Default/x"}, {Pod: "noslash"}, {Protocol: "gre"}} {
		if err := f.Validate(); err == nil {
			t.Errorf("filter %+v validated", f)
		}
	}
}
