package socklb

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/axonhq/axon/internal/testutil"
)

// The socket LB tests run their clients as separate processes (this test
// binary re-executed with TestSockLBHelperProcess selected), started straight
// into a test cgroup with clone3(CLONE_INTO_CGROUP), which then enter the
// test netns: cgroup hooks act on the cgroup of the process that made the
// socket, so the test process itself must stay outside.

const sockLBHelperEnv = "AXON_SOCKLB_HELPER"
const sockLBResultPrefix = "SOCKLB-RESULT "

type clientOp struct {
	Kind   string // "tcp" | "udp" | "bind"
	Family int    // 4 | 6 (6 with an IPv4 address = v4-in-v6 via ::ffff:a.b.c.d)
	Addr   string // ip:port
	Count  int    // > 1: repeat, counting failures and answering backends
}

type clientResult struct {
	Errno  int            // 0 = success
	Err    string         // error text
	Peer   string         // getpeername after connect (tcp)
	From   string         // recvfrom source (udp)
	Reply  string         // what the server answered: its own address
	Millis int64          // duration of the op (all repetitions)
	Nanos  int64          // the same in ns (cost measurements)
	Fails  int            // repetitions that failed (Count > 1)
	Seen   map[string]int // answering backends (Count > 1)
}

// TestSockLBHelperProcess is the client process of the socket LB tests; run
// by itself it only skips.
func TestSockLBHelperProcess(t *testing.T) {
	var in struct {
		Netns string
		Ops   []clientOp
	}
	testutil.HelperStart(t, sockLBHelperEnv, "client helper of the socket LB tests: runs only when re-executed by them", &in)
	out := make([]clientResult, len(in.Ops))
	for i, op := range in.Ops {
		start := time.Now()
		if op.Count > 1 {
			r := clientResult{Seen: map[string]int{}}
			for j := 0; j < op.Count; j++ {
				one := runOp(op)
				if one.Err != "" {
					r.Fails++
					if r.Err == "" {
						r.Err = one.Err
					}
					continue
				}
				r.Seen[one.Reply]++
			}
			out[i] = r
		} else {
			out[i] = runOp(op)
		}
		out[i].Millis = time.Since(start).Milliseconds()
		out[i].Nanos = time.Since(start).Nanoseconds()
	}
	b, _ := json.Marshal(out)
	fmt.Printf("%s%s\n", sockLBResultPrefix, b)
	os.Exit(0)
}

func sockaddrOf(family int, ap netip.AddrPort) unix.Sockaddr {
	if family == 4 {
		return &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().Unmap().As4()}
	}
	return &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
}

func sockaddrString(sa unix.Sockaddr) string {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port)).String()
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(a.Addr), uint16(a.Port)).String()
	}
	return fmt.Sprintf("%v", sa)
}

func fail(err error) clientResult {
	r := clientResult{Err: err.Error()}
	var en unix.Errno
	if errors.As(err, &en) {
		r.Errno = int(en)
	}
	return r
}

func runOp(op clientOp) clientResult {
	ap, err := netip.ParseAddrPort(op.Addr)
	if err != nil {
		return fail(err)
	}
	af := unix.AF_INET
	if op.Family == 6 {
		af = unix.AF_INET6
	}
	typ := unix.SOCK_STREAM
	if op.Kind == "udp" || op.Kind == "udpc" || op.Kind == "udpconnect" || op.Kind == "udpconnectpeer" {
		typ = unix.SOCK_DGRAM
	}
	fd, err := unix.Socket(af, typ|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fail(err)
	}
	defer unix.Close(fd)
	tv := unix.Timeval{Sec: 2}
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv)
	sa := sockaddrOf(op.Family, ap)
	var r clientResult
	buf := make([]byte, 256)
	switch op.Kind {
	case "bind":
		if err := unix.Bind(fd, sa); err != nil {
			return fail(err)
		}
	case "tcp", "udpc": // udpc is connected UDP: connect, getpeername, send, recvfrom
		if err := unix.Connect(fd, sa); err != nil {
			return fail(err)
		}
		peer, err := unix.Getpeername(fd)
		if err != nil {
			return fail(err)
		}
		r.Peer = sockaddrString(peer)
		if _, err := unix.Write(fd, []byte("ping\n")); err != nil {
			return fail(err)
		}
		var n int
		if op.Kind == "tcp" {
			n, err = unix.Read(fd, buf)
		} else {
			var from unix.Sockaddr
			n, from, err = unix.Recvfrom(fd, buf, 0)
			r.From = sockaddrString(from)
		}
		if err != nil {
			return fail(err)
		}
		r.Reply = strings.TrimSpace(string(buf[:n]))
	case "udp":
		if err := unix.Sendto(fd, []byte("ping\n"), 0, sa); err != nil {
			return fail(err)
		}
		n, from, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return fail(err)
		}
		r.From = sockaddrString(from)
		r.Reply = strings.TrimSpace(string(buf[:n]))
	case "udpconnect", "udpconnectpeer": // connect (+ getpeername, as Go's Dial does); nothing sent
		if err := unix.Connect(fd, sa); err != nil {
			return fail(err)
		}
		if op.Kind == "udpconnectpeer" {
			if _, err := unix.Getpeername(fd); err != nil {
				return fail(err)
			}
		}
	default:
		return fail(fmt.Errorf("unknown op %q", op.Kind))
	}
	return r
}

// runClients runs ops in one client process inside netns ns, in the cgroup
// whose directory fd is cgFD (-1: the test process's own cgroup). The
// process is killed after 30 s stretched by AXON_TEST_SLOWDOWN.
func runClients(t testing.TB, ns string, cgFD int, ops ...clientOp) []clientResult {
	t.Helper()
	req, err := json.Marshal(struct {
		Netns string
		Ops   []clientOp
	}{ns, ops})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Stretch(t, 30*time.Second))
	defer cancel()
	cmd := testutil.HelperCommand(ctx, "TestSockLBHelperProcess", sockLBHelperEnv, req, cgFD)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("client process: %v\nstderr: %s\nstdout: %s", err, stderr.String(), out)
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, sockLBResultPrefix); ok {
			var res []clientResult
			if err := json.Unmarshal([]byte(rest), &res); err != nil {
				t.Fatalf("client result: %v: %s", err, rest)
			}
			return res
		}
	}
	t.Fatalf("client process printed no result\nstdout: %s\nstderr: %s", out, stderr.String())
	return nil
}

// newTestCgroup makes a test cgroup <cgroup2>/axt-socklb-<pid>-<rand> (see
// testutil.NewCgroup) and returns its path and directory fd.
func newTestCgroup(t testing.TB) (string, int) {
	t.Helper()
	return testutil.NewCgroup(t, "axt-socklb-")
}

// echoServers listens on TCP and UDP at every addr inside netns ns and
// answers each request with its own address (stopped at cleanup).
func echoServers(t *testing.T, ns string, addrs ...string) {
	t.Helper()
	var closers []func() error
	t.Cleanup(func() {
		for _, c := range closers {
			_ = c()
		}
	})
	dptest.InNetns(t, ns, func() {
		for _, a := range addrs {
			ln, err := net.Listen("tcp", a)
			if err != nil {
				t.Errorf("listen tcp %s: %v", a, err)
				return
			}
			closers = append(closers, ln.Close)
			pc, err := net.ListenPacket("udp", a)
			if err != nil {
				t.Errorf("listen udp %s: %v", a, err)
				return
			}
			closers = append(closers, pc.Close)
			go serveTCP(ln)
			go serveUDP(pc)
		}
	})
	if t.Failed() {
		t.FailNow()
	}
}

func serveTCP(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			buf := make([]byte, 64)
			if _, err := c.Read(buf); err != nil {
				return
			}
			_, _ = c.Write([]byte(c.LocalAddr().String() + "\n"))
		}()
	}
}

func serveUDP(pc net.PacketConn) {
	buf := make([]byte, 64)
	me := pc.LocalAddr().String()
	for {
		_, from, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		_, _ = pc.WriteTo([]byte(me+"\n"), from)
	}
}

// addLoopbackAddrs adds addresses to lo inside ns (dummy devices may be
// missing from the kernel).
func addLoopbackAddrs(t testing.TB, ns string, cidrs ...string) {
	t.Helper()
	c := dptest.NSConf(t, ns)
	for _, cidr := range cidrs {
		c.Addr("lo", cidr)
	}
	waitLocalRoutes(t, ns, cidrs...)
}

// waitLocalRoutes waits until the kernel routes the address of every cidr in
// netns ns as local, i.e. until a connect() to it can succeed. An IPv4
// address gets its local route while RTM_NEWADDR is handled. An IPv6
// address, even with nodad and on lo, can be bound at once, but its route in
// the local table is inserted only when the address's DAD work item runs
// (addrconf_dad_work, on a kernel workqueue, under RTNL): on a busy machine
// where other tests hold RTNL, measured up to ~1 s later. Until then the
// only match for it is its prefix route on lo, which the kernel turns into
// a reject route, and a connect() to it fails with ENETUNREACH.
func waitLocalRoutes(t testing.TB, ns string, cidrs ...string) {
	t.Helper()
	h := dptest.NSConf(t, ns).H
	bound := testutil.Stretch(t, 10*time.Second)
	deadline := time.Now().Add(bound)
	for _, cidr := range cidrs {
		p, err := netip.ParsePrefix(cidr)
		if err != nil {
			t.Fatal(err)
		}
		for {
			rs, err := h.RouteGet(p.Addr().AsSlice())
			if err == nil && len(rs) == 1 && rs[0].Type == unix.RTN_LOCAL {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %s is not routed as local %v after it was added: route %+v, error %v", ns, p.Addr(), bound, rs, err)
			}
			time.Sleep(time.Millisecond)
		}
	}
}
