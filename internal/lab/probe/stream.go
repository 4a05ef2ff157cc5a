package probe

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"
)

// StreamPort is the port of the bypass check's echo server (`axon lab
// check`, same-node TCP bypass): apart from EchoPort so that it never meets
// the connectivity check's servers.
const StreamPort = 5659

// StreamResult is what `axon lab _echo stream` prints once its bytes came
// back: the connection's two ends as the client sees them, and the bytes
// sent and checked.
type StreamResult struct {
	Local  netip.AddrPort `json:"local"`
	Remote netip.AddrPort `json:"remote"`
	Bytes  int            `json:"bytes"`
	OK     bool           `json:"ok"`
	Err    string         `json:"error,omitempty"`
}

// Stream connects to a, writes n random bytes while reading the echo, checks
// that the same bytes came back in order, prints one StreamResult JSON line
// to out and then keeps the connection open until hold reaches EOF (the
// checker looks the connection up in the agent's list meanwhile). The
// exchange is bounded by timeout.
func Stream(ctx context.Context, a netip.AddrPort, n int, timeout time.Duration, out io.Writer, hold io.Reader) error {
	res, conn := stream(ctx, a, n, timeout)
	if conn != nil {
		defer conn.Close()
	}
	if err := json.NewEncoder(out).Encode(res); err != nil {
		return err
	}
	if conn != nil && hold != nil {
		_, _ = io.Copy(io.Discard, hold)
	}
	return nil
}

func stream(ctx context.Context, a netip.AddrPort, n int, timeout time.Duration) (StreamResult, net.Conn) {
	res := StreamResult{Remote: a, Bytes: n}
	fail := func(err error) StreamResult { res.Err = err.Error(); return res }
	d := net.Dialer{Timeout: timeout}
	c, err := d.DialContext(ctx, "tcp", a.String())
	if err != nil {
		return fail(err), nil
	}
	res.Local = unmapAddrPort(c.LocalAddr().(*net.TCPAddr).AddrPort())
	res.Remote = unmapAddrPort(c.RemoteAddr().(*net.TCPAddr).AddrPort())
	_ = c.SetDeadline(time.Now().Add(timeout))
	payload := make([]byte, n)
	_, _ = rand.Read(payload)
	werr := make(chan error, 1)
	go func() {
		_, err := c.Write(payload)
		werr <- err
	}()
	got := make([]byte, n)
	_, rerr := io.ReadFull(c, got)
	if err := errors.Join(<-werr, rerr); err != nil {
		c.Close()
		return fail(fmt.Errorf("echo of %d bytes: %w", n, err)), nil
	}
	if !bytes.Equal(got, payload) {
		c.Close()
		return fail(fmt.Errorf("the echo of %d bytes differs from what was sent", n)), nil
	}
	_ = c.SetDeadline(time.Time{})
	res.OK = true
	return res, c
}

func unmapAddrPort(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}
