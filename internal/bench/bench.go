// Package bench is axon's benchmark runner: single-flow TCP throughput with
// iperf3 and TCP request/response round-trip time with sockperf ping-pong,
// measured on named paths between network namespaces, repetitions interleaved
// across paths, client and server pinned to different CPUs, CPU pressure
// recorded around every measurement. It reports min/median/max per path and the
// ratio of each path's median to the first (reference) path measured in the
// same run, as CSV, Markdown and an SVG chart.
//
// The caller (axon lab bench) owns the namespaces and cgroups; bench only
// starts processes in them with `nsenter --net=<path>` and stops them by PID.
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/axonhq/axon/internal/cpustat"
	"github.com/axonhq/axon/internal/netnsutil"
)

// Endpoint is one side of a path: a process runs in network namespace Netns
// (a path like /run/netns/x; empty means the caller's own namespace), in cgroup
// v2 directory Cgroup (optional), using address IP. A server binds only to IP;
// a client binds its source to IP when it is valid.
type Endpoint struct {
	Name   string
	Netns  string
	Cgroup string
	IP     netip.Addr
}

// Path is a named client→server pair, e.g. "axon pod-to-pod cross-node".
type Path struct {
	Name   string
	Client Endpoint
	Server Endpoint
}

// ToolPaths are the binaries used; empty fields are looked up in PATH.
type ToolPaths struct {
	Iperf3   string
	Sockperf string
	Taskset  string
	Nsenter  string
}

// Config describes one benchmark run. The first path is the reference every
// ratio is computed against (host-to-host for pod-to-pod comparisons).
type Config struct {
	Paths    []Path
	Reps     int           // repetitions per path and metric; default 3
	Duration time.Duration // per measurement, whole seconds (rounded up); default 5s
	// OutDir, when set, receives raw tool outputs under raw/ during the run and
	// the report files (WriteFiles) at the end, also when the run fails part way.
	OutDir   string
	Tools    ToolPaths
	Logger   *slog.Logger // default: discard
	Progress io.Writer    // one human line per measurement; default: none

	// MessageSize is the sockperf message size in bytes; default 64.
	MessageSize int
	// ClientCPU and ServerCPU are the CPUs the client and the server are pinned
	// to with taskset. Both zero means the default: 0 and 1 (0 and 0 on a
	// one-CPU machine). NoPin disables pinning.
	ClientCPU, ServerCPU int
	NoPin                bool
	// IperfPort and SockperfPort are base ports; path i uses base+i.
	// Defaults 5201 and 11111.
	IperfPort, SockperfPort int
}

// Metric names used in Result samples, the CSV and the Markdown.
const (
	MetricThroughput  = "throughput"  // bit/s received, iperf3 end.sum_received
	MetricRetransmits = "retransmits" // count, iperf3 end.sum_sent
	MetricRTTP50      = "rtt_p50"     // µs, sockperf ping-pong --full-rtt
	MetricRTTP99      = "rtt_p99"     // µs
	MetricRTTAvg      = "rtt_avg"     // µs
	// MetricDSACK counts the segments the receiver reported as received twice
	// (DSACK; TcpExt TCPDSACKRecvSegs in the client's netns) during the iperf3
	// run: retransmits that were not needed, because a segment arrived out of
	// order rather than lost.
	MetricDSACK = "dsack_segs"
	// MetricCPUPerGB is the CPU time the transfer cost: busy seconds (user,
	// system, irq, softirq; not steal) of the client's and the server's CPUs
	// (all CPUs when not pinned) during the iperf3 run, per GB (1e9 bytes)
	// received. A path's packet processing runs on those CPUs (softirqs run
	// where the sender and the receiver run), so the ratio of two paths is
	// the ratio of their work per byte, whatever limited their throughput.
	// Anything else that ran on those CPUs is counted too.
	MetricCPUPerGB = "cpu_s_per_gb"
)

// Result holds the samples of one path. Every slice has one entry per
// repetition (index = rep-1); a failed measurement is NaN.
type Result struct {
	Path        string
	Client      Endpoint
	Server      Endpoint
	Throughput  []float64 // bit/s
	Retransmits []float64 // TCP retransmits during the iperf3 run
	DSACKSegs   []float64 // of those, segments the receiver had already (MetricDSACK)
	CPUPerGB    []float64 // CPU seconds per GB received (MetricCPUPerGB)
	RTTP50      []float64 // µs, round-trip time
	RTTP99      []float64 // µs, round-trip time
	RTTAvg      []float64 // µs, round-trip time
	Congestion  string    // TCP congestion control iperf3 reported for the sender
	Errors      []string  // one line per failed measurement or server start
}

// Values returns the samples of one metric (see the Metric constants).
func (r *Result) Values(metric string) []float64 {
	switch metric {
	case MetricThroughput:
		return r.Throughput
	case MetricRetransmits:
		return r.Retransmits
	case MetricDSACK:
		return r.DSACKSegs
	case MetricCPUPerGB:
		return r.CPUPerGB
	case MetricRTTP50:
		return r.RTTP50
	case MetricRTTP99:
		return r.RTTP99
	case MetricRTTAvg:
		return r.RTTAvg
	}
	return nil
}

// Pressure is a reading of /proc/pressure/cpu ("some" line).
type Pressure struct {
	Avg10 float64 // percent; NaN when PSI is unavailable
	Total uint64  // µs stalled since boot
}

// Measurement is one tool run, with the exact commands and CPU pressure.
type Measurement struct {
	Rep        int
	Path       string
	Tool       string // "iperf3" or "sockperf"
	Client     []string
	Server     []string
	Start      time.Time
	Elapsed    time.Duration
	Before     Pressure
	After      Pressure
	StallMicro uint64 // CPU "some" stall time accumulated during the measurement
	Err        string
}

// Host describes the machine the run happened on.
type Host struct {
	Kernel   string
	CPUModel string
	NumCPU   int
	Iperf3   string // version line
	Sockperf string // version line
}

// Report is the outcome of Run.
type Report struct {
	Started      time.Time
	Finished     time.Time
	Reps         int
	Duration     time.Duration
	MessageSize  int
	ClientCPU    int // -1 when not pinned
	ServerCPU    int
	Host         Host
	Reference    string // name of the first path
	Results      []*Result
	Measurements []Measurement
}

// Result returns the result of the named path, or nil.
func (r *Report) Result(path string) *Result {
	for _, res := range r.Results {
		if res.Path == path {
			return res
		}
	}
	return nil
}

// DefaultOutDir returns the conventional results folder for a run started at
// t: <root>/bench-<UTC timestamp>, e.g. results/bench-20261122T043000Z.
func DefaultOutDir(root string, t time.Time) string {
	return filepath.Join(root, "bench-"+t.UTC().Format("20060102T150405Z"))
}

// ErrMissingTool is wrapped by Run's error when a benchmark tool is not installed.
var ErrMissingTool = errors.New("benchmark tool not found")

func (c Config) withDefaults() (Config, error) {
	if c.Reps == 0 {
		c.Reps = 3
	}
	if c.Duration == 0 {
		c.Duration = 5 * time.Second
	}
	if c.MessageSize == 0 {
		c.MessageSize = 64
	}
	if c.IperfPort == 0 {
		c.IperfPort = 5201
	}
	if c.SockperfPort == 0 {
		c.SockperfPort = 11111
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	switch {
	case c.NoPin:
		c.ClientCPU, c.ServerCPU = -1, -1
	case c.ClientCPU == 0 && c.ServerCPU == 0 && runtime.NumCPU() > 1:
		c.ServerCPU = 1
	}
	if c.Reps < 1 {
		return c, fmt.Errorf("reps must be at least 1, got %d", c.Reps)
	}
	if c.Duration < time.Second {
		return c, fmt.Errorf("duration must be at least 1s (iperf3 and sockperf take whole seconds), got %s", c.Duration)
	}
	if c.MessageSize < 14 {
		return c, fmt.Errorf("message size must be at least 14 bytes (sockperf's minimum), got %d", c.MessageSize)
	}
	if len(c.Paths) == 0 {
		return c, errors.New("no paths to measure: give at least one (the first is the reference)")
	}
	if c.IperfPort+len(c.Paths) > 65535 || c.SockperfPort+len(c.Paths) > 65535 || c.IperfPort < 0 || c.SockperfPort < 0 {
		return c, fmt.Errorf("base ports %d/%d leave no room for %d paths", c.IperfPort, c.SockperfPort, len(c.Paths))
	}
	if c.IperfPort < c.SockperfPort+len(c.Paths) && c.SockperfPort < c.IperfPort+len(c.Paths) {
		return c, fmt.Errorf("iperf3 ports %d.. and sockperf ports %d.. overlap for %d paths", c.IperfPort, c.SockperfPort, len(c.Paths))
	}
	seen := map[string]bool{}
	for i, p := range c.Paths {
		if strings.TrimSpace(p.Name) == "" {
			return c, fmt.Errorf("path %d has no name", i)
		}
		if seen[p.Name] {
			return c, fmt.Errorf("path name %q is used twice: names must be unique", p.Name)
		}
		seen[p.Name] = true
		if !p.Server.IP.IsValid() {
			return c, fmt.Errorf("path %q: server has no IP address", p.Name)
		}
		if !p.Server.IP.Unmap().Is4() {
			return c, fmt.Errorf("path %q: server %s is IPv6, but sockperf 3.7 (Debian 12) has no IPv6 support: give IPv4 addresses", p.Name, p.Server.IP)
		}
		if p.Client.IP.IsValid() && p.Client.IP.Unmap().Is4() != p.Server.IP.Unmap().Is4() {
			return c, fmt.Errorf("path %q: client %s and server %s are of different IP families", p.Name, p.Client.IP, p.Server.IP)
		}
		for _, ep := range []struct {
			side string
			e    Endpoint
		}{{"client", p.Client}, {"server", p.Server}} {
			if ep.e.Netns != "" {
				if _, err := os.Stat(ep.e.Netns); err != nil {
					return c, fmt.Errorf("path %q: %s netns: %w", p.Name, ep.side, err)
				}
			}
			if ep.e.Cgroup != "" {
				if st, err := os.Stat(filepath.Join(ep.e.Cgroup, "cgroup.procs")); err != nil || st.IsDir() {
					return c, fmt.Errorf("path %q: %s cgroup %s is not a cgroup v2 directory (no cgroup.procs)", p.Name, ep.side, ep.e.Cgroup)
				}
			}
		}
	}
	var err error
	if c.Tools, err = c.Tools.Resolve(c.NoPin); err != nil {
		return c, err
	}
	return c, nil
}

// Resolve fills empty tool paths from PATH and checks that every tool exists.
func (t ToolPaths) Resolve(noPin bool) (ToolPaths, error) {
	type tool struct {
		name, hint string
		p          *string
	}
	tools := []tool{
		{"iperf3", "run `make deps` (hack/install-packages.sh) to install iperf3", &t.Iperf3},
		{"sockperf", "run `make deps` (hack/install-packages.sh) to install sockperf", &t.Sockperf},
		{"nsenter", "install util-linux", &t.Nsenter},
	}
	if !noPin {
		tools = append(tools, tool{"taskset", "install util-linux", &t.Taskset})
	}
	var errs []error
	for _, tl := range tools {
		name := *tl.p
		if name == "" {
			name = tl.name
		}
		p, err := exec.LookPath(name)
		if err != nil {
			errs = append(errs, fmt.Errorf("%w: %s (%s)", ErrMissingTool, name, tl.hint))
			continue
		}
		*tl.p = p
	}
	return t, errors.Join(errs...)
}

// Run measures every path cfg.Reps times, interleaved (A B C, A B C, ...).
// It returns the report also when some measurements failed: the error then
// joins one line per failure, and the report holds NaN for those samples.
// A nil report means nothing was measured (bad config, missing tools).
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("bench config: %w", err)
	}
	r := &runner{cfg: cfg, log: cfg.Logger}
	rep := &Report{
		Started:     time.Now().UTC(),
		Reps:        cfg.Reps,
		Duration:    cfg.Duration,
		MessageSize: cfg.MessageSize,
		ClientCPU:   cfg.ClientCPU,
		ServerCPU:   cfg.ServerCPU,
		Host:        HostInfo(ctx, cfg.Tools),
		Reference:   cfg.Paths[0].Name,
	}
	if cfg.OutDir != "" {
		if err := os.MkdirAll(filepath.Join(cfg.OutDir, "raw"), 0o755); err != nil {
			return nil, fmt.Errorf("create output dir: %w", err)
		}
	}
	for _, p := range cfg.Paths {
		n := cfg.Reps
		rep.Results = append(rep.Results, &Result{
			Path: p.Name, Client: p.Client, Server: p.Server,
			Throughput: nanSlice(n), Retransmits: nanSlice(n), DSACKSegs: nanSlice(n), CPUPerGB: nanSlice(n),
			RTTP50: nanSlice(n), RTTP99: nanSlice(n), RTTAvg: nanSlice(n),
		})
	}
	runErr := r.run(ctx, rep)
	rep.Finished = time.Now().UTC()
	if cfg.OutDir != "" {
		if err := rep.WriteFiles(cfg.OutDir); err != nil {
			runErr = errors.Join(runErr, err)
		}
	}
	return rep, runErr
}

func nanSlice(n int) []float64 {
	s := make([]float64, n)
	for i := range s {
		s[i] = math.NaN()
	}
	return s
}

type runner struct {
	cfg Config
	log *slog.Logger
}

func (r *runner) secs() string {
	return strconv.Itoa(int(math.Ceil(r.cfg.Duration.Seconds())))
}

// clientTimeout bounds one client run: the duration plus connection set-up,
// sockperf's warm-up and result exchange.
func (r *runner) clientTimeout() time.Duration { return r.cfg.Duration + 20*time.Second }

func (r *runner) run(ctx context.Context, rep *Report) error {
	var errs []error
	fail := func(res *Result, err error) {
		res.Errors = append(res.Errors, err.Error())
		errs = append(errs, fmt.Errorf("%s: %w", res.Path, err))
		r.log.Warn("bench measurement failed", "path", res.Path, "err", err)
	}

	// One long-lived sockperf server per path; iperf3 servers are one-shot.
	sp := make([]*Server, len(r.cfg.Paths))
	defer func() {
		for _, s := range sp {
			if s != nil {
				s.Stop()
			}
		}
	}()

	for n := 1; n <= r.cfg.Reps; n++ {
		for i, p := range r.cfg.Paths {
			if err := ctx.Err(); err != nil {
				return errors.Join(append(errs, fmt.Errorf("benchmark interrupted: %w", err))...)
			}
			res := rep.Results[i]

			m := r.throughput(ctx, n, i, p, res)
			rep.Measurements = append(rep.Measurements, m)
			if m.Err != "" {
				fail(res, fmt.Errorf("rep %d iperf3: %s", n, m.Err))
			}
			if err := ctx.Err(); err != nil {
				return errors.Join(append(errs, fmt.Errorf("benchmark interrupted: %w", err))...)
			}

			if sp[i] == nil || sp[i].Exited() {
				if sp[i] != nil {
					r.log.Warn("sockperf server exited, restarting", "path", p.Name, "err", sp[i].err)
				}
				s, err := StartServer(ctx, p.Server.Cgroup, r.sockperfServerArgv(i, p), p.Server.IP, r.cfg.SockperfPort+i, 5*time.Second)
				sp[i] = s
				if err != nil {
					rep.Measurements = append(rep.Measurements, Measurement{Rep: n, Path: p.Name, Tool: "sockperf",
						Server: r.sockperfServerArgv(i, p), Start: time.Now().UTC(), Err: err.Error()})
					fail(res, fmt.Errorf("rep %d sockperf server: %w", n, err))
					continue
				}
				r.log.Debug("sockperf server started", "path", p.Name, "pid", s.PID())
			}
			m = r.latency(ctx, n, i, p, res)
			rep.Measurements = append(rep.Measurements, m)
			if m.Err != "" {
				fail(res, fmt.Errorf("rep %d sockperf: %s", n, m.Err))
			}
		}
	}
	return errors.Join(errs...)
}

func (r *runner) clientCPU() int { return r.cfg.ClientCPU }
func (r *runner) serverCPU() int { return r.cfg.ServerCPU }

// measuredCPUs are the CPUs whose time MetricCPUPerGB counts: the client's
// and the server's, or all (nil) when the tools are not pinned.
func (r *runner) measuredCPUs() []int { return MeasuredCPUs(r.clientCPU(), r.serverCPU()) }

// MeasuredCPUs are the CPUs whose busy time MetricCPUPerGB counts for a
// client pinned to client and a server pinned to server (-1: not pinned):
// both, one when they are the same, all (nil) when the client is not pinned.
func MeasuredCPUs(client, server int) []int {
	if client < 0 {
		return nil
	}
	if server < 0 || server == client {
		return []int{client}
	}
	return []int{client, server}
}

// CPUSecondsPerGB is MetricCPUPerGB: busy ticks (cpustat, USER_HZ) of the
// measured CPUs over the bytes received, in seconds per GB (1e9 bytes); NaN
// without bytes.
func CPUSecondsPerGB(busyTicks uint64, bytes float64) float64 {
	if !(bytes > 0) {
		return math.NaN()
	}
	return float64(busyTicks) / cpustat.TicksPerSecond / (bytes / 1e9)
}

func (r *runner) iperfServerArgv(i int, p Path) []string {
	return r.cfg.Tools.Wrap(p.Server.Netns, r.serverCPU(), r.cfg.Tools.Iperf3,
		"-s", "-1", "-B", p.Server.IP.String(), "-p", strconv.Itoa(r.cfg.IperfPort+i))
}

func (r *runner) iperfClientArgv(i int, p Path) []string {
	argv := []string{r.cfg.Tools.Iperf3, "-c", p.Server.IP.String(), "-p", strconv.Itoa(r.cfg.IperfPort + i),
		"-t", r.secs(), "-J", "--connect-timeout", "5000"}
	if p.Client.IP.IsValid() {
		argv = append(argv, "-B", p.Client.IP.String())
	}
	return r.cfg.Tools.Wrap(p.Client.Netns, r.clientCPU(), argv...)
}

func (r *runner) sockperfServerArgv(i int, p Path) []string {
	return r.cfg.Tools.Wrap(p.Server.Netns, r.serverCPU(), r.cfg.Tools.Sockperf,
		"server", "--tcp", "-i", p.Server.IP.String(), "-p", strconv.Itoa(r.cfg.SockperfPort+i))
}

func (r *runner) sockperfClientArgv(i int, p Path) []string {
	argv := []string{r.cfg.Tools.Sockperf, "ping-pong", "--tcp", "-i", p.Server.IP.String(),
		"-p", strconv.Itoa(r.cfg.SockperfPort + i), "-t", r.secs(), "-m", strconv.Itoa(r.cfg.MessageSize), "--full-rtt"}
	if p.Client.IP.IsValid() {
		argv = append(argv, "--client_ip", p.Client.IP.String())
	}
	return r.cfg.Tools.Wrap(p.Client.Netns, r.clientCPU(), argv...)
}

// throughput runs one iperf3 measurement with a one-shot server.
func (r *runner) throughput(ctx context.Context, n, i int, p Path, res *Result) Measurement {
	m := Measurement{Rep: n, Path: p.Name, Tool: "iperf3", Server: r.iperfServerArgv(i, p), Client: r.iperfClientArgv(i, p)}
	m.Start = time.Now().UTC()
	srv, err := StartServer(ctx, p.Server.Cgroup, m.Server, p.Server.IP, r.cfg.IperfPort+i, 5*time.Second)
	if err != nil {
		m.Err = err.Error()
		return m
	}
	defer srv.Stop()
	m.Before = ReadPressure()
	dsack0, dsackErr := dsackSegs(p.Client.Netns)
	cpus := r.measuredCPUs()
	busy0, busyErr := cpustat.ReadBusy(cpus)
	t0 := time.Now()
	out, stderr, runErr := RunClient(ctx, p.Client.Cgroup, m.Client, r.clientTimeout())
	m.Elapsed = time.Since(t0)
	busy1, err := cpustat.ReadBusy(cpus)
	busyErr = errors.Join(busyErr, err)
	m.After = ReadPressure()
	dsack1, err := dsackSegs(p.Client.Netns)
	dsackErr = errors.Join(dsackErr, err)
	m.StallMicro = Stall(m.Before, m.After)
	r.saveRaw(n, p.Name, "iperf3.json", out)
	ir, perr := ParseIperfJSON(out)
	switch {
	case perr == nil:
	case runErr != nil:
		m.Err = fmt.Sprintf("%v: %v %s", runErr, perr, strings.TrimSpace(string(stderr)))
		return m
	default:
		m.Err = perr.Error()
		return m
	}
	if !srv.Wait(3 * time.Second) {
		r.log.Debug("iperf3 one-shot server still running after the test; stopping it", "pid", srv.PID())
	}
	res.Throughput[n-1] = ir.BitsPerSecond
	res.Retransmits[n-1] = float64(ir.Retransmits)
	dsack := "n/a"
	if dsackErr == nil {
		res.DSACKSegs[n-1] = float64(dsack1 - dsack0)
		dsack = strconv.FormatUint(dsack1-dsack0, 10)
	} else {
		r.log.Debug("no DSACK count for this run", "path", p.Name, "error", dsackErr)
	}
	cpu := "n/a"
	if busyErr == nil && ir.Bytes > 0 && busy1 >= busy0 {
		res.CPUPerGB[n-1] = CPUSecondsPerGB(busy1-busy0, ir.Bytes)
		cpu = strconv.FormatFloat(res.CPUPerGB[n-1], 'f', 3, 64)
	} else if busyErr != nil {
		r.log.Debug("no CPU time for this run", "path", p.Name, "error", busyErr)
	}
	if ir.Congestion != "" {
		res.Congestion = ir.Congestion
	}
	fmt.Fprintf(r.cfg.Progress, "[rep %d/%d] %-32s iperf3   %8.2f Gbit/s  retr %-6d dsack %-6s CPU s/GB %-6s cpu-psi %.1f→%.1f%%\n",
		n, r.cfg.Reps, p.Name, ir.BitsPerSecond/1e9, ir.Retransmits, dsack, cpu, m.Before.Avg10, m.After.Avg10)
	return m
}

// latency runs one sockperf ping-pong against the path's long-lived server.
func (r *runner) latency(ctx context.Context, n, i int, p Path, res *Result) Measurement {
	m := Measurement{Rep: n, Path: p.Name, Tool: "sockperf", Server: r.sockperfServerArgv(i, p), Client: r.sockperfClientArgv(i, p)}
	m.Start = time.Now().UTC()
	m.Before = ReadPressure()
	t0 := time.Now()
	out, stderr, runErr := RunClient(ctx, p.Client.Cgroup, m.Client, r.clientTimeout())
	m.Elapsed = time.Since(t0)
	m.After = ReadPressure()
	m.StallMicro = Stall(m.Before, m.After)
	r.saveRaw(n, p.Name, "sockperf.txt", append(out, stderr...))
	sr, perr := ParseSockperf(append(out, stderr...))
	if perr == nil && !sr.RTT {
		perr = errors.New("sockperf printed one-way latency, not round-trip time: --full-rtt was not honoured")
	}
	var p50, p99 float64
	if perr == nil {
		p50, perr = sr.P(50)
	}
	if perr == nil {
		p99, perr = sr.P(99)
	}
	if perr != nil {
		if runErr != nil {
			m.Err = fmt.Sprintf("%v: %v", runErr, perr)
		} else {
			m.Err = perr.Error()
		}
		return m
	}
	res.RTTP50[n-1], res.RTTP99[n-1], res.RTTAvg[n-1] = p50, p99, sr.Avg
	fmt.Fprintf(r.cfg.Progress, "[rep %d/%d] %-32s sockperf RTT p50 %7.2f µs  p99 %7.2f µs  cpu-psi %.1f→%.1f%%\n",
		n, r.cfg.Reps, p.Name, p50, p99, m.Before.Avg10, m.After.Avg10)
	return m
}

func (r *runner) saveRaw(n int, path, suffix string, data []byte) {
	if r.cfg.OutDir == "" {
		return
	}
	name := filepath.Join(r.cfg.OutDir, "raw", fmt.Sprintf("rep%d-%s-%s", n, Slug(path), suffix))
	if err := os.WriteFile(name, data, 0o644); err != nil {
		r.log.Warn("save raw tool output", "file", name, "err", err)
	}
}

// Slug turns a path name into a file-name-safe word.
func Slug(s string) string {
	var b strings.Builder
	dash := false
	for _, c := range strings.ToLower(s) {
		if (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') {
			b.WriteRune(c)
			dash = false
		} else if !dash && b.Len() > 0 {
			b.WriteByte('-')
			dash = true
		}
	}
	return strings.TrimSuffix(b.String(), "-")
}

func ReadPressure() Pressure {
	data, err := os.ReadFile("/proc/pressure/cpu")
	if err != nil {
		return Pressure{Avg10: math.NaN()}
	}
	avg, total, err := ParsePressure(data)
	if err != nil {
		return Pressure{Avg10: math.NaN()}
	}
	return Pressure{Avg10: avg, Total: total}
}

func Stall(before, after Pressure) uint64 {
	if after.Total < before.Total {
		return 0
	}
	return after.Total - before.Total
}

// HostInfo records kernel, CPU and tool versions.
func HostInfo(ctx context.Context, t ToolPaths) Host {
	h := Host{NumCPU: runtime.NumCPU()}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		h.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				h.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	version := func(bin string) string {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		out, _ := exec.CommandContext(ctx, bin, "--version").CombinedOutput()
		first, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
		return strings.TrimSpace(first)
	}
	h.Iperf3 = version(t.Iperf3)
	h.Sockperf = version(t.Sockperf)
	return h
}

// dsackSegs reads TcpExt TCPDSACKRecvSegs in the network namespace at netns
// ("" for ours): segments a receiver reported as received twice.
func dsackSegs(netns string) (uint64, error) {
	return netnsutil.ReadNetCounter(netns, "netstat", "TcpExt", "TCPDSACKRecvSegs")
}

// LoadAvg is /proc/loadavg's first three fields ("1.02 0.98 0.91"; "n/a"
// when unreadable): the machine's load beside a run's numbers.
func LoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "n/a"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}
