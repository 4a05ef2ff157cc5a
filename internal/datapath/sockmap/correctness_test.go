package sockmap

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/testutil"
)

// The correctness suite: each case runs twice on fresh loopback pairs in a
// private network namespace, once on the TCP stack (the sockets outside the
// map) and once bypassed (both ends put into a private SOCKHASH under the
// real sk_msg program, as SelfTest does), with the same bytes; what the
// application sees (bytes, EOF, errors, wake-ups) is recorded and the two
// records must be equal. The bypass run must have redirected (the counter
// moved), the stack run must not have. The stream verdict is attached where
// this kernel needs it for FIONREAD, as the agent does.

// corrEnv is the private bypass and namespace the suite runs in.
type corrEnv struct {
	in      *privateBypass
	ns      *privateNetns
	verdict bool
}

func newCorrEnv(t *testing.T) *corrEnv {
	t.Helper()
	testutil.RequireRoot(t, "loads BPF programs, creates a network namespace")
	ns, err := newPrivateNetns()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.close)
	e := &corrEnv{ns: ns}
	if e.in, err = loadPrivate(false, false); err != nil {
		t.Fatal(err)
	}
	n, err := fionreadCheck(context.Background(), e.in, ns, false)
	if err != nil {
		t.Fatal(err)
	}
	if n != selfTestMsg { // the kernel needs the stream verdict (SelfTest decides the same)
		e.in.close()
		if e.in, err = loadPrivate(true, false); err != nil {
			t.Fatal(err)
		}
		e.verdict = true
	}
	t.Cleanup(e.in.close)
	t.Logf("stream verdict attached: %v", e.verdict)
	return e
}

// rec is what the application saw in one run.
type rec struct{ ev []string }

func (r *rec) add(format string, a ...any) { r.ev = append(r.ev, fmt.Sprintf(format, a...)) }

// data records received bytes by length and hash (equal records = equal
// bytes).
func (r *rec) data(label string, b []byte) {
	r.add("%s: %d bytes sha256 %x", label, len(b), sha256.Sum256(b))
}

// errName is err as the application sees it ("nil" for none).
func errName(err error) string {
	var errno unix.Errno
	if errors.As(err, &errno) {
		return unix.ErrnoName(errno)
	}
	if err == nil {
		return "nil"
	}
	return err.Error()
}

// detBytes is n bytes determined by seed: both runs of a case send the same.
func detBytes(seed string, n int) []byte {
	r := rand.NewChaCha8(sha256.Sum256([]byte(seed)))
	b := make([]byte, n)
	r.Read(b)
	return b
}

// corrRun is one run of a case: the pair, whether it is bypassed, and the
// env (for cases that switch a socket's mode or open a second pair).
type corrRun struct {
	e      *corrEnv
	p      sockPair
	bypass bool
	fam    pairFamily
}

// pair opens another pair of the run's family, bypassed like the run.
func (c *corrRun) pair(t *testing.T) sockPair {
	t.Helper()
	sp, err := c.e.ns.pairOf(c.fam)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sp.close)
	if c.bypass {
		if err := c.e.in.both(sp); err != nil {
			t.Fatal(err)
		}
	}
	return sp
}

// setStack puts socket fd (an end of the run's pair) into stack mode, as
// the sk_msg program does after a miss: its later writes go through TCP.
func (c *corrRun) setStack(t *testing.T, fd int) {
	t.Helper()
	if !c.bypass {
		return
	}
	peer := c.p.ka
	if fd == c.p.a {
		peer = c.p.kb
	}
	if err := c.e.in.ops.AxonSockmapState.Put(uint32(fd), sockOpsSockmapState{Mode: modeStack, Peer: peer}); err != nil {
		t.Fatalf("set stack mode: %v", err)
	}
}

// run runs fn on a fresh pair of family fam, bypassed or not, and returns
// the record; it fails the test when the bypass run did not redirect or the
// stack run did.
func (e *corrEnv) run(t *testing.T, fam pairFamily, bypass bool, fn func(t *testing.T, c *corrRun, r *rec)) rec {
	t.Helper()
	sp, err := e.ns.pairOf(fam)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { sp.close() }()
	if bypass {
		if err := e.in.both(sp); err != nil {
			t.Fatal(err)
		}
	}
	before := e.in.counter(idxRedirectMsgs)
	c := &corrRun{e: e, p: sp, bypass: bypass, fam: fam}
	var r rec
	fn(t, c, &r)
	sp = c.p // a case may have closed an end (-1)
	moved := e.in.counter(idxRedirectMsgs) - before
	switch {
	case bypass && moved == 0:
		t.Errorf("the bypass run redirected nothing (redirect_msgs unchanged): it compared the stack with itself")
	case !bypass && moved != 0:
		t.Errorf("the stack run redirected %d writes: its sockets must be outside the map", moved)
	}
	return r
}

// corrWait bounds every wait of a case.
func corrWait(t *testing.T) time.Duration { return testutil.Stretch(t, 5*time.Second) }

func mustWrite(t *testing.T, fd int, b []byte) {
	t.Helper()
	if err := writeAll(fd, b); err != nil {
		t.Fatalf("write %d bytes: %v", len(b), err)
	}
}

// waitReadable polls fd for POLLIN (or an error/hang-up) up to d.
func waitReadable(fd int, d time.Duration) bool {
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(pfd, int(d.Milliseconds()))
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return n == 1
	}
}

// corrCase is one case; fams are the address families it runs with.
// psockLen: the bypass run relies on sk_psock.msg_tot_len (FIONREAD of
// redirected bytes, the back-pressure bound); kernels without it (before
// 6.6.128 / 6.12.75 / 6.18.14, e.g. 6.1) fail it, and SelfTest keeps the
// bypass off there.
type corrCase struct {
	name     string
	fams     []pairFamily
	fn       func(t *testing.T, c *corrRun, r *rec)
	psockLen bool
}

var allFams = []pairFamily{pairV4, pairV6, pairV4Mapped}

func famName(f pairFamily) string { return [...]string{"v4", "v6", "v4mapped"}[f] }

var corrCases = []corrCase{
	{name: "half_close_writer", fams: allFams, fn: func(t *testing.T, c *corrRun, r *rec) {
		d := detBytes("half_close_writer", 300<<10)
		mustWrite(t, c.p.a, d)
		if err := unix.Shutdown(c.p.a, unix.SHUT_WR); err != nil {
			t.Fatal(err)
		}
		got, eof, err := readEOF(c.p.b, len(d), corrWait(t))
		r.data("b read", got)
		r.add("b EOF %v err %s", eof, errName(err))
		answer := detBytes("answer", 5000)
		mustWrite(t, c.p.b, answer)
		back, _, err := readN(c.p.a, len(answer), corrWait(t))
		r.data("a read the answer", back)
		r.add("a err %s", errName(err))
		if string(got) != string(d) || string(back) != string(answer) {
			t.Errorf("bytes differ from the written ones (b %d of %d, answer %d of %d)", len(got), len(d), len(back), len(answer))
		}
	}},
}

func init() {
	corrCases = append(corrCases,
		corrCase{name: "half_close_reader_first", fams: []pairFamily{pairV4}, fn: func(t *testing.T, c *corrRun, r *rec) {
			if err := unix.Shutdown(c.p.b, unix.SHUT_WR); err != nil {
				t.Fatal(err)
			}
			got, eof, err := readEOF(c.p.a, 0, corrWait(t))
			r.add("a read %d bytes EOF %v err %s", len(got), eof, errName(err))
			d := detBytes("half_close_reader_first", 100<<10)
			mustWrite(t, c.p.a, d)
			got, _, err = readN(c.p.b, len(d), corrWait(t))
			r.data("b read", got)
			r.add("b err %s", errName(err))
		}},
		corrCase{name: "close_writer", fams: allFams, fn: func(t *testing.T, c *corrRun, r *rec) {
			d := detBytes("close_writer", 300<<10)
			mustWrite(t, c.p.a, d)
			unix.Close(c.p.a)
			c.p.a = -1
			got, eof, err := readEOF(c.p.b, len(d), corrWait(t))
			r.data("b read", got)
			r.add("b EOF %v err %s", eof, errName(err))
		}},
		corrCase{name: "close_reader", fams: []pairFamily{pairV4}, fn: func(t *testing.T, c *corrRun, r *rec) {
			d := detBytes("close_reader", 1000)
			mustWrite(t, c.p.a, d)
			got, _, err := readN(c.p.b, len(d), corrWait(t))
			r.data("b read", got)
			r.add("b err %s", errName(err))
			unix.Close(c.p.b)
			c.p.b = -1
			// the first write after the peer's close is accepted (the peer
			// answers it with RST); a later one fails
			err = nil
			for i := 0; i < 100 && err == nil; i++ {
				_, err = unix.Write(c.p.a, []byte("x"))
				time.Sleep(10 * time.Millisecond)
			}
			r.add("a's write after the peer closed: %s", errName(err))
		}},
		corrCase{name: "rst", fams: []pairFamily{pairV4}, fn: func(t *testing.T, c *corrRun, r *rec) {
			d := detBytes("rst", 1000)
			mustWrite(t, c.p.a, d)
			r.add("b readable %v", waitReadable(c.p.b, corrWait(t)))
			if err := unix.SetsockoptLinger(c.p.a, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0}); err != nil {
				t.Fatal(err)
			}
			unix.Close(c.p.a)
			c.p.a = -1
			// wait for the RST to arrive
			deadline := time.Now().Add(corrWait(t))
			for time.Now().Before(deadline) {
				ti, err := unix.GetsockoptTCPInfo(c.p.b, unix.IPPROTO_TCP, unix.TCP_INFO)
				if err != nil || ti.State == 7 /* TCP_CLOSE */ {
					break
				}
				time.Sleep(time.Millisecond)
			}
			got, eof, err := readEOF(c.p.b, len(d), corrWait(t))
			r.data("b read after RST", got)
			r.add("b EOF %v err %s", eof, errName(err))
		}},
		corrCase{name: "msg_peek", fams: allFams, fn: func(t *testing.T, c *corrRun, r *rec) {
			d := detBytes("msg_peek", 3000)
			mustWrite(t, c.p.a, d)
			r.add("b readable %v", waitReadable(c.p.b, corrWait(t)))
			buf := make([]byte, 10000)
			n, _, err := unix.Recvfrom(c.p.b, buf, unix.MSG_PEEK|unix.MSG_DONTWAIT)
			r.data("b peeked", buf[:max(n, 0)])
			r.add("peek err %s", errName(err))
			got, _, err := readN(c.p.b, len(d), corrWait(t))
			r.data("b read", got)
			r.add("read err %s", errName(err))
		}},
		corrCase{name: "sendfile_4MiB", fams: []pairFamily{pairV4}, fn: func(t *testing.T, c *corrRun, r *rec) {
			d := detBytes("sendfile", 4<<20)
			f, err := os.CreateTemp(t.TempDir(), "sendfile")
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := f.Write(d); err != nil {
				t.Fatal(err)
			}
			serr := make(chan error, 1)
			go func() {
				var off int64
				for off < int64(len(d)) {
					if _, err := unix.Sendfile(c.p.a, int(f.Fd()), &off, len(d)-int(off)); err != nil {
						serr <- err
						return
					}
				}
				serr <- unix.Shutdown(c.p.a, unix.SHUT_WR)
			}()
			got, eof, err := readEOF(c.p.b, len(d), corrWait(t))
			r.data("b read", got)
			r.add("b EOF %v err %s sendfile %s", eof, errName(err), errName(<-serr))
		}},
		corrCase{name: "one_write_16MiB", fams: []pairFamily{pairV4}, fn: func(t *testing.T, c *corrRun, r *rec) {
			d := detBytes("16MiB", 16<<20)
			werr := make(chan error, 1)
			go func() { werr <- writeAll(c.p.a, d) }()
			got, _, err := readN(c.p.b, len(d), 2*corrWait(t))
			r.data("b read", got)
			r.add("b err %s write %s", errName(err), errName(<-werr))
		}},
		corrCase{name: "epoll_edge_triggered_reader", fams: allFams, fn: func(t *testing.T, c *corrRun, r *rec) {
			// many writes of varied sizes, read by a Go-runtime-like
			// reader: EPOLLET, read until EAGAIN, wait again
			var d []byte
			for i := range 200 {
				d = append(d, detBytes(fmt.Sprint("epoll", i), 1+i*97%5000)...)
			}
			ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(ep)
			unix.SetNonblock(c.p.b, true)
			if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, c.p.b, &unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLET, Fd: int32(c.p.b)}); err != nil {
				t.Fatal(err)
			}
			go func() {
				for off := 0; off < len(d); {
					n := min(len(d)-off, 1+off%7000)
					if writeAll(c.p.a, d[off:off+n]) != nil {
						return
					}
					off += n
				}
			}()
			var got []byte
			buf := make([]byte, 64<<10)
			ev := make([]unix.EpollEvent, 1)
			deadline := time.Now().Add(corrWait(t))
			for len(got) < len(d) && time.Now().Before(deadline) {
				n, err := unix.EpollWait(ep, ev, int(time.Until(deadline).Milliseconds())+1)
				if n == 0 || (err != nil && !errors.Is(err, unix.EINTR)) {
					break
				}
				for {
					m, err := unix.Read(c.p.b, buf)
					if m <= 0 || err != nil {
						break
					}
					got = append(got, buf[:m]...)
				}
			}
			r.data("b read", got)
		}},
		corrCase{name: "fionread_sized_reader", fams: []pairFamily{pairV4}, fn: func(t *testing.T, c *corrRun, r *rec) {
			// a reader that reads exactly FIONREAD bytes after each
			// wake-up; halfway the writer goes through TCP (as after the
			// small-write or back-pressure switch): FIONREAD must count
			// those bytes too (the stream verdict where the kernel needs it)
			var d []byte
			for i := range 50 {
				d = append(d, detBytes(fmt.Sprint("fionread", i), 100+i*131)...)
			}
			done := make(chan struct{})
			go func() {
				defer close(done)
				for i, off := 0, 0; off < len(d); i++ {
					if i == 25 {
						c.setStack(t, c.p.a)
					}
					n := 100 + i*131
					if writeAll(c.p.a, d[off:off+n]) != nil {
						return
					}
					off += n
					time.Sleep(time.Millisecond)
				}
			}()
			var got []byte
			stalls := 0
			deadline := time.Now().Add(corrWait(t))
			for len(got) < len(d) && time.Now().Before(deadline) {
				if !waitReadable(c.p.b, time.Until(deadline)) {
					break
				}
				n, err := unix.IoctlGetInt(c.p.b, unix.SIOCINQ)
				if err != nil {
					t.Fatal(err)
				}
				if n == 0 {
					stalls++ // readable but FIONREAD 0: such a reader spins or gives up
					if stalls > 1000 {
						break
					}
					time.Sleep(time.Millisecond)
					continue
				}
				buf := make([]byte, n)
				m, err := unix.Read(c.p.b, buf)
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, buf[:m]...)
			}
			<-done
			r.data("b read", got)
			r.add("readable with FIONREAD 0: %v", stalls > 0)
		}, psockLen: true},
		corrCase{name: "peer_stops_reading", fams: []pairFamily{pairV4}, fn: func(t *testing.T, c *corrRun, r *rec) {
			// a non-blocking writer whose peer does not read gets EAGAIN
			// (bounded memory), then every byte it wrote is read back
			if err := unix.SetNonblock(c.p.a, true); err != nil {
				t.Fatal(err)
			}
			d := detBytes("peer_stops_reading", backpressureLimit)
			off := 0
			var err error
			for off < len(d) {
				var n int
				n, err = unix.Write(c.p.a, d[off:min(len(d), off+64<<10)])
				if err != nil {
					break
				}
				off += n
			}
			r.add("writer stopped by %s", errName(err))
			if off >= len(d) {
				t.Errorf("the writer queued %d MiB while the peer did not read: memory not bounded", off>>20)
			}
			t.Logf("bypass=%v: EAGAIN after %d KiB", c.bypass, off>>10)
			unix.SetNonblock(c.p.a, false)
			unix.Shutdown(c.p.a, unix.SHUT_WR)
			got, eof, rerr := readEOF(c.p.b, off, 2*corrWait(t))
			if string(got) != string(d[:off]) {
				t.Errorf("read back %d of %d bytes written (equal %v)", len(got), off, string(got) == string(d[:min(off, len(got))]))
			}
			r.add("read back every written byte %v, EOF %v err %s", string(got) == string(d[:off]), eof, errName(rerr))
		}, psockLen: true},
		corrCase{name: "go_io_copy_read_write", fams: allFams, fn: func(t *testing.T, c *corrRun, r *rec) {
			// a Go proxy between two bypassed connections, copying with
			// read/write (what io.Copy falls back to when splice(2) is
			// refused)
			got, how := proxy(t, c, false)
			r.data("proxied", got)
			r.add("%s", how)
		}},
	)
}

// proxy copies a -> b -> (io.Copy) -> c2.a -> c2.b with a second pair of
// the run and returns what arrived at the end, and how each step ended (the
// writer's error, io.Copy's count and error, the reader's EOF and error:
// what a difference in the bytes is explained by). splice: let io.Copy use
// TCPConn.ReadFrom (splice(2)); else plain read/write.
func proxy(t *testing.T, c *corrRun, splice bool) ([]byte, string) {
	t.Helper()
	out := c.pair(t)
	src, err := fileConn(c.p.b)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := fileConn(out.a)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	d := detBytes("proxy", 1<<20)
	type copied struct {
		n   int64
		err error
	}
	cp, wr := make(chan copied, 1), make(chan error, 1)
	go func() {
		var n int64
		var err error
		if splice {
			n, err = io.Copy(dst, src)
		} else {
			n, err = io.Copy(struct{ io.Writer }{dst}, struct{ io.Reader }{src})
		}
		dst.(*net.TCPConn).CloseWrite()
		cp <- copied{n, err}
	}()
	go func() {
		err := writeAll(c.p.a, d)
		unix.Shutdown(c.p.a, unix.SHUT_WR)
		wr <- err
	}()
	got, eof, rerr := readEOF(out.b, len(d), corrWait(t))
	src.Close()
	how := fmt.Sprintf("reader EOF %v err %s", eof, errName(rerr))
	select {
	case err := <-wr:
		how = fmt.Sprintf("writer err %s, %s", errName(err), how)
	case <-time.After(corrWait(t)):
		how = "writer still writing, " + how
	}
	select {
	case x := <-cp:
		how += fmt.Sprintf(", io.Copy %d bytes err %s", x.n, errName(x.err))
	case <-time.After(corrWait(t)):
		how += ", io.Copy still copying"
	}
	return got, how
}

// TestCorrectness runs every case on the stack and bypassed and compares
// what the application saw.
func TestCorrectness(t *testing.T) {
	e := newCorrEnv(t)
	hasPsockLen := kernelHasMsgTotLen(t)
	for _, cc := range corrCases {
		for _, fam := range cc.fams {
			t.Run(cc.name+"/"+famName(fam), func(t *testing.T) {
				if cc.psockLen && !hasPsockLen {
					t.Skip("this kernel has no sk_psock.msg_tot_len (before 6.6.128 / 6.12.75 / 6.18.14): no FIONREAD of redirected bytes, no back-pressure bound; SelfTest keeps the bypass off here")
				}
				stack := e.run(t, fam, false, cc.fn)
				bypass := e.run(t, fam, true, cc.fn)
				if !slices.Equal(stack.ev, bypass.ev) {
					t.Errorf("the bypass differs from the stack:\nstack:  %s\nbypass: %s", strings.Join(stack.ev, "\n        "), strings.Join(bypass.ev, "\n        "))
				}
				for _, ev := range stack.ev {
					t.Log(ev)
				}
			})
		}
	}
}

// TestCorrectnessSpliceLosesRedirectedBytesWithoutGuard: Go's io.Copy
// between two bypassed connections splices (TCPConn.ReadFrom). On kernels
// up to at least 6.18 tcp_bpf has no splice_read: splice(2) reads only the
// TCP receive queue, never the psock queue the redirected bytes are in, and
// returns EOF when the FIN arrives: every byte is lost (the splice guard
// refuses splice so io.Copy falls back to read/write, as in
// go_io_copy_read_write). A kernel that splices them passes the byte
// comparison; anything between (some bytes) fails.
func TestCorrectnessSpliceLosesRedirectedBytesWithoutGuard(t *testing.T) {
	e := newCorrEnv(t)
	want := detBytes("proxy", 1<<20)
	var stack, bypass []byte
	var stackHow, bypassHow string
	e.run(t, pairV4, false, func(t *testing.T, c *corrRun, r *rec) { stack, stackHow = proxy(t, c, true) })
	e.run(t, pairV4, true, func(t *testing.T, c *corrRun, r *rec) { bypass, bypassHow = proxy(t, c, true) })
	t.Logf("on the stack: %s; bypassed: %s", stackHow, bypassHow)
	if string(stack) != string(want) {
		t.Fatalf("on the stack io.Copy moved %d of %d bytes", len(stack), len(want))
	}
	switch {
	case string(bypass) == string(want):
		t.Logf("this kernel splices redirected bytes: io.Copy moved all %d bytes", len(bypass))
	case len(bypass) == 0:
		t.Logf("this kernel cannot splice redirected bytes: io.Copy moved 0 of %d bytes (the splice guard is needed)", len(want))
	default:
		t.Errorf("io.Copy between bypassed connections moved %d of %d bytes (equal prefix %v): neither all nor none", len(bypass), len(want), string(bypass) == string(want[:len(bypass)]))
	}
}

// TestCorrectnessRcvlowatIgnoredByBypass: SO_RCVLOWAT is not applied to the
// psock queue (every kernel so far): a bypassed reader is woken by fewer
// bytes than its low-water mark, which the stack never does. Short reads
// are legal, so this is a documented difference, not a failure; the bytes
// are the same.
func TestCorrectnessRcvlowatIgnoredByBypass(t *testing.T) {
	e := newCorrEnv(t)
	for _, bypass := range []bool{false, true} {
		var early bool
		var got []byte
		e.run(t, pairV4, bypass, func(t *testing.T, c *corrRun, r *rec) {
			if err := unix.SetsockoptInt(c.p.b, unix.SOL_SOCKET, unix.SO_RCVLOWAT, 1000); err != nil {
				t.Fatal(err)
			}
			d := detBytes("rcvlowat", 1000)
			mustWrite(t, c.p.a, d[:100])
			early = waitReadable(c.p.b, 200*time.Millisecond)
			mustWrite(t, c.p.a, d[100:])
			if !waitReadable(c.p.b, corrWait(t)) {
				t.Errorf("bypass=%v: not readable with 1000 bytes and SO_RCVLOWAT 1000", bypass)
			}
			got, _, _ = readN(c.p.b, len(d), corrWait(t))
			if string(got) != string(d) {
				t.Errorf("bypass=%v: read %d of %d bytes", bypass, len(got), len(d))
			}
		})
		t.Logf("bypass=%v: readable after 100 of SO_RCVLOWAT 1000 bytes: %v", bypass, early)
		if !bypass && early {
			t.Errorf("the stack woke the reader below SO_RCVLOWAT")
		}
		if bypass && !early {
			t.Logf("this kernel honours SO_RCVLOWAT on the bypass: the documented limit can go")
		}
	}
}
