package sockmap

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/axonhq/axon/internal/testutil"
)

// The splice guard on real sockets: loopback pairs of this process in a
// private netns, put into the map from user space with their state
// (newOrderPair), and plain pairs that are in no map. The guard is what the
// kernel runs: these tests skip, with the probe's reason, where it cannot.

// guardCfg is cfg for tests that do not need the splice guard (the
// admission, the redirect): without it where the kernel cannot run it, so
// they still run there.
func guardCfg(cfg Config) Config {
	if !datapath.ProbeFeature("splice_guard").Available {
		cfg.NoSpliceGuard = true
	}
	return cfg
}

// loadGuarded loads the bypass with its splice guard; skips where the kernel
// cannot run it.
func loadGuarded(t *testing.T) (b *Bypass, pin, cgroup string) {
	t.Helper()
	dptest.RequireRoot(t)
	if c := datapath.ProbeFeature("splice_guard"); !c.Available {
		t.Skip(c.Reason)
	}
	b, pin, cgroup, _ = loadTest(t, Config{})
	return b, pin, cgroup
}

// plainPair is a connected loopback pair in a private netns, in no map.
func plainPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ns := dptest.NewNetns(t, "sms")
	testutil.InNetns(t, ns, func() error {
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			return err
		}
		defer ln.Close()
		if client, err = net.Dial("tcp4", ln.Addr().String()); err != nil {
			return err
		}
		server, err = ln.Accept()
		return err
	})
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// newPipe returns a pipe (read end, write end), closed at cleanup.
func newPipe(t *testing.T) (r, w int) {
	t.Helper()
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(p[0]); unix.Close(p[1]) })
	return p[0], p[1]
}

// readFull reads exactly n bytes from c.
func readFull(t *testing.T, c net.Conn, n int) []byte {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(testutil.Stretch(t, 5*time.Second)))
	b := make([]byte, n)
	if _, err := io.ReadFull(c, b); err != nil {
		t.Fatalf("read %d bytes: %v", n, err)
	}
	return b
}

// mustBeReadable waits until fd has data (the bytes are queued at it).
func mustBeReadable(t *testing.T, fd int) {
	t.Helper()
	if !waitReadable(fd, testutil.Stretch(t, 5*time.Second)) {
		t.Fatalf("socket %d never became readable", fd)
	}
}

// A read of a bypassed socket through splice_read fails with EINVAL and is
// counted; the bytes stay and read(2) gets them. The same calls on a socket
// in no map, or with the bypassed socket as the output, work and count
// nothing.
func TestSpliceGuard(t *testing.T) {
	b, _, _ := loadGuarded(t)
	data := randBytes(t, 1000)
	cases := []struct {
		name     string
		bypassed bool
		// do makes the call on the server side of the pair (server fd sfd,
		// client fd cfd) after data was written at the client; it returns
		// the call's byte count and error
		do      func(t *testing.T, sfd, cfd int) (int, error)
		wantErr error
		refused bool // the guard refused it (splice_refused +1); else the kernel did, or it worked
		// readBack: the bytes must still be readable with read(2) after
		// the call (it moved none of them)
		readBack bool
	}{
		{name: "splice from a bypassed socket", bypassed: true, wantErr: unix.EINVAL, refused: true, readBack: true,
			do: func(t *testing.T, sfd, _ int) (int, error) {
				_, w := newPipe(t)
				n, err := unix.Splice(sfd, nil, w, nil, 4096, unix.SPLICE_F_NONBLOCK)
				return int(n), err
			}},
		{name: "sendfile from a bypassed socket into a pipe", bypassed: true, wantErr: unix.EINVAL, refused: true, readBack: true,
			do: func(t *testing.T, sfd, _ int) (int, error) {
				_, w := newPipe(t)
				return unix.Sendfile(w, sfd, nil, 4096)
			}},
		{name: "splice from a socket in no map", bypassed: false,
			do: func(t *testing.T, sfd, _ int) (int, error) {
				_, w := newPipe(t)
				n, err := unix.Splice(sfd, nil, w, nil, 4096, unix.SPLICE_F_NONBLOCK)
				return int(n), err
			}},
		{name: "splice into a bypassed socket (it is the output)", bypassed: true,
			do: func(t *testing.T, _, cfd int) (int, error) {
				r, w := newPipe(t)
				if _, err := unix.Write(w, []byte("to the peer")); err != nil {
					t.Fatal(err)
				}
				n, err := unix.Splice(r, nil, cfd, nil, 4096, unix.SPLICE_F_NONBLOCK)
				return int(n), err
			}},
		// what the guard does not need to cover: the kernel refuses these
		// reads of a socket itself (shown on a socket in no map)
		{name: "sendfile from a socket into a socket: the kernel refuses", wantErr: unix.EINVAL, readBack: true,
			do: func(t *testing.T, sfd, cfd int) (int, error) { return unix.Sendfile(cfd, sfd, nil, 4096) }},
		{name: "copy_file_range from a socket: the kernel refuses", wantErr: unix.EINVAL, readBack: true,
			do: func(t *testing.T, sfd, _ int) (int, error) {
				f, err := os.CreateTemp(t.TempDir(), "out")
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				return unix.CopyFileRange(sfd, nil, int(f.Fd()), nil, 4096, 0)
			}},
		{name: "tee from a socket: the kernel refuses (pipes only)", wantErr: unix.EINVAL, readBack: true,
			do: func(t *testing.T, sfd, _ int) (int, error) {
				_, w := newPipe(t)
				n, err := unix.Tee(sfd, w, 4096, unix.SPLICE_F_NONBLOCK)
				return int(n), err
			}},
		{name: "vmsplice on a socket: the kernel refuses (a pipe only)", wantErr: unix.EBADF, readBack: true,
			do: func(t *testing.T, sfd, _ int) (int, error) {
				buf := make([]byte, 4096)
				return unix.Vmsplice(sfd, []unix.Iovec{{Base: &buf[0], Len: uint64(len(buf))}}, 0)
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var client, server net.Conn
			var cfd, sfd int
			if tc.bypassed {
				o := newOrderPair(t, b)
				client, server, cfd, sfd = o.client, o.server, o.cfd, o.sfd
			} else {
				client, server = plainPair(t)
				cfd, sfd = fdOf(t, client), fdOf(t, server)
			}
			before := metrics(t, b)
			if _, err := client.Write(data); err != nil {
				t.Fatal(err)
			}
			mustBeReadable(t, sfd)
			if d := metricsDelta(t, b, before); tc.bypassed && d["redirect_bytes"] != uint64(len(data)) {
				t.Fatalf("the pair is not bypassed: counters moved %v, want redirect_bytes %d", d, len(data))
			}
			before = metrics(t, b)
			n, err := tc.do(t, sfd, cfd)
			d := metricsDelta(t, b, before)
			if tc.wantErr != nil {
				want := uint64(0)
				if tc.refused {
					want = 1
				}
				if !errors.Is(err, tc.wantErr) || d["splice_refused"] != want {
					t.Fatalf("got n=%d err=%v, counters moved %v; want %v and splice_refused %d", n, err, d, tc.wantErr, want)
				}
			} else if err != nil || n <= 0 || d["splice_refused"] != 0 {
				t.Fatalf("got n=%d err=%v, counters moved %v; want it to work and splice_refused unchanged", n, err, d)
			}
			if tc.readBack && !bytes.Equal(readFull(t, server, len(data)), data) {
				t.Fatal("read(2) after the refused call returned other bytes")
			}
		})
	}
}

// copyThrough runs io.Copy(dst, src) (Go tries splice(2) first between two
// TCP conns), writes data at in and reads it at out: in -> src ... dst -> out.
// Returns what out read.
func copyThrough(t *testing.T, in, src, dst, out net.Conn, data []byte) []byte {
	t.Helper()
	copied := make(chan error, 1)
	go func() {
		_, err := io.Copy(dst, src)
		_ = dst.(*net.TCPConn).CloseWrite()
		copied <- err
	}()
	wrote := make(chan error, 1)
	go func() {
		_, err := in.Write(data)
		_ = in.(*net.TCPConn).CloseWrite()
		wrote <- err
	}()
	_ = out.SetReadDeadline(time.Now().Add(testutil.Stretch(t, 30*time.Second)))
	got, err := io.ReadAll(out)
	if err != nil {
		t.Fatalf("read at the end of the copy: %v (after %d bytes)", err, len(got))
	}
	if err := <-wrote; err != nil {
		t.Fatalf("write: %v", err)
	}
	if err := <-copied; err != nil {
		t.Fatalf("io.Copy: %v", err)
	}
	return got
}

// Go's io.Copy between two bypassed sockets delivers every byte (its splice
// is refused, it falls back to read/write); between two sockets in no map
// it still splices (the guard refuses nothing: counter unchanged).
func TestSpliceIOCopy(t *testing.T) {
	b, _, _ := loadGuarded(t)
	data := randBytes(t, 16<<20)
	t.Run("bypassed", func(t *testing.T) {
		x, y := newOrderPair(t, b), newOrderPair(t, b)
		before := metrics(t, b)
		got := copyThrough(t, x.client, x.server, y.client, y.server, data)
		d := metricsDelta(t, b, before)
		if !bytes.Equal(got, data) {
			t.Fatalf("io.Copy delivered %d bytes, want the %d written, byte for byte (counters moved %v)", len(got), len(data), d)
		}
		// both hops bypassed (until a writer outran its reader by the
		// back-pressure bound and moved to TCP, counted as backpressure:
		// then the rest of its bytes took TCP, still in order)
		if d["splice_refused"] == 0 || d["redirect_bytes"] == 0 ||
			d["backpressure"] == 0 && d["redirect_bytes"] < 2*uint64(len(data)) {
			t.Fatalf("counters moved %v: want splice refused, and both hops redirected (redirect_bytes >= %d) unless a writer hit the back-pressure bound", d, 2*len(data))
		}
		t.Logf("counters moved %v", d)
	})
	t.Run("in no map", func(t *testing.T) {
		inC, inS := plainPair(t)
		outC, outS := plainPair(t)
		before := metrics(t, b)
		got := copyThrough(t, inC, inS, outC, outS, data)
		d := metricsDelta(t, b, before)
		if !bytes.Equal(got, data) || d["splice_refused"] != 0 {
			t.Fatalf("io.Copy delivered %d of %d bytes, counters moved %v; want all and splice_refused unchanged", len(got), len(data), d)
		}
	})
}

// The guard sees the file, not the fd number: a bypassed socket at an fd
// above 1024 (a process with a large fd table) is refused the same.
func TestSpliceGuardLargeFD(t *testing.T) {
	b, _, _ := loadGuarded(t)
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	const want = 4000
	if lim.Cur < want+1 {
		t.Skipf("RLIMIT_NOFILE %d: cannot open fd %d", lim.Cur, want)
	}
	o := newOrderPair(t, b)
	big, err := unix.FcntlInt(uintptr(o.sfd), unix.F_DUPFD_CLOEXEC, want)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(big)
	if big < 1024 {
		t.Fatalf("dup got fd %d, want one above 1024", big)
	}
	before := metrics(t, b)
	if _, err := o.client.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	mustBeReadable(t, big)
	_, w := newPipe(t)
	n, err := unix.Splice(big, nil, w, nil, 4096, unix.SPLICE_F_NONBLOCK)
	if d := metricsDelta(t, b, before); !errors.Is(err, unix.EINVAL) || d["splice_refused"] != 1 {
		t.Fatalf("splice from fd %d: n=%d err=%v, counters moved %v; want EINVAL and splice_refused 1", big, n, err, d)
	}
}

// The guard's link is pinned: it keeps refusing while the agent is down
// (Close), a second Load replaces it with its own (one guard attached, the
// pin names the new program), and Uninstall removes the pin.
func TestSpliceGuardAdopt(t *testing.T) {
	b, pin, cg := loadGuarded(t)
	linkPin := filepath.Join(datapath.LinksDir(pin), SplicePin)
	o := newOrderPair(t, b)
	before := metrics(t, b)
	oldInfo, err := b.splice.AxonSockSplice.Info()
	if err != nil {
		t.Fatal(err)
	}
	oldID, _ := oldInfo.ID()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := o.client.Write([]byte("while the agent is down")); err != nil {
		t.Fatal(err)
	}
	mustBeReadable(t, o.sfd)
	_, w := newPipe(t)
	if _, err := unix.Splice(o.sfd, nil, w, nil, 4096, unix.SPLICE_F_NONBLOCK); !errors.Is(err, unix.EINVAL) {
		t.Fatalf("splice from a bypassed socket with the agent down: %v, want EINVAL (the pinned guard)", err)
	}
	b2, err := Load(pin, cg, Config{}, dptest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	if d := metricsDelta(t, b2, before); d["splice_refused"] != 1 {
		t.Fatalf("counters moved %v while the agent was down, want splice_refused 1", d)
	}
	l, err := link.LoadPinnedLink(linkPin, nil)
	if err != nil {
		t.Fatalf("the guard's pin after the second Load: %v", err)
	}
	info, err := l.Info()
	l.Close()
	if err != nil {
		t.Fatal(err)
	}
	pinfo, err := b2.splice.AxonSockSplice.Info()
	if err != nil {
		t.Fatal(err)
	}
	if id, _ := pinfo.ID(); info.Program != id {
		t.Fatalf("the pinned guard runs program %d, want the second Load's %d", info.Program, id)
	}
	// the first guard is gone: its link lost its pin and descriptor, its
	// program its last reference (freed after an RCU grace period)
	deadline := time.Now().Add(testutil.Stretch(t, 5*time.Second))
	for {
		p, err := ebpf.NewProgramFromID(oldID)
		if err != nil {
			break
		}
		p.Close()
		if time.Now().After(deadline) {
			t.Fatalf("the first Load's guard (program %d) still exists after the second Load", oldID)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := os.Stat(linkPin + "-next"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("temporary pin left behind: %v", err)
	}
	if err := Uninstall(pin); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(linkPin); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("guard pin after Uninstall: %v", err)
	}
}

// Why the guard exists, on the running kernel: without it, io.Copy between
// two bypassed sockets delivers less than was written (its splice reads the
// TCP receive queue; the redirected bytes wait in the psock queue) or never
// finishes. A failure here means this kernel no longer loses them, and the
// guard (and docs/sockmap-splice.md) should say so.
func TestSpliceLossWithoutGuard(t *testing.T) {
	b, _, _, _ := loadTest(t, Config{NoSpliceGuard: true})
	data := randBytes(t, 1<<20)
	x, y := newOrderPair(t, b), newOrderPair(t, b)
	before := metrics(t, b)
	go func() {
		_, _ = io.Copy(y.client, x.server)
		_ = y.client.(*net.TCPConn).CloseWrite()
	}()
	if _, err := x.client.Write(data); err != nil {
		t.Fatal(err)
	}
	_ = x.client.(*net.TCPConn).CloseWrite()
	_ = y.server.SetReadDeadline(time.Now().Add(testutil.Stretch(t, 5*time.Second)))
	got, err := io.ReadAll(y.server)
	d := metricsDelta(t, b, before)
	if d["redirect_bytes"] < uint64(len(data)) {
		t.Fatalf("the first pair is not bypassed: counters moved %v", d)
	}
	if bytes.Equal(got, data) {
		t.Fatalf("without the guard io.Copy delivered all %d bytes: this kernel's splice reads the psock queue; revisit the guard", len(data))
	}
	t.Logf("without the guard io.Copy delivered %d of %d bytes (read: %v); counters moved %v", len(got), len(data), err, d)
}

// The guard's cost for everything else on the node: a 1-byte read(2) of
// /dev/zero (security_file_permission runs on each) without and with the
// guard attached (default constants: the same early return as for any read
// outside splice/sendfile). Runs only when asked (AXON_SPLICE_GUARD_BENCH=1;
// in a VM: hack/vm -env AXON_SPLICE_GUARD_BENCH=1 -icount, where the guest
// clock counts instructions).
func TestSpliceGuardCost(t *testing.T) {
	if os.Getenv("AXON_SPLICE_GUARD_BENCH") != "1" {
		t.Skip("benchmark of the guard's cost on read(2): runs with AXON_SPLICE_GUARD_BENCH=1")
	}
	dptest.RequireRoot(t)
	if c := datapath.ProbeFeature("splice_guard"); !c.Available {
		t.Skip(c.Reason)
	}
	f, err := os.Open("/dev/zero")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1)
	read := func(b *testing.B) {
		for b.Loop() {
			if _, err := unix.Read(int(f.Fd()), buf); err != nil {
				b.Fatal(err)
			}
		}
	}
	without := testing.Benchmark(read)
	spec, err := loadSockSplice()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range spec.Maps {
		m.Pinning = ebpf.PinNone
	}
	var objs sockSpliceObjects
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		t.Fatal(err)
	}
	defer objs.Close()
	l, err := link.AttachTracing(link.TracingOptions{Program: objs.AxonSockSplice})
	if err != nil {
		t.Fatal(err)
	}
	with := testing.Benchmark(read)
	l.Close()
	again := testing.Benchmark(read)
	t.Logf("read(2) of 1 byte: without the guard %d ns/op, with it %d ns/op, without again %d ns/op (%d, %d, %d reads)",
		without.NsPerOp(), with.NsPerOp(), again.NsPerOp(), without.N, with.N, again.N)
}
