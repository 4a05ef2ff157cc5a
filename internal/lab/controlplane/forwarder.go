package controlplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/netnsutil"
)

// Forwarder proxies TCP connections accepted inside other network namespaces to a target
// dialed in the namespace the Forwarder was created from (the lab: node netns → root-netns
// loopback apiserver). A listening socket keeps the netns it was created in, so one process
// serves every node namespace.
type Forwarder struct {
	target    string
	log       *slog.Logger
	listeners map[string]net.Listener // netns path → listener
}

// ListenForwarder opens a TCP listener on listen (e.g. "127.0.0.1:6443") inside each netns in
// netnsPaths (e.g. /run/netns/axonlab-node1), bringing `lo` up there when it is down. On error
// every listener opened so far is closed.
func ListenForwarder(netnsPaths []string, listen, target string, log *slog.Logger) (*Forwarder, error) {
	if log == nil {
		log = slog.Default()
	}
	if _, _, err := net.SplitHostPort(listen); err != nil {
		return nil, fmt.Errorf("forwarder listen address %q: %w", listen, err)
	}
	if _, _, err := net.SplitHostPort(target); err != nil {
		return nil, fmt.Errorf("forwarder target address %q: %w", target, err)
	}
	f := &Forwarder{target: target, log: log.With("component", "apiserver-forwarder"), listeners: map[string]net.Listener{}}
	for _, p := range netnsPaths {
		if _, dup := f.listeners[p]; dup {
			continue
		}
		l, err := listenInNetns(p, listen)
		if err != nil {
			f.Close()
			return nil, err
		}
		f.listeners[p] = l
	}
	return f, nil
}

// listenInNetns brings lo up in the netns at path and creates the listening socket there
// (netnsutil.DoAt: on a thread of its own, switched in and back; the socket keeps the netns).
func listenInNetns(path, listen string) (net.Listener, error) {
	target, err := netns.GetFromPath(path)
	if err != nil {
		return nil, fmt.Errorf("open netns %s: %w", path, err)
	}
	defer target.Close()
	if err := ensureLoopbackUp(target); err != nil {
		return nil, fmt.Errorf("netns %s: %w", path, err)
	}
	var l net.Listener
	err = netnsutil.DoAt(path, func() (err error) {
		l, err = net.Listen("tcp", listen)
		if err != nil {
			return fmt.Errorf("listen on %s in netns %s: %w", listen, path, err)
		}
		return nil
	})
	return l, err
}

// ensureLoopbackUp sets `lo` up in the given netns (a fresh netns has it down).
func ensureLoopbackUp(ns netns.NsHandle) error {
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE) // route only: xfrm/netfilter sockets fail on kernels without those modules
	if err != nil {
		return fmt.Errorf("netlink handle: %w", err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find lo: %w", err)
	}
	if lo.Attrs().Flags&net.FlagUp != 0 {
		return nil
	}
	if err := h.LinkSetUp(lo); err != nil {
		return fmt.Errorf("set lo up: %w", err)
	}
	return nil
}

// Addrs returns the listening address per netns path (useful when listen used port 0).
func (f *Forwarder) Addrs() map[string]net.Addr {
	out := make(map[string]net.Addr, len(f.listeners))
	for p, l := range f.listeners {
		out[p] = l.Addr()
	}
	return out
}

// Serve accepts and proxies connections until ctx is cancelled, then closes the listeners and
// waits for open connections to finish (they are closed too). It returns nil after a cancel.
func (f *Forwarder) Serve(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	conns := &connSet{m: map[net.Conn]struct{}{}}
	errc := make(chan error, len(f.listeners))
	for p, l := range f.listeners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errc <- f.acceptLoop(ctx, p, l, conns, &wg)
		}()
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
		cancel()
	}
	f.Close()
	conns.closeAll()
	wg.Wait()
	return err
}

func (f *Forwarder) acceptLoop(ctx context.Context, path string, l net.Listener, conns *connSet, wg *sync.WaitGroup) error {
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(50 * time.Millisecond)
				continue
			}
			return fmt.Errorf("accept in netns %s: %w", path, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.proxy(ctx, path, c, conns)
		}()
	}
}

func (f *Forwarder) proxy(ctx context.Context, path string, in net.Conn, conns *connSet) {
	if !conns.add(in) {
		in.Close()
		return
	}
	defer conns.remove(in)
	d := net.Dialer{Timeout: 5 * time.Second}
	out, err := d.DialContext(ctx, "tcp", f.target)
	if err != nil {
		f.log.Warn("dial target", "netns", path, "target", f.target, "err", err)
		return
	}
	if !conns.add(out) {
		out.Close()
		return
	}
	defer conns.remove(out)
	f.log.Debug("forwarding", "netns", path, "from", in.RemoteAddr(), "to", f.target)
	splice(in, in, out)
}

// splice copies inR → out and out → in until both directions end, half-closing each side
// when its source ends. inR is in, or a reader holding bytes already read from in.
func splice(in net.Conn, inR io.Reader, out net.Conn) {
	var wg sync.WaitGroup
	pipe := func(dst net.Conn, src io.Reader) {
		defer wg.Done()
		_, _ = io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		} else {
			dst.Close()
		}
	}
	wg.Add(2)
	go pipe(out, inR)
	go pipe(in, out)
	wg.Wait()
}

// Close closes the listeners (Serve closes them itself when it returns).
func (f *Forwarder) Close() {
	for _, l := range f.listeners {
		l.Close()
	}
}

// ServeForwarder listens on listen inside every netns in netnsPaths and proxies each
// connection to target, dialed in the caller's netns, until ctx is cancelled.
func ServeForwarder(ctx context.Context, netnsPaths []string, listen, target string, log *slog.Logger) error {
	f, err := ListenForwarder(netnsPaths, listen, target, log)
	if err != nil {
		return err
	}
	return f.Serve(ctx)
}

// connSet tracks open connections so Serve can close them on shutdown.
type connSet struct {
	mu     sync.Mutex
	m      map[net.Conn]struct{}
	closed bool
}

func (s *connSet) add(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.m[c] = struct{}{}
	return true
}

func (s *connSet) remove(c net.Conn) {
	s.mu.Lock()
	delete(s.m, c)
	s.mu.Unlock()
	c.Close()
}

func (s *connSet) closeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for c := range s.m {
		c.Close()
	}
}
