package bench

// The connect-rate tool of the Service benchmark (issue 4): a client that
// loops socket → connect → request → response → close for a fixed time and
// reports connections per second and connect latency percentiles, and the
// matching server. sockperf and iperf3 cannot measure this: they keep one
// connection open. `axon lab bench _connrate` runs both sides.
//
// The server closes first (after its response), so TIME_WAIT sockets pile up
// on the server side and the client never runs out of ephemeral ports.
// Everything is blocking system calls on one locked OS thread: no Go netpoller
// between the measurement and the kernel.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"runtime"
	"slices"
	"time"

	"golang.org/x/sys/unix"
)

// ConnRateConfig describes one client run.
type ConnRateConfig struct {
	Target   netip.AddrPort // server address (a pod IP or a Service ClusterIP)
	Duration time.Duration  // how long to loop; default 3s
	Request  int            // request bytes; default 32 (the server answers with as many)
	Timeout  time.Duration  // per connect and per read; default 2s
	// MaxErrors stops the run early after this many failed connections
	// (default 1000): a dead path should not spin for the whole duration.
	MaxErrors int
}

// ConnRateResult is what the client prints (one JSON object).
type ConnRateResult struct {
	Target     string  `json:"target"`
	Conns      int     `json:"conns"`  // completed connect+request+response+close cycles
	Errors     int     `json:"errors"` // failed cycles
	FirstError string  `json:"firstError,omitempty"`
	Seconds    float64 `json:"seconds"`
	Rate       float64 `json:"connPerSec"`   // Conns / Seconds
	ConnectP50 float64 `json:"connectP50Us"` // connect(2) latency, µs
	ConnectP99 float64 `json:"connectP99Us"`
	CycleP50   float64 `json:"cycleP50Us"` // whole cycle, socket(2) to close(2), µs
	CycleP99   float64 `json:"cycleP99Us"`
}

func (c ConnRateConfig) withDefaults() (ConnRateConfig, error) {
	if c.Duration == 0 {
		c.Duration = 3 * time.Second
	}
	if c.Request == 0 {
		c.Request = 32
	}
	if c.Timeout == 0 {
		c.Timeout = 2 * time.Second
	}
	if c.MaxErrors == 0 {
		c.MaxErrors = 1000
	}
	switch {
	case !c.Target.IsValid() || c.Target.Port() == 0:
		return c, fmt.Errorf("connrate: target %q is not an address:port", c.Target)
	case c.Duration < 0 || c.Request < 1 || c.Request > 64<<10 || c.Timeout <= 0:
		return c, fmt.Errorf("connrate: bad duration %s, request size %d or timeout %s (want >0, 1..65536, >0)", c.Duration, c.Request, c.Timeout)
	}
	return c, nil
}

// sockaddr returns the family and sockaddr of ap (IPv4 stays AF_INET).
func sockaddr(ap netip.AddrPort) (int, unix.Sockaddr) {
	a := ap.Addr().Unmap()
	if a.Is4() {
		return unix.AF_INET, &unix.SockaddrInet4{Port: int(ap.Port()), Addr: a.As4()}
	}
	return unix.AF_INET6, &unix.SockaddrInet6{Port: int(ap.Port()), Addr: a.As16()}
}

// ConnRate runs the client loop and returns its result. It fails only on
// bad configuration; connection failures are counted in Errors.
func ConnRate(ctx context.Context, cfg ConnRateConfig) (ConnRateResult, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return ConnRateResult{}, err
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	family, sa := sockaddr(cfg.Target)
	tv := unix.NsecToTimeval(cfg.Timeout.Nanoseconds())
	req := bytes.Repeat([]byte{'x'}, cfg.Request)
	buf := make([]byte, cfg.Request+1)
	res := ConnRateResult{Target: cfg.Target.String()}
	connectNs := make([]int64, 0, 1<<16)
	cycleNs := make([]int64, 0, 1<<16)

	cycle := func() (connect time.Duration, err error) {
		fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return 0, fmt.Errorf("socket: %w", err)
		}
		defer unix.Close(fd)
		// SO_SNDTIMEO bounds a blocking connect(2), SO_RCVTIMEO the read.
		_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv)
		_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
		t0 := time.Now()
		if err := unix.Connect(fd, sa); err != nil {
			if err == unix.EINTR { // a signal (Go's async preemption): the handshake goes on
				err = awaitConnect(fd, cfg.Timeout)
			}
			if err != nil {
				return 0, fmt.Errorf("connect %s: %w", cfg.Target, err)
			}
		}
		connect = time.Since(t0)
		if _, err := unix.Write(fd, req); err != nil {
			return connect, fmt.Errorf("write: %w", err)
		}
		got := 0
		for {
			n, err := unix.Read(fd, buf)
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				return connect, fmt.Errorf("read: %w", err)
			}
			if n == 0 {
				break // the server closes after its answer
			}
			got += n
		}
		if got != cfg.Request {
			return connect, fmt.Errorf("got %d response bytes, want %d", got, cfg.Request)
		}
		return connect, nil
	}

	start := time.Now()
	deadline := start.Add(cfg.Duration)
	for n := 0; ; n++ {
		if n%64 == 0 && ctx.Err() != nil {
			break
		}
		t0 := time.Now()
		if !t0.Before(deadline) {
			break
		}
		c, err := cycle()
		if err != nil {
			res.Errors++
			if res.FirstError == "" {
				res.FirstError = err.Error()
			}
			if res.Errors >= cfg.MaxErrors {
				break
			}
			continue
		}
		cycleNs = append(cycleNs, int64(time.Since(t0)))
		connectNs = append(connectNs, int64(c))
	}
	res.Seconds = time.Since(start).Seconds()
	res.Conns = len(cycleNs)
	if res.Seconds > 0 {
		res.Rate = float64(res.Conns) / res.Seconds
	}
	res.ConnectP50, res.ConnectP99 = percentileUs(connectNs, 50), percentileUs(connectNs, 99)
	res.CycleP50, res.CycleP99 = percentileUs(cycleNs, 50), percentileUs(cycleNs, 99)
	return res, nil
}

// percentileUs returns the p-th percentile (nearest rank) of ns in µs, NaN
// when empty. It sorts ns in place.
// awaitConnect finishes a blocking connect(2) that a signal interrupted: the
// kernel goes on with the handshake, so wait until the socket is writable and
// return its SO_ERROR (nil when connected).
func awaitConnect(fd int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return unix.ETIMEDOUT
		}
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}, int(left.Milliseconds())+1)
		if err == unix.EINTR || (err == nil && n == 0) {
			continue
		}
		if err != nil {
			return fmt.Errorf("poll: %w", err)
		}
		soErr, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
		if err != nil {
			return fmt.Errorf("SO_ERROR: %w", err)
		}
		if soErr != 0 {
			return unix.Errno(soErr)
		}
		return nil
	}
}

func percentileUs(ns []int64, p float64) float64 {
	if len(ns) == 0 {
		return math.NaN()
	}
	slices.Sort(ns)
	rank := int(math.Ceil(p/100*float64(len(ns)))) - 1
	rank = max(0, min(rank, len(ns)-1))
	return float64(ns[rank]) / 1e3
}

// MarshalJSON writes NaN percentiles (no connection succeeded) as null.
func (r ConnRateResult) MarshalJSON() ([]byte, error) {
	type plain ConnRateResult
	type out struct {
		plain
		ConnectP50 *float64 `json:"connectP50Us"`
		ConnectP99 *float64 `json:"connectP99Us"`
		CycleP50   *float64 `json:"cycleP50Us"`
		CycleP99   *float64 `json:"cycleP99Us"`
	}
	p := func(v float64) *float64 {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return nil
		}
		return &v
	}
	return json.Marshal(out{plain(r), p(r.ConnectP50), p(r.ConnectP99), p(r.CycleP50), p(r.CycleP99)})
}

// ParseConnRate parses the client's JSON output (null percentiles → NaN).
func ParseConnRate(data []byte) (ConnRateResult, error) {
	var raw struct {
		ConnRateResult
		ConnectP50 *float64 `json:"connectP50Us"`
		ConnectP99 *float64 `json:"connectP99Us"`
		CycleP50   *float64 `json:"cycleP50Us"`
		CycleP99   *float64 `json:"cycleP99Us"`
	}
	data = bytes.TrimSpace(data)
	if i := bytes.LastIndexByte(data, '\n'); i >= 0 {
		data = data[i+1:] // the result is the last line
	}
	if len(data) == 0 {
		return ConnRateResult{}, errors.New("connrate printed nothing")
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return ConnRateResult{}, fmt.Errorf("parse connrate output %q: %w", truncate(string(data), 200), err)
	}
	if raw.Target == "" {
		return ConnRateResult{}, fmt.Errorf("connrate output %q has no target", truncate(string(data), 200))
	}
	r := raw.ConnRateResult
	v := func(p *float64) float64 {
		if p == nil {
			return math.NaN()
		}
		return *p
	}
	r.ConnectP50, r.ConnectP99, r.CycleP50, r.CycleP99 = v(raw.ConnectP50), v(raw.ConnectP99), v(raw.CycleP50), v(raw.CycleP99)
	return r, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// ServeConnRate listens on addr and answers every connection: read one
// request, write as many bytes back, close. It returns when ctx is done
// (the listener is shut down) or on a listen error. ready, when not nil, is
// called once the socket listens.
func ServeConnRate(ctx context.Context, addr netip.AddrPort, ready func()) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	family, sa := sockaddr(addr)
	lfd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("connrate server: socket: %w", err)
	}
	defer unix.Close(lfd)
	_ = unix.SetsockoptInt(lfd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
	if err := unix.Bind(lfd, sa); err != nil {
		return fmt.Errorf("connrate server: bind %s (is the address configured in this namespace?): %w", addr, err)
	}
	if err := unix.Listen(lfd, 4096); err != nil {
		return fmt.Errorf("connrate server: listen %s: %w", addr, err)
	}
	if ready != nil {
		ready()
	}
	stop := context.AfterFunc(ctx, func() { _ = unix.Shutdown(lfd, unix.SHUT_RDWR) })
	defer stop()
	buf := make([]byte, 64<<10)
	tv := unix.NsecToTimeval((2 * time.Second).Nanoseconds())
	for {
		fd, _, err := unix.Accept4(lfd, unix.SOCK_CLOEXEC)
		if ctx.Err() != nil {
			if err == nil {
				unix.Close(fd)
			}
			return nil
		}
		if err != nil {
			if err == unix.EINTR || err == unix.ECONNABORTED || err == unix.EMFILE || err == unix.ENFILE {
				continue
			}
			return fmt.Errorf("connrate server: accept: %w", err)
		}
		_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
		n, err := unix.Read(fd, buf)
		if err == nil && n > 0 {
			_, _ = unix.Write(fd, buf[:n])
		}
		unix.Close(fd)
	}
}
