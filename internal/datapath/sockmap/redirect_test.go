package sockmap

import (
	"bytes"
	"net/netip"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/datapath/dptest"
)

// The redirect on real sockets: what goes through the bypass, what falls
// back to the stack and why, and that every byte arrives in order.
func TestRedirect(t *testing.T) {
	b, _, _, cgFD := loadTest(t, Config{})
	n := newPodNet(t)
	n.register(t, b)
	p := startSockProc(t, cgFD)
	ap := func(ip netip.Addr) string { return netip.AddrPortFrom(ip, 0).String() }
	podPair := func(t *testing.T) conn {
		t.Helper()
		c := p.connect(n.a, "tcp4", ap(n.podA), "", n.b, "tcp4", ap(n.podB))
		if got := connsOf(t, b, c); len(got) != 2 {
			t.Fatalf("pod pair not in the map: %v", got)
		}
		return c
	}

	t.Run("bypassed pair: byte-identical, redirected bytes counted exactly", func(t *testing.T) {
		c := podPair(t)
		before := metrics(t, b)
		var sent uint64
		for _, size := range []int{1, 2, 3, 100, 1460, 4096, 16384, 65536} {
			sent += p.send(c.client, c.server, randBytes(t, size))
			sent += p.send(c.server, c.client, randBytes(t, size))
		}
		d := metricsDelta(t, b, before)
		if d["redirect_bytes"] != sent || d["pass_bytes"] != 0 || d["pass_no_peer"] != 0 || d["redirect_msgs"] < 16 {
			t.Fatalf("sent %d bytes in 16 writes; counters moved by %v (want redirect_bytes = %d, redirect_msgs >= 16, nothing passed)", sent, d, sent)
		}
	})

	t.Run("first write finds no peer: stack for good, in order", func(t *testing.T) {
		// the impostor's connection: A's end is in the map, B's is not
		c := p.connect(n.a, "tcp4", ap(n.podA), "", n.b, "tcp4", ap(n.victim))
		if got := connsOf(t, b, c); len(got) != 1 {
			t.Fatalf("want only A's end in the map: %v", got)
		}
		before := metrics(t, b)
		var chunks [][]byte
		for i := range 20 {
			chunks = append(chunks, bytes.Repeat([]byte{byte('a' + i)}, 100*(i+1)))
		}
		sent := p.send(c.server, c.client, chunks...) // compares the whole stream: order kept
		d := metricsDelta(t, b, before)
		if d["pass_no_peer"] != 1 || d["pass_sticky"] < 19 || d["pass_bytes"] != sent || d["redirect_bytes"] != 0 {
			t.Fatalf("20 writes from a socket whose peer is not in the map: %v; want pass_no_peer 1, pass_sticky >= 19, pass_bytes %d, nothing redirected", d, sent)
		}
	})

	t.Run("write after the peer closed: stack, never EACCES", func(t *testing.T) {
		c := podPair(t)
		p.send(c.client, c.server, randBytes(t, 10)) // the client's socket is in bypass mode now
		p.do(hreq{Op: "close", ID: c.server})
		if got := connsOf(t, b, c); len(got) != 1 {
			t.Fatalf("after the server's close the map must hold only the client: %v", got)
		}
		before := metrics(t, b)
		w := p.try(hreq{Op: "write", ID: c.client, Data: randBytes(t, 100)})
		if w.Errno == int(unix.EACCES) || w.N != 100 {
			t.Fatalf("write after the peer closed: %d bytes, %q (errno %d): the verdict must pass a miss to TCP", w.N, w.Err, w.Errno)
		}
		d := metricsDelta(t, b, before)
		if d["pass_no_peer"] != 1 || d["pass_bytes"] != 100 || d["redirect_bytes"] != 0 {
			t.Fatalf("counters moved by %v, want pass_no_peer 1, pass_bytes 100", d)
		}
		p.do(hreq{Op: "close", ID: c.client})
	})

	t.Run("two pods on the same loopback tuple are never joined", func(t *testing.T) {
		if err := b.SetNetns(n.cb); err != nil {
			t.Fatal(err)
		}
		defer b.DeleteNetns(n.cb)
		before := metrics(t, b)
		// the same 127.0.0.1:15001 <-> 127.0.0.1:40123 in A and in B
		ca := p.connect(n.a, "tcp4", "127.0.0.1:15001", "", n.a, "tcp4", "127.0.0.1:40123")
		cb := p.connect(n.b, "tcp4", "127.0.0.1:15001", "", n.b, "tcp4", "127.0.0.1:40123")
		if ca.clientAddr != cb.clientAddr || ca.serverAddr != cb.serverAddr {
			t.Fatalf("the two connections must share their tuple: %v/%v and %v/%v", ca.clientAddr, ca.serverAddr, cb.clientAddr, cb.serverAddr)
		}
		got := connsOf(t, b, ca) // both connections match
		byNetns := map[uint64]int{}
		for _, x := range got {
			byNetns[x.Netns]++
		}
		if len(got) != 4 || byNetns[n.ca] != 2 || byNetns[n.cb] != 2 {
			t.Fatalf("map holds %v; want both ends of both connections, keyed by their netns (%d, %d)", got, n.ca, n.cb)
		}
		// interleaved writes, each read back where it belongs
		da, db := bytes.Repeat([]byte("A"), 5000), bytes.Repeat([]byte("B"), 7000)
		for _, x := range []struct {
			c conn
			d []byte
		}{{ca, da}, {cb, db}} {
			if w := p.do(hreq{Op: "write", ID: x.c.client, Data: x.d}); w.N != len(x.d) {
				t.Fatalf("short write %d", w.N)
			}
		}
		for _, x := range []struct {
			c conn
			d []byte
		}{{ca, da}, {cb, db}} {
			r := p.do(hreq{Op: "read", ID: x.c.server, N: len(x.d)})
			if !bytes.Equal(r.Data, x.d) {
				t.Fatalf("server got %q..., want only %q", r.Data[:min(20, len(r.Data))], x.d[:1])
			}
		}
		d := metricsDelta(t, b, before)
		if d["admit_loopback"] != 4 || d["redirect_bytes"] != uint64(len(da)+len(db)) {
			t.Fatalf("counters moved by %v, want admit_loopback 4, redirect_bytes %d", d, len(da)+len(db))
		}
		for _, c := range []conn{ca, cb} {
			p.do(hreq{Op: "close", ID: c.client})
			p.do(hreq{Op: "close", ID: c.server})
		}
	})
}

// Close and Load again with connections open: the maps and the link are
// pinned, so bypassed connections keep flowing through the bypass across
// the restart (and while no agent holds the programs), and new ones enter.
func TestRestartKeepsConnections(t *testing.T) {
	cfg := Config{MaxEntries: 1024}
	b, pin, cg, cgFD := loadTest(t, cfg)
	n := newPodNet(t)
	n.register(t, b)
	p := startSockProc(t, cgFD)
	ap := func(ip netip.Addr) string { return netip.AddrPortFrom(ip, 0).String() }
	c := p.connect(n.a, "tcp4", ap(n.podA), "", n.b, "tcp4", ap(n.podB))
	before := metrics(t, b)
	sent := p.send(c.client, c.server, randBytes(t, 3000))
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	sent += p.send(c.server, c.client, randBytes(t, 5000)) // no agent
	b2, err := Load(pin, cg, cfg, dptest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	sent += p.send(c.client, c.server, randBytes(t, 7000))
	sent += p.send(c.server, c.client, randBytes(t, 11))
	c2 := p.connect(n.a, "tcp4", ap(n.podA), "", n.b, "tcp4", ap(n.podB))
	sent += p.send(c2.client, c2.server, randBytes(t, 1234))
	d := metricsDelta(t, b2, before)
	if d["redirect_bytes"] != sent || d["pass_bytes"] != 0 || d["admit_pod"] != 2 {
		t.Fatalf("across the restart: %v; want redirect_bytes %d, nothing passed, the new connection admitted (admit_pod 2)", d, sent)
	}
	// the state map is pinned: each end's counters span the restart
	got := connsOf(t, b2, c)
	if len(got) != 2 {
		t.Fatalf("the old connection left the map: %v", got)
	}
	for _, x := range got {
		want := uint64(5000 + 11) // the server's writes
		if x.Local == c.clientAddr {
			want = 3000 + 7000
		}
		if x.Mode != "bypass" || x.RedirectedBytes != want {
			t.Errorf("after the restart %+v: want mode bypass, %d bytes redirected", x, want)
		}
	}
}

// A full map: sockets that do not fit stay on the stack, counted, and their
// data arrives like everyone else's; a closed connection frees its entries.
func TestFullMap(t *testing.T) {
	b, _, _, cgFD := loadTest(t, Config{MaxEntries: 4})
	n := newPodNet(t)
	n.register(t, b)
	p := startSockProc(t, cgFD)
	ap := func(ip netip.Addr) string { return netip.AddrPortFrom(ip, 0).String() }
	before := metrics(t, b)
	var cs []conn
	for range 3 {
		cs = append(cs, p.connect(n.a, "tcp4", ap(n.podA), "", n.b, "tcp4", ap(n.podB)))
	}
	var redirected, stacked uint64
	for i, c := range cs {
		s := p.send(c.client, c.server, randBytes(t, 10000)) + p.send(c.server, c.client, randBytes(t, 333))
		if i < 2 {
			redirected += s
		} else {
			stacked += s
		}
	}
	d := metricsDelta(t, b, before)
	if d["admit_pod"] != 4 || d["insert_failed"] != 2 || d["redirect_bytes"] != redirected || d["pass_bytes"] != 0 {
		t.Fatalf("3 connections into a map of 4: %v; want admit_pod 4, insert_failed 2, redirect_bytes %d (the third's %d bytes through TCP, untouched)",
			d, redirected, stacked)
	}
	// a full 4-bucket map has collisions: the iterator's list (which the
	// kernel repeats in part when a read ends inside a bucket) is exact
	all, err := b.Conns()
	if err != nil || len(all) != 4 {
		t.Fatalf("map holds %v, %v; want 4 entries", all, err)
	}
	byKey, err := b.keyConns()
	if err != nil || !slices.Equal(keys(all), keys(byKey)) {
		t.Fatalf("the connection list %v differs from the map's keys %v (%v)", keys(all), keys(byKey), err)
	}
	if got := connsOf(t, b, cs[2]); len(got) != 0 {
		t.Fatalf("the third connection is in the map: %v", got)
	}
	p.do(hreq{Op: "close", ID: cs[0].client})
	p.do(hreq{Op: "close", ID: cs[0].server})
	c := p.connect(n.a, "tcp4", ap(n.podA), "", n.b, "tcp4", ap(n.podB))
	if got := connsOf(t, b, c); len(got) != 2 {
		t.Fatalf("a closed connection's entries must be free for a new one: %v", got)
	}
	p.send(c.client, c.server, randBytes(t, 100))
}
