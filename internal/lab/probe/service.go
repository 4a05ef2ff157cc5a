package probe

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Service is one TCP or UDP exchange with a service address.
type Service struct {
	Proto string         `json:"proto"` // tcp or udp
	Addr  netip.AddrPort `json:"addr"`
}

func (p Service) String() string { return p.Proto + "/" + p.Addr.String() }

// ParseService parses "tcp/10.96.100.10:80" or "udp/[fd00:10:96::10]:80".
func ParseService(s string) (Service, error) {
	proto, addr, ok := strings.Cut(s, "/")
	if !ok || (proto != "tcp" && proto != "udp") {
		return Service{}, fmt.Errorf("probe %q: want tcp/ADDR:PORT or udp/ADDR:PORT, e.g. tcp/10.96.100.10:80 or udp/[fd00:10:96::10]:80", s)
	}
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return Service{}, fmt.Errorf("probe %q: %w", s, err)
	}
	return Service{Proto: proto, Addr: ap}, nil
}

// ServiceResult is printed by `axon lab _probe`, one JSON object per line.
type ServiceResult struct {
	Service
	OK   bool          `json:"ok"`
	Peer string        `json:"peer,omitempty"` // TCP getpeername / UDP reply source
	RTT  time.Duration `json:"rtt"`
	Err  string        `json:"err,omitempty"`
}

// RunServices runs the probes (at most 16 at a time) and writes one
// ServiceResult JSON line each to out. A probe passes when the echo comes
// back AND the peer the socket reports is the service address itself
// (getpeername for TCP, the reply's source for unconnected UDP), as an
// application expects.
func RunServices(ctx context.Context, probes []Service, timeout time.Duration, out io.Writer) error {
	return runAll(ctx, probes, timeout, out, func(ctx context.Context, p Service) ServiceResult {
		start := time.Now()
		var peer netip.AddrPort
		var err error
		if p.Proto == "tcp" {
			peer, err = EchoTCP(ctx, p.Addr)
		} else {
			peer, err = EchoUDP(ctx, p.Addr)
		}
		if err == nil && peer != p.Addr {
			err = fmt.Errorf("echo came back but the peer is %s, not the service address", peer)
		}
		r := ServiceResult{Service: p, OK: err == nil, RTT: time.Since(start)}
		if peer.IsValid() {
			r.Peer = peer.String()
		}
		if err != nil {
			r.Err = err.Error()
		}
		return r
	})
}

// EchoTCP connects to a, sends a token and waits for it to come back; peer
// is the address the socket reports (getpeername).
func EchoTCP(ctx context.Context, a netip.AddrPort) (netip.AddrPort, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", a.String())
	if err != nil {
		return netip.AddrPort{}, err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	var peer netip.AddrPort
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		return peer, err
	}
	var gerr error
	if err := rc.Control(func(fd uintptr) {
		var sa unix.Sockaddr
		if sa, gerr = unix.Getpeername(int(fd)); gerr != nil {
			return
		}
		switch sa := sa.(type) {
		case *unix.SockaddrInet4:
			peer = netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(sa.Port))
		case *unix.SockaddrInet6:
			peer = netip.AddrPortFrom(netip.AddrFrom16(sa.Addr).Unmap(), uint16(sa.Port))
		}
	}); err != nil || gerr != nil {
		return peer, fmt.Errorf("getpeername: %w", errors.Join(err, gerr))
	}
	tok := token()
	if _, err := c.Write(tok); err != nil {
		return peer, fmt.Errorf("write: %w", err)
	}
	buf := make([]byte, len(tok))
	if _, err := io.ReadFull(c, buf); err != nil {
		return peer, fmt.Errorf("read echo: %w", err)
	}
	if !bytes.Equal(buf, tok) {
		return peer, errors.New("echo mismatch")
	}
	return peer, nil
}

// EchoUDP sends a token to a and waits for it to come back; peer is the
// source of the reply (recvmsg). It uses an unconnected socket (sendmsg +
// recvmsg, as a DNS resolver does) and resends every 300 ms until the echo
// comes back or ctx ends.
func EchoUDP(ctx context.Context, a netip.AddrPort) (netip.AddrPort, error) {
	network := "udp4"
	if a.Addr().Is6() {
		network = "udp6"
	}
	c, err := net.ListenUDP(network, nil)
	if err != nil {
		return netip.AddrPort{}, err
	}
	defer c.Close()
	dst := net.UDPAddrFromAddrPort(a)
	tok := token()
	buf := make([]byte, 256)
	var lastErr error
	for ctx.Err() == nil {
		if _, err := c.WriteToUDP(tok, dst); err != nil {
			lastErr = fmt.Errorf("send: %w", err)
			if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EPERM) {
				return netip.AddrPort{}, lastErr
			}
		}
		wait := time.Now().Add(300 * time.Millisecond)
		if dl, ok := ctx.Deadline(); ok && dl.Before(wait) {
			wait = dl
		}
		_ = c.SetReadDeadline(wait)
		for {
			n, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				if !errors.Is(err, os.ErrDeadlineExceeded) {
					lastErr = err
				}
				break // timeout: send again
			}
			if bytes.Equal(buf[:n], tok) {
				return netip.AddrPortFrom(from.Addr().Unmap(), from.Port()), nil
			}
		}
	}
	if lastErr != nil {
		return netip.AddrPort{}, fmt.Errorf("no UDP echo before the deadline (last error: %w)", lastErr)
	}
	return netip.AddrPort{}, errors.New("no UDP echo before the deadline")
}
