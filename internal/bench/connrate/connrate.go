// Package connrate is the connect-rate tool of the Service and north-south
// benchmarks: a client that loops socket → connect → request → response →
// close for a fixed time and reports connections per second and connect latency percentiles, and the
// matching server. sockperf and iperf3 cannot measure this: they keep one
// connection open. `axon lab bench _connrate` runs both sides.
//
// The server closes first (after its response), so TIME_WAIT sockets pile up
// on the server side and the client never runs out of ephemeral ports.
// Everything is blocking system calls on one locked OS thread: no Go netpoller
// between the measurement and the kernel.
package connrate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/bench/clip"
	"github.com/axonhq/axon/internal/bench/jsonnum"
	"github.com/axonhq/axon/internal/stats"
)

// Config describes one client run.
type Config struct {
	Target   netip.AddrPort // server address (a pod IP or a Service ClusterIP)
	Duration time.Duration  // how long to loop; default 3s
	Request  int            // request bytes; default 32 (the server answers with as many)
	Timeout  time.Duration  // per connect and per read; default 2s
	// MaxErrors stops the run early after this many failed connections
	// (default 1000): a dead path should not spin for the whole duration.
	MaxErrors int
}

// Result is what the client prints (one JSON object).
type Result struct {
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

func (c Config) withDefaults() (Config, error) {
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

// Run runs the client loop and returns its result. It fails only on
// bad configuration; connection failures are counted in Errors.
func Run(ctx context.Context, cfg Config) (Result, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return Result{}, err
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	l := newConnLoop(cfg)
	acc := &connAcc{res: Result{Target: cfg.Target.String()}}
	start := time.Now()
	l.run(ctx, cfg.Target, start.Add(cfg.Duration), acc)
	return acc.result(time.Since(start)), nil
}

// connLoop runs connect+request+response+close cycles (blocking system
// calls, on the caller's locked OS thread).
type connLoop struct {
	cfg Config
	tv  unix.Timeval
	req []byte
	buf []byte
}

func newConnLoop(cfg Config) *connLoop {
	return &connLoop{cfg: cfg, tv: unix.NsecToTimeval(cfg.Timeout.Nanoseconds()),
		req: bytes.Repeat([]byte{'x'}, cfg.Request), buf: make([]byte, cfg.Request+1)}
}

// connAcc collects the cycles of one target.
type connAcc struct {
	res                Result
	connectNs, cycleNs []int64
	stopped            bool // ctx ended or MaxErrors
}

// result finishes acc after d of looping.
func (a *connAcc) result(d time.Duration) Result {
	res := a.res
	res.Seconds = d.Seconds()
	res.Conns = len(a.cycleNs)
	if res.Seconds > 0 {
		res.Rate = float64(res.Conns) / res.Seconds
	}
	res.ConnectP50, res.ConnectP99 = percentileUs(a.connectNs, 50), percentileUs(a.connectNs, 99)
	res.CycleP50, res.CycleP99 = percentileUs(a.cycleNs, 50), percentileUs(a.cycleNs, 99)
	return res
}

// run loops cycles to target until deadline (or ctx ends, or MaxErrors);
// it returns the cycles completed.
func (l *connLoop) run(ctx context.Context, target netip.AddrPort, deadline time.Time, acc *connAcc) int {
	done := 0
	for n := 0; !acc.stopped; n++ {
		if n%64 == 0 && ctx.Err() != nil {
			acc.stopped = true
			break
		}
		t0 := time.Now()
		if !t0.Before(deadline) {
			break
		}
		c, err := l.cycle(target)
		if err != nil {
			acc.res.Errors++
			if acc.res.FirstError == "" {
				acc.res.FirstError = err.Error()
			}
			if acc.res.Errors >= l.cfg.MaxErrors {
				acc.stopped = true
			}
			continue
		}
		acc.cycleNs = append(acc.cycleNs, int64(time.Since(t0)))
		acc.connectNs = append(acc.connectNs, int64(c))
		done++
	}
	return done
}

func (l *connLoop) cycle(target netip.AddrPort) (connect time.Duration, err error) {
	family, sa := sockaddr(target)
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	// SO_SNDTIMEO bounds a blocking connect(2), SO_RCVTIMEO the read.
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &l.tv)
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &l.tv)
	t0 := time.Now()
	if err := unix.Connect(fd, sa); err != nil {
		if err == unix.EINTR { // a signal (Go's async preemption): the handshake goes on
			err = awaitConnect(fd, l.cfg.Timeout)
		}
		if err != nil {
			return 0, fmt.Errorf("connect %s: %w", target, err)
		}
	}
	connect = time.Since(t0)
	if _, err := unix.Write(fd, l.req); err != nil {
		return connect, fmt.Errorf("write: %w", err)
	}
	got := 0
	for {
		n, err := unix.Read(fd, l.buf)
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
	if got != l.cfg.Request {
		return connect, fmt.Errorf("got %d response bytes, want %d", got, l.cfg.Request)
	}
	return connect, nil
}

// PairedResult compares two targets measured in alternating time
// slices by one client, in pairs of slices (A then B or B then A, picked at
// random per pair, so a steady drift of the machine cancels out): the ratio
// of A's rate to B's in each pair, and every cycle of each side.
type PairedResult struct {
	A           Result  `json:"a"`
	B           Result  `json:"b"`
	SliceSec    float64 `json:"sliceSec"`
	Pairs       int     `json:"pairs"`       // pairs with cycles on both sides
	RatioMedian float64 `json:"ratioMedian"` // rate(A) / rate(B), median over the pairs
	RatioP25    float64 `json:"ratioP25"`
	RatioP75    float64 `json:"ratioP75"`
	// RatioCILo..RatioCIHi is the 95 % confidence interval of the median
	// ratio (stats.MedianCI; NaN below 8 pairs): how precisely the run pins it.
	RatioCILo float64   `json:"ratioCI95Lo"`
	RatioCIHi float64   `json:"ratioCI95Hi"`
	Ratios    []float64 `json:"ratios,omitempty"` // every pair's ratio, in pair order
}

// RunPaired measures cfg.Target (A) against versus (B) for
// cfg.Duration in alternating slices of about slice. A noisy shared machine
// moves both sides of a pair alike, so the paired ratio is far tighter than
// a ratio of two separately measured rates. from[0] and from[1] say where A
// and B connect from (Place; zero: both from where the process runs), so
// two clients in different pods can be paired too.
//
// The order within a pair is random and each pair's slice length is drawn
// from 0.75–1.25 × slice: with a fixed A B B A pattern of 250 ms slices the
// pattern repeats every second, so anything on the machine that runs once a
// second (agents', kube-proxies' and the control plane's timers) kept
// landing in slices of the same side for a whole run, and runs disagreed by
// more than their spread (10 000 Services: 0.965, 1.029, 1.020).
func RunPaired(ctx context.Context, cfg Config, versus netip.AddrPort, slice time.Duration, from [2]Place) (res PairedResult, err error) {
	cfg, err = cfg.withDefaults()
	if err != nil {
		return PairedResult{}, err
	}
	if !versus.IsValid() || slice <= 0 || slice*2 > cfg.Duration {
		return PairedResult{}, fmt.Errorf("versus %s, slice %s, duration %s: want a versus address and 2 slices within the duration", versus, slice, cfg.Duration)
	}
	runtime.LockOSThread()
	pl, err := newPlacer(from)
	if err != nil {
		runtime.UnlockOSThread()
		return PairedResult{}, err
	}
	defer func() {
		if cerr := pl.close(); cerr != nil {
			// the thread stays locked: it is in a side's netns, and Go
			// ends a locked thread with its goroutine instead of reusing it
			err = errors.Join(err, cerr)
			return
		}
		runtime.UnlockOSThread()
	}()
	l := newConnLoop(cfg)
	acc := [2]*connAcc{{res: Result{Target: cfg.Target.String()}}, {res: Result{Target: versus.String()}}}
	targets := [2]netip.AddrPort{cfg.Target, versus}
	var spent [2]time.Duration
	var ratios []float64
	end := time.Now().Add(cfg.Duration)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0x9e3779b97f4a7c15))
	for pair := 0; time.Now().Add(2*slice).Before(end) || pair == 0; pair++ {
		var rate [2]float64
		order := [2]int{0, 1}
		if rng.IntN(2) == 1 {
			order = [2]int{1, 0}
		}
		length := time.Duration(float64(slice) * (0.75 + 0.5*rng.Float64()))
		for _, i := range order {
			if err := pl.enter(i); err != nil {
				return PairedResult{}, err
			}
			t0 := time.Now()
			n := l.run(ctx, targets[i], t0.Add(length), acc[i])
			d := time.Since(t0)
			spent[i] += d
			rate[i] = float64(n) / d.Seconds()
		}
		if acc[0].stopped || acc[1].stopped {
			break
		}
		if rate[0] > 0 && rate[1] > 0 {
			ratios = append(ratios, rate[0]/rate[1])
		}
	}
	res = PairedResult{A: acc[0].result(spent[0]), B: acc[1].result(spent[1]), SliceSec: slice.Seconds(), Pairs: len(ratios)}
	res.Ratios = slices.Clone(ratios)
	res.RatioMedian, res.RatioP25, res.RatioP75 = stats.Median(ratios), stats.Quantile(ratios, 0.25), stats.Quantile(ratios, 0.75)
	res.RatioCILo, res.RatioCIHi = stats.MedianCI(ratios)
	return res, nil
}

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

// percentileUs returns the p-th percentile (stats.Quantile: linear between
// order statistics) of ns in µs, NaN when empty.
func percentileUs(ns []int64, p float64) float64 {
	us := make([]float64, len(ns))
	for i, n := range ns {
		us[i] = float64(n) / 1e3
	}
	return stats.Quantile(us, p/100)
}

// MarshalJSON writes NaN percentiles (no connection succeeded) as null.
func (r Result) MarshalJSON() ([]byte, error) {
	type plain Result
	type out struct {
		plain
		ConnectP50 *float64 `json:"connectP50Us"`
		ConnectP99 *float64 `json:"connectP99Us"`
		CycleP50   *float64 `json:"cycleP50Us"`
		CycleP99   *float64 `json:"cycleP99Us"`
	}
	return json.Marshal(out{plain(r), jsonnum.From(r.ConnectP50), jsonnum.From(r.ConnectP99), jsonnum.From(r.CycleP50), jsonnum.From(r.CycleP99)})
}

// pairedJSON is PairedResult on the wire: NaN statistics (too few
// pairs) as null.
type pairedJSON struct {
	A           Result    `json:"a"`
	B           Result    `json:"b"`
	SliceSec    float64   `json:"sliceSec"`
	Pairs       int       `json:"pairs"`
	RatioMedian *float64  `json:"ratioMedian"`
	RatioP25    *float64  `json:"ratioP25"`
	RatioP75    *float64  `json:"ratioP75"`
	RatioCILo   *float64  `json:"ratioCI95Lo"`
	RatioCIHi   *float64  `json:"ratioCI95Hi"`
	Ratios      []float64 `json:"ratios,omitempty"`
}

// MarshalJSON writes NaN statistics as null.
func (r PairedResult) MarshalJSON() ([]byte, error) {
	return json.Marshal(pairedJSON{r.A, r.B, r.SliceSec, r.Pairs, jsonnum.From(r.RatioMedian), jsonnum.From(r.RatioP25), jsonnum.From(r.RatioP75),
		jsonnum.From(r.RatioCILo), jsonnum.From(r.RatioCIHi), r.Ratios})
}

// UnmarshalJSON reads null (or, from reports older than the interval, a
// missing) statistic as NaN.
func (r *PairedResult) UnmarshalJSON(data []byte) error {
	var w pairedJSON
	if err := json.Unmarshal(data, &w); err != nil {
		return err
	}
	*r = PairedResult{A: w.A, B: w.B, SliceSec: w.SliceSec, Pairs: w.Pairs, RatioMedian: jsonnum.To(w.RatioMedian),
		RatioP25: jsonnum.To(w.RatioP25), RatioP75: jsonnum.To(w.RatioP75), RatioCILo: jsonnum.To(w.RatioCILo), RatioCIHi: jsonnum.To(w.RatioCIHi), Ratios: w.Ratios}
	return nil
}

// Parse parses the client's JSON output (null percentiles → NaN).
func Parse(data []byte) (Result, error) {
	var raw struct {
		Result
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
		return Result{}, errors.New("connrate printed nothing")
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return Result{}, fmt.Errorf("parse connrate output %q: %w", clip.String(string(data), 200), err)
	}
	if raw.Target == "" {
		return Result{}, fmt.Errorf("connrate output %q has no target", clip.String(string(data), 200))
	}
	r := raw.Result
	r.ConnectP50, r.ConnectP99, r.CycleP50, r.CycleP99 = jsonnum.To(raw.ConnectP50), jsonnum.To(raw.ConnectP99), jsonnum.To(raw.CycleP50), jsonnum.To(raw.CycleP99)
	return r, nil
}

// Serve listens on addr and answers every connection: read one
// request, write as many bytes back, close. It returns when ctx is done
// (the listener is shut down) or on a listen error. ready, when not nil, is
// called once the socket listens.
func Serve(ctx context.Context, addr netip.AddrPort, ready func()) error {
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
		// With a receive timeout set, a signal (Go's async preemption)
		// fails read(2) with EINTR rather than restarting it (signal(7)):
		// read again, or the close below answers the unread request with
		// a reset
		n, err := unix.Read(fd, buf)
		for err == unix.EINTR {
			n, err = unix.Read(fd, buf)
		}
		if err == nil && n > 0 {
			_, _ = unix.Write(fd, buf[:n])
		}
		unix.Close(fd)
	}
}
