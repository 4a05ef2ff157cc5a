// Package bypass is the benchmark of the same-node TCP bypass (`axon lab
// bench sockmap`): two pods on one lab node, qperf tcp_lat (one-way latency,
// half the round trip) and tcp_bw (throughput, and the CPU seconds per GB of
// the two CPUs the client and the server are pinned to) at message sizes
// 1 B..16 KiB, with the bypass and without it (the TCP stack). Both arms are
// measured back to back for every test and size in every repetition, the
// order alternating, so each repetition gives one paired ratio
// bypass/stack; the report gives the median ratio with its 95 % interval
// against the feature's targets.
//
// The bypass is switched through the product (the pods' axon.io/sockmap
// annotation, which the agent applies) or, where the agent keeps the
// bypass off (its kernel self-test failed), by loading the same programs
// (internal/datapath/sockmap) on the node's cgroup root itself. qperf
// connects anew for every measurement, and new connections follow the
// switch.
package bypass

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
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/axonhq/axon/internal/bench"
	"github.com/axonhq/axon/internal/cpustat"
	"github.com/axonhq/axon/internal/lab"
	"github.com/axonhq/axon/internal/netnsutil"
)

// Arms, tests and attach modes.
const (
	ArmStack  = "stack"  // the pods' connections take the TCP/IP stack
	ArmBypass = "bypass" // the pods' connections are in the SOCKHASH

	TestLat = "tcp_lat" // one-way latency, µs (qperf: half the round trip)
	TestBW  = "tcp_bw"  // throughput, bit/s

	AttachAgent  = "agent"  // the agent's bypass, switched by the pods' annotation
	AttachDirect = "direct" // the bench loads the bypass itself
)

// DefaultSizes are the message sizes measured by default, in bytes.
var DefaultSizes = []int{1, 4, 16, 64, 256, 1024, 4096, 16384}

// DefaultTests are the qperf tests measured by default, in order.
var DefaultTests = []string{TestLat, TestBW}

// Bench pod names.
const (
	ClientPod = "bench-sockmap-c"
	ServerPod = "bench-sockmap-s"
)

// qperfPort is qperf's control (listen) port in the server pod.
const qperfPort = 19765

// Config describes one run.
type Config struct {
	Lab      *lab.Lab
	Node     string        // lab node of the two pods; default the first
	Attach   string        // AttachAgent (default) or AttachDirect
	Reps     int           // repetitions; default 8
	Duration time.Duration // qperf -t per measurement, whole seconds; default 3s
	Sizes    []int         // message sizes, bytes; default DefaultSizes (DefaultChainSizes with Chain)
	// BWSizes are the sizes tcp_bw is measured at (tcp_lat: Sizes); default
	// Sizes (DefaultChainBWSizes with Chain). Each must be one of Sizes.
	BWSizes []int
	Tests   []string // default DefaultTests
	// Chain puts an HAProxy sidecar in each pod, wired as a mesh wires its
	// proxy (chain.go): the arms are the chain with the bypass and without.
	Chain bool
	// ClientCPU and ServerCPU are the CPUs the qperf client and server are
	// pinned to; both 0 means 0 and 1.
	ClientCPU, ServerCPU int
	OutDir               string    // results.{csv,md,json}, rewritten after every repetition
	Progress             io.Writer // one line per measurement
	KeepPods             bool
	Command              string // the command line, for the report
	Log                  *slog.Logger
	// AgentWait bounds the wait for the agent to apply an annotation; default 30s.
	AgentWait time.Duration
}

func (c Config) withDefaults() (Config, error) {
	if c.Lab == nil {
		return c, errors.New("no lab: bring one up first (axon lab up --nodes 1)")
	}
	nodes := c.Lab.Nodes()
	if len(nodes) == 0 {
		return c, errors.New("the lab has no nodes")
	}
	if c.Node == "" {
		c.Node = nodes[0].Name
	}
	if c.Attach == "" {
		c.Attach = AttachAgent
	}
	if c.Attach != AttachAgent && c.Attach != AttachDirect {
		return c, fmt.Errorf("--attach %q: want %s or %s", c.Attach, AttachAgent, AttachDirect)
	}
	if c.Reps == 0 {
		c.Reps = 8
	}
	if c.Reps < 1 {
		return c, fmt.Errorf("reps must be at least 1, got %d", c.Reps)
	}
	if c.Duration == 0 {
		c.Duration = 3 * time.Second
	}
	if c.Duration < time.Second {
		return c, fmt.Errorf("duration must be at least 1s (qperf -t takes whole seconds), got %s", c.Duration)
	}
	if err := c.sizeDefaults(); err != nil {
		return c, err
	}
	if len(c.Tests) == 0 {
		c.Tests = DefaultTests
	}
	for _, t := range c.Tests {
		if t != TestLat && t != TestBW {
			return c, fmt.Errorf("test %q: want %s or %s", t, TestLat, TestBW)
		}
	}
	if c.ClientCPU == 0 && c.ServerCPU == 0 {
		c.ServerCPU = 1
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.AgentWait == 0 {
		c.AgentWait = 30 * time.Second
	}
	return c, nil
}

// sizeDefaults fills in and checks Sizes and BWSizes.
func (c *Config) sizeDefaults() error {
	if len(c.Sizes) == 0 {
		c.Sizes = DefaultSizes
		if c.Chain {
			c.Sizes = DefaultChainSizes
		}
	}
	if len(c.BWSizes) == 0 {
		c.BWSizes = c.Sizes
		if c.Chain && slices.Equal(c.Sizes, DefaultChainSizes) {
			c.BWSizes = DefaultChainBWSizes
		}
	}
	for _, s := range c.BWSizes {
		if !slices.Contains(c.Sizes, s) {
			return fmt.Errorf("throughput size %d is not one of the message sizes %v", s, c.Sizes)
		}
	}
	for _, s := range c.Sizes {
		if s < 1 || s > 1<<20 {
			return fmt.Errorf("message size %d: want 1 B..1 MiB", s)
		}
	}
	return nil
}

// Sample is one qperf measurement of one arm.
type Sample struct {
	Rep   int    `json:"rep"`
	Test  string `json:"test"`
	Size  int    `json:"size"`
	Arm   string `json:"arm"`
	First bool   `json:"first"` // measured first of its pair
	// Value: tcp_lat one-way latency in µs, tcp_bw throughput in bit/s; NaN
	// when the measurement failed.
	Value float64 `json:"-"`
	// CPUPerGB (tcp_bw): busy seconds of the client's and the server's CPUs
	// per GB received (bench.CPUSecondsPerGB).
	CPUPerGB  float64 `json:"-"`
	RecvBytes float64 `json:"recvBytes"`
	// Counters are the bypass's counters that moved during the measurement
	// (redirect_bytes, pass_bytes, admit_pod, skip_not_pod, ...).
	Counters  map[string]uint64 `json:"counters,omitempty"`
	PSIBefore float64           `json:"-"`
	PSIAfter  float64           `json:"-"`
	// Hops (Chain): the pods' established sockets halfway through the
	// measurement, by hop, with what the SOCKHASH held of them.
	Hops []HopSocket `json:"hops,omitempty"`
	// HopsErr says why Hops is missing.
	HopsErr string `json:"hopsError,omitempty"`
	Err     string `json:"error,omitempty"`
}

// Run measures. It returns the report also when measurements failed (their
// values NaN, the error joining one line each); a nil report means nothing
// was measured.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("sockmap bench: %w", err)
	}
	tools := map[string]string{}
	need := []string{"qperf", "nsenter", "taskset"}
	if cfg.Chain {
		need = append(need, "haproxy", "iptables")
	}
	for _, t := range need {
		p, err := lookPath(t)
		if err != nil {
			return nil, fmt.Errorf("sockmap bench: %s not found: run `make deps` (hack/install-packages.sh): %w", t, err)
		}
		tools[t] = p
	}
	st := cfg.Lab.State()
	node, ok := st.Node(cfg.Node)
	if !ok {
		return nil, fmt.Errorf("sockmap bench: no node %q in the lab", cfg.Node)
	}
	if node.Agent == nil {
		return nil, fmt.Errorf("sockmap bench: node %s runs no axon-agent (the lab's datapath is not axon): axon lab up --datapath axon", node.Name)
	}
	agentc, err := cfg.Lab.Agent(node.Name)
	if err != nil {
		return nil, fmt.Errorf("sockmap bench: %w", err)
	}
	status, err := agentc.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("sockmap bench: status of the agent on %s: %w", node.Name, err)
	}
	agentOn, agentWhy := false, "this agent has no same-node TCP bypass"
	if sm := status.Sockmap; sm != nil {
		agentOn, agentWhy = sm.Enabled, sm.Reason
	}
	switch {
	case cfg.Attach == AttachAgent && !agentOn:
		return nil, fmt.Errorf("sockmap bench: the agent on %s keeps the same-node TCP bypass off (%s): measure with --attach direct, which loads the same programs itself", node.Name, agentWhy)
	case cfg.Attach == AttachDirect && agentOn:
		return nil, fmt.Errorf("sockmap bench: the agent on %s has the same-node TCP bypass on: measure with --attach agent (a second copy of the programs on the same cgroup would make the measurement ambiguous)", node.Name)
	}

	rep := &Report{Started: time.Now().UTC(), Command: cfg.Command, Node: node.Name, Attach: cfg.Attach,
		Reps: cfg.Reps, Duration: cfg.Duration, Sizes: cfg.Sizes, BWSizes: cfg.BWSizes, Tests: cfg.Tests,
		ClientCPU: cfg.ClientCPU, ServerCPU: cfg.ServerCPU, Host: bench.HostInfo(ctx, bench.ToolPaths{}),
		Qperf: qperfVersion(ctx, tools["qperf"]), LoadStart: bench.LoadAvg(), PSIStart: bench.ReadPressure().Avg10}
	if cfg.Attach == AttachDirect {
		rep.AttachReason = "the agent keeps the bypass off: " + agentWhy
	}
	progress := func(format string, args ...any) { fmt.Fprintf(cfg.Progress, format+"\n", args...) }

	pods, cleanupPods, err := addPods(ctx, cfg.Lab, node.Name, cfg.KeepPods)
	defer cleanupPods()
	if err != nil {
		return nil, fmt.Errorf("sockmap bench: %w", err)
	}
	client, server := pods[0], pods[1]
	rep.Client, rep.Server = PodRef{client.Name, client.IP.String()}, PodRef{server.Name, server.IP.String()}

	var sw switcher
	if cfg.Attach == AttachDirect {
		ds, verdict, err := loadDirect(ctx, node.Name, node.Cgroup, pods, cfg.Log)
		if err != nil {
			return nil, fmt.Errorf("sockmap bench: --attach direct: %w", err)
		}
		rep.AttachDetail = fmt.Sprintf("internal/datapath/sockmap loaded by the bench on %s (pins %s); %s", node.Cgroup, ds.pinDir, verdict)
		sw = ds
	} else {
		kube, err := cfg.Lab.Kube()
		if err != nil {
			return nil, fmt.Errorf("sockmap bench: %w", err)
		}
		sw = &agentSwitch{kube: kube, agent: agentc, pods: pods, wait: cfg.AgentWait}
		rep.AttachDetail = fmt.Sprintf("the agent on %s, switched by the pods' annotation", node.Name)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := sw.close(cctx); err != nil {
			progress("sockmap bench: undo the %s attach: %v", cfg.Attach, err)
		}
	}()
	progress("sockmap bench: %s ↔ %s on %s, bypass attached by %s; %d reps × %d sizes × %v × 2 arms × %s",
		client.Name, server.Name, node.Name, cfg.Attach, cfg.Reps, len(cfg.Sizes), cfg.Tests, cfg.Duration)

	var ch *chain
	if cfg.Chain {
		ch, err = startChain(ctx, tools, client, server, cfg.ClientCPU, cfg.ServerCPU)
		if err != nil {
			return nil, fmt.Errorf("sockmap bench: %w", err)
		}
		defer func() {
			if err := ch.stop(); err != nil {
				progress("sockmap bench: undo the sidecar chain: %v", err)
			}
		}()
		rep.Chain = &ch.info
		ch.info.OrigDst, err = ch.checkOrigDst(ctx)
		if err != nil {
			return nil, fmt.Errorf("sockmap bench: %w", err)
		}
		progress("sockmap bench: sidecar chain up (HAProxy in both pods, nat REDIRECT to %d and %d); original destination kept: %d ports checked",
			OutboundPort, InboundPort, len(ch.info.OrigDst))
	}

	srv, srvArgv, err := startServer(ctx, cfg, tools, server)
	if err != nil {
		return nil, fmt.Errorf("sockmap bench: %w", err)
	}
	defer srv.Stop()
	rep.ServerCmd = bench.ShellQuote(srvArgv)

	r := &runner{cfg: cfg, tools: tools, sw: sw, client: client, server: server, chain: ch}
	var errs []error
	pair := 0
	for n := 1; n <= cfg.Reps; n++ {
		for _, size := range cfg.Sizes {
			for _, test := range cfg.Tests {
				if test == TestBW && !slices.Contains(cfg.BWSizes, size) {
					continue
				}
				arms := []string{ArmStack, ArmBypass}
				if (n+pair)%2 == 0 { // alternate per pair and per repetition
					arms[0], arms[1] = arms[1], arms[0]
				}
				pair++
				for j, arm := range arms {
					if err := ctx.Err(); err != nil {
						rep.Finished = time.Now().UTC()
						return rep, errors.Join(append(errs, fmt.Errorf("benchmark interrupted: %w", err))...)
					}
					s := r.measure(ctx, n, test, size, arm, j == 0)
					rep.Samples = append(rep.Samples, s)
					if s.Err != "" {
						errs = append(errs, fmt.Errorf("rep %d %s %d B %s: %s", n, test, size, arm, s.Err))
					}
					progress("%s", s.line(cfg.Reps))
				}
			}
		}
		if rep.ClientCmd == "" {
			rep.ClientCmd = bench.ShellQuote(r.clientArgvOf("TEST", "SIZE")) // shape of every client run
		}
		rep.Finished, rep.LoadEnd, rep.PSIEnd = time.Now().UTC(), bench.LoadAvg(), bench.ReadPressure().Avg10
		if cfg.OutDir != "" {
			if err := rep.WriteFiles(cfg.OutDir); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return rep, errors.Join(errs...)
}

// addPods (re)creates the client and the server pod on node; cleanup
// removes them unless keep.
func addPods(ctx context.Context, l *lab.Lab, node string, keep bool) ([]lab.Pod, func(), error) {
	var pods []lab.Pod
	cleanup := func() {
		if keep {
			return
		}
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, p := range pods {
			if err := l.DeletePod(cctx, p.Name); err != nil {
				fmt.Fprintf(os.Stderr, "sockmap bench: remove pod %s: %v\n", p.Name, err)
			}
		}
	}
	existing := map[string]bool{}
	for _, p := range l.Pods() {
		existing[p.Name] = true
	}
	for _, name := range []string{ClientPod, ServerPod} {
		if existing[name] { // left by an interrupted run or --keep-pods
			if err := l.DeletePod(ctx, name); err != nil {
				return pods, cleanup, fmt.Errorf("remove stale bench pod %s: %w", name, err)
			}
		}
		p, err := l.AddPod(ctx, node, name, lab.DatapathAxon)
		if err != nil {
			return pods, cleanup, fmt.Errorf("add bench pod %s on %s: %w", name, node, err)
		}
		if !p.IP.Is4() {
			pods = append(pods, p)
			return pods, cleanup, fmt.Errorf("bench pod %s has no IPv4 address (%s)", name, p.IP)
		}
		pods = append(pods, p)
	}
	return pods, cleanup, nil
}

// startServer starts the long-lived qperf server in the server pod (it
// forks a child per client run) and waits until it listens (qperf binds the
// dual-stack wildcard): through the sidecar chain a client that comes too
// early is not refused but cut by the server proxy, which qperf does not
// retry.
func startServer(ctx context.Context, cfg Config, tools map[string]string, pod lab.Pod) (*bench.Server, []string, error) {
	argv := []string{tools["nsenter"], "--net=" + netnsutil.Path(pod.Netns), tools["taskset"], "-c", strconv.Itoa(cfg.ServerCPU),
		tools["qperf"], "--listen_port", strconv.Itoa(qperfPort)}
	srv, err := bench.StartServer(context.WithoutCancel(ctx), pod.Cgroup, argv, netip.IPv6Unspecified(), qperfPort, 10*time.Second)
	if err != nil {
		return nil, nil, fmt.Errorf("the qperf server: %w", err)
	}
	return srv, argv, nil
}

type runner struct {
	cfg            Config
	tools          map[string]string
	sw             switcher
	client, server lab.Pod
	chain          *chain // nil without Chain
}

func (r *runner) clientArgv(test string, size int) []string {
	return r.clientArgvOf(test, strconv.Itoa(size))
}

// clientArgvOf is clientArgv with the size as text ("SIZE" for the report).
func (r *runner) clientArgvOf(test, size string) []string {
	return []string{r.tools["nsenter"], "--net=" + netnsutil.Path(r.client.Netns), r.tools["taskset"], "-c", strconv.Itoa(r.cfg.ClientCPU),
		r.tools["qperf"], r.server.IP.String(), "--listen_port", strconv.Itoa(qperfPort),
		"-t", strconv.Itoa(int(math.Ceil(r.cfg.Duration.Seconds()))), "-m", size,
		"-uu", "-v", "-vvs", test}
}

// measure switches to arm and runs one qperf client.
func (r *runner) measure(ctx context.Context, n int, test string, size int, arm string, first bool) (s Sample) {
	s = Sample{Rep: n, Test: test, Size: size, Arm: arm, First: first, Value: math.NaN(), CPUPerGB: math.NaN(),
		PSIBefore: math.NaN(), PSIAfter: math.NaN()}
	if r.chain != nil {
		if err := r.chain.quiesce(ctx, 5*time.Second); err != nil {
			s.Err = err.Error()
			return s
		}
	}
	if err := r.sw.set(ctx, arm); err != nil {
		s.Err = err.Error()
		return s
	}
	c0, err := r.sw.counters(ctx)
	if err != nil {
		s.Err = err.Error()
		return s
	}
	if r.chain != nil {
		if err := r.chain.alive(); err != nil {
			s.Err = err.Error()
			return s
		}
		// halfway through, the chain's sockets and what the SOCKHASH holds
		// of them (they leave the map when qperf closes them)
		type snap struct {
			hops []HopSocket
			err  error
		}
		snapc := make(chan snap, 1)
		sctx, cancel := context.WithCancel(ctx)
		defer func() {
			cancel()
			if x := <-snapc; x.err != nil {
				s.HopsErr = x.err.Error()
			} else {
				s.Hops = x.hops
			}
		}()
		go func() {
			select {
			case <-sctx.Done():
				snapc <- snap{err: errors.New("the measurement ended before it was taken")}
				return
			case <-time.After(r.cfg.Duration / 2):
			}
			h, err := r.chain.snapshot(sctx, r.sw)
			snapc <- snap{h, err}
		}()
	}
	cpus := bench.MeasuredCPUs(r.cfg.ClientCPU, r.cfg.ServerCPU)
	before := bench.ReadPressure()
	busy0, busyErr := cpustat.ReadBusy(cpus)
	// A fresh server may not listen yet, and qperf's "failed to connect"
	// comes at once: retry that for a few seconds.
	var out, stderr []byte
	var runErr error
	for deadline := time.Now().Add(5 * time.Second); ; {
		out, stderr, runErr = bench.RunClient(ctx, r.client.Cgroup, r.clientArgv(test, size), r.cfg.Duration+30*time.Second)
		if runErr == nil || !strings.Contains(string(out)+string(stderr), "failed to connect") || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
		busy0, busyErr = cpustat.ReadBusy(cpus)
	}
	busy1, err := cpustat.ReadBusy(cpus)
	busyErr = errors.Join(busyErr, err)
	after := bench.ReadPressure()
	s.PSIBefore, s.PSIAfter = before.Avg10, after.Avg10
	c1, err := r.sw.counters(ctx)
	if err == nil {
		s.Counters = counterDeltas(c0, c1)
	} else {
		s.Err = err.Error()
	}
	res, perr := bench.ParseQperf(append(out, stderr...))
	switch {
	case perr != nil && runErr != nil:
		s.Err = fmt.Sprintf("qperf: %v: %v", runErr, perr)
		return s
	case perr != nil:
		s.Err = perr.Error()
		return s
	case len(res) != 1 || res[0].Test != test:
		s.Err = fmt.Sprintf("qperf printed %d results, want one of %s", len(res), test)
		return s
	}
	q := res[0]
	if test == TestLat {
		s.Value = q.LatencyNs / 1e3
	} else {
		s.Value = q.BytesPerSec * 8
		s.RecvBytes = q.RecvBytes
		if s.RecvBytes == 0 {
			s.RecvBytes = q.BytesPerSec * q.Seconds
		}
		if busyErr == nil && busy1 >= busy0 {
			s.CPUPerGB = bench.CPUSecondsPerGB(busy1-busy0, s.RecvBytes)
		}
	}
	return s
}

// lookPath finds a tool in PATH, or in /usr/sbin (haproxy, iptables) when
// PATH lacks it.
func lookPath(name string) (string, error) {
	p, err := exec.LookPath(name)
	if err == nil {
		return p, nil
	}
	if p := filepath.Join("/usr/sbin", name); isExecutable(p) {
		return p, nil
	}
	return "", err
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// counterDeltas are the counters that moved from before to after.
func counterDeltas(before, after map[string]uint64) map[string]uint64 {
	d := map[string]uint64{}
	for k, v := range after {
		if v > before[k] {
			d[k] = v - before[k]
		}
	}
	return d
}

// line is the progress line of one sample.
func (s Sample) line(reps int) string {
	head := fmt.Sprintf("[rep %d/%d] %-7s %6s %-6s", s.Rep, reps, s.Test, sizeName(s.Size), s.Arm)
	if s.Err != "" {
		return head + "  FAILED: " + s.Err
	}
	val := fmt.Sprintf("%8.2f µs", s.Value)
	if s.Test == TestBW {
		val = fmt.Sprintf("%8.1f Mbit/s  CPU %s s/GB", s.Value/1e6, bench.FormatNum(s.CPUPerGB, 2))
	}
	return fmt.Sprintf("%s  %s  redirect_bytes +%d  pass_bytes +%d  cpu-psi %.1f→%.1f%%", head, val,
		s.Counters["redirect_bytes"], s.Counters["pass_bytes"], s.PSIBefore, s.PSIAfter)
}

// sizeName renders 16384 as 16K, 1024 as 1K, 64 as 64.
func sizeName(n int) string {
	if n >= 1024 && n%1024 == 0 {
		return strconv.Itoa(n/1024) + "K"
	}
	return strconv.Itoa(n)
}

func qperfVersion(ctx context.Context, qperf string) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out, _ := exec.CommandContext(ctx, qperf, "--version").CombinedOutput()
	first, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return strings.TrimSpace(first)
}
