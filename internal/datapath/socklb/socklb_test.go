package socklb

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/axonhq/axon/internal/datapath/lbmap"
	"github.com/axonhq/axon/internal/lb"
)

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

func fkey(s string, proto lb.Proto, scope lb.Scope) lb.FrontendKey {
	a := ap(s)
	return lb.FrontendKey{Addr: a.Addr(), Port: a.Port(), Proto: proto, Scope: scope}
}

func backends(state lb.BackendState, addrs ...string) []lb.Backend {
	var out []lb.Backend
	for _, s := range addrs {
		a := ap(s)
		out = append(out, lb.Backend{Addr: a.Addr(), Port: a.Port(), State: state})
	}
	return out
}

// sockLBEnv is one loaded socket LB attached to a fresh test cgroup.
type sockLBEnv struct {
	s      *LB
	pinDir string
	cgroup string
	cgFD   int
}

func newSockLBEnv(t testing.TB, o sockLBOptions) *sockLBEnv {
	t.Helper()
	dptest.RequireRoot(t)
	cg, fd := newTestCgroup(t)
	pin := newPinDir(t)
	s, err := loadSockLBWith(pin, cg, dptest.Logger(t), o)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	t.Cleanup(func() {
		s.Close()
		if err := Uninstall(pin, cg); err != nil {
			t.Errorf("Uninstall: %v", err)
		}
	})
	return &sockLBEnv{s: s, pinDir: pin, cgroup: cg, cgFD: fd}
}

func (e *sockLBEnv) upsert(t testing.TB, fs ...lb.Frontend) {
	t.Helper()
	for _, f := range fs {
		if err := e.s.UpsertFrontend(f); err != nil {
			t.Fatalf("UpsertFrontend: %v", err)
		}
	}
}

// TestSockLBTraffic: real sockets of a process in the attached cgroup reach
// service addresses that exist nowhere (no route, no address), see the
// service address as their peer, and are refused fast without backends.
func TestSockLBTraffic(t *testing.T) {
	e := newSockLBEnv(t, sockLBOptions{})
	ns := dptest.NewNetns(t, "socklb")
	addLoopbackAddrs(t, ns, "198.18.98.1/24", "198.18.98.2/24", "fd00:198:98::1/64", "fd00:198:98::2/64")
	echoServers(t, ns, "198.18.98.1:8080", "198.18.98.2:8080", "[fd00:198:98::1]:8080", "[fd00:198:98::2]:8080",
		"198.18.98.1:5353", "198.18.98.2:5353", "[fd00:198:98::1]:5353")

	both4 := []string{"198.18.98.1:8080", "198.18.98.2:8080"}
	e.upsert(t,
		lb.Frontend{Key: fkey("10.96.0.10:80", lb.TCP, lb.ScopeCluster), Backends: backends(lb.Active, both4...)},
		lb.Frontend{Key: fkey("10.96.0.10:53", lb.UDP, lb.ScopeCluster), Backends: backends(lb.Active, "198.18.98.1:5353", "198.18.98.2:5353")},
		lb.Frontend{Key: fkey("[fd00:96::10]:80", lb.TCP, lb.ScopeCluster), Backends: backends(lb.Active, "[fd00:198:98::1]:8080", "[fd00:198:98::2]:8080")},
		lb.Frontend{Key: fkey("[fd00:96::10]:53", lb.UDP, lb.ScopeCluster), Backends: backends(lb.Active, "[fd00:198:98::1]:5353")},
		lb.Frontend{Key: fkey("10.96.0.11:80", lb.TCP, lb.ScopeCluster)},
		lb.Frontend{Key: fkey("10.96.0.11:53", lb.UDP, lb.ScopeCluster)},
		lb.Frontend{Key: fkey("10.96.0.12:80", lb.TCP, lb.ScopeCluster), Backends: backends(lb.Terminating, "198.18.98.2:8080")},
		lb.Frontend{Key: fkey("10.96.0.14:80", lb.TCP, lb.ScopeCluster), Backends: append(backends(lb.Active, "198.18.98.1:8080"), backends(lb.Terminating, "198.18.98.2:8080")...)},
		lb.Frontend{Key: fkey("10.96.0.15:80", lb.TCP, lb.ScopeCluster), Backends: backends(lb.Quarantined, "198.18.98.1:8080")},
		lb.Frontend{Key: fkey("10.96.0.13:80", lb.TCP, lb.ScopeCluster), Backends: backends(lb.Active, both4...), Affinity: time.Minute},
		lb.Frontend{Key: fkey("0.0.0.0:30080", lb.TCP, lb.ScopeNodePort), Backends: backends(lb.Active, both4...)},
		lb.Frontend{Key: fkey("[::]:30080", lb.TCP, lb.ScopeNodePort), Backends: backends(lb.Active, "[fd00:198:98::1]:8080")},
		lb.Frontend{Key: fkey("0.0.0.0:8443", lb.TCP, lb.ScopeHostPort), Backends: backends(lb.Active, "198.18.98.2:8080")},
	)
	if err := e.s.SetLocalAddrs([]netip.Addr{netip.MustParseAddr("198.18.98.1")}); err != nil {
		t.Fatal(err)
	}

	type want struct {
		errno   unix.Errno // expected failure, 0 = success
		replyIn []string   // the answering backend is one of these
		peer    string     // getpeername / recvfrom source
	}
	cases := []struct {
		name string
		op   clientOp
		want want
	}{
		{"tcp v4 clusterIP", clientOp{"tcp", 4, "10.96.0.10:80", 0}, want{0, both4, "10.96.0.10:80"}},
		{"udp v4 unconnected", clientOp{"udp", 4, "10.96.0.10:53", 0}, want{0, []string{"198.18.98.1:5353", "198.18.98.2:5353"}, "10.96.0.10:53"}},
		{"tcp v6 clusterIP", clientOp{"tcp", 6, "[fd00:96::10]:80", 0}, want{0, []string{"[fd00:198:98::1]:8080", "[fd00:198:98::2]:8080"}, "[fd00:96::10]:80"}},
		{"udp v6 unconnected", clientOp{"udp", 6, "[fd00:96::10]:53", 0}, want{0, []string{"[fd00:198:98::1]:5353"}, "[fd00:96::10]:53"}},
		{"tcp v4-in-v6", clientOp{"tcp", 6, "[::ffff:10.96.0.10]:80", 0}, want{0, both4, "[::ffff:10.96.0.10]:80"}},
		{"udp v4-in-v6", clientOp{"udp", 6, "[::ffff:10.96.0.10]:53", 0}, want{0, []string{"198.18.98.1:5353", "198.18.98.2:5353"}, "[::ffff:10.96.0.10]:53"}},
		{"udp v4 connected", clientOp{"udpc", 4, "10.96.0.10:53", 0}, want{0, []string{"198.18.98.1:5353", "198.18.98.2:5353"}, "10.96.0.10:53"}},
		{"udp v6 connected", clientOp{"udpc", 6, "[fd00:96::10]:53", 0}, want{0, []string{"[fd00:198:98::1]:5353"}, "[fd00:96::10]:53"}},
		{"tcp no backends refused", clientOp{"tcp", 4, "10.96.0.11:80", 0}, want{errno: unix.ECONNREFUSED}},
		{"udp no backends refused", clientOp{"udp", 4, "10.96.0.11:53", 0}, want{errno: unix.ECONNREFUSED}},
		{"only quarantined refused", clientOp{"tcp", 4, "10.96.0.15:80", 0}, want{errno: unix.ECONNREFUSED}},
		{"only terminating still served", clientOp{"tcp", 4, "10.96.0.12:80", 0}, want{0, []string{"198.18.98.2:8080"}, "10.96.0.12:80"}},
		{"nodeport on loopback", clientOp{"tcp", 4, "127.0.0.1:30080", 0}, want{0, both4, "127.0.0.1:30080"}},
		{"nodeport on a local address", clientOp{"tcp", 4, "198.18.98.1:30080", 0}, want{0, both4, "198.18.98.1:30080"}},
		{"nodeport v6 loopback", clientOp{"tcp", 6, "[::1]:30080", 0}, want{0, []string{"[fd00:198:98::1]:8080"}, "[::1]:30080"}},
		{"hostport on a local address", clientOp{"tcp", 4, "198.18.98.1:8443", 0}, want{0, []string{"198.18.98.2:8080"}, "198.18.98.1:8443"}},
		{"nodeport not on a foreign address", clientOp{"tcp", 4, "198.18.98.2:30080", 0}, want{errno: unix.ECONNREFUSED}}, // not local: untranslated, nothing listens
		{"bind nodeport refused", clientOp{"bind", 4, "0.0.0.0:30080", 0}, want{errno: unix.EADDRINUSE}},
		{"bind nodeport v6 refused", clientOp{"bind", 6, "[::]:30080", 0}, want{errno: unix.EADDRINUSE}},
		{"bind other port allowed", clientOp{"bind", 4, "0.0.0.0:30081", 0}, want{}},
	}
	ops := make([]clientOp, len(cases))
	for i, c := range cases {
		ops[i] = c.op
	}
	res := runClients(t, ns, e.cgFD, ops...)
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := res[i]
			if c.want.errno != 0 {
				if unix.Errno(r.Errno) != c.want.errno {
					t.Fatalf("%s %s: got errno %d (%s), want %v", c.op.Kind, c.op.Addr, r.Errno, r.Err, c.want.errno)
				}
				if r.Millis > 500 {
					t.Errorf("refusal took %d ms, want fast", r.Millis)
				}
				return
			}
			if r.Err != "" {
				t.Fatalf("%s %s: %s", c.op.Kind, c.op.Addr, r.Err)
			}
			if c.op.Kind == "bind" {
				return
			}
			if !contains(c.want.replyIn, r.Reply) {
				t.Errorf("reply from %q, want one of %v", r.Reply, c.want.replyIn)
			}
			if c.op.Kind != "udp" && r.Peer != c.want.peer {
				t.Errorf("getpeername %q, want the service address %q", r.Peer, c.want.peer)
			}
			if c.op.Kind != "tcp" && r.From != c.want.peer {
				t.Errorf("recvfrom source %q, want the service address %q", r.From, c.want.peer)
			}
		})
	}

	t.Run("random among active, never terminating", func(t *testing.T) {
		var ops []clientOp
		for i := 0; i < 16; i++ {
			ops = append(ops, clientOp{"tcp", 4, "10.96.0.10:80", 0}, clientOp{"tcp", 4, "10.96.0.14:80", 0})
		}
		seen := map[string]int{}
		for i, r := range runClients(t, ns, e.cgFD, ops...) {
			if r.Err != "" {
				t.Fatalf("connect %d: %s", i, r.Err)
			}
			if i%2 == 1 {
				if r.Reply != "198.18.98.1:8080" {
					t.Errorf("10.96.0.14 answered by %s: a terminating backend got a new connection while an active one exists", r.Reply)
				}
				continue
			}
			seen[r.Reply]++
		}
		if len(seen) != 2 {
			t.Errorf("16 connects to 10.96.0.10 reached %v, want both backends", seen)
		}
	})

	t.Run("affinity keeps one backend per netns", func(t *testing.T) {
		var ops []clientOp
		for i := 0; i < 12; i++ {
			ops = append(ops, clientOp{"tcp", 4, "10.96.0.13:80", 0})
		}
		seen := map[string]int{}
		for i, r := range runClients(t, ns, e.cgFD, ops...) {
			if r.Err != "" {
				t.Fatalf("connect %d: %s", i, r.Err)
			}
			seen[r.Reply]++
		}
		if len(seen) != 1 {
			t.Errorf("12 connects with session affinity reached %v, want one backend", seen)
		}
	})

	t.Run("process outside the cgroup is not translated", func(t *testing.T) {
		r := runClients(t, ns, -1, clientOp{"tcp", 4, "10.96.0.10:80", 0})[0]
		if r.Err == "" {
			t.Fatalf("connect to 10.96.0.10:80 from outside the cgroup reached %s: it must not be translated", r.Reply)
		}
		if r.Millis > 1000 {
			t.Errorf("untranslated connect took %d ms (%s), want a fast failure", r.Millis, r.Err)
		}
	})

	t.Run("backend change takes effect, deleted frontend untranslated", func(t *testing.T) {
		e.upsert(t, lb.Frontend{Key: fkey("10.96.0.10:80", lb.TCP, lb.ScopeCluster), Backends: backends(lb.Active, "198.18.98.2:8080")})
		var ops []clientOp
		for i := 0; i < 6; i++ {
			ops = append(ops, clientOp{"tcp", 4, "10.96.0.10:80", 0})
		}
		for _, r := range runClients(t, ns, e.cgFD, ops...) {
			if r.Reply != "198.18.98.2:8080" {
				t.Errorf("after shrinking to one backend got %q (%s)", r.Reply, r.Err)
			}
		}
		if err := e.s.DeleteFrontend(fkey("10.96.0.10:80", lb.TCP, lb.ScopeCluster)); err != nil {
			t.Fatal(err)
		}
		r := runClients(t, ns, e.cgFD, clientOp{"tcp", 4, "10.96.0.10:80", 0})[0]
		if unix.Errno(r.Errno) != unix.ENETUNREACH {
			t.Errorf("after delete: got %q (errno %d), want the untranslated ENETUNREACH", r.Err, r.Errno)
		}
	})

	t.Run("rolling backend replacement under load: no failed connect", func(t *testing.T) {
		key := fkey("10.96.0.16:80", lb.TCP, lb.ScopeCluster)
		one, two := "198.18.98.1:8080", "198.18.98.2:8080"
		steps := [][]lb.Backend{
			backends(lb.Active, one),
			backends(lb.Active, one, two),
			append(backends(lb.Terminating, one), backends(lb.Active, two)...),
			backends(lb.Active, two),
			backends(lb.Active, two, one),
			append(backends(lb.Terminating, two), backends(lb.Active, one)...),
		}
		e.upsert(t, lb.Frontend{Key: key, Backends: steps[0]})
		stop := make(chan struct{})
		done := make(chan int)
		go func() {
			n := 0
			for {
				select {
				case <-stop:
					done <- n
					return
				default:
				}
				if err := e.s.UpsertFrontend(lb.Frontend{Key: key, Backends: steps[n%len(steps)]}); err != nil {
					t.Errorf("upsert during load: %v", err)
				}
				n++
			}
		}()
		r := runClients(t, ns, e.cgFD, clientOp{"tcp", 4, "10.96.0.16:80", 400})[0]
		close(stop)
		updates := <-done
		if r.Fails != 0 {
			t.Errorf("%d of 400 connects failed during %d backend-set updates, first: %s", r.Fails, updates, r.Err)
		}
		if len(r.Seen) != 2 {
			t.Errorf("answering backends %v, want both over the rolling replacement", r.Seen)
		}
		t.Logf("400 connects, %d failed, while %d updates replaced the backend set; answered by %v", r.Fails, updates, r.Seen)
	})

	t.Run("connect rate: service address vs backend directly", func(t *testing.T) {
		e.upsert(t, lb.Frontend{Key: fkey("10.96.0.17:80", lb.TCP, lb.ScopeCluster), Backends: backends(lb.Active, "198.18.98.1:8080")})
		n, rounds := 500, 6
		if os.Getenv("AXON_VM") != "" || os.Getenv("AXON_VM_NIC_MACS") != "" {
			// QEMU TCG runs this 5-20x slower: keep it a correctness check
			// within the client's deadline; the numbers come from the host
			n, rounds = 40, 2
		}
		var ops []clientOp
		for i := 0; i < rounds; i++ {
			ops = append(ops, clientOp{"tcp", 4, "198.18.98.1:8080", n}, clientOp{"tcp", 4, "10.96.0.17:80", n})
		}
		res := runClients(t, ns, e.cgFD, ops...)
		var direct, svc int64
		var ratios []float64
		for i, r := range res {
			if r.Fails != 0 {
				t.Fatalf("%s: %d of %d failed: %s", ops[i].Addr, r.Fails, n, r.Err)
			}
			if i%2 == 0 {
				direct += r.Millis
			} else {
				svc += r.Millis
				ratios = append(ratios, float64(res[i-1].Millis)/float64(max(r.Millis, 1)))
			}
		}
		slices.Sort(ratios)
		t.Logf("connect+request+close, %d each, interleaved in %d rounds: direct %.1f µs, service %.1f µs per connection; "+
			"service/direct rate per round min %.3f median %.3f max %.3f",
			rounds*n, rounds, float64(direct)*1000/float64(rounds*n), float64(svc)*1000/float64(rounds*n),
			ratios[0], ratios[len(ratios)/2], ratios[len(ratios)-1])
	})

	t.Run("restart adopts links and maps", func(t *testing.T) {
		before := linkIDs(t, e.pinDir)
		want, err := e.s.Frontends()
		if err != nil {
			t.Fatal(err)
		}
		e.s.Close()
		s2, err := Load(e.pinDir, e.cgroup, dptest.Logger(t))
		if err != nil {
			t.Fatalf("reload: %v", err)
		}
		e.s = s2
		if after := linkIDs(t, e.pinDir); !reflect.DeepEqual(before, after) {
			t.Errorf("link ids changed over a restart: %v -> %v (want in-place update)", before, after)
		}
		got, err := s2.Frontends()
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("frontends after restart:\n got %+v\nwant %+v", got, want)
		}
		r := runClients(t, ns, e.cgFD, clientOp{"tcp", 4, "10.96.0.12:80", 0})[0]
		if r.Reply != "198.18.98.2:8080" {
			t.Errorf("after restart: %q (%s)", r.Reply, r.Err)
		}
	})
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// linkIDs returns hook name -> kernel link id of the pinned cgroup links.
func linkIDs(t *testing.T, pinDir string) map[string]link.ID {
	t.Helper()
	out := map[string]link.ID{}
	for _, h := range sockHooks {
		l, err := link.LoadPinnedLink(filepath.Join(datapath.LinksDir(pinDir), sockHookPrefix+h.name), nil)
		if err != nil {
			t.Fatalf("pinned link %s: %v", h.name, err)
		}
		info, err := l.Info()
		l.Close()
		if err != nil {
			t.Fatal(err)
		}
		out[h.name] = info.ID
	}
	return out
}

// TestSockLBWriter: what goes in comes back out of the maps; updates leave
// no stale entries; bad input and a full map change nothing.
func TestSockLBWriter(t *testing.T) {
	e := newSockLBEnv(t, sockLBOptions{maxEntries: map[string]uint32{MapLBService: 12, MapLBBackend: 12}})
	s := e.s
	web := lb.Frontend{
		Key: fkey("10.96.0.20:80", lb.TCP, lb.ScopeCluster), Kind: lb.KindClusterIP, Service: "default/web", PortName: "http",
		Backends: []lb.Backend{
			{Addr: netip.MustParseAddr("10.244.1.3"), Port: 8080, State: lb.Terminating, NodeName: "node1"},
			{Addr: netip.MustParseAddr("10.244.1.2"), Port: 8080, State: lb.Active, NodeName: "node1", Zone: "a"},
			{Addr: netip.MustParseAddr("10.244.2.2"), Port: 8080, State: lb.Quarantined, NodeName: "node2"},
		},
		Affinity: 3 * time.Hour,
	}
	e.upsert(t, web)
	got, err := s.Frontends()
	if err != nil {
		t.Fatal(err)
	}
	want := web
	want.Backends = []lb.Backend{web.Backends[1], web.Backends[0], web.Backends[2]} // sorted by address
	if len(got) != 1 || !reflect.DeepEqual(got[0], want) {
		t.Fatalf("read back:\n got %+v\nwant %+v", got, want)
	}
	if n := dptest.MapLen(t, s.objs.AxonLbSvc); n != 4 {
		t.Errorf("service map holds %d entries, want master + 3 slots", n)
	}

	before, _ := s.Frontends()
	bad := []struct {
		name string
		f    lb.Frontend
		msg  string
	}{
		{"no address", lb.Frontend{Key: lb.FrontendKey{Port: 80, Proto: lb.TCP}}, "empty address"},
		{"port 0", lb.Frontend{Key: fkey("10.96.0.21:0", lb.TCP, lb.ScopeCluster)}, "port 0"},
		{"icmp", lb.Frontend{Key: fkey("10.96.0.21:80", 1, lb.ScopeCluster)}, "not TCP, UDP or SCTP"},
		{"nodeport with address", lb.Frontend{Key: fkey("10.96.0.21:30000", lb.TCP, lb.ScopeNodePort)}, "use 0.0.0.0"},
		{"cluster without address", lb.Frontend{Key: fkey("0.0.0.0:80", lb.TCP, lb.ScopeCluster)}, "needs a service address"},
		{"mixed family", lb.Frontend{Key: web.Key, Backends: backends(lb.Active, "[fd00::1]:80")}, "other address family"},
		{"backend port 0", lb.Frontend{Key: web.Key, Backends: backends(lb.Active, "10.244.1.9:0")}, "port 0"},
		{"duplicate backend", lb.Frontend{Key: web.Key, Backends: backends(lb.Active, "10.244.1.9:80", "10.244.1.9:80")}, "listed twice"},
		{"unknown state", lb.Frontend{Key: web.Key, Backends: backends(7, "10.244.1.9:80")}, "unknown state"},
		{"negative affinity", lb.Frontend{Key: web.Key, Affinity: -time.Second}, "negative"},
		{"map full: new frontend", lb.Frontend{Key: fkey("10.96.0.22:80", lb.TCP, lb.ScopeCluster),
			Backends: backends(lb.Active, "10.244.1.2:80", "10.244.1.3:80", "10.244.1.4:80", "10.244.1.5:80", "10.244.1.6:80",
				"10.244.1.7:80", "10.244.1.8:80", "10.244.1.9:80", "10.244.1.10:80")}, "is full"},
		{"map full: grow existing", lb.Frontend{Key: web.Key,
			Backends: backends(lb.Active, "10.244.1.2:80", "10.244.1.3:80", "10.244.1.4:80", "10.244.1.5:80", "10.244.1.6:80",
				"10.244.1.7:80", "10.244.1.8:80", "10.244.1.9:80", "10.244.1.10:80", "10.244.1.11:80", "10.244.1.12:80", "10.244.1.13:80")}, "is full"},
	}
	for _, c := range bad {
		t.Run(c.name, func(t *testing.T) {
			err := s.UpsertFrontend(c.f)
			if err == nil || !strings.Contains(err.Error(), c.msg) {
				t.Fatalf("got %v, want an error containing %q", err, c.msg)
			}
			after, err := s.Frontends()
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(after, before) {
				t.Errorf("state changed by a rejected upsert:\n got %+v\nwant %+v", after, before)
			}
			if n := dptest.MapLen(t, s.objs.AxonLbBe); n != 3 {
				t.Errorf("backend map holds %d entries after a rejected upsert, want 3", n)
			}
		})
	}

	t.Run("shrink and switch leave no stale entries", func(t *testing.T) {
		web2 := web
		web2.Backends = backends(lb.Active, "10.244.1.3:8080") // was terminating: same id, new state
		e.upsert(t, web2)
		if n := dptest.MapLen(t, s.objs.AxonLbSvc); n != 2 {
			t.Errorf("service map holds %d entries, want 2", n)
		}
		if n := dptest.MapLen(t, s.objs.AxonLbBe); n != 1 {
			t.Errorf("backend map holds %d entries, want 1", n)
		}
		got, _ := s.Frontends()
		if len(got) != 1 || len(got[0].Backends) != 1 || got[0].Backends[0].State != lb.Active {
			t.Errorf("read back %+v", got)
		}
	})

	t.Run("nodeport v4 and v6 are distinct keys", func(t *testing.T) {
		e.upsert(t,
			lb.Frontend{Key: fkey("0.0.0.0:30001", lb.UDP, lb.ScopeNodePort), Backends: backends(lb.Active, "10.244.1.2:53")},
			lb.Frontend{Key: fkey("[::]:30001", lb.UDP, lb.ScopeNodePort), Backends: backends(lb.Active, "[fd00::2]:53")},
			lb.Frontend{Key: fkey("[::ffff:10.96.0.30]:443", lb.TCP, lb.ScopeCluster)}, // stored unmapped
		)
		got, _ := s.Frontends()
		var keys []string
		for _, f := range got {
			keys = append(keys, lbmap.KeyString(f.Key))
		}
		want := []string{"0.0.0.0:30001/udp (nodeport)", "10.96.0.20:80/tcp (cluster)", "10.96.0.30:443/tcp (cluster)", "[::]:30001/udp (nodeport)"}
		if !reflect.DeepEqual(keys, want) {
			t.Errorf("keys %v, want %v", keys, want)
		}
	})

	t.Run("delete removes everything and is idempotent", func(t *testing.T) {
		got, _ := s.Frontends()
		for _, f := range got {
			for i := 0; i < 2; i++ {
				if err := s.DeleteFrontend(f.Key); err != nil {
					t.Fatal(err)
				}
			}
		}
		if n, b := dptest.MapLen(t, s.objs.AxonLbSvc), dptest.MapLen(t, s.objs.AxonLbBe); n != 0 || b != 0 {
			t.Errorf("after deleting all: %d service and %d backend entries left", n, b)
		}
	})

	t.Run("local addresses are replaced", func(t *testing.T) {
		a, b := netip.MustParseAddr("198.18.0.11"), netip.MustParseAddr("fd00:198:18::11")
		if err := s.SetLocalAddrs([]netip.Addr{a, b}); err != nil {
			t.Fatal(err)
		}
		if err := s.SetLocalAddrs([]netip.Addr{b, {}}); err == nil {
			t.Fatal("an invalid address was accepted")
		}
		if err := s.SetLocalAddrs([]netip.Addr{b}); err != nil {
			t.Fatal(err)
		}
		var k [16]byte
		var v uint8
		var have []netip.Addr
		it := s.objs.AxonLbLocal.Iterate()
		for it.Next(&k, &v) {
			have = append(have, lbmap.FromAddr16(k))
		}
		if len(have) != 1 || have[0] != b {
			t.Errorf("local addresses %v, want [%s]", have, b)
		}
	})
}

// TestSockLBUninstall: the hooks leave the cgroup and the pins go away, the
// rest of the pin dir stays; a second run is a no-op.
func TestSockLBUninstall(t *testing.T) {
	dptest.RequireRoot(t)
	cg, _ := newTestCgroup(t)
	pin := newPinDir(t)
	s, err := Load(pin, cg, dptest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	// the cgroup root changes: the pinned links move, nothing stays behind
	cg2, _ := newTestCgroup(t)
	s, err = Load(pin, cg2, dptest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if left, err := attachedSockPrograms(cg); err != nil || len(left) != 0 {
		t.Errorf("old cgroup still has %v (%v) after moving to another cgroup", left, err)
	}
	cg = cg2
	other := filepath.Join(pin, "axon_other_marker")
	if err := os.Mkdir(other, 0o700); err != nil {
		t.Fatal(err)
	}
	if left, err := attachedSockPrograms(cg); err != nil || len(left) != len(sockHooks) {
		t.Fatalf("attached before uninstall: %v %v, want %d hooks", left, err, len(sockHooks))
	}
	for i := 0; i < 2; i++ {
		if err := Uninstall(pin, cg); err != nil {
			t.Fatalf("uninstall #%d: %v", i+1, err)
		}
	}
	if left, err := attachedSockPrograms(cg); err != nil || len(left) != 0 {
		t.Errorf("still attached after uninstall: %v %v", left, err)
	}
	for _, m := range []string{MapLBService, MapLBBackend, MapLBReverse, MapLBAffinity, MapLBLocal, "links/cgroup-connect4"} {
		if _, err := os.Stat(filepath.Join(pin, m)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s still pinned (%v)", m, err)
		}
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("uninstall removed something else in the pin dir: %v", err)
	}
	if _, err := Load(pin, "/proc", dptest.Logger(t)); err == nil || !strings.Contains(err.Error(), "cgroup v2") {
		t.Errorf("loading on a non-cgroup2 path: %v, want a clear error", err)
	}
}

// TestSockLBRestartRepairs: what an agent crash between two map writes can
// leave (slots beyond a master's count, slots without a master, backends no
// slot references) is removed on the next load; the frontends stay.
func TestSockLBRestartRepairs(t *testing.T) {
	e := newSockLBEnv(t, sockLBOptions{})
	key := fkey("10.96.0.40:80", lb.TCP, lb.ScopeCluster)
	holed := fkey("10.96.0.42:80", lb.TCP, lb.ScopeCluster)
	e.upsert(t, lb.Frontend{Key: holed, Backends: backends(lb.Active, "10.244.2.2:80", "10.244.2.3:80", "10.244.2.4:80")})
	hk := svcKey(holed, 2) // a slot lost below the count: the frontend is rewritten without it
	if err := e.s.objs.AxonLbSvc.Delete(&hk); err != nil {
		t.Fatal(err)
	}
	e.upsert(t, lb.Frontend{Key: key, Backends: backends(lb.Active, "10.244.1.2:80", "10.244.1.3:80")})
	want := []lb.Frontend{
		{Key: key, Backends: backends(lb.Active, "10.244.1.2:80", "10.244.1.3:80")},
		{Key: holed, Backends: backends(lb.Active, "10.244.2.2:80", "10.244.2.4:80")},
	}
	put := func(k sockLBLbSvcKey, id uint32) {
		v := sockLBLbSvcVal{Id: id}
		if err := e.s.objs.AxonLbSvc.Put(&k, &v); err != nil {
			t.Fatal(err)
		}
	}
	put(svcKey(key, 5), 999)                                            // beyond the count
	put(svcKey(fkey("10.96.0.41:80", lb.TCP, lb.ScopeCluster), 1), 997) // no master
	orphan := uint32(998)
	bv := backendVal(lb.Backend{Addr: netip.MustParseAddr("10.244.9.9"), Port: 80}, lb.TCP, 77)
	if err := e.s.objs.AxonLbBe.Put(&orphan, &bv); err != nil {
		t.Fatal(err)
	}
	e.s.Close()
	s, err := Load(e.pinDir, e.cgroup, dptest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	e.s = s
	got, err := s.Frontends()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("frontends after repair:\n got %+v\nwant %+v", got, want)
	}
	if n, b := dptest.MapLen(t, s.objs.AxonLbSvc), dptest.MapLen(t, s.objs.AxonLbBe); n != 6 || b != 4 {
		t.Errorf("after repair: %d service entries (want 3+3), %d backends (want 2+2)", n, b)
	}
	if err := s.DeleteFrontend(holed); err != nil {
		t.Fatal(err)
	}
	// the reloaded writer reuses the programmed ids: a shrink leaves nothing behind
	e.upsert(t, lb.Frontend{Key: key, Backends: backends(lb.Active, "10.244.1.3:80")})
	if n, b := dptest.MapLen(t, s.objs.AxonLbSvc), dptest.MapLen(t, s.objs.AxonLbBe); n != 2 || b != 1 {
		t.Errorf("after shrink: %d service entries (want 2), %d backends (want 1)", n, b)
	}
}

// BenchmarkSockLBUpsert: programming one ClusterIP frontend with 10 backends
// (21 map writes), cycling over 10 000 frontends, the agent's full-sync unit:
// go test -run XXX -bench SockLBUpsert ./internal/datapath
func BenchmarkSockLBUpsert(b *testing.B) {
	e := newSockLBEnv(b, sockLBOptions{})
	const services = 10000
	fes := make([]lb.Frontend, services)
	for i := range fes {
		vip := netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})
		f := lb.Frontend{Key: lb.FrontendKey{Addr: vip, Port: 80, Proto: lb.TCP}}
		for j := 0; j < 10; j++ {
			f.Backends = append(f.Backends, lb.Backend{Addr: netip.AddrFrom4([4]byte{10, 244, byte(i >> 8), byte(i)}), Port: uint16(8000 + j)})
		}
		fes[i] = f
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		f := fes[i%services]
		if i/services%2 == 1 { // second pass over the same keys: an update that changes every backend's port
			f.Backends = slices.Clone(f.Backends)
			for j := range f.Backends {
				f.Backends[j].Port += 100
			}
		}
		if err := e.s.UpsertFrontend(f); err != nil {
			b.Fatal(err)
		}
	}
}
