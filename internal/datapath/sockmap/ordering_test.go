package sockmap

import (
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/testutil"
)

// The ordering claims of the sticky mode, shown on a loopback pair of this
// process put into the map from user space (the map update with the socket
// fd, no sock_ops), with the socket's state set directly: a redirect lands
// in the peer's psock queue, which the peer reads before its TCP receive
// queue.

// fdOf is the file descriptor of c.
func fdOf(t *testing.T, c net.Conn) int {
	t.Helper()
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var fd int
	if err := rc.Control(func(f uintptr) { fd = int(f) }); err != nil {
		t.Fatal(err)
	}
	return fd
}

// keyOf is the map key of c (loopback, in the netns with cookie netns).
func keyOf(t *testing.T, c net.Conn, netns uint64) sockOpsSockmapKey {
	t.Helper()
	words := func(ap netip.AddrPort) [4]uint32 {
		b := ap.Addr().As16() // IPv4 as ::ffff:a.b.c.d
		var w [4]uint32
		for i := range w {
			w[i] = binary.NativeEndian.Uint32(b[4*i:])
		}
		return w
	}
	l, r := mustAP(t, c.LocalAddr().String()), mustAP(t, c.RemoteAddr().String())
	return sockOpsSockmapKey{Local: words(l), Remote: words(r), Lport: uint32(l.Port()), Rport: uint32(r.Port()), Netns: netns}
}

// orderPair is a connected loopback pair in a private netns, both ends in
// the map with their state (mode undecided, the peer's key).
type orderPair struct {
	b              *Bypass
	client, server net.Conn
	cfd, sfd       int
	ckey, skey     sockOpsSockmapKey
}

func newOrderPair(t *testing.T, b *Bypass) *orderPair {
	t.Helper()
	ns := dptest.NewNetns(t, "smo")
	var o orderPair
	o.b = b
	testutil.InNetns(t, ns, func() error {
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			return err
		}
		defer ln.Close()
		if o.client, err = net.Dial("tcp4", ln.Addr().String()); err != nil {
			return err
		}
		o.server, err = ln.Accept()
		return err
	})
	t.Cleanup(func() { o.client.Close(); o.server.Close() })
	cookie, err := netnsutil.Cookie(netnsutil.Path(ns))
	if err != nil {
		t.Fatal(err)
	}
	o.cfd, o.sfd = fdOf(t, o.client), fdOf(t, o.server)
	o.ckey, o.skey = keyOf(t, o.client, cookie), keyOf(t, o.server, cookie)
	o.setMode(t, o.cfd, modeUndecided)
	o.setMode(t, o.sfd, modeUndecided)
	for _, x := range []struct {
		k  sockOpsSockmapKey
		fd int
	}{{o.ckey, o.cfd}, {o.skey, o.sfd}} {
		if err := b.ops.AxonSockHash.Put(x.k, uint64(x.fd)); err != nil {
			t.Fatalf("put socket into %s: %v", MapSockHash, err)
		}
	}
	return &o
}

// setMode writes the state of socket fd: mode, and the peer's key.
func (o *orderPair) setMode(t *testing.T, fd int, mode uint32) {
	t.Helper()
	peer := o.skey
	if fd == o.sfd {
		peer = o.ckey
	}
	if err := o.b.ops.AxonSockmapState.Put(uint32(fd), sockOpsSockmapState{Mode: mode, Peer: peer}); err != nil {
		t.Fatalf("set socket state: %v", err)
	}
}

// mode reads the mode of socket fd.
func (o *orderPair) mode(t *testing.T, fd int) uint32 {
	t.Helper()
	var st sockOpsSockmapState
	if err := o.b.ops.AxonSockmapState.Lookup(uint32(fd), &st); err != nil {
		t.Fatal(err)
	}
	return st.Mode
}

// write writes s from the client; a write through TCP returns once the
// server's kernel acknowledged it (it is in the server's receive queue).
func (o *orderPair) write(t *testing.T, s string) {
	t.Helper()
	if _, err := o.client.Write([]byte(s)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(testutil.Stretch(t, 5*time.Second))
	for {
		ti, err := unix.GetsockoptTCPInfo(o.cfd, unix.IPPROTO_TCP, unix.TCP_INFO)
		if err != nil {
			t.Fatal(err)
		}
		if ti.Unacked == 0 && ti.Notsent_bytes == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("write %q not acknowledged: %+v", s, ti)
		}
		time.Sleep(time.Millisecond)
	}
}

// read reads n bytes at the server.
func (o *orderPair) read(t *testing.T, n int) string {
	t.Helper()
	_ = o.server.SetReadDeadline(time.Now().Add(testutil.Stretch(t, 5*time.Second)))
	b := make([]byte, n)
	if _, err := io.ReadFull(o.server, b); err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestOrdering(t *testing.T) {
	b, _, _, _ := loadTest(t, Config{})

	t.Run("sticky stack: the peer is there, the write still goes through TCP", func(t *testing.T) {
		o := newOrderPair(t, b)
		o.setMode(t, o.cfd, modeStack)
		before := metrics(t, b)
		o.write(t, "one|")
		d := metricsDelta(t, b, before)
		if d["pass_sticky"] != 1 || d["pass_bytes"] != 4 || d["redirect_msgs"] != 0 {
			t.Fatalf("counters moved by %v, want pass_sticky 1, pass_bytes 4, no redirect", d)
		}
		if m := o.mode(t, o.cfd); m != modeStack {
			t.Fatalf("mode after a sticky pass: %d, want stack (%d)", m, modeStack)
		}
		if got := o.read(t, 4); got != "one|" {
			t.Fatalf("read %q", got)
		}
	})

	t.Run("undecided: the first write redirects and sets bypass", func(t *testing.T) {
		o := newOrderPair(t, b)
		before := metrics(t, b)
		if _, err := o.client.Write([]byte("hi")); err != nil {
			t.Fatal(err)
		}
		if got := o.read(t, 2); got != "hi" {
			t.Fatalf("read %q", got)
		}
		if d := metricsDelta(t, b, before); d["redirect_msgs"] != 1 || d["redirect_bytes"] != 2 {
			t.Fatalf("counters moved by %v, want one redirected write of 2 bytes", d)
		}
		if m := o.mode(t, o.cfd); m != modeBypass {
			t.Fatalf("mode after a redirect: %d, want bypass (%d)", m, modeBypass)
		}
	})

	t.Run("bypass then stack is ordered", func(t *testing.T) {
		o := newOrderPair(t, b)
		o.write(t, "bypass-1|") // redirected: in the server's psock queue, unread
		if m := o.mode(t, o.cfd); m != modeBypass {
			t.Fatalf("first write not redirected (mode %d)", m)
		}
		o.setMode(t, o.cfd, modeStack) // what a miss or a switch to the stack does
		o.write(t, "stack-2|")         // through TCP, acknowledged: in the receive queue
		if got := o.read(t, 17); got != "bypass-1|stack-2|" {
			t.Fatalf("server read %q, want bypass-1|stack-2|", got)
		}
	})

	t.Run("stack then bypass reorders: only the sticky mode prevents it", func(t *testing.T) {
		o := newOrderPair(t, b)
		o.setMode(t, o.cfd, modeStack)
		o.write(t, "stack-1|") // in the server's TCP receive queue
		// without the sticky mode the next write would redirect
		o.setMode(t, o.cfd, modeUndecided)
		before := metrics(t, b)
		o.write(t, "bypass-2|")
		if d := metricsDelta(t, b, before); d["redirect_msgs"] != 1 {
			t.Fatalf("second write not redirected: %v", d)
		}
		if got := o.read(t, 17); got != "bypass-2|stack-1|" {
			t.Fatalf("server read %q; the kernel reads the psock queue first, so this was expected to be reordered "+
				"(bypass-2|stack-1|): if the kernel now orders it, the sticky mode may be relaxed", got)
		}
	})
}
