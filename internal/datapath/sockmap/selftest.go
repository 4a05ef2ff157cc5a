package sockmap

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/axonhq/axon/internal/datapath"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Check is one kernel behaviour the bypass relies on, as SelfTest found it.
type Check struct {
	Name   string
	OK     bool
	Detail string // what was measured; for a failure, what goes wrong for applications
}

// Result is the outcome of SelfTest. OK is false when a check failed (or
// the programs do not load): the bypass must stay off, Reason says why (the
// first failing check).
type Result struct {
	OK     bool
	Reason string
	Checks []Check
	// StreamVerdict: this kernel needs the no-op stream verdict on the
	// SOCKHASH (Config.StreamVerdict) for FIONREAD to count bytes that
	// reach a bypassed socket through TCP; the checks ran with it.
	StreamVerdict bool
}

// SelfTest checks what this kernel does with sockets in a SOCKHASH under the
// real sk_msg program, before the agent turns the bypass on. It loads the
// programs with private, unpinned maps (nothing of the node's bypass is
// touched), opens loopback socket pairs in a private network namespace,
// puts them into the private SOCKHASH from user space (socket storage, then
// the map, as sockops would) and checks byte for byte, with a timeout each:
// the redirect itself, FIONREAD and epoll/poll wake-ups for redirected bytes
// and for bytes that arrive through TCP, splice(2) as Go's io.Copy between
// TCP connections uses it, half-close, close, MSG_PEEK, a 16 MiB write, and
// back-pressure (a writer whose peer stops reading must be stopped within
// bounded memory). Where FIONREAD misses TCP bytes without the no-op stream
// verdict and counts them with it, the checks run with it and
// Result.StreamVerdict says to load with Config.StreamVerdict. Every check
// runs; Result.Reason is the first that failed.
// Needs CAP_BPF, CAP_NET_ADMIN and CAP_SYS_ADMIN (a network namespace); it
// takes well under a second on an idle machine.
func SelfTest(ctx context.Context) Result {
	var res Result
	fail := func(name, detail string) Result {
		res.Checks = append(res.Checks, Check{Name: name, Detail: detail})
		res.Reason = name + ": " + detail
		return res
	}
	ns, err := newPrivateNetns()
	if err != nil {
		return fail("netns", err.Error())
	}
	defer ns.close()

	plain, err := loadPrivate(false, true)
	if err != nil {
		return fail("load", err.Error())
	}
	defer plain.close()
	inst := plain

	// FIONREAD of TCP bytes decides the stream verdict: the other checks
	// run with the configuration the bypass will use.
	n, err := fionreadCheck(ctx, inst, ns, false)
	switch {
	case err != nil:
		return fail("fionread_stack_bytes", err.Error())
	case n == selfTestMsg:
		res.Checks = append(res.Checks, Check{Name: "fionread_stack_bytes", OK: true,
			Detail: fmt.Sprintf("FIONREAD %d for %d bytes that arrived through TCP", n, selfTestMsg)})
	default:
		withVerdict, err := loadPrivate(true, true)
		if err != nil {
			return fail("load_stream_verdict", err.Error())
		}
		defer withVerdict.close()
		n2, err := fionreadCheck(ctx, withVerdict, ns, false)
		if err != nil {
			return fail("fionread_stack_bytes", err.Error())
		}
		if n2 != selfTestMsg {
			return fail("fionread_stack_bytes", fmt.Sprintf("FIONREAD %d (without the stream verdict %d) for %d readable bytes that arrived through TCP: "+
				"applications that size reads by FIONREAD would stall", n2, n, selfTestMsg))
		}
		inst = withVerdict
		res.StreamVerdict = true
		res.Checks = append(res.Checks, Check{Name: "fionread_stack_bytes", OK: true,
			Detail: fmt.Sprintf("FIONREAD %d without the no-op stream verdict (kernel bug), %d with it: load with Config.StreamVerdict", n, n2)})
	}

	checks := []struct {
		name string
		fn   func(context.Context, *privateBypass, *privateNetns) (string, error)
	}{
		{"redirect", checkRedirect},
		{"fionread_redirected", func(ctx context.Context, in *privateBypass, ns *privateNetns) (string, error) {
			n, err := fionreadCheck(ctx, in, ns, true)
			if err == nil && n != selfTestMsg {
				err = fmt.Errorf("FIONREAD %d for %d redirected readable bytes", n, selfTestMsg)
			}
			return fmt.Sprintf("FIONREAD %d for %d redirected bytes", n, selfTestMsg), err
		}},
		{"wakeup_redirected", func(ctx context.Context, in *privateBypass, ns *privateNetns) (string, error) {
			return wakeupCheck(in, ns, true)
		}},
		{"wakeup_stack_bytes", func(ctx context.Context, in *privateBypass, ns *privateNetns) (string, error) {
			return wakeupCheck(in, ns, false)
		}},
		{"splice", checkSplice},
		{"half_close", checkHalfClose},
		{"close", checkClose},
		{"msg_peek", checkPeek},
		{"large_write", checkLargeWrite},
		{"backpressure", checkBackpressure},
	}
	// every check runs (each on sockets of its own), so the result lists
	// all that this kernel gets wrong; Reason is the first
	for _, c := range checks {
		if err := ctx.Err(); err != nil {
			res.Checks = append(res.Checks, Check{Name: c.name, Detail: "not run: " + err.Error()})
			continue
		}
		detail, err := c.fn(ctx, inst, ns)
		if err != nil {
			detail = err.Error()
		}
		res.Checks = append(res.Checks, Check{Name: c.name, OK: err == nil, Detail: detail})
	}
	for _, c := range res.Checks {
		if !c.OK {
			res.Reason = c.Name + ": " + c.Detail
			return res
		}
	}
	res.OK = true
	return res
}

// selfTestMsg is the size of the small writes of the checks.
const selfTestMsg = 1000

// selfTestWait bounds each wait of a check for bytes or an event.
const selfTestWait = 2 * time.Second

// privateBypass is the bypass's programs with private maps.
type privateBypass struct {
	ops     sockOpsObjects
	msg     skMsgObjects
	splice  sockSpliceObjects // the splice guard for the private SOCKHASH, where the kernel can run it
	guard   link.Link         // its attachment; nil without
	noGuard string            // why there is no guard
}

// loadPrivate loads both objects with unpinned maps and attaches
// axon_sk_msg (and with verdict the no-op stream verdict) to the private
// SOCKHASH, and with guard the splice guard for it where the kernel can run
// it (noGuard says why not). No cgroup: sockets enter from user space
// (insert).
func loadPrivate(verdict, guard bool) (*privateBypass, error) {
	spec, err := loadSockOps()
	if err != nil {
		return nil, fmt.Errorf("parse sockops object: %w", err)
	}
	for _, m := range spec.Maps {
		m.Pinning = ebpf.PinNone
	}
	spec.Maps[MapSockHash].MaxEntries = 64
	spec.Maps[MapSockAlias].MaxEntries = 128
	p := &privateBypass{}
	if err := spec.LoadAndAssign(&p.ops, nil); err != nil {
		return nil, fmt.Errorf("load sockops object: %w", err)
	}
	msgSpec, err := loadSkMsg()
	if err != nil {
		p.ops.Close()
		return nil, fmt.Errorf("parse sk_msg object: %w", err)
	}
	if err := loadOnMaps(&p.ops, msgSpec, &p.msg); err != nil {
		p.ops.Close()
		return nil, fmt.Errorf("load sk_msg object: %w", err)
	}
	// the splice guard, as Load attaches it, bound to this private map
	if !guard {
		p.noGuard = "not loaded for this run"
	} else if c := datapath.ProbeFeature("splice_guard"); !c.Available {
		p.noGuard = c.Reason
	} else if err := loadGuard(&p.ops, &p.splice); err != nil {
		p.noGuard = err.Error()
	} else if p.guard, err = link.AttachTracing(link.TracingOptions{Program: p.splice.AxonSockSplice}); err != nil {
		p.noGuard = fmt.Sprintf("attach the splice guard: %v", err)
	}
	if err := link.RawAttachProgram(link.RawAttachProgramOptions{
		Target: p.ops.AxonSockHash.FD(), Program: p.msg.AxonSkMsg, Attach: ebpf.AttachSkMsgVerdict,
	}); err != nil {
		p.close()
		return nil, fmt.Errorf("attach axon_sk_msg to a private SOCKHASH: %w", err)
	}
	if verdict {
		if err := attachStreamVerdict(p.ops.AxonSockHash, p.msg.AxonSkSkbPass, true); err != nil {
			p.close()
			return nil, err
		}
	}
	return p, nil
}

// close releases the programs and maps; the private SOCKHASH goes with
// them (the programs detach with it).
func (p *privateBypass) close() {
	if p.guard != nil {
		p.guard.Close()
	}
	p.splice.Close()
	p.msg.Close()
	p.ops.Close()
}

// insert puts fd into the private SOCKHASH under k with its peer's key, as
// sockops does: the socket storage first (sk_msg passes a socket without
// state to TCP).
func (p *privateBypass) insert(fd int, k, peer sockOpsSockmapKey) error {
	if err := p.ops.AxonSockmapState.Update(uint32(fd), sockOpsSockmapState{Peer: peer}, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("create the socket state of fd %d: %w", fd, err)
	}
	if err := p.ops.AxonSockHash.Update(k, uint64(fd), ebpf.UpdateNoExist); err != nil {
		return fmt.Errorf("insert fd %d into the private SOCKHASH: %w", fd, err)
	}
	return nil
}

// both inserts both ends of sp.
func (p *privateBypass) both(sp sockPair) error {
	if err := p.insert(sp.a, sp.ka, sp.kb); err != nil {
		return err
	}
	return p.insert(sp.b, sp.kb, sp.ka)
}

// counter is one metric of the private bypass, summed over CPUs.
func (p *privateBypass) counter(idx int) uint64 {
	var per []uint64
	if err := p.ops.AxonSockmapMetrics.Lookup(uint32(idx), &per); err != nil {
		return 0
	}
	var sum uint64
	for _, v := range per {
		sum += v
	}
	return sum
}

// privateNetns is a network namespace of its own with lo up, entered by one
// locked OS thread that runs the socket calls (socket, bind, connect) given
// to do. The thread is never unlocked: it ends with its goroutine, and the
// namespace goes when its last socket closes.
type privateNetns struct {
	fns    chan func()
	ln     int // listener on 127.0.0.1
	cookie uint64
	lns    map[pairFamily]int // listeners of the other families, opened on demand
}

// pairFamily is the address family of a loopback pair.
type pairFamily int

const (
	pairV4       pairFamily = iota // AF_INET, 127.0.0.1
	pairV6                         // AF_INET6, ::1
	pairV4Mapped                   // AF_INET6 sockets, ::ffff:127.0.0.1 (as Go listens on "tcp")
)

func newPrivateNetns() (*privateNetns, error) {
	ns := &privateNetns{fns: make(chan func()), ln: -1, lns: map[pairFamily]int{}}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("create a private network namespace (needs CAP_SYS_ADMIN): %w", err)
			return
		}
		h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
		if err == nil {
			var lo netlink.Link
			if lo, err = h.LinkByName("lo"); err == nil {
				err = h.LinkSetUp(lo)
			}
			h.Close()
		}
		if err != nil {
			errc <- fmt.Errorf("set lo up in the private network namespace: %w", err)
			return
		}
		errc <- nil
		for fn := range ns.fns {
			fn()
		}
	}()
	if err := <-errc; err != nil {
		return nil, err
	}
	err := ns.do(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		ns.ln = fd
		if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
			return err
		}
		if err := unix.Listen(fd, 64); err != nil {
			return err
		}
		ns.cookie, err = unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
		return err
	})
	if err != nil {
		ns.close()
		return nil, fmt.Errorf("listen on 127.0.0.1 in the private network namespace: %w", err)
	}
	return ns, nil
}

// do runs fn on the namespace's thread.
func (ns *privateNetns) do(fn func() error) error {
	errc := make(chan error, 1)
	ns.fns <- func() { errc <- fn() }
	return <-errc
}

func (ns *privateNetns) close() {
	if ns.ln >= 0 {
		unix.Close(ns.ln)
	}
	for _, fd := range ns.lns {
		unix.Close(fd)
	}
	close(ns.fns)
}

// listener is the listening socket for fam (the 127.0.0.1 one for pairV4)
// and the address to connect to.
func (ns *privateNetns) listener(fam pairFamily) (int, unix.Sockaddr, error) {
	if fam == pairV4 {
		sa, err := unix.Getsockname(ns.ln)
		return ns.ln, sa, err
	}
	fd, ok := ns.lns[fam]
	if !ok {
		err := ns.do(func() error {
			var err error
			if fd, err = unix.Socket(unix.AF_INET6, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0); err != nil {
				return err
			}
			bind := &unix.SockaddrInet6{Addr: netip.IPv6Loopback().As16()}
			if fam == pairV4Mapped {
				bind = &unix.SockaddrInet6{} // [::], dual stack
				if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 0); err != nil {
					return err
				}
			}
			if err := unix.Bind(fd, bind); err != nil {
				return err
			}
			return unix.Listen(fd, 64)
		})
		if err != nil {
			if fd > 0 {
				unix.Close(fd)
			}
			return -1, nil, fmt.Errorf("listen in the private network namespace: %w", err)
		}
		ns.lns[fam] = fd
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return -1, nil, err
	}
	if fam == pairV4Mapped {
		s6 := sa.(*unix.SockaddrInet6)
		sa = &unix.SockaddrInet6{Port: s6.Port, Addr: netip.AddrFrom4([4]byte{127, 0, 0, 1}).As16()} // As16 maps it
	}
	return fd, sa, nil
}

// sockPair is a connected loopback pair: a connected to the listener, b
// accepted; ka, kb their keys in axon_sock_hash (the loopback rule: netns =
// the namespace's cookie).
type sockPair struct {
	a, b   int
	ka, kb sockOpsSockmapKey
}

func (sp sockPair) close() {
	for _, fd := range []int{sp.a, sp.b} {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
}

// pair opens an IPv4 loopback pair in the namespace.
func (ns *privateNetns) pair() (sockPair, error) { return ns.pairOf(pairV4) }

// pairOf opens a loopback pair of family fam in the namespace.
func (ns *privateNetns) pairOf(fam pairFamily) (sockPair, error) {
	sp := sockPair{a: -1, b: -1}
	ln, sa, err := ns.listener(fam)
	if err != nil {
		return sp, err
	}
	domain := unix.AF_INET6
	if fam == pairV4 {
		domain = unix.AF_INET
	}
	err = ns.do(func() error {
		var err error
		if sp.a, err = unix.Socket(domain, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0); err != nil {
			return err
		}
		return unix.Connect(sp.a, sa)
	})
	if err == nil {
		sp.b, _, err = unix.Accept4(ln, unix.SOCK_CLOEXEC)
	}
	if err == nil {
		sp.ka, err = ns.keyOf(sp.a)
	}
	if err == nil {
		sp.kb, err = ns.keyOf(sp.b)
	}
	if err != nil {
		sp.close()
		return sockPair{}, fmt.Errorf("open a loopback socket pair in the private network namespace: %w", err)
	}
	return sp, nil
}

// keyOf is the axon_sock_hash key of a loopback socket, as sockops builds it.
func (ns *privateNetns) keyOf(fd int) (sockOpsSockmapKey, error) {
	l, err := unix.Getsockname(fd)
	if err != nil {
		return sockOpsSockmapKey{}, err
	}
	r, err := unix.Getpeername(fd)
	if err != nil {
		return sockOpsSockmapKey{}, err
	}
	la, ra := addrPortOf(l), addrPortOf(r)
	return sockOpsSockmapKey{
		Local: wordsOf(la.Addr()), Remote: wordsOf(ra.Addr()),
		Lport: uint32(la.Port()), Rport: uint32(ra.Port()), Netns: ns.cookie,
	}, nil
}

func addrPortOf(sa unix.Sockaddr) netip.AddrPort {
	switch s := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(s.Addr), uint16(s.Port))
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(s.Addr), uint16(s.Port))
	}
	return netip.AddrPort{}
}

// wordsOf is the four key words of an address (IPv4 v4-mapped), network
// order bytes as the kernel keeps them: the inverse of addrOf.
func wordsOf(a netip.Addr) [4]uint32 {
	b := a.As16()
	var w [4]uint32
	for i := range w {
		w[i] = uint32(b[4*i]) | uint32(b[4*i+1])<<8 | uint32(b[4*i+2])<<16 | uint32(b[4*i+3])<<24
	}
	return w
}

// newInserted opens a pair and puts both ends into the private SOCKHASH.
func newInserted(in *privateBypass, ns *privateNetns) (sockPair, error) {
	sp, err := ns.pair()
	if err != nil {
		return sp, err
	}
	if err := in.both(sp); err != nil {
		sp.close()
		return sockPair{}, err
	}
	return sp, nil
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

// writeAll writes b to the blocking socket fd.
func writeAll(fd int, b []byte) error {
	for len(b) > 0 {
		n, err := unix.Write(fd, b)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// readN reads up to n bytes from fd until EOF, an error or d passes; eof
// tells whether it ended with EOF.
func readN(fd int, n int, d time.Duration) (got []byte, eof bool, err error) {
	tv := unix.NsecToTimeval(int64(d))
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return nil, false, err
	}
	buf := make([]byte, 256<<10)
	deadline := time.Now().Add(d)
	for len(got) < n {
		if time.Now().After(deadline) {
			return got, false, fmt.Errorf("timed out after %v with %d of %d bytes", d, len(got), n)
		}
		m, err := unix.Read(fd, buf[:min(len(buf), n-len(got))])
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EAGAIN):
			return got, false, fmt.Errorf("nothing more to read after %v: %d of %d bytes", d, len(got), n)
		case err != nil:
			return got, false, err
		case m == 0:
			return got, true, nil
		}
		got = append(got, buf[:m]...)
	}
	return got, false, nil
}

// readEOF reads what is left until EOF (n more bytes at most).
func readEOF(fd int, n int, d time.Duration) ([]byte, bool, error) {
	return readN(fd, n+1, d)
}

// checkRedirect: a write between two sockets in the map reaches the peer
// through the redirect (the counter moves) and byte for byte.
func checkRedirect(_ context.Context, in *privateBypass, ns *privateNetns) (string, error) {
	sp, err := newInserted(in, ns)
	if err != nil {
		return "", err
	}
	defer sp.close()
	before := in.counter(idxRedirectMsgs)
	data := randomBytes(selfTestMsg)
	if err := writeAll(sp.a, data); err != nil {
		return "", fmt.Errorf("write: %w", err)
	}
	got, _, err := readN(sp.b, len(data), selfTestWait)
	if err != nil {
		return "", err
	}
	if !bytes.Equal(got, data) {
		return "", errors.New("the peer read other bytes than were written")
	}
	if d := in.counter(idxRedirectMsgs) - before; d == 0 {
		return "", errors.New("the write reached the peer but not through the redirect (redirect_msgs unchanged): the kernel does not run the sk_msg verdict")
	}
	return fmt.Sprintf("%d bytes redirected and read back", len(data)), nil
}

// Metric indexes the self-test reads (enum axon_sockmap_counter).
var (
	idxRedirectMsgs = metricIndex("redirect_msgs")
	idxPassBytes    = metricIndex("pass_bytes")
	idxBackpressure = metricIndex("backpressure")
)

func metricIndex(name string) int {
	for i, n := range metricNames {
		if n == name {
			return i
		}
	}
	panic("sockmap: no metric " + name)
}

// fionreadCheck writes selfTestMsg bytes to b and returns b's FIONREAD once
// they are readable (polled until it matches or selfTestWait passes).
// redirected: both ends in the map; else only b, so the bytes come through
// TCP into a socket that has a psock (as when the peer is in stack mode).
func fionreadCheck(_ context.Context, in *privateBypass, ns *privateNetns, redirected bool) (int, error) {
	sp, err := ns.pair()
	if err != nil {
		return 0, err
	}
	defer sp.close()
	if redirected {
		err = in.both(sp)
	} else {
		err = in.insert(sp.b, sp.kb, sp.ka)
	}
	if err != nil {
		return 0, err
	}
	passed := in.counter(idxPassBytes)
	if err := writeAll(sp.a, randomBytes(selfTestMsg)); err != nil {
		return 0, fmt.Errorf("write: %w", err)
	}
	if !redirected && in.counter(idxPassBytes) != passed {
		return 0, errors.New("a socket outside the map ran the sk_msg program")
	}
	n := -1
	for deadline := time.Now().Add(selfTestWait); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if n, err = unix.IoctlGetInt(sp.b, unix.SIOCINQ); err != nil {
			return 0, fmt.Errorf("FIONREAD: %w", err)
		}
		if n == selfTestMsg {
			break
		}
	}
	got, _, err := readN(sp.b, selfTestMsg, selfTestWait)
	if err != nil {
		return n, fmt.Errorf("read after FIONREAD %d: %w", n, err)
	}
	if len(got) != selfTestMsg {
		return n, fmt.Errorf("read %d of %d bytes", len(got), selfTestMsg)
	}
	return n, nil
}

// wakeupCheck: an edge-triggered epoll (as Go's runtime uses) and poll(2)
// both report b readable after the peer's write, for redirected bytes or
// bytes that came through TCP (only b in the map).
func wakeupCheck(in *privateBypass, ns *privateNetns, redirected bool) (string, error) {
	sp, err := ns.pair()
	if err != nil {
		return "", err
	}
	defer sp.close()
	if redirected {
		err = in.both(sp)
	} else {
		err = in.insert(sp.b, sp.kb, sp.ka)
	}
	if err != nil {
		return "", err
	}
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return "", fmt.Errorf("epoll_create: %w", err)
	}
	defer unix.Close(ep)
	if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, sp.b, &unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLET, Fd: int32(sp.b)}); err != nil {
		return "", fmt.Errorf("epoll_ctl: %w", err)
	}
	start := time.Now()
	// the first event of an edge-triggered epoll is the registration's
	// level; drain it by waiting 0 first
	ev := make([]unix.EpollEvent, 1)
	unix.EpollWait(ep, ev, 0)
	if err := writeAll(sp.a, randomBytes(selfTestMsg)); err != nil {
		return "", fmt.Errorf("write: %w", err)
	}
	var n int
	for {
		n, err = unix.EpollWait(ep, ev, int(selfTestWait.Milliseconds()))
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	epollAfter := time.Since(start)
	if n != 1 {
		return "", fmt.Errorf("no epoll (EPOLLET) wake-up within %v for %d readable bytes: a waiting reader would hang", selfTestWait, selfTestMsg)
	}
	pfd := []unix.PollFd{{Fd: int32(sp.b), Events: unix.POLLIN}}
	if n, _ := unix.Poll(pfd, int(selfTestWait.Milliseconds())); n != 1 || pfd[0].Revents&unix.POLLIN == 0 {
		return "", errors.New("poll(2) does not report POLLIN for readable bytes")
	}
	return fmt.Sprintf("epoll (EPOLLET) woke after %v, poll POLLIN", epollAfter.Round(time.Microsecond)), nil
}

// fileConn turns fd into a net.Conn of its own (a dup; fd stays open).
func fileConn(fd int) (net.Conn, error) {
	d, err := unix.Dup(fd)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(d), "sockmap-selftest")
	defer f.Close()
	return net.FileConn(f)
}

// checkSplice: Go's io.Copy from a bypassed connection into another TCP
// connection (a proxy) splices; every byte must arrive.
func checkSplice(_ context.Context, in *privateBypass, ns *privateNetns) (string, error) {
	sp, err := newInserted(in, ns)
	if err != nil {
		return "", err
	}
	defer sp.close()
	out, err := ns.pair() // not in the map
	if err != nil {
		return "", err
	}
	defer out.close()
	src, err := fileConn(sp.b)
	if err != nil {
		return "", err
	}
	defer src.Close()
	dst, err := fileConn(out.a)
	if err != nil {
		return "", err
	}
	defer dst.Close()
	data := randomBytes(256 << 10)
	type copied struct {
		n   int64
		err error
	}
	done := make(chan copied, 1)
	go func() {
		n, err := io.Copy(dst, src)
		dst.(*net.TCPConn).CloseWrite() // the reader below ends at EOF
		done <- copied{n, err}
	}()
	if err := writeAll(sp.a, data); err != nil {
		return "", fmt.Errorf("write: %w", err)
	}
	unix.Shutdown(sp.a, unix.SHUT_WR)
	got, _, rerr := readN(out.b, len(data), selfTestWait)
	src.Close() // ends a copy that still waits
	c := <-done
	if rerr != nil || !bytes.Equal(got, data) {
		return "", fmt.Errorf("io.Copy from a bypassed TCP connection to another (Go splices) moved %d of %d bytes (copy returned %d, %v; reader: %v): "+
			"this kernel cannot splice(2) from a socket in a SOCKHASH (no splice_read for redirected bytes) and %s: proxies would lose data",
			len(got), len(data), c.n, c.err, rerr, in.guardState())
	}
	return fmt.Sprintf("io.Copy moved %d bytes (%s)", c.n, in.guardState()), nil
}

// guardState says whether the splice guard was attached for the checks.
func (p *privateBypass) guardState() string {
	if p.guard != nil {
		return "the splice guard refused splice(2), the copy fell back to read/write"
	}
	return "the splice guard is not attached: " + p.noGuard
}

// checkHalfClose: shutdown(SHUT_WR) after a write: the peer reads every
// byte, then EOF, and can still answer.
func checkHalfClose(_ context.Context, in *privateBypass, ns *privateNetns) (string, error) {
	sp, err := newInserted(in, ns)
	if err != nil {
		return "", err
	}
	defer sp.close()
	data := randomBytes(100 << 10)
	if err := writeAll(sp.a, data); err != nil {
		return "", fmt.Errorf("write: %w", err)
	}
	if err := unix.Shutdown(sp.a, unix.SHUT_WR); err != nil {
		return "", fmt.Errorf("shutdown: %w", err)
	}
	got, eof, err := readEOF(sp.b, len(data), selfTestWait)
	if err != nil || !eof || !bytes.Equal(got, data) {
		return "", fmt.Errorf("after a half-close the peer read %d of %d bytes (equal %v, EOF %v, %v)", len(got), len(data), bytes.Equal(got, data), eof, err)
	}
	answer := []byte("answer after half-close")
	if err := writeAll(sp.b, answer); err != nil {
		return "", fmt.Errorf("answer after half-close: %w", err)
	}
	back, _, err := readN(sp.a, len(answer), selfTestWait)
	if err != nil || !bytes.Equal(back, answer) {
		return "", fmt.Errorf("the half-closed side read %q of the answer (%v)", back, err)
	}
	return fmt.Sprintf("%d bytes, EOF, answer back", len(data)), nil
}

// checkClose: close after a write: the peer reads every byte, then EOF.
func checkClose(_ context.Context, in *privateBypass, ns *privateNetns) (string, error) {
	sp, err := newInserted(in, ns)
	if err != nil {
		return "", err
	}
	defer sp.close()
	data := randomBytes(100 << 10)
	if err := writeAll(sp.a, data); err != nil {
		return "", fmt.Errorf("write: %w", err)
	}
	unix.Close(sp.a)
	sp.a = -1
	got, eof, err := readEOF(sp.b, len(data), selfTestWait)
	if err != nil || !eof || !bytes.Equal(got, data) {
		return "", fmt.Errorf("after close the peer read %d of %d bytes (equal %v, EOF %v, %v)", len(got), len(data), bytes.Equal(got, data), eof, err)
	}
	return fmt.Sprintf("%d bytes, EOF", len(data)), nil
}

// checkPeek: MSG_PEEK shows the bytes without consuming them.
func checkPeek(_ context.Context, in *privateBypass, ns *privateNetns) (string, error) {
	sp, err := newInserted(in, ns)
	if err != nil {
		return "", err
	}
	defer sp.close()
	data := randomBytes(selfTestMsg)
	if err := writeAll(sp.a, data); err != nil {
		return "", fmt.Errorf("write: %w", err)
	}
	pfd := []unix.PollFd{{Fd: int32(sp.b), Events: unix.POLLIN}}
	unix.Poll(pfd, int(selfTestWait.Milliseconds()))
	buf := make([]byte, 2*selfTestMsg)
	n, _, err := unix.Recvfrom(sp.b, buf, unix.MSG_PEEK|unix.MSG_DONTWAIT)
	if err != nil || n != len(data) || !bytes.Equal(buf[:n], data) {
		return "", fmt.Errorf("MSG_PEEK returned %d of %d bytes (%v)", n, len(data), err)
	}
	got, _, err := readN(sp.b, len(data), selfTestWait)
	if err != nil || !bytes.Equal(got, data) {
		return "", fmt.Errorf("the read after MSG_PEEK returned %d of %d bytes (%v)", len(got), len(data), err)
	}
	return fmt.Sprintf("peeked and read %d bytes", n), nil
}

// checkLargeWrite: one 16 MiB write() arrives whole.
func checkLargeWrite(_ context.Context, in *privateBypass, ns *privateNetns) (string, error) {
	sp, err := newInserted(in, ns)
	if err != nil {
		return "", err
	}
	defer sp.close()
	data := randomBytes(16 << 20)
	werr := make(chan error, 1)
	go func() { werr <- writeAll(sp.a, data) }()
	got, _, err := readN(sp.b, len(data), 4*selfTestWait)
	if err != nil || !bytes.Equal(got, data) {
		return "", fmt.Errorf("a 16 MiB write arrived as %d bytes (equal %v, %v)", len(got), bytes.Equal(got, data), err)
	}
	if err := <-werr; err != nil {
		return "", fmt.Errorf("16 MiB write: %w", err)
	}
	return "16 MiB in one write() arrived whole", nil
}

// backpressureLimit is how far a non-blocking writer may get ahead of a
// peer that stopped reading before the check calls the memory unbounded
// (TCP stops it at a few hundred KiB, the socket buffers).
const backpressureLimit = 64 << 20

// checkBackpressure: a non-blocking writer whose peer does not read gets
// EAGAIN within bounded memory, and every byte it wrote is read afterwards.
func checkBackpressure(_ context.Context, in *privateBypass, ns *privateNetns) (string, error) {
	sp, err := newInserted(in, ns)
	if err != nil {
		return "", err
	}
	defer sp.close()
	if err := unix.SetNonblock(sp.a, true); err != nil {
		return "", err
	}
	switched := in.counter(idxBackpressure)
	chunk := randomBytes(64 << 10)
	total := 0
	for total < backpressureLimit {
		n, err := unix.Write(sp.a, chunk)
		if errors.Is(err, unix.EAGAIN) {
			break
		}
		if err != nil {
			return "", fmt.Errorf("non-blocking write after %d bytes: %w", total, err)
		}
		total += n
	}
	if total >= backpressureLimit {
		return "", fmt.Errorf("a writer whose peer stopped reading queued %d MiB without EAGAIN: no back-pressure (a pod could pin unbounded kernel memory)", total>>20)
	}
	// every byte written is still delivered
	unix.SetNonblock(sp.a, false)
	unix.Shutdown(sp.a, unix.SHUT_WR)
	got, eof, err := readEOF(sp.b, total, 4*selfTestWait)
	if err != nil || !eof || len(got) != total {
		return "", fmt.Errorf("after back-pressure the peer read %d of %d bytes (EOF %v, %v)", len(got), total, eof, err)
	}
	return fmt.Sprintf("EAGAIN after %d KiB (backpressure switches %d); all read back", total>>10, in.counter(idxBackpressure)-switched), nil
}
