package sockmap

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/axonhq/axon/internal/testutil"
)

// The mode machine on real sockets of two pod namespaces joined by a veth
// pair, inserted by the real sockops program: sockets that went to the
// stack leave axon_sock_hash (counter left, gone from the map) while both
// ends keep writing and reading, and not one byte is lost, duplicated or
// reordered across the switch and the leave (the helper checks every byte of
// both directions against the stream written). Each case runs with and
// without the stream verdict (the agent attaches it where FIONREAD needs it).
func TestLeave(t *testing.T) {
	requireLeave(t)
	for _, verdict := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream verdict %v", verdict), func(t *testing.T) {
			testLeave(t, verdict)
		})
	}
}

func testLeave(t *testing.T, verdict bool) {
	b, _, _, cgFD := loadTest(t, Config{StreamVerdict: verdict})
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
		if got := aliasKeys(t, b.ops.AxonSockAlias, c.clientAddr); len(got) == 0 {
			t.Fatalf("pod pair has no alias keys in %s: the leave's check that they go would prove nothing", MapSockAlias)
		}
		return c
	}
	// stream runs the helper's stream (r's connections and sizes), then
	// one more byte each way: a socket leaves on a segment it sends, and
	// the last bytes of a stream may be read after its last segment went
	// out (a later write, or ACK, is when it leaves). It returns the
	// counters that moved.
	stream := func(t *testing.T, c conn, r hreq) map[string]uint64 {
		t.Helper()
		r.Op, r.ID, r.Peer = "stream", c.client, c.server
		before := metrics(t, b)
		a := p.try(r)
		if a.Err != "" {
			t.Fatalf("stream of %d bytes in %d-byte writes: %s (counters moved: %v)", r.Bytes, r.Chunk, a.Err, metricsDelta(t, b, before))
		}
		p.send(c.client, c.server, []byte("x"))
		p.send(c.server, c.client, []byte("y"))
		d := metricsDelta(t, b, before)
		t.Logf("%d bytes in %d-byte writes (one way: %v, blocking reader: %v), intact; counters moved: %v", r.Bytes, r.Chunk, r.OneWay, r.Blocking, d)
		return d
	}
	// left checks that both ends left: counted, gone from the map, and
	// that what is written after the leave reaches the peer intact without
	// the sk_msg program seeing it (plain TCP). When during the stream the
	// pair left depends on how fast the reader drained its queue, so the
	// stream's own bytes are no measure of it.
	left := func(t *testing.T, c conn, d map[string]uint64) {
		t.Helper()
		if d["left"] != 2 {
			t.Errorf("left moved by %d, want 2 (both ends quiet, queues drained)", d["left"])
		}
		if got := connsOf(t, b, c); len(got) != 0 {
			t.Errorf("after the leave the map still holds %v", got)
		}
		if got := aliasKeys(t, b.ops.AxonSockAlias, c.clientAddr); len(got) != 0 {
			t.Errorf("after the leave %s still holds the pair's alias keys %v (their links keep the psock)", MapSockAlias, got)
		}
		afterLeave(t, p, b, c.client, c.server)
		// sockets that left keep their axon_sockmap_quiet entries (QUIET)
		// until they close, then take them along
		if got := quietEntries(t, b); got == 0 {
			t.Errorf("%s is empty while the pair that left is open: its peer could not tell it from a closed one", MapQuiet)
		}
		p.do(hreq{Op: "close", ID: c.client})
		p.do(hreq{Op: "close", ID: c.server})
		waitQuietEmpty(t, b)
	}

	t.Run("bulk both ways past the back-pressure bound: stack, then out of the map", func(t *testing.T) {
		c := podPair(t)
		const bytes = 24 << 20
		// the readers start late, once their writer can go no further: each
		// writer queues more than the back-pressure bound into its peer,
		// moves to the stack, and the pair leaves once the readers drained
		// the redirected bytes
		d := stream(t, c, hreq{Bytes: bytes, Chunk: 16 << 10, ReadLate: true})
		if d["backpressure"] != 2 {
			t.Errorf("backpressure moved by %d, want 2 (each writer outran its reader)", d["backpressure"])
		}
		left(t, c, d)
	})

	t.Run("small streaming writes both ways: small-write rule, then out of the map", func(t *testing.T) {
		c := podPair(t)
		const bytes = 2 << 20
		d := stream(t, c, hreq{Bytes: bytes, Chunk: 64, DelayMS: 20})
		if d["switch_stack"] < 1 || d["redirect_msgs"] == 0 {
			t.Errorf("switch_stack moved by %d, redirect_msgs by %d: want the writes redirected first, then at least one writer switched by the small-write rule",
				d["switch_stack"], d["redirect_msgs"])
		}
		left(t, c, d)
	})

	t.Run("one-way small writes to a blocking reader: both leave, no EAGAIN", func(t *testing.T) {
		c := podPair(t)
		const bytes = 2 << 20
		d := stream(t, c, hreq{Bytes: bytes, Chunk: 64, OneWay: true, Blocking: true})
		if d["switch_stack"] != 1 {
			t.Errorf("switch_stack moved by %d, want 1 (the writer)", d["switch_stack"])
		}
		left(t, c, d)
	})

	t.Run("request/response stays bypassed: nobody leaves", func(t *testing.T) {
		c := podPair(t)
		before := metrics(t, b)
		var sent uint64
		for range 200 {
			sent += p.send(c.client, c.server, randBytes(t, 100))
			sent += p.send(c.server, c.client, randBytes(t, 100))
		}
		d := metricsDelta(t, b, before)
		if d["redirect_bytes"] != sent || d["left"] != 0 || d["switch_stack"] != 0 || d["pass_bytes"] != 0 {
			t.Fatalf("400 alternating 100-byte writes: counters moved by %v; want redirect_bytes %d and no switch, pass or leave", d, sent)
		}
		if got := connsOf(t, b, c); len(got) != 2 {
			t.Fatalf("a bypassed pair must stay in the map: %v", got)
		}
		// every other socket of this test closed, this pair closes now: no
		// axon_sockmap_quiet entry may stay behind (a socket that left keeps
		// its entries until it closes)
		if got, want := quietEntries(t, b), 2+len(aliasKeys(t, b.ops.AxonSockAlias, c.clientAddr)); got != want {
			t.Errorf("%s holds %d entries, want the %d of this open pair (2 exact keys, the rest alias keys)", MapQuiet, got, want)
		}
		p.do(hreq{Op: "close", ID: c.client})
		p.do(hreq{Op: "close", ID: c.server})
		waitQuietEmpty(t, b)
	})
}

// A restarted agent adopts sockets inserted by a loader without the mode
// machine (no axon_sockmap_quiet entries), or without the alias pairs'
// leave (none under alias keys): Load gives each key a live entry with its
// cookie, so that a peer inserted by the new sockops never reads
// it as gone and leaves while it still redirects.
func TestLoadMarksEarlierSocketsLive(t *testing.T) {
	requireLeave(t) // no axon_sockmap_quiet entries where nothing leaves
	cfg := Config{MaxEntries: 1024}
	b, pin, cg, cgFD := loadTest(t, cfg)
	n := newPodNet(t)
	n.register(t, b)
	p := startSockProc(t, cgFD)
	ap := func(ip netip.Addr) string { return netip.AddrPortFrom(ip, 0).String() }
	c := p.connect(n.a, "tcp4", ap(n.podA), "", n.b, "tcp4", ap(n.podB))
	var keys []sockOpsSockmapKey
	var k sockOpsSockmapKey
	var cookie uint64
	cookies := map[sockOpsSockmapKey]uint64{}
	for it := b.ops.AxonSockHash.Iterate(); it.Next(&k, &cookie); {
		keys = append(keys, k)
		cookies[k] = cookie
	}
	if len(keys) != 2 {
		t.Fatalf("want the pair's two keys in %s, got %d", MapSockHash, len(keys))
	}
	// and the alias keys, whose entries a loader before the alias pairs'
	// leave did not make
	for it := b.ops.AxonSockAlias.Iterate(); it.Next(&k, &cookie); {
		keys = append(keys, k)
		cookies[k] = cookie
	}
	if len(keys) < 3 {
		t.Fatalf("want the pair's alias keys in %s too, got %d keys in all", MapSockAlias, len(keys))
	}
	for _, k := range keys { // what a loader without the mode machine leaves behind
		if err := b.ops.AxonSockmapQuiet.Delete(k); err != nil {
			t.Fatalf("sockops made no %s entry for %+v: %v", MapQuiet, k, err)
		}
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	b2, err := Load(pin, cg, guardCfg(cfg), dptest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	for _, k := range keys {
		var q sockOpsSockmapQuiet
		if err := b2.ops.AxonSockmapQuiet.Lookup(k, &q); err != nil {
			t.Fatalf("after the reload %+v has no %s entry: %v", k, MapQuiet, err)
		}
		if q.State != 0 || q.Cookie != cookies[k] || q.Cookie == 0 {
			t.Errorf("after the reload %+v: %+v, want live with cookie %d", k, q, cookies[k])
		}
	}
	p.send(c.client, c.server, randBytes(t, 100))
}

// Sockets paired by alias key (a sidecar's REDIRECTed connection) leave the
// map like a pod pair: each publishes its quiet state under its alias keys
// too, so the other end, which knows it only by an alias key, can tell when
// nothing more comes from it. A two-way bulk stream past the back-pressure
// bound through a real iptables-nft REDIRECT moves both writers to the
// stack; both ends leave (left 2, gone from both SOCKHASHes) while the
// stream goes on, every byte intact both ways; closed, they take every
// axon_sockmap_quiet entry along. With one way only (the reader never
// writes, so it never paired), the reader finds its peer by the alias keys
// its own first write would have tried, and both leave too.
func TestLeaveAliasPairs(t *testing.T) {
	requireLeave(t)
	requireIptables(t)
	for _, oneWay := range []bool{false, true} {
		t.Run(fmt.Sprintf("one way %v", oneWay), func(t *testing.T) {
			b, _, _, cgFD := loadTest(t, Config{StreamVerdict: true})
			n := newSidecarNet(t, b)
			p := startSockProc(t, cgFD)
			nsRun(t, n.b, "iptables", "-w", "-t", "nat", "-A", "PREROUTING", "-p", "tcp", "--dport", "8080", "-j", "REDIRECT", "--to-ports", "15006")
			ln := p.do(hreq{Op: "listen", Netns: n.b, Net: "tcp4", Addr: "10.78.0.2:15006"})
			cl := p.do(hreq{Op: "dial", Netns: n.a, Net: "tcp4", Addr: "10.78.0.2:8080", Local: "10.78.0.1:0"})
			sv := p.do(hreq{Op: "accept", ID: ln.ID})
			p.do(hreq{Op: "closeln", ID: ln.ID})
			clientAddr := mustAP(t, cl.Local)
			if got := aliasKeys(t, b.ops.AxonSockAlias, clientAddr); len(got) < 2 {
				t.Fatalf("the REDIRECTed pair has alias keys %v, want the client's and the server's: the check that they go would prove nothing", got)
			}
			before := metrics(t, b)
			const bytes = 24 << 20
			if a := p.try(hreq{Op: "stream", ID: cl.ID, Peer: sv.ID, Bytes: bytes, Chunk: 16 << 10, ReadLate: true, OneWay: oneWay}); a.Err != "" {
				t.Fatalf("stream: %s", a.Err)
			}
			// a socket leaves on a segment it sends: one more byte each way
			p.send(cl.ID, sv.ID, []byte("x"))
			p.send(sv.ID, cl.ID, []byte("y"))
			d := metricsDelta(t, b, before)
			t.Logf("%d bytes (one way: %v) through the REDIRECTed pair, intact; counters moved: %v", bytes, oneWay, d)
			wantPaired, wantBP := uint64(2), uint64(2)
			if oneWay {
				wantPaired, wantBP = 1, 1
			}
			if d["alias_paired"] < wantPaired || d["backpressure"] != wantBP || d["left"] != 2 {
				t.Errorf("counters moved by %v; want alias_paired >= %d, backpressure %d (the writers on the stack), left 2", d, wantPaired, wantBP)
			}
			afterLeave(t, p, b, cl.ID, sv.ID)
			for _, local := range []string{cl.Local, sv.Local} {
				if c, ok := connByEnds(t, b, mustAP(t, local), netip.AddrPort{}); ok {
					t.Errorf("socket %s is still in %s after the leave: %+v", local, MapSockHash, c)
				}
			}
			if got := aliasKeys(t, b.ops.AxonSockAlias, clientAddr); len(got) != 0 {
				t.Errorf("after the leave %s still holds the pair's alias keys %v", MapSockAlias, got)
			}
			if got := quietEntries(t, b); got == 0 {
				t.Fatalf("%s is empty before the close: the check below would prove nothing", MapQuiet)
			}
			p.do(hreq{Op: "close", ID: cl.ID})
			p.do(hreq{Op: "close", ID: sv.ID})
			waitQuietEmpty(t, b)
		})
	}
}

// afterLeave writes 256 KiB each way between two sockets that left the
// map: every byte arrives intact (send checks them), and the sk_msg
// program, which runs on every write of a socket in the map, sees none of
// them: the writes went through plain TCP.
func afterLeave(t *testing.T, p *sockProc, b *Bypass, a, z int) {
	t.Helper()
	before := metrics(t, b)
	var sent uint64
	for range 16 {
		sent += p.send(a, z, randBytes(t, 16<<10))
		sent += p.send(z, a, randBytes(t, 16<<10))
	}
	d := metricsDelta(t, b, before)
	if seen := d["redirect_bytes"] + d["pass_bytes"]; seen != 0 {
		t.Errorf("sk_msg saw %d of the %d bytes written after the leave, want 0 (counters moved: %v)", seen, sent, d)
	}
}

// quietEntries counts the entries of axon_sockmap_quiet.
func quietEntries(t *testing.T, b *Bypass) int {
	t.Helper()
	var (
		k sockOpsSockmapKey
		v sockOpsSockmapQuiet
		n int
	)
	it := b.ops.AxonSockmapQuiet.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// waitQuietEmpty waits until every socket of the test reached TCP_CLOSE and
// took its axon_sockmap_quiet entries along.
func waitQuietEmpty(t *testing.T, b *Bypass) {
	t.Helper()
	deadline := time.Now().Add(testutil.Stretch(t, 5*time.Second))
	for quietEntries(t, b) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%s still holds %d entries after every socket closed: they leak", MapQuiet, quietEntries(t, b))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A stream of small writes through a REDIRECTed (alias-paired) connection
// stays bypassed: through the sidecar chain that was faster than the chain
// without the bypass (the small-write rule spares such pairs). The same
// stream between an exactly paired pod pair moves to the stack
// (switch_stack), the control.
func TestSmallWritesAliasPairStaysBypassed(t *testing.T) {
	requireLeave(t) // the small-write rule reads the peer's queue too
	requireIptables(t)
	b, _, _, cgFD := loadTest(t, Config{StreamVerdict: true})
	n := newSidecarNet(t, b)
	p := startSockProc(t, cgFD)
	nsRun(t, n.b, "iptables", "-w", "-t", "nat", "-A", "PREROUTING", "-p", "tcp", "--dport", "8080", "-j", "REDIRECT", "--to-ports", "15006")
	const bytes, chunk = 256 << 10, 64
	stream := func(name, dial string, ln hresp) map[string]uint64 {
		t.Helper()
		cl := p.do(hreq{Op: "dial", Netns: n.a, Net: "tcp4", Addr: dial, Local: "10.78.0.1:0"})
		sv := p.do(hreq{Op: "accept", ID: ln.ID})
		before := metrics(t, b)
		if a := p.try(hreq{Op: "stream", ID: cl.ID, Peer: sv.ID, Bytes: bytes, Chunk: chunk, DelayMS: 300}); a.Err != "" {
			t.Fatalf("%s: stream: %s", name, a.Err)
		}
		d := metricsDelta(t, b, before)
		t.Logf("%s: %d bytes each way in %d-byte writes, intact; counters moved: %v", name, bytes, chunk, d)
		p.do(hreq{Op: "close", ID: cl.ID})
		p.do(hreq{Op: "close", ID: sv.ID})
		return d
	}
	redirected := p.do(hreq{Op: "listen", Netns: n.b, Net: "tcp4", Addr: "10.78.0.2:15006"})
	d := stream("REDIRECTed pair", "10.78.0.2:8080", redirected)
	if d["alias_paired"] != 2 || d["switch_stack"] != 0 || d["pass_bytes"] != 0 || d["redirect_bytes"] < 2*bytes {
		t.Errorf("REDIRECTed pair: counters moved by %v; want alias_paired 2, switch_stack 0, nothing through TCP, every byte redirected", d)
	}
	exact := p.do(hreq{Op: "listen", Netns: n.b, Net: "tcp4", Addr: "10.78.0.2:9090"})
	d = stream("exact pair", "10.78.0.2:9090", exact)
	if d["alias_paired"] != 0 || d["switch_stack"] == 0 {
		t.Errorf("exact pair: counters moved by %v; want no alias pairing and the small-write rule moving a writer to the stack (switch_stack)", d)
	}
}

// requireLeave skips where the mode machine cannot run: a kernel without
// sk_psock.msg_tot_len (Debian's 6.1) has no back-pressure bound, no
// small-write rule and no leaving the map (sockmap_can_leave), and the
// self-test keeps the bypass off there.
func requireLeave(t *testing.T) {
	t.Helper()
	if !kernelHasMsgTotLen(t) {
		t.Skip("this kernel has no sk_psock.msg_tot_len (before 6.6.128 / 6.12.75 / 6.18.14): no back-pressure, no small-write rule, nothing leaves the map; SelfTest keeps the bypass off here")
	}
}
