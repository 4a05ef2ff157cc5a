package socklb

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/axonhq/axon/internal/lb"
	"github.com/axonhq/axon/internal/testutil"
)

// The socket destruction test needs a client that holds its sockets across
// a backend change: this helper (the test binary re-executed) connects, does
// one exchange, prints "READY", waits for a line on stdin, then uses the same
// sockets again and prints what each got.

const sockDestroyHelperEnv = "AXON_SOCKDESTROY_HELPER"

type holdSock struct {
	Kind   string // "udp" | "tcp" (connected sockets)
	Addr   string // ip:port
	Before string // reply before the change ("" = failed: see BeforeErr)
	BeErr  string
	After  string // reply after the change
	Peer   string // getpeername after the change, before using the socket
	Errno  string // errno name after the change ("" = worked)
	AfErr  string
}

// TestSockDestroyHelperProcess is the client of TestSockDestroy; run by
// itself it only skips.
func TestSockDestroyHelperProcess(t *testing.T) {
	var in struct {
		Netns string
		Socks []holdSock
	}
	testutil.HelperStart(t, sockDestroyHelperEnv, "client helper of TestSockDestroy: runs only when re-executed by it", &in)
	fds := make([]int, len(in.Socks))
	exchange := func(fd int) (string, error) {
		if _, err := unix.Write(fd, []byte("ping\n")); err != nil {
			return "", err
		}
		buf := make([]byte, 128)
		n, err := unix.Read(fd, buf)
		if err != nil {
			return "", err
		}
		return strings.TrimSpace(string(buf[:n])), nil
	}
	for i := range in.Socks {
		s := &in.Socks[i]
		typ := unix.SOCK_DGRAM
		if s.Kind == "tcp" {
			typ = unix.SOCK_STREAM
		}
		fd, err := unix.Socket(unix.AF_INET, typ|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			s.BeErr = err.Error()
			continue
		}
		fds[i] = fd
		tv := unix.Timeval{Sec: 2}
		_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
		ap := ap(s.Addr)
		if err := unix.Connect(fd, &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}); err != nil {
			s.BeErr = err.Error()
			continue
		}
		if s.Before, err = exchange(fd); err != nil {
			s.BeErr = err.Error()
		}
	}
	fmt.Println("READY")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil && !errors.Is(err, io.EOF) {
		os.Exit(2)
	}
	for i := range in.Socks {
		s := &in.Socks[i]
		if fds[i] == 0 {
			continue
		}
		if sa, err := unix.Getpeername(fds[i]); err == nil {
			s.Peer = sockaddrString(sa)
		}
		var err error
		if s.Kind == "udp" {
			// an application blocked in recv sees the abort at once; a
			// live socket times out here and then exchanges again
			tv := unix.Timeval{Usec: 300000}
			_ = unix.SetsockoptTimeval(fds[i], unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
			buf := make([]byte, 128)
			if _, err = unix.Read(fds[i], buf); errors.Is(err, unix.EAGAIN) {
				tv = unix.Timeval{Sec: 2}
				_ = unix.SetsockoptTimeval(fds[i], unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
				s.After, err = exchange(fds[i])
			} else if err == nil {
				err = errors.New("unexpected datagram")
			}
		} else {
			s.After, err = exchange(fds[i])
		}
		if err != nil {
			s.AfErr = err.Error()
			var en unix.Errno
			if errors.As(err, &en) {
				s.Errno = unix.ErrnoName(en)
			}
		}
	}
	b, _ := json.Marshal(in.Socks)
	fmt.Printf("RESULT %s\n", b)
	os.Exit(0)
}

// holdClient starts the helper in netns ns and cgroup cgFD (-1: the test's
// own) and returns once its sockets are connected; finish lets it go on.
func holdClient(t *testing.T, ns string, cgFD int, socks ...holdSock) (before []holdSock, finish func() []holdSock) {
	t.Helper()
	req, _ := json.Marshal(struct {
		Netns string
		Socks []holdSock
	}{ns, socks})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	cmd := testutil.HelperCommand(ctx, "TestSockDestroyHelperProcess", sockDestroyHelperEnv, req, cgFD)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = cmd.Wait() })
	rd := bufio.NewReader(stdout)
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatalf("client helper ended before READY: %v", err)
		}
		if strings.TrimSpace(line) == "READY" {
			break
		}
	}
	return socks, func() []holdSock {
		fmt.Fprintln(stdin, "go")
		for {
			line, err := rd.ReadString('\n')
			if err != nil {
				t.Fatalf("client helper printed no result: %v", err)
			}
			if rest, ok := strings.CutPrefix(line, "RESULT "); ok {
				var out []holdSock
				if err := json.Unmarshal([]byte(rest), &out); err != nil {
					t.Fatalf("client result %q: %v", rest, err)
				}
				return out
			}
		}
	}
}

func TestSockDestroyProbe(t *testing.T) {
	dptest.RequireRoot(t)
	c := ProbeSockDestroy()
	t.Logf("bpf_sock_destroy: %+v", c)
	var u unix.Utsname
	_ = unix.Uname(&u)
	release := unix.ByteSliceToString(u.Release[:])
	var major, minor int
	fmt.Sscanf(release, "%d.%d", &major, &minor)
	// the kfunc exists from 6.5 on; a BTF-less kernel would lack it too
	if major > 6 || (major == 6 && minor >= 5) {
		if _, err := os.Stat("/sys/kernel/btf/vmlinux"); err == nil && !c.Available {
			t.Errorf("kernel %s with BTF: bpf_sock_destroy should load: %s", release, c.Reason)
		}
	} else if c.Available {
		t.Errorf("kernel %s < 6.5 reports bpf_sock_destroy available", release)
	}
	if !c.Available && !strings.Contains(c.Reason, "until the application reconnects") {
		t.Errorf("reason %q does not say what happens without it", c.Reason)
	}
}

// TestSockDestroy: sockets connected through the socket LB to a backend
// that leaves its frontend get ECONNABORTED; a socket connected to the same
// backend directly (not translated) and one still on a live backend stay.
func TestSockDestroy(t *testing.T) {
	dptest.RequireRoot(t)
	if c := ProbeSockDestroy(); !c.Available {
		t.Skipf("kernel without bpf_sock_destroy: %s", c.Reason)
	}
	const sockTable = 1024 // axon_lb_sock, small so that the churn below overruns it
	e := newSockLBEnv(t, sockLBOptions{maxEntries: map[string]uint32{MapLBSock: sockTable}})
	ns := dptest.NewNetns(t, "sockdestroy")
	addLoopbackAddrs(t, ns, "198.18.97.1/24", "198.18.97.2/24")
	echoServers(t, ns, "198.18.97.1:5353", "198.18.97.2:5353")
	lineEchoServers(t, ns, "198.18.97.1:8081", "198.18.97.2:8081")
	if err := e.s.EnableSockDestroy(func() []string { return []string{"", "/var/run/netns/" + ns, "/var/run/netns/axt-gone"} }); err != nil {
		t.Fatal(err)
	}
	dns := fkey("10.96.0.60:53", lb.UDP, lb.ScopeCluster)
	web := fkey("10.96.0.60:80", lb.TCP, lb.ScopeCluster)
	keep := fkey("10.96.0.61:53", lb.UDP, lb.ScopeCluster)
	e.upsert(t,
		lb.Frontend{Key: dns, Backends: backends(lb.Active, "198.18.97.1:5353")},
		lb.Frontend{Key: web, Backends: backends(lb.Active, "198.18.97.1:8081")},
		lb.Frontend{Key: keep, Backends: backends(lb.Active, "198.18.97.2:5353")},
		lb.Frontend{Key: fkey("10.96.0.61:80", lb.TCP, lb.ScopeCluster), Backends: backends(lb.Active, "198.18.97.2:8081")},
	)
	_, finish := holdClient(t, ns, e.cgFD,
		holdSock{Kind: "udp", Addr: "10.96.0.60:53"},    // 0: through the LB to .1: aborted
		holdSock{Kind: "tcp", Addr: "10.96.0.60:80"},    // 1: through the LB to .1: aborted
		holdSock{Kind: "udp", Addr: "198.18.97.1:5353"}, // 2: to .1 directly: stays
		holdSock{Kind: "udp", Addr: "10.96.0.61:53"},    // 3: through the LB to .2 (kept): stays
		holdSock{Kind: "tcp", Addr: "10.96.0.61:80"},    // 4: through the LB to .2 (kept): stays
	)
	// Churn four times the socket table's size of short connections
	// through the LB while they are held, as a busy node would: each
	// closed socket's entry goes with it, so the held sockets keep theirs
	// and the abort below and getpeername still find them (when entries
	// stayed until evicted, neither did).
	churn := runClients(t, ns, e.cgFD, clientOp{Kind: "udpconnect", Family: 4, Addr: "10.96.0.61:53", Count: 4 * sockTable})[0]
	if churn.Fails > 0 {
		t.Fatalf("churn: %d of %d connects failed: %s", churn.Fails, 4*sockTable, churn.Err)
	}
	if n := dptest.MapLen(t, e.s.objs.AxonLbSock); n != 4 {
		t.Errorf("axon_lb_sock holds %d entries after the churn, want 4 (the held translated sockets)", n)
	}
	// .1 leaves both frontends, .2 takes over
	t0 := time.Now()
	e.upsert(t,
		lb.Frontend{Key: dns, Backends: backends(lb.Active, "198.18.97.2:5353")},
		lb.Frontend{Key: web, Backends: backends(lb.Active, "198.18.97.2:8081")},
	)
	t.Logf("2 upserts (destroy passes run in the background): %s", time.Since(t0).Round(time.Microsecond))
	waitDestroyed(t, e.s, 2)
	t.Logf("sockets aborted %s after the first write", time.Since(t0).Round(time.Microsecond))
	res := finish()
	if len(res) != 5 {
		t.Fatalf("client results %+v", res)
	}
	want := []struct{ before, after, errno string }{
		{"198.18.97.1:5353", "", "ECONNABORTED"},
		{"198.18.97.1:8081", "", "ECONNABORTED"},
		{"198.18.97.1:5353", "198.18.97.1:5353", ""},
		{"198.18.97.2:5353", "198.18.97.2:5353", ""},
		{"198.18.97.2:8081", "198.18.97.2:8081", ""},
	}
	for i, w := range want {
		r := res[i]
		if r.Before != w.before {
			t.Errorf("%s %s before the change: %q (%s), want a reply from %s", r.Kind, r.Addr, r.Before, r.BeErr, w.before)
		}
		if w.errno != "" {
			if r.Errno != w.errno {
				t.Errorf("%s %s after its backend left: after=%q errno=%q (%s), want %s", r.Kind, r.Addr, r.After, r.Errno, r.AfErr, w.errno)
			}
			continue
		}
		if r.Errno != "" || r.After != w.after {
			t.Errorf("%s %s must be left alone: after=%q errno=%q (%s)", r.Kind, r.Addr, r.After, r.Errno, r.AfErr)
		}
		if r.Peer != r.Addr {
			t.Errorf("%s %s: getpeername %q after the churn, want the address it connected to", r.Kind, r.Addr, r.Peer)
		}
	}
	on, why, st := e.s.SockDestroyStatus()
	t.Logf("socket destruction: enabled=%v %s %+v", on, why, st)
	if st.Destroyed != 2 || st.Failed != 0 {
		t.Errorf("stats %+v, want 2 sockets destroyed, no failure", st)
	}

	t.Run("reconnect goes to the live backend", func(t *testing.T) {
		r := runClients(t, ns, e.cgFD, clientOp{"udpc", 4, "10.96.0.60:53", 0})[0]
		if r.Reply != "198.18.97.2:5353" || r.From != "10.96.0.60:53" {
			t.Errorf("reconnected: %+v", r)
		}
	})

	t.Run("more removed backends than axon_lb_gone holds", func(t *testing.T) {
		big := lb.Frontend{Key: fkey("10.96.0.62:80", lb.TCP, lb.ScopeCluster)}
		for i := range 5000 {
			big.Backends = append(big.Backends, lb.Backend{Addr: netip.AddrFrom4([4]byte{10, 250, byte(i >> 8), byte(i)}), Port: 80})
		}
		e.upsert(t, big)
		_, _, before := e.s.SockDestroyStatus()
		if err := e.s.DeleteFrontend(big.Key); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			_, _, st := e.s.SockDestroyStatus()
			if st.Passes > before.Passes {
				if st.Failed != before.Failed {
					t.Errorf("destroy pass over 5000 removed backends failed: %+v", st)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no destroy pass after deleting 5000 backends: %+v", st)
			}
			time.Sleep(5 * time.Millisecond)
		}
	})

	t.Run("deleted service aborts UDP only", func(t *testing.T) {
		_, finish := holdClient(t, ns, e.cgFD,
			holdSock{Kind: "udp", Addr: "10.96.0.60:53"},
			holdSock{Kind: "tcp", Addr: "10.96.0.60:80"},
		)
		if err := e.s.DeleteFrontend(dns); err != nil {
			t.Fatal(err)
		}
		if err := e.s.DeleteFrontend(web); err != nil {
			t.Fatal(err)
		}
		waitDestroyed(t, e.s, 3)
		res := finish()
		if res[0].Errno != "ECONNABORTED" {
			t.Errorf("UDP socket of a deleted Service: %+v, want ECONNABORTED", res[0])
		}
		if res[1].Errno != "" || res[1].After != "198.18.97.2:8081" {
			t.Errorf("TCP connection of a deleted Service must keep working: %+v", res[1])
		}
	})
}

// waitDestroyed waits until the destroy worker aborted n sockets in all.
func waitDestroyed(t *testing.T, s *LB, n uint64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, _, st := s.SockDestroyStatus()
		if st.Destroyed+st.Failed >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("destroy worker: %+v after 10s, want %d sockets handled", st, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// lineEchoServers listens on TCP at every addr inside netns ns and answers
// every line with its own address, keeping the connection open.
func lineEchoServers(t *testing.T, ns string, addrs ...string) {
	t.Helper()
	dptest.InNetns(t, ns, func() {
		for _, a := range addrs {
			ln, err := net.Listen("tcp", a)
			if err != nil {
				t.Errorf("listen tcp %s: %v", a, err)
				return
			}
			t.Cleanup(func() { ln.Close() })
			testutil.ServeConns(ln, func(c net.Conn) {
				testutil.AnswerLines(c, 30*time.Second, c.LocalAddr().String())
			})
		}
	})
	if t.Failed() {
		t.FailNow()
	}
}
