package nodeport

// SNAT port allocation of the north-south LB (bpf/lib/nat.h):
// real connect loops through the attached LB and fixtures of the port
// choice (client port kept, collision -> another port, pool full), at tc
// and XDP.

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/axonhq/axon/internal/datapath/lbmap"
	"github.com/axonhq/axon/internal/lb"
	"github.com/axonhq/axon/internal/netnsutil"
)

// npConnLoop runs connect+request+response+close cycles from the calling
// thread's netns to dst for d (the server closes first, so TIME_WAIT piles
// up on the backend, as in the lab's connect benchmark) and returns
// completed cycles, failures and stalls (connect slower than 500 ms: a
// SYN retransmission, the initial RTO being 1 s).
func npConnLoop(dst netip.AddrPort, d time.Duration) (conns, fails, stalls int, first string) {
	sa := &unix.SockaddrInet4{Port: int(dst.Port()), Addr: dst.Addr().As4()}
	tv := unix.NsecToTimeval((3 * time.Second).Nanoseconds())
	buf := make([]byte, 256)
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		err := func() error {
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv)
			_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
			t0 := time.Now()
			if err := unix.Connect(fd, sa); err == unix.EINTR {
				// Go's preemption signal: the connect goes on, wait for it
				pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
				for {
					if _, err := unix.Poll(pfd, 3000); err != unix.EINTR {
						break
					}
				}
				if soerr, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR); err != nil || soerr != 0 || pfd[0].Revents&unix.POLLOUT == 0 {
					return fmt.Errorf("connect (after EINTR): so_error %d: %v", soerr, err)
				}
			} else if err != nil {
				return fmt.Errorf("connect: %w", err)
			}
			if time.Since(t0) > 500*time.Millisecond {
				stalls++
			}
			if _, err := unix.Write(fd, []byte("hello axon\n")); err != nil {
				return fmt.Errorf("write: %w", err)
			}
			got := 0
			for {
				n, err := unix.Read(fd, buf)
				if err == unix.EINTR {
					continue
				}
				if err != nil {
					return fmt.Errorf("read: %w", err)
				}
				if n == 0 {
					break
				}
				got += n
			}
			if got == 0 {
				return fmt.Errorf("no response")
			}
			return nil
		}()
		if err != nil {
			fails++
			if first == "" {
				first = err.Error()
			}
			continue
		}
		conns++
	}
	return conns, fails, stalls, first
}

// npNstat reads TcpExt counters of netns c.
func npNstat(c *dptest.NSCfg, names ...string) map[string]int64 {
	out := map[string]int64{}
	lines := strings.Split(c.ProcNet("netstat"), "\n")
	for i := 0; i+1 < len(lines); i += 2 {
		h, v := strings.Fields(lines[i]), strings.Fields(lines[i+1])
		if len(h) != len(v) || len(h) == 0 || h[0] != "TcpExt:" {
			continue
		}
		for j := 1; j < len(h); j++ {
			for _, n := range names {
				if h[j] == n {
					out[n], _ = strconv.ParseInt(v[j], 10, 64)
				}
			}
		}
	}
	return out
}

// TestNodePortSNATConnectLoop: a connect loop through the SNAT path to ONE
// backend must complete every connection without a SYN retransmission.
// Before the fix (61000-65535, NOEXIST on 32 random ports) 8 of 4 214
// connections in 10 s stalled 1 s, all of them snat_no_port drops.
// AXON_NP_LOOP=30s makes it longer.
func TestNodePortSNATConnectLoop(t *testing.T) {
	f := newNPTrafficFix(t)
	if err := f.nodeLB.UpsertFrontendWith(npNodePort(30080, lb.TCP, false, npBE("198.18.0.12:8080", "node2")), FrontendOptions{}); err != nil {
		t.Fatal(err)
	}
	d := 4 * time.Second
	if s := os.Getenv("AXON_NP_LOOP"); s != "" {
		var err error
		if d, err = time.ParseDuration(s); err != nil {
			t.Fatalf("AXON_NP_LOOP=%q: %v", s, err)
		}
	}
	names := []string{"TW", "TWRecycled", "PAWSEstabRejected", "PAWSActiveRejected", "TCPChallengeACK", "TCPACKSkippedTimeWait"}
	bc := dptest.NSConf(t, f.backend)
	for _, xdp := range []string{XDPNone, XDPGeneric} {
		t.Run("xdp="+xdp, func(t *testing.T) {
			var err error
			dptest.InNetns(t, f.node, func() { _, err = f.nodeLB.Attach("eth0", xdp) })
			if err != nil {
				t.Fatal(err)
			}
			before := npNstat(bc, names...)
			mb, _ := f.nodeLB.Metrics()
			var conns, fails, stalls int
			var first string
			if err := netnsutil.Do(f.client, func() error {
				conns, fails, stalls, first = npConnLoop(netip.MustParseAddrPort("198.18.0.11:30080"), d)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			after := npNstat(bc, names...)
			ma, _ := f.nodeLB.Metrics()
			st, _ := f.nodeLB.CTStats()
			t.Logf("%d connections in %s (%.0f/s), %d failed (first: %s), %d stalled > 500 ms; NAT entries %d/%d",
				conns, d, float64(conns)/d.Seconds(), fails, first, stalls, st.NATEntries, st.NATMax)
			for _, n := range names {
				t.Logf("backend TcpExt %s +%d", n, after[n]-before[n])
			}
			moved := npMoved(mb, ma, "tc")
			if xdp != XDPNone {
				for k, v := range npMoved(mb, ma, "xdp") {
					moved[k] += v
				}
			}
			t.Logf("LB counters: %v", moved)
			if conns == 0 || fails != 0 || stalls != 0 || moved["snat_no_port"] != 0 {
				t.Errorf("%d failed, %d stalled of %d connections, snat_no_port %d: want none", fails, stalls, conns+fails, moved["snat_no_port"])
			}
		})
	}
}

// snatPorts returns the reverse entries of backend be (SNAT kind) by SNAT port.
func (f *npFix) snatPorts(t testing.TB, be netip.AddrPort) map[uint16]NATEntry {
	t.Helper()
	es, err := f.n.NAT()
	if err != nil {
		t.Fatal(err)
	}
	out := map[uint16]NATEntry{}
	for _, e := range es {
		if e.Kind == "snat" && e.Reply.Src == be {
			out[e.Reply.Dst.Port()] = e
		}
	}
	return out
}

// TestNodePortSNATPorts: the SNAT port choice, byte for byte at tc and XDP:
// the client's port kept when it is free and inside the range, a
// collision gets another port of the range, a closing flow reopened by
// the same client tuple keeps its port (also after its CT entry is gone),
// and a full pool drops the SYN with snat_no_port.
func TestNodePortSNATPorts(t *testing.T) {
	const pmin, pmax = 20000, 20007 // 8 ports
	f := newNPFix(t, func(o *Options) { o.SNATPortMin, o.SNATPortMax = pmin, pmax })
	be := npAP("10.244.2.5:8080")
	f.upsert(t, npNodePort(30080, lb.TCP, false, npBE(be.String(), "node2")), FrontendOptions{})
	front := "198.18.0.11:30080"
	// send runs a SYN of flow and checks it left translated to the backend
	// from the node address and returns the SNAT port it got.
	send := func(t *testing.T, hook string, flow Tuple, flags uint8) uint16 {
		t.Helper()
		pkt := f.wirePkt(flow, flags)
		v, out := f.run(t, hook, pkt)
		if v != npFwd {
			t.Fatalf("%s %s: verdict %s, want fwd (counters %v)", flow, hook, v, f.counters(t)[hook])
		}
		e, ok := f.ctFor(t, flow)
		if !ok || e.Mode != "snat" {
			t.Fatalf("%s: CT %+v, want an snat entry", flow, e)
		}
		nt := Tuple{Proto: lb.TCP, Src: netip.AddrPortFrom(npNode, e.NATPort), Dst: be}
		if want := npTranslated(pkt, nt, flags, f.gwMAC, f.upMAC); !bytes.Equal(out[:len(want)], want) {
			t.Fatalf("%s: output\n got %x\nwant %x", flow, out[:len(want)], want)
		}
		if e.NATPort < pmin || e.NATPort > pmax {
			t.Fatalf("%s: SNAT port %d outside %d-%d", flow, e.NATPort, pmin, pmax)
		}
		return e.NATPort
	}
	for _, hook := range npHooks {
		t.Run(hook, func(t *testing.T) {
			f.resetFlows(t)
			before := f.counters(t)
			a := npTCP("198.18.0.250:20001", front)
			if p := send(t, hook, a, npSYN); p != 20001 {
				t.Errorf("client port 20001 is free and inside the range: got SNAT port %d", p)
			}
			// same port from another client: taken, so another one
			b := npTCP("203.0.113.9:20001", front)
			if p := send(t, hook, b, npSYN); p == 20001 {
				t.Errorf("second client with port 20001 got 20001 too: the backend would see one 4-tuple for two flows")
			}
			// outside the range: hash / random port inside it
			c := npTCP("198.18.0.250:45000", front)
			send(t, hook, c, npSYN)
			if n := len(f.snatPorts(t, be)); n != 3 {
				t.Errorf("%d reservations for %s, want 3", n, be)
			}
			// a closes and reopens (client port reuse): same SNAT port
			send(t, hook, a, npFIN|npACK)
			if p := send(t, hook, a, npSYN); p != 20001 {
				t.Errorf("reopened flow %s got SNAT port %d, want its old 20001", a, p)
			}
			// its CT entry (not answered: in the unreplied table) expired,
			// its reservation held: taken over again
			k := npTuple(a)
			if err := f.n.tc.AxonNpCtNew.Delete(&k); err != nil {
				t.Fatal(err)
			}
			if p := send(t, hook, a, npSYN); p != 20001 {
				t.Errorf("flow %s after its CT entry expired got SNAT port %d, want its held 20001", a, p)
			}
			if n := len(f.snatPorts(t, be)); n != 3 {
				t.Errorf("%d reservations after the reopenings, want still 3", n)
			}
			// fill the pool: 5 more clients take the 5 free ports
			for i := 0; i < 5; i++ {
				send(t, hook, npTCP(fmt.Sprintf("203.0.113.%d:50000", 20+i), front), npSYN)
			}
			if n := len(f.snatPorts(t, be)); n != pmax-pmin+1 {
				t.Fatalf("%d reservations, want the whole pool %d", n, pmax-pmin+1)
			}
			full := npTCP("203.0.113.99:50000", front)
			if v, _ := f.run(t, hook, f.wirePkt(full, npSYN)); v != npDrop {
				t.Errorf("SYN with the pool full: verdict %s, want drop", v)
			}
			if _, ok := f.ctFor(t, full); ok {
				t.Errorf("a flow without SNAT port got a CT entry")
			}
			got := npMoved(before, f.counters(t), hook)
			if got["snat_no_port"] != 1 {
				t.Errorf("counters %v: want snat_no_port 1", got)
			}
			st, err := f.n.CTStats()
			if err != nil || st.SNATNoPort == 0 || st.NATEntries != pmax-pmin+1 {
				t.Errorf("CTStats %+v (%v): want SNATNoPort > 0 and %d NAT entries", st, err, pmax-pmin+1)
			}
			// the same client tuple as a held reservation still gets through
			if p := send(t, hook, a, npSYN); p != 20001 {
				t.Errorf("with the pool full, %s got %d, want its own 20001", a, p)
			}
		})
	}
}

// TestNodePortSNATHold: GC keeps a closed TCP flow's SNAT port reserved for
// SNATTimeWait (longer than the backend's TIME_WAIT), frees it after; UDP
// reservations and local reverse entries go after TCPClosing; a flow of a
// removed backend is kept while it moves, removed once closing.
func TestNodePortSNATHold(t *testing.T) {
	f := newNPFix(t, nil)
	be := npAP("10.244.2.5:8080")
	f.upsert(t, npNodePort(30080, lb.TCP, false, npBE(be.String(), "node2")), FrontendOptions{})
	now := monoCoarse()
	ago := func(d time.Duration) uint64 { return now - uint64(d) }
	put := func(proto lb.Proto, port uint16, lastSeen uint64) lbTCNpTuple {
		k := npTuple(Tuple{Proto: proto, Src: be, Dst: netip.AddrPortFrom(npNode, port)})
		v := lbTCNpNat{Saddr: lbmap.Addr16(npNode), Daddr: lbmap.Addr16(npClient), Sport: lbmap.Port(30080), Dport: lbmap.Port(port), Flags: npNATSNAT, LastSeen: lastSeen}
		if err := f.n.tc.AxonNpNat.Put(&k, &v); err != nil {
			t.Fatal(err)
		}
		return k
	}
	// Short timeouts, same proportions as the defaults (TCPClosing 10 s,
	// SNATTimeWait 65 s): a freshly booted kernel-matrix VM has less
	// monotonic time than the defaults' "70 s ago".
	to := CTTimeouts{TCPClosing: 200 * time.Millisecond, SNATTimeWait: 2 * time.Second}
	tcpHeld := put(lb.TCP, 1030, ago(time.Second))   // closed 1 s ago: backend may be in TIME_WAIT
	tcpFree := put(lb.TCP, 1070, ago(3*time.Second)) // closed 3 s ago (> SNATTimeWait): free
	udp := put(lb.UDP, 1031, ago(time.Second))       // UDP: no TIME_WAIT, freed after TCPClosing
	if now < uint64(4*time.Second) {
		t.Fatalf("monotonic clock at %s: too early to fake idle times", time.Duration(now))
	}
	if _, err := f.n.GC(to); err != nil {
		t.Fatal(err)
	}
	var v lbTCNpNat
	for _, c := range []struct {
		k    lbTCNpTuple
		want bool
		desc string
	}{{tcpHeld, true, "TCP reservation idle 1 s (< SNATTimeWait 2 s)"}, {tcpFree, false, "TCP reservation idle 3 s (> SNATTimeWait 2 s)"}, {udp, false, "UDP reservation idle 1 s (> TCPClosing)"}} {
		if got := f.n.tc.AxonNpNat.Lookup(&c.k, &v) == nil; got != c.want {
			t.Errorf("%s: present after GC = %v, want %v", c.desc, got, c.want)
		}
	}
	// removed backend: a moving flow keeps it, a closing one goes
	for _, hook := range []string{"tc"} {
		f.resetFlows(t)
		moving, closing := npTCP("198.18.0.250:40001", "198.18.0.11:30080"), npTCP("198.18.0.250:40002", "198.18.0.11:30080")
		for _, fl := range []Tuple{moving, closing} {
			if v, _ := f.run(t, hook, f.wirePkt(fl, npSYN)); v != npFwd {
				t.Fatalf("SYN %s: %s", fl, v)
			}
		}
		f.run(t, hook, f.wirePkt(closing, npFIN|npACK))
		f.upsert(t, npNodePort(30080, lb.TCP, false, npBE("10.244.2.6:8080", "node2")), FrontendOptions{})
		if _, err := f.n.GC(CTTimeouts{}); err != nil {
			t.Fatal(err)
		}
		if _, ok := f.ctFor(t, moving); !ok {
			t.Errorf("GC removed the moving flow of a removed backend: its connection would be cut")
		}
		if _, ok := f.ctFor(t, closing); ok {
			t.Errorf("GC kept the closing flow of a removed backend")
		}
		if v, out := f.run(t, hook, f.wirePkt(moving, npACK)); v != npFwd || !bytes.Equal(out[30:34], be.Addr().AsSlice()) {
			t.Errorf("packet of the moving flow: verdict %s to %x, want fwd to its old backend %s", v, out[30:34], be)
		}
	}
}
