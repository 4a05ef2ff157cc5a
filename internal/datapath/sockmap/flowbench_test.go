package sockmap

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"

	"github.com/axonhq/axon/internal/bench"
	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/stats"
	"github.com/axonhq/axon/internal/testutil"
)

// TestFlowBench measures the bypass against the stack with qperf (tcp_bw
// and tcp_lat, 1 B..16 KiB by default) between two pod namespaces joined by
// a veth pair, client and server in the test cgroup on CPUs 0 and 1. Each
// arm is one way of carrying the connection:
//
//	stack      the pods withdrawn: plain TCP over the veth pair
//	bypass     the programs as the agent loads them here (axon_sk_msg, the
//	           stream verdict attached, the mode machine's callbacks)
//	noverdict  the same without the stream verdict
//	bare       the least a bypass can be: sockops as in bypass, but on the
//	           map a 16-instruction sk_msg (bareSkMsg: the state's peer
//	           key, one redirect, SK_PASS) and no stream verdict
//	unbounded  bypass without the back-pressure bound (cfg_backlog_max at
//	           its largest: a reader's unread redirected bytes are never
//	           bounded, so the writer never switches to the stack): the
//	           ceiling any resume of a back-pressure-switched writer could
//	           reach; memory grows without limit while the reader lags
//	pipe       no TCP at all (tcp_lat only): perf bench sched pipe, two
//	           processes passing a word through two pipes, half its round
//	           trip: the cost of waking a blocked process and the syscalls,
//	           the floor of any hand-off between two blocking processes
//	           (on the client's CPU when client and server share one, else
//	           on both CPUs, unpinned)
//
// The arms switch by admitting or withdrawing the two pods and by attaching
// the arm's sk_msg program and stream verdict to the SOCKHASH (qperf
// connects anew for every run, and a socket takes the map's programs when
// it enters). Every arm runs back to back for every size in each round, the
// order rotating from round to round; the report is each arm's median, the
// median of its per-round ratios to the stack with their 95 % interval
// (stats.MedianCI, 9 rounds or more; min–max below), the counters the
// bypass arms moved and the TCP segments each arm sent per second (both
// namespaces: what the mode machine's per-segment callback runs on).
// A benchmark for a quiet machine: runs with AXON_SOCKMAP_FLOW_BENCH=1;
// AXON_SOCKMAP_FLOW_BENCH_ROUNDS (default 5), _SECONDS (qperf -t, default
// 1), _SIZES (comma-separated bytes), _TESTS (tcp_bw,tcp_lat), _ARMS
// (default stack,bypass; any of the others), _CPUS (client,server CPUs,
// default 0,1; 0,0 puts both on one CPU) change it. _VERDICT=0 drops the
// stream verdict from the bypass arm (as noverdict).
func TestFlowBench(t *testing.T) {
	if os.Getenv("AXON_SOCKMAP_FLOW_BENCH") != "1" {
		t.Skip("qperf benchmark of the bypass against the stack: runs with AXON_SOCKMAP_FLOW_BENCH=1")
	}
	rounds := testutil.EnvInt(t, "AXON_SOCKMAP_FLOW_BENCH_ROUNDS", 5)
	secs := testutil.EnvInt(t, "AXON_SOCKMAP_FLOW_BENCH_SECONDS", 1)
	sizes := []int{1, 4, 16, 64, 256, 1024, 4096, 16384}
	if v := os.Getenv("AXON_SOCKMAP_FLOW_BENCH_SIZES"); v != "" {
		sizes = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 {
				t.Fatalf("AXON_SOCKMAP_FLOW_BENCH_SIZES: %q is not a size in bytes", f)
			}
			sizes = append(sizes, n)
		}
	}
	tests := []string{"tcp_bw", "tcp_lat"}
	if v := os.Getenv("AXON_SOCKMAP_FLOW_BENCH_TESTS"); v != "" {
		tests = strings.Split(v, ",")
	}
	arms := []string{"stack", "bypass"}
	if v := os.Getenv("AXON_SOCKMAP_FLOW_BENCH_ARMS"); v != "" {
		arms = []string{"stack"}
		for _, a := range strings.Split(v, ",") {
			switch a = strings.TrimSpace(a); a {
			case "stack":
			case "bypass", "noverdict", "bare", "unbounded", "pipe":
				arms = append(arms, a)
			default:
				t.Fatalf("AXON_SOCKMAP_FLOW_BENCH_ARMS: %q is not an arm (stack, bypass, noverdict, bare, unbounded, pipe)", a)
			}
		}
	}
	cpus := [2]string{"0", "1"}
	if v := os.Getenv("AXON_SOCKMAP_FLOW_BENCH_CPUS"); v != "" {
		f := strings.Split(v, ",")
		if len(f) != 2 {
			t.Fatalf("AXON_SOCKMAP_FLOW_BENCH_CPUS=%q: want client,server (e.g. 0,1 or 0,0)", v)
		}
		for i := range f {
			if _, err := strconv.Atoi(f[i]); err != nil {
				t.Fatalf("AXON_SOCKMAP_FLOW_BENCH_CPUS=%q: %q is not a CPU number", v, f[i])
			}
			cpus[i] = f[i]
		}
	}
	qperf, err := lookTool("qperf", "nsenter", "taskset")
	if err != nil {
		t.Skip(err)
	}

	verdict := os.Getenv("AXON_SOCKMAP_FLOW_BENCH_VERDICT") != "0"
	b, _, cg, _ := loadTest(t, Config{StreamVerdict: verdict})
	bare, err := bareSkMsg(b.ops.AxonSockmapState, b.ops.AxonSockHash)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bare.Close() })
	unbounded, err := unboundedSkMsg(b)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unbounded.Close() })
	n := newPodNet(t)
	setArm := func(arm string) {
		for ip, ns := range map[netip.Addr]uint64{n.podA: n.ca, n.podB: n.cb} {
			var err error
			if arm != "stack" {
				err = b.SetPod(ip, ns)
			} else {
				err = b.DeletePod(ip)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		prog := b.msg.AxonSkMsg
		switch arm {
		case "bare":
			prog = bare
		case "unbounded":
			prog = unbounded.AxonSkMsg
		}
		if err := link.RawAttachProgram(link.RawAttachProgramOptions{
			Target: b.ops.AxonSockHash.FD(), Program: prog, Attach: ebpf.AttachSkMsgVerdict,
		}); err != nil {
			t.Fatalf("attach the %s arm's sk_msg program: %v", arm, err)
		}
		if err := attachStreamVerdict(b.ops.AxonSockHash, b.msg.AxonSkSkbPass, (arm == "bypass" || arm == "unbounded") && verdict); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	startQperfServer(t, ctx, cg, qperf, n.b, cpus[1], "19765")

	pipeFloor := func() (float64, error) {
		pin := cpus[0]
		if cpus[0] != cpus[1] {
			pin = cpus[0] + "," + cpus[1]
		}
		out, err := exec.Command(qperf["taskset"], "-c", pin, "perf", "bench", "sched", "pipe", "-l", strconv.Itoa(20000*secs)).CombinedOutput()
		if err != nil {
			return math.NaN(), fmt.Errorf("perf bench sched pipe (apt-get install linux-perf): %v: %s", err, out)
		}
		for _, line := range strings.Split(string(out), "\n") {
			if f := strings.Fields(line); len(f) == 2 && f[1] == "usecs/op" {
				v, err := strconv.ParseFloat(f[0], 64)
				return v / 2, err
			}
		}
		return math.NaN(), fmt.Errorf("perf bench sched pipe: no usecs/op in %q", out)
	}
	run := func(test string, size int) (float64, error) {
		out, errOut, err := runQperf(ctx, cg, qperf, n.a, cpus[0], n.podB, "19765", secs, size, test)
		res, perr := bench.ParseQperf(append(out, errOut...))
		if perr != nil || len(res) != 1 {
			return math.NaN(), fmt.Errorf("qperf %s %d: %v %v: %s", test, size, err, perr, out)
		}
		if strings.HasSuffix(test, "_lat") {
			return res[0].LatencyNs / 1e3, nil
		}
		return res[0].BytesPerSec * 8 / 1e9, nil
	}

	type key struct {
		test string
		size int
		arm  string
	}
	vals := map[key][]float64{}
	ratios := map[key][]float64{}
	segs := map[key]float64{}
	moved := map[key]map[string]uint64{}
	var loads []string
	for r := range rounds {
		loads = append(loads, loadavg())
		for _, test := range tests {
			for _, size := range sizes {
				got := map[string]float64{}
				for i := range arms {
					arm := arms[(i+r)%len(arms)]
					k := key{test, size, arm}
					if arm == "pipe" {
						if !strings.HasSuffix(test, "_lat") {
							continue
						}
						v, err := pipeFloor()
						if err != nil {
							t.Fatal(err)
						}
						got[arm] = v
						vals[k] = append(vals[k], v)
						continue
					}
					setArm(arm)
					before := metrics(t, b)
					s0 := tcpOutSegs(t, n.a) + tcpOutSegs(t, n.b)
					v, err := run(test, size)
					if err != nil {
						t.Fatal(err)
					}
					segs[k] += float64(tcpOutSegs(t, n.a)+tcpOutSegs(t, n.b)-s0) / float64(secs*rounds)
					if arm != "stack" {
						if moved[k] == nil {
							moved[k] = map[string]uint64{}
						}
						for c, x := range metricsDelta(t, b, before) {
							moved[k][c] += x
						}
					}
					got[arm] = v
					vals[k] = append(vals[k], v)
				}
				for _, arm := range arms[1:] {
					if v, ok := got[arm]; ok {
						k := key{test, size, arm}
						ratios[k] = append(ratios[k], v/got["stack"])
					}
				}
			}
		}
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "\n%d rounds, qperf -t %d, client CPU %s, server CPU %s, load average at each round's start: %s\n"+
		"| test | size | arm | median | arm/stack (median of rounds) | 95 %% CI (min–max below 9 rounds) | TCP segments/s | counters |\n|---|---:|---|---:|---:|---|---:|---|\n",
		rounds, secs, cpus[0], cpus[1], strings.Join(loads, "; "))
	for _, test := range tests {
		unit := "Gb/s"
		if strings.HasSuffix(test, "_lat") {
			unit = "µs"
		}
		for _, size := range sizes {
			for _, arm := range arms {
				k := key{test, size, arm}
				if len(vals[k]) == 0 {
					continue
				}
				ratio, ci := "", ""
				if arm != "stack" {
					lo, hi := stats.MedianCI(ratios[k])
					if math.IsNaN(lo) {
						lo, hi = slices.Min(ratios[k]), slices.Max(ratios[k])
					}
					ratio, ci = fmt.Sprintf("%.2fx", stats.Median(ratios[k])), fmt.Sprintf("%.2f–%.2f", lo, hi)
				}
				fmt.Fprintf(&sb, "| %s | %d | %s | %.3f %s | %s | %s | %.0f | %s |\n", test, size, arm,
					stats.Median(vals[k]), unit, ratio, ci, segs[k], counterText(moved[k]))
			}
		}
	}
	t.Log(sb.String())
}

// bareSkMsg builds the least sk_msg program a bypass can run, for
// TestFlowBench's bare arm: the peer key sockops stored in the socket's
// state (struct sockmap_state's peer), one bpf_msg_redirect_hash into hash
// with BPF_F_INGRESS, SK_PASS whatever happened (a miss then takes TCP). No
// mode, no counters, no back-pressure bound.
func bareSkMsg(state, hash *ebpf.Map) (*ebpf.Program, error) {
	skOff := int16(unsafe.Offsetof(sockMsgMd{}.sk))
	peerOff := int32(unsafe.Offsetof(sockOpsSockmapState{}.Peer))
	insns := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.LoadMem(asm.R2, asm.R1, skOff, asm.DWord),
		asm.JEq.Imm(asm.R2, 0, "pass"),
		asm.LoadMapPtr(asm.R1, state.FD()),
		asm.Mov.Imm(asm.R3, 0),
		asm.Mov.Imm(asm.R4, 0),
		asm.FnSkStorageGet.Call(),
		asm.JEq.Imm(asm.R0, 0, "pass"),
		asm.Mov.Reg(asm.R3, asm.R0),
		asm.Add.Imm(asm.R3, peerOff),
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.LoadMapPtr(asm.R2, hash.FD()),
		asm.Mov.Imm(asm.R4, 1), // BPF_F_INGRESS
		asm.FnMsgRedirectHash.Call(),
		asm.Mov.Imm(asm.R0, 1).WithSymbol("pass"), // SK_PASS
		asm.Return(),
	}
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "bench_bare_msg", Type: ebpf.SkMsg, License: "Dual BSD/GPL", Instructions: insns})
	if err != nil {
		return nil, fmt.Errorf("load the bare sk_msg program: %w", err)
	}
	return p, nil
}

// unboundedSkMsg loads axon_sk_msg on b's maps with cfg_backlog_max at its
// largest (no back-pressure switch), for TestFlowBench's unbounded arm.
func unboundedSkMsg(b *Bypass) (*skMsgObjects, error) {
	spec, err := loadSkMsg()
	if err != nil {
		return nil, err
	}
	if err := spec.Variables["cfg_backlog_max"].Set(^uint32(0)); err != nil {
		return nil, fmt.Errorf("set cfg_backlog_max: %w", err)
	}
	var objs skMsgObjects
	if err := loadOnMaps(&b.ops, spec, &objs); err != nil {
		return nil, fmt.Errorf("load the unbounded axon_sk_msg: %w", err)
	}
	return &objs, nil
}

// sockMsgMd is the head of the uapi struct sk_msg_md up to sk (the socket
// the program runs for), for its offset.
type sockMsgMd struct {
	data, dataEnd         uint64
	family                uint32
	remoteIP4, localIP4   uint32
	remoteIP6, localIP6   [4]uint32
	remotePort, localPort uint32
	size                  uint32
	sk                    uint64
}

// tcpOutSegs reads Tcp OutSegs of netns ns (/proc/net/snmp as the netns
// sees it).
func tcpOutSegs(t *testing.T, ns string) uint64 {
	t.Helper()
	out, err := exec.Command("nsenter", "--net="+netnsutil.Path(ns), "cat", "/proc/net/snmp").Output()
	if err != nil {
		t.Fatalf("read /proc/net/snmp in %s: %v", ns, err)
	}
	var head []string
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "Tcp:" {
			continue
		}
		if head == nil {
			head = f
			continue
		}
		for i, h := range head {
			if h == "OutSegs" && i < len(f) {
				v, err := strconv.ParseUint(f[i], 10, 64)
				if err != nil {
					t.Fatalf("Tcp OutSegs in %s: %v", ns, err)
				}
				return v
			}
		}
	}
	t.Fatalf("no Tcp OutSegs in %s's /proc/net/snmp", ns)
	return 0
}

// counterText lists the counters of the mode machine that moved.
func counterText(m map[string]uint64) string {
	var parts []string
	for _, c := range []string{"redirect_msgs", "pass_sticky", "switch_stack", "backpressure", "left"} {
		if m[c] > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", c, m[c]))
		}
	}
	return strings.Join(parts, ", ")
}

// lookTool finds the named programs in PATH.
func lookTool(names ...string) (map[string]string, error) {
	out := map[string]string{}
	for _, name := range names {
		for _, dir := range strings.Split(os.Getenv("PATH")+":/usr/sbin:/usr/bin:/sbin:/bin", ":") {
			p := dir + "/" + name
			if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
				out[name] = p
				break
			}
		}
		if out[name] == "" {
			return nil, fmt.Errorf("%s not installed (apt-get install qperf util-linux)", name)
		}
	}
	return out, nil
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

// startQperfServer starts a qperf server in the netns named netns, pinned
// to cpu and listening on port, in the test cgroup cg; it is stopped when
// the test ends.
func startQperfServer(t *testing.T, ctx context.Context, cg string, qperf map[string]string, netns, cpu, port string) {
	t.Helper()
	srv, cleanup, err := bench.Command(ctx, cg, []string{qperf["nsenter"], "--net=" + netnsutil.Path(netns),
		qperf["taskset"], "-c", cpu, qperf["qperf"], "--listen_port", port})
	if err != nil {
		t.Fatal(err)
	}
	srv.Stdout, srv.Stderr = io.Discard, io.Discard
	if err := srv.Start(); err != nil {
		cleanup()
		t.Fatal(err)
	}
	cleanup()
	t.Cleanup(func() { _ = srv.Process.Signal(syscall.SIGTERM); _ = srv.Wait() })
}

// runQperf runs one qperf test (e.g. tcp_bw) of size bytes for secs seconds
// from the netns named netns, pinned to cpu, against the qperf server at
// server:port (startQperfServer); it retries for 5 s while the server is not
// listening yet.
func runQperf(ctx context.Context, cg string, qperf map[string]string, netns, cpu string, server netip.Addr, port string,
	secs, size int, test string) (out, errOut []byte, err error) {
	argv := []string{qperf["nsenter"], "--net=" + netnsutil.Path(netns), qperf["taskset"], "-c", cpu,
		qperf["qperf"], server.String(), "--listen_port", port, "-t", strconv.Itoa(secs), "-m", strconv.Itoa(size),
		"-uu", "-v", test}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		out, errOut, err = bench.RunClient(ctx, cg, argv, time.Duration(secs)*time.Second+30*time.Second)
		if err == nil || !strings.Contains(string(out)+string(errOut), "failed to connect") || time.Now().After(deadline) {
			return out, errOut, err
		}
	}
}
