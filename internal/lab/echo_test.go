package lab

import (
	"bytes"
	"context"
	"io"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/axonhq/axon/internal/lab/probe"
	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/testutil"
)

func TestCheckResultPrint(t *testing.T) {
	v4, v6 := netip.MustParseAddr("10.244.2.2"), netip.MustParseAddr("fd00:10:244:2::2")
	ok := func(proto string, a netip.Addr) probe.PodResult {
		return probe.PodResult{Pod: probe.Pod{Proto: proto, Addr: a}, OK: true}
	}
	r := &CheckResult{
		Sources:      []string{"p1", "p2"},
		Destinations: []string{"p1", "p2"},
		Cells: map[[2]string][]probe.PodResult{
			{"p1", "p2"}: {ok("tcp", v4), ok("udp", v4), ok("icmp", v4), ok("tcp", v6), ok("udp", v6), ok("icmp", v6)},
			{"p2", "p1"}: {ok("tcp", v4), {Pod: probe.Pod{Proto: "udp", Addr: v6}, Err: "timeout"}},
		},
	}
	var b bytes.Buffer
	r.Print(&b)
	out := b.String()
	for _, want := range []string{"FAIL(v6udp)", "FAIL p2 → p1 udp/fd00:10:244:2::2: timeout", "7/8 probes passed"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if n := len(r.Failed()); n != 1 {
		t.Errorf("Failed() has %d entries, want 1", n)
	}
}

func TestCheckFamilies(t *testing.T) {
	v4, v6 := netip.MustParseAddr("10.244.1.2"), netip.MustParseAddr("fd00:10:244:1::2")
	for _, tc := range []struct {
		name string
		pods []checkTarget
		want string
		line string // Print's summary for that family set
	}{
		{"dual-stack lab pods", []checkTarget{{ips: []netip.Addr{v4, v6}}, {ips: []netip.Addr{v6, v4}}}, "IPv4+IPv6", "(IPv4+IPv6 × TCP/UDP/ICMP; ok = all 6)"},
		{"kubelet pods (IPv4 only)", []checkTarget{{ips: []netip.Addr{v4}}, {ips: []netip.Addr{v4}}}, "IPv4", "(IPv4 × TCP/UDP/ICMP; ok = all 3)"},
		{"one pod without IPv6", []checkTarget{{ips: []netip.Addr{v4, v6}}, {ips: []netip.Addr{v4}}}, "IPv4", "(IPv4 × TCP/UDP/ICMP; ok = all 3)"},
		{"IPv6 only", []checkTarget{{ips: []netip.Addr{v6}}}, "IPv6", "(IPv6 × TCP/UDP/ICMP; ok = all 3)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := families(tc.pods)
			if got != tc.want {
				t.Fatalf("families = %q, want %q", got, tc.want)
			}
			var b bytes.Buffer
			(&CheckResult{Families: got}).Print(&b)
			if !strings.Contains(b.String(), tc.line) {
				t.Errorf("summary %q lacks %q", b.String(), tc.line)
			}
		})
	}
	if hasFamily([]netip.Addr{v4}, v6) || !hasFamily([]netip.Addr{v4, v6}, v6) {
		t.Error("hasFamily: wrong answer for IPv6")
	}
}

// TestEchoAndProbes runs the check's echo server and prober (TCP, UDP and
// the raw-socket ICMP pinger) in a private namespace over loopback.
func TestEchoAndProbes(t *testing.T) {
	testutil.RequireRoot(t, "creates a network namespace and raw ICMP sockets")
	ns := testutil.NewNetnsKernelDAD(t, "axt-lab-echo-") // preparePodNetns turns DAD off, as for a lab pod
	if err := preparePodNetns(ns); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	readyR, readyW := io.Pipe()
	srvDone := make(chan error, 1)
	go func() {
		srvDone <- netnsutil.Do(ns, func() error { return probe.ServeEcho(ctx, probe.EchoPort, readyW, nil) })
	}()
	if err := probe.ReadReady(readyR); err != nil {
		t.Fatal(err)
	}
	lo4, lo6 := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1")
	unroutable := netip.MustParseAddr("203.0.113.7") // TEST-NET-3: no route in the namespace
	var probes []probe.Pod
	for _, a := range []netip.Addr{lo4, lo6, unroutable} {
		for _, p := range []string{"tcp", "udp", "icmp"} {
			probes = append(probes, probe.Pod{Proto: p, Addr: a})
		}
	}
	// Sequentially on the namespace's thread: goroutines would not be in the
	// namespace (in `axon lab _echo probe` the whole process is).
	t0 := time.Now()
	err := netnsutil.Do(ns, func() error {
		for _, p := range probes {
			err := p.Run(ctx, time.Second)
			if want := p.Addr != unroutable; (err == nil) != want {
				t.Errorf("%s: err=%v, want ok=%v", p, err, want)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d probes in %s", len(probes), time.Since(t0).Round(time.Millisecond))
	cancel()
	select {
	case err := <-srvDone:
		if err != nil {
			t.Errorf("echo server: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Error("echo server did not stop on cancel")
	}
}
