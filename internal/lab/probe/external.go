package probe

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"
)

// PeerEchoPort is the port of the peer-echo server (TCP and UDP): it answers
// a line with the line, the client address it saw and its own address.
const PeerEchoPort = 5658

// ServePeerEcho serves TCP and UDP on [::]:port: each request line is
// answered with "<line> <client addr:port> <server addr:port>\n" (TCP; UDP
// answers "<line> <client addr:port> -"). It writes "ready" to ready and
// serves until ctx ends or stop reaches EOF.
func ServePeerEcho(ctx context.Context, port int, ready io.Writer, stop io.Reader) error {
	unmap := func(a net.Addr) string {
		if ap, err := netip.ParseAddrPort(a.String()); err == nil {
			return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()).String()
		}
		return a.String()
	}
	return serve(ctx, "peer echo", port, ready, stop, 512,
		func(req []byte, from net.Addr) []byte {
			return []byte(strings.TrimRight(string(req), "\n") + " " + unmap(from) + " -\n")
		},
		func(c net.Conn) {
			r := bufio.NewReader(io.LimitReader(c, 512))
			for {
				line, err := r.ReadString('\n')
				if err != nil {
					return
				}
				line = strings.TrimRight(line, "\n")
				if _, err := fmt.Fprintf(c, "%s %s %s\n", line, unmap(c.RemoteAddr()), unmap(c.LocalAddr())); err != nil {
					return
				}
			}
		})
}

// External is one exchange of the external client: tcp, udp or http (GET
// /healthz) to an address:port.
type External struct {
	Proto string         `json:"proto"`
	Addr  netip.AddrPort `json:"addr"`
}

func (p External) String() string { return p.Proto + "/" + p.Addr.String() }

// ParseExternal parses "tcp/198.18.0.11:30080", "udp/[fd00:198:18::200]:80"
// or "http/198.18.0.11:30082".
func ParseExternal(s string) (External, error) {
	proto, addr, ok := strings.Cut(s, "/")
	if !ok || (proto != "tcp" && proto != "udp" && proto != "http") {
		return External{}, fmt.Errorf("probe %q: want tcp|udp|http/ADDR:PORT, e.g. tcp/198.18.0.11:30080 or udp/[fd00:198:18::200]:80", s)
	}
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return External{}, fmt.Errorf("probe %q: %w", s, err)
	}
	return External{Proto: proto, Addr: ap}, nil
}

// ExternalResult is one JSON line of `axon lab _xprobe`.
type ExternalResult struct {
	External
	OK     bool          `json:"ok"`               // the exchange completed (tcp/udp: echo came back from Addr; http: any answer)
	Peer   string        `json:"peer,omitempty"`   // reply source (udp) / getpeername (tcp)
	Seen   string        `json:"seen,omitempty"`   // client address the backend saw (peer-echo servers only)
	Server string        `json:"server,omitempty"` // backend address (peer-echo TCP only)
	Status int           `json:"status,omitempty"` // http status
	Body   string        `json:"body,omitempty"`   // http body
	RTT    time.Duration `json:"rtt"`
	Err    string        `json:"err,omitempty"`
}

// RunExternals runs the probes (at most 16 at a time) and writes one
// ExternalResult JSON line each to out.
func RunExternals(ctx context.Context, probes []External, timeout time.Duration, out io.Writer) error {
	return runAll(ctx, probes, timeout, out, func(ctx context.Context, p External) ExternalResult {
		start := time.Now()
		r := exchange(ctx, p)
		r.RTT = time.Since(start)
		return r
	})
}

func exchange(ctx context.Context, p External) ExternalResult {
	r := ExternalResult{External: p}
	fail := func(err error) ExternalResult { r.Err = err.Error(); return r }
	tok := string(token())
	switch p.Proto {
	case "http":
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.Addr.String()+"/healthz", nil)
		if err != nil {
			return fail(err)
		}
		resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
		if err != nil {
			return fail(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		r.OK, r.Status, r.Body = true, resp.StatusCode, strings.TrimSpace(string(b))
		return r
	case "tcp":
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", p.Addr.String())
		if err != nil {
			return fail(err)
		}
		defer c.Close()
		if dl, ok := ctx.Deadline(); ok {
			_ = c.SetDeadline(dl)
		}
		r.Peer = c.RemoteAddr().String()
		if _, err := io.WriteString(c, tok+"\n"); err != nil {
			return fail(fmt.Errorf("write: %w", err))
		}
		// The plain echo (5657) sends the line back; the peer echo adds addresses.
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			return fail(fmt.Errorf("read answer: %w", err))
		}
		return parseAnswer(r, tok, line)
	case "udp":
		network := "udp4"
		if p.Addr.Addr().Is6() {
			network = "udp6"
		}
		c, err := net.ListenUDP(network, nil)
		if err != nil {
			return fail(err)
		}
		defer c.Close()
		dst := net.UDPAddrFromAddrPort(p.Addr)
		buf := make([]byte, 512)
		for ctx.Err() == nil {
			if _, err := c.WriteToUDP([]byte(tok+"\n"), dst); err != nil {
				return fail(fmt.Errorf("send: %w", err))
			}
			wait := time.Now().Add(300 * time.Millisecond)
			if dl, ok := ctx.Deadline(); ok && dl.Before(wait) {
				wait = dl
			}
			_ = c.SetReadDeadline(wait)
			n, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				continue // resend
			}
			if !strings.HasPrefix(string(buf[:n]), tok) {
				continue
			}
			r.Peer = netip.AddrPortFrom(from.Addr().Unmap(), from.Port()).String()
			r = parseAnswer(r, tok, string(buf[:n]))
			if r.OK && r.Peer != p.Addr.String() {
				r.OK, r.Err = false, fmt.Sprintf("echo came back from %s, not from the service address", r.Peer)
			}
			return r
		}
		return fail(errors.New("no UDP answer before the deadline"))
	}
	return fail(fmt.Errorf("unknown protocol %q", p.Proto))
}

// parseAnswer checks "<tok>[ <seen> <server>]\n".
func parseAnswer(r ExternalResult, tok, line string) ExternalResult {
	f := strings.Fields(line)
	if len(f) == 0 || f[0] != tok {
		r.Err = fmt.Sprintf("unexpected answer %q", strings.TrimSpace(line))
		return r
	}
	if len(f) >= 2 {
		r.Seen = f[1]
	}
	if len(f) >= 3 && f[2] != "-" {
		r.Server = f[2]
	}
	r.OK = true
	return r
}
