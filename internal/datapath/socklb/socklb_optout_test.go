package socklb

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/axonhq/axon/internal/lb"
)

// TestSockLBSkipNetns: sockets of a netns in axon_lb_skip (a pod that opted
// out) reach the service address untranslated; other netns are translated;
// removing the cookie translates it again.
func TestSockLBSkipNetns(t *testing.T) {
	e := newSockLBEnv(t, sockLBOptions{})
	nsA, nsB := dptest.NewNetns(t, "optin"), dptest.NewNetns(t, "optout")
	for _, ns := range []string{nsA, nsB} {
		addLoopbackAddrs(t, ns, "198.18.96.1/24")
		echoServers(t, ns, "198.18.96.1:8080")
	}
	e.upsert(t, lb.Frontend{Key: fkey("10.96.0.70:80", lb.TCP, lb.ScopeCluster), Backends: backends(lb.Active, "198.18.96.1:8080")})
	cookieB, err := NetnsCookie("/var/run/netns/" + nsB)
	if err != nil {
		t.Fatal(err)
	}
	cookieA, err := NetnsCookie("/var/run/netns/" + nsA)
	if err != nil {
		t.Fatal(err)
	}
	if cookieA == cookieB || cookieA == 0 {
		t.Fatalf("netns cookies %d and %d: want distinct non-zero values", cookieA, cookieB)
	}
	op := clientOp{"tcp", 4, "10.96.0.70:80", 0}
	steps := []struct {
		name   string
		skip   []uint64
		wantA  unix.Errno
		wantB  unix.Errno
		reason string
	}{
		{"nobody opted out", nil, 0, 0, "both translated"},
		{"B opted out", []uint64{cookieB}, 0, unix.ENETUNREACH, "B untranslated: no route to the ClusterIP"},
		{"B opted in again", []uint64{}, 0, 0, "both translated"},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			if err := e.s.SetSkipNetns(st.skip); err != nil {
				t.Fatal(err)
			}
			got, err := e.s.SkipNetns()
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(st.skip) || (len(got) > 0 && !reflect.DeepEqual(got, st.skip)) {
				t.Errorf("SkipNetns() = %v, want %v", got, st.skip)
			}
			for _, c := range []struct {
				ns   string
				want unix.Errno
			}{{nsA, st.wantA}, {nsB, st.wantB}} {
				r := runClients(t, c.ns, e.cgFD, op)[0]
				if unix.Errno(r.Errno) != c.want || (c.want == 0 && (r.Reply != "198.18.96.1:8080" || r.Peer != "10.96.0.70:80")) {
					t.Errorf("%s from %s: %+v, want errno %d (%s)", op.Addr, c.ns, r, c.want, st.reason)
				}
			}
		})
	}
}

// TestSockLBHostNetnsOnly: in hostns-only mode only the agent's own netns is
// translated; a pod netns reaches the service address untranslated.
func TestSockLBHostNetnsOnly(t *testing.T) {
	e := newSockLBEnv(t, sockLBOptions{cfg: Config{HostNetnsOnly: true}})
	pod := dptest.NewNetns(t, "hostonly")
	addLoopbackAddrs(t, pod, "198.18.95.1/24")
	echoServers(t, pod, "198.18.95.1:8080")
	// a backend on loopback of the test's own netns (the "host")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go serveTCP(ln)
	hostBE := ln.Addr().String()
	e.upsert(t,
		lb.Frontend{Key: fkey("10.96.0.71:80", lb.TCP, lb.ScopeCluster), Backends: backends(lb.Active, hostBE)},
		lb.Frontend{Key: fkey("10.96.0.72:80", lb.TCP, lb.ScopeCluster), Backends: backends(lb.Active, "198.18.95.1:8080")},
	)
	host := runClients(t, "", e.cgFD, clientOp{"tcp", 4, "10.96.0.71:80", 0})[0]
	if host.Err != "" || host.Reply != hostBE || host.Peer != "10.96.0.71:80" {
		t.Errorf("host netns: %+v, want translated to %s", host, hostBE)
	}
	p := runClients(t, pod, e.cgFD, clientOp{"tcp", 4, "10.96.0.72:80", 0})[0]
	if unix.Errno(p.Errno) != unix.ENETUNREACH {
		t.Errorf("pod netns in hostns-only mode: %+v, want the untranslated ENETUNREACH", p)
	}
}

// TestSockLBResizeAndFits: a Service that does not fit is refused by Fits
// with lb.ErrFull before anything is written; a reload with larger maps
// migrates the pinned content.
func TestSockLBResizeAndFits(t *testing.T) {
	e := newSockLBEnv(t, sockLBOptions{cfg: Config{ServiceMapSize: 8, BackendMapSize: 8}})
	var five []string
	for i := 1; i <= 5; i++ {
		five = append(five, fmt.Sprintf("10.244.1.%d:80", i))
	}
	a := lb.Frontend{Key: fkey("10.96.0.80:80", lb.TCP, lb.ScopeCluster), Backends: backends(lb.Active, five...)}
	if err := e.s.Fits([]lb.Frontend{a}); err != nil {
		t.Fatalf("6 of 8 entries: %v", err)
	}
	e.upsert(t, a)
	b := lb.Frontend{Key: fkey("10.96.0.81:80", lb.TCP, lb.ScopeCluster), Backends: backends(lb.Active, "10.244.2.1:80", "10.244.2.2:80")}
	err := e.s.Fits([]lb.Frontend{b})
	if !errors.Is(err, lb.ErrFull) {
		t.Fatalf("Fits of 3 more entries into 2 free: %v, want lb.ErrFull", err)
	}
	t.Logf("refused: %v", err)
	// the same frontend with one backend swapped needs one slot: fits
	a2 := a
	a2.Backends = append(backends(lb.Active, five[:4]...), backends(lb.Active, "10.244.1.9:80")...)
	if err := e.s.Fits([]lb.Frontend{a2}); err != nil {
		t.Errorf("replacing one backend: %v", err)
	}
	want, _ := e.s.Frontends()
	e.s.Close()
	s2, err := LoadWithConfig(e.pinDir, e.cgroup, Config{ServiceMapSize: 64, BackendMapSize: 32}, dptest.Logger(t))
	if err != nil {
		t.Fatalf("reload with larger maps: %v", err)
	}
	e.s = s2
	got, _ := s2.Frontends()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("frontends after resize:\n got %+v\nwant %+v", got, want)
	}
	for name, size := range map[string]uint32{MapLBService: 64, MapLBBackend: 32} {
		m, err := ebpf.LoadPinnedMap(filepath.Join(e.pinDir, name), nil)
		if err != nil {
			t.Fatal(err)
		}
		if m.MaxEntries() != size {
			t.Errorf("pinned %s has %d entries max, want %d", name, m.MaxEntries(), size)
		}
		m.Close()
	}
	if err := s2.Fits([]lb.Frontend{b}); err != nil {
		t.Errorf("after resize: %v", err)
	}
	e.upsert(t, b)
}
