package sockmap

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/testutil"
)

// The bypass's programs act on sockets made by processes of the cgroup they
// are attached to, so the tests' sockets live in a helper process started
// into the test cgroup (testutil.HelperCommand): the test drives it over
// stdin/stdout, one JSON request and one JSON answer per line, and makes
// listeners and connections in any network namespace with it.

const sockHelperEnv = "AXON_SOCKMAP_HELPER"
const sockHelperPrefix = "SOCKMAP-HELPER "

// hreq is one request to the helper process.
type hreq struct {
	Op    string // listen | dial | accept | closeln | write | read | close | shutdown
	Netns string // listen, dial: the named netns of the socket ("" = the helper's)
	Net   string // listen, dial: tcp, tcp4, tcp6
	Addr  string // listen: local address; dial: remote address
	Local string // dial: local address to bind (ip:port, port 0 = any)
	Reuse bool   // dial: SO_REUSEADDR before the bind (two sockets on one local endpoint)
	ID    int    // accept: the listener; write, read, close, shutdown: the connection
	Data  []byte // write
	N     int    // read: exactly N bytes
	// stream: connections ID and Peer (the two ends of one connection) each
	// write Bytes in writes of Chunk bytes while the other end reads and
	// checks them; the readers start DelayMS after the writers, or with
	// ReadLate once their writer can go no further without a reader (it
	// wrote everything or made no progress for a second: past any
	// back-pressure bound, however slow the machine). OneWay: only ID
	// writes; Blocking: Peer reads with blocking read(2) calls (an EAGAIN
	// fails the stream).
	Peer, Bytes, Chunk, DelayMS int
	OneWay, Blocking, ReadLate  bool
}

// hresp is the helper's answer.
type hresp struct {
	ID            int
	Local, Remote string // the socket's addresses
	Family        int    // dial, accept: the socket's family (SO_DOMAIN)
	N             int
	Data          []byte
	Err           string
	Errno         int
}

// TestSockmapHelperProcess is the socket process of the bypass tests; run by
// itself it only skips.
func TestSockmapHelperProcess(t *testing.T) {
	var in struct{ Netns string }
	testutil.HelperStart(t, sockHelperEnv, "socket helper of the sockmap tests: runs only when re-executed by them", &in)
	lns := map[int]net.Listener{}
	conns := map[int]net.Conn{}
	next := 1
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var r hreq
		var a hresp
		var err0 error
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			fmt.Fprintf(os.Stderr, "helper: bad request: %v\n", err)
			os.Exit(2)
		}
		fail := func(err error) {
			a.Err = err.Error()
			a.Errno = errnoOf(err)
		}
		switch r.Op {
		case "listen":
			err := inNetns(r.Netns, func() error {
				ln, err := net.Listen(r.Net, r.Addr)
				if err != nil {
					return err
				}
				lns[next] = ln
				a.ID, a.Local = next, ln.Addr().String()
				next++
				return nil
			})
			if err != nil {
				fail(err)
			}
		case "dial":
			err := inNetns(r.Netns, func() error {
				d := net.Dialer{Timeout: 5 * time.Second}
				if r.Reuse {
					d.Control = func(_, _ string, rc syscall.RawConn) error {
						var serr error
						if err := rc.Control(func(fd uintptr) {
							serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
						}); err != nil {
							return err
						}
						return serr
					}
				}
				if r.Local != "" {
					la, err := net.ResolveTCPAddr(r.Net, r.Local)
					if err != nil {
						return err
					}
					d.LocalAddr = la
				}
				c, err := d.Dial(r.Net, r.Addr)
				if err != nil {
					return err
				}
				conns[next] = c
				a.ID, a.Local, a.Remote, a.Family = next, c.LocalAddr().String(), c.RemoteAddr().String(), domainOf(c)
				next++
				return nil
			})
			if err != nil {
				fail(err)
			}
		case "accept":
			ln := lns[r.ID]
			if ln == nil {
				fail(fmt.Errorf("no listener %d", r.ID))
				break
			}
			_ = ln.(*net.TCPListener).SetDeadline(time.Now().Add(5 * time.Second))
			c, err := ln.Accept()
			if err != nil {
				fail(err)
				break
			}
			conns[next] = c
			a.ID, a.Local, a.Remote, a.Family = next, c.LocalAddr().String(), c.RemoteAddr().String(), domainOf(c)
			next++
		case "closeln":
			if ln := lns[r.ID]; ln != nil {
				_ = ln.Close()
				delete(lns, r.ID)
			}
		case "stream":
			a.N, err0 = stream(conns[r.ID], conns[r.Peer], r)
			if err0 != nil {
				fail(err0)
			}
		case "write", "read", "close", "shutdown":
			c := conns[r.ID]
			if c == nil {
				fail(fmt.Errorf("no connection %d", r.ID))
				break
			}
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			var err error
			switch r.Op {
			case "write":
				a.N, err = c.Write(r.Data)
			case "read":
				a.Data = make([]byte, r.N)
				a.N, err = io.ReadFull(c, a.Data)
				a.Data = a.Data[:a.N]
			case "close":
				err = c.Close()
				delete(conns, r.ID)
			case "shutdown":
				err = c.(*net.TCPConn).CloseWrite()
			}
			if err != nil {
				fail(err)
			}
		default:
			fail(fmt.Errorf("unknown op %q", r.Op))
		}
		var b bytes.Buffer
		b.WriteString(sockHelperPrefix)
		_ = json.NewEncoder(&b).Encode(a)
		os.Stdout.Write(b.Bytes())
	}
	os.Exit(0)
}

// streamBytes is the deterministic byte stream of direction dir (the
// readers regenerate it to check every byte: a lost, duplicated or
// reordered byte shows as a difference).
func streamBytes(dir string) *mrand.ChaCha8 {
	var seed [32]byte
	copy(seed[:], dir)
	return mrand.NewChaCha8(seed)
}

// stream runs the stream op: a and b write r.Bytes each, in r.Chunk-byte
// writes, and read the other's bytes (starting r.DelayMS late) checking each
// against streamBytes. It returns the bytes checked per direction.
func stream(a, b net.Conn, r hreq) (int, error) {
	if a == nil || b == nil {
		return 0, fmt.Errorf("stream: no connection %d or %d", r.ID, r.Peer)
	}
	deadline := time.Now().Add(60 * time.Second)
	_ = a.SetDeadline(deadline)
	_ = b.SetDeadline(deadline)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	// bytes written per direction, for ReadLate
	written := map[string]*atomic.Int64{"a->b": {}, "b->a": {}}
	writerStuck := func(dir string) {
		last, since := int64(-1), time.Now()
		for {
			n := written[dir].Load()
			if n >= int64(r.Bytes) || time.Since(since) >= time.Second || time.Now().After(deadline) {
				return
			}
			if n != last {
				last, since = n, time.Now()
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	write := func(c net.Conn, dir string) {
		defer wg.Done()
		g := streamBytes(dir)
		buf := make([]byte, r.Chunk)
		for left := r.Bytes; left > 0; {
			n := min(left, r.Chunk)
			g.Read(buf[:n])
			if _, err := c.Write(buf[:n]); err != nil {
				errs <- fmt.Errorf("%s: write after %d bytes: %w", dir, r.Bytes-left, err)
				return
			}
			left -= n
			written[dir].Add(int64(n))
		}
	}
	read := func(c net.Conn, dir string) {
		defer wg.Done()
		time.Sleep(time.Duration(r.DelayMS) * time.Millisecond)
		if r.ReadLate {
			writerStuck(dir)
		}
		g := streamBytes(dir)
		buf := make([]byte, 256<<10)
		want := make([]byte, len(buf))
		readFn := c.Read
		if r.Blocking {
			fd, err := blockingFD(c)
			if err != nil {
				errs <- err
				return
			}
			defer unix.Close(fd)
			readFn = func(b []byte) (int, error) {
				for {
					n, err := unix.Read(fd, b)
					if errors.Is(err, unix.EINTR) {
						continue
					}
					if n < 0 {
						n = 0
					}
					return n, err
				}
			}
		}
		for off := 0; off < r.Bytes; {
			n, err := readFn(buf[:min(len(buf), r.Bytes-off)])
			if n > 0 {
				g.Read(want[:n])
				if i := firstDiff(buf[:n], want[:n]); i < n {
					errs <- fmt.Errorf("%s: byte %d differs from the stream written (lost, duplicated or reordered bytes)", dir, off+i)
					return
				}
				off += n
			}
			if err != nil {
				errs <- fmt.Errorf("%s: read after %d of %d bytes: %w", dir, off, r.Bytes, err)
				return
			}
		}
	}
	wg.Add(2)
	go write(a, "a->b")
	go read(b, "a->b")
	if !r.OneWay {
		wg.Add(2)
		go write(b, "b->a")
		go read(a, "b->a")
	}
	wg.Wait()
	close(errs)
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	return r.Bytes, errors.Join(all...)
}

// blockingFD is a duplicate of c's socket switched to blocking mode (the
// flag is the socket's: c blocks too, which its reader, this, wants).
func blockingFD(c net.Conn) (int, error) {
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		return -1, err
	}
	fd := -1
	var derr error
	if err := rc.Control(func(f uintptr) { fd, derr = unix.Dup(int(f)) }); err != nil {
		return -1, err
	}
	if derr != nil {
		return -1, derr
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// domainOf is the address family of c's socket (SO_DOMAIN), -1 unknown.
func domainOf(c net.Conn) int {
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		return -1
	}
	d := -1
	_ = rc.Control(func(fd uintptr) {
		if v, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_DOMAIN); err == nil {
			d = v
		}
	})
	return d
}

// inNetns runs fn in the named netns ("" = in place).
func inNetns(name string, fn func() error) error {
	if name == "" {
		return fn()
	}
	return netnsutil.Do(name, fn)
}

// errnoOf is the errno inside err, 0 if none.
func errnoOf(err error) int {
	var en syscall.Errno
	if errors.As(err, &en) {
		return int(en)
	}
	return 0
}

// sockProc is a running helper process.
type sockProc struct {
	t   testing.TB
	in  io.WriteCloser
	out *bufio.Scanner
	mu  sync.Mutex
}

// startSockProc starts the helper in the cgroup of directory fd cgFD; it
// ends at cleanup.
func startSockProc(t testing.TB, cgFD int) *sockProc {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Stretch(t, 120*time.Second))
	req, _ := json.Marshal(struct{ Netns string }{})
	cmd := testutil.HelperCommand(ctx, "TestSockmapHelperProcess", sockHelperEnv, req, cgFD)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("start socket helper: %v", err)
	}
	t.Cleanup(func() {
		in.Close()
		err := cmd.Wait()
		cancel()
		if err != nil {
			t.Errorf("socket helper: %v\nstderr: %s", err, stderr.String())
		}
	})
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	return &sockProc{t: t, in: in, out: sc}
}

// try sends r and returns the answer (Err set on failure).
func (p *sockProc) try(r hreq) hresp {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	b, _ := json.Marshal(r)
	if _, err := p.in.Write(append(b, '\n')); err != nil {
		p.t.Fatalf("socket helper: send %s: %v", r.Op, err)
	}
	for p.out.Scan() {
		line := p.out.Text()
		rest, ok := strings.CutPrefix(line, sockHelperPrefix)
		if !ok {
			continue
		}
		var a hresp
		if err := json.Unmarshal([]byte(rest), &a); err != nil {
			p.t.Fatalf("socket helper: answer %q: %v", rest, err)
		}
		return a
	}
	p.t.Fatalf("socket helper ended before answering %s: %v", r.Op, p.out.Err())
	return hresp{}
}

// do is try that fails the test on an error.
func (p *sockProc) do(r hreq) hresp {
	p.t.Helper()
	a := p.try(r)
	if a.Err != "" {
		p.t.Fatalf("socket helper %s %s %s: %s", r.Op, r.Netns, r.Addr, a.Err)
	}
	return a
}

// conn is one connection made through the helper: both ends.
type conn struct {
	client, server             int
	clientAddr, serverAddr     netip.AddrPort // as the client sees them (local, remote)
	clientFamily, serverFamily int            // AF_INET or AF_INET6 (SO_DOMAIN)
}

// connect listens at laddr in netns lns (network lnet), dials it at host
// dhost (the listener's host when "") from netns dns (network dnet, bound to
// local when set) and accepts: when connect returns both ends are
// established (and, when admitted, in the map).
func (p *sockProc) connect(lns, lnet, laddr, dhost, dns, dnet, local string) conn {
	p.t.Helper()
	ln := p.do(hreq{Op: "listen", Netns: lns, Net: lnet, Addr: laddr})
	port := netip.MustParseAddrPort(ln.Local).Port()
	if dhost == "" {
		dhost, _, _ = net.SplitHostPort(laddr)
	}
	dst := net.JoinHostPort(dhost, fmt.Sprint(port))
	c := p.do(hreq{Op: "dial", Netns: dns, Net: dnet, Addr: dst, Local: local})
	s := p.do(hreq{Op: "accept", ID: ln.ID})
	p.do(hreq{Op: "closeln", ID: ln.ID})
	return conn{client: c.ID, server: s.ID, clientAddr: mustAP(p.t, c.Local), serverAddr: mustAP(p.t, c.Remote),
		clientFamily: c.Family, serverFamily: s.Family}
}

func mustAP(t testing.TB, s string) netip.AddrPort {
	t.Helper()
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		t.Fatalf("address %q: %v", s, err)
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// randBytes returns n random bytes.
func randBytes(t testing.TB, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// send writes the chunks from connection from and reads them, byte for
// byte, at connection to; it returns the bytes sent.
func (p *sockProc) send(from, to int, chunks ...[]byte) uint64 {
	p.t.Helper()
	var all []byte
	for _, c := range chunks {
		w := p.do(hreq{Op: "write", ID: from, Data: c})
		if w.N != len(c) {
			p.t.Fatalf("wrote %d of %d bytes", w.N, len(c))
		}
		all = append(all, c...)
	}
	r := p.do(hreq{Op: "read", ID: to, N: len(all)})
	if !bytes.Equal(r.Data, all) {
		p.t.Fatalf("read %d bytes that differ from the %d written (first difference at %d)", len(r.Data), len(all), firstDiff(r.Data, all))
	}
	return uint64(len(all))
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// metricsDelta returns the counters that moved since before.
func metricsDelta(t testing.TB, b *Bypass, before map[string]uint64) map[string]uint64 {
	t.Helper()
	now, err := b.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	d := map[string]uint64{}
	for k, v := range now {
		if v != before[k] {
			d[k] = v - before[k]
		}
	}
	return d
}

func metrics(t testing.TB, b *Bypass) map[string]uint64 {
	t.Helper()
	m, err := b.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	return m
}
