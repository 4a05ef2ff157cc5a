package cni

// A small, self-contained two-node datapath benchmark: two node
// netns joined by a veth "wire", the real axon datapath loaded in each, pods
// wired by the plugin binary; no kube-apiserver, so it also runs in the
// kernel-matrix VM (netkit), where the lab benchmark cannot (one node):
//
//	AXON_NK_BENCH=1 go test -count=1 -run TestDatapathBench -v ./internal/cni/
//	make test-vm KERNEL=debian-6.12 VM_PKGS=./internal/cni VM_RUN=TestDatapathBench VM_LAB=0 \
//	     VM_FLAGS='-env AXON_NK_BENCH_TOOLS=sockperf -env AXON_NK_BENCH_REPS=30'
//
// With VM_FLAGS='-icount ...' the VM's clock counts guest instructions
// (AXON_VM_ICOUNT=1, internal/vmtest VM.ICount): latencies then measure the
// work on a round trip, free of TCG's host-speed noise.
//
// Knobs (environment; in the VM through hack/vm -env): AXON_NK_BENCH_REPS
// (12), AXON_NK_BENCH_SECS (3), AXON_NK_BENCH_WARMUP (1 discarded
// repetition), AXON_NK_BENCH_TOOLS ("iperf3,sockperf"; "sockperf" = TCP_RR
// only), AXON_NK_BENCH_OUT (Markdown report; default
// $AXON_RESULTS/datapath-bench-<kernel>.md when the VM runner sets
// AXON_RESULTS), AXON_NK_BENCH_BIGTCP=1 (pods of both GSO sizes, wire at 192
// KiB: BIG TCP on vs off, and pod vs host with the same GSO settings; with
// netkit in the kernel a netkit pod at 192 KiB too).
//
// Every repetition measures every path, in an order rotated by one each
// repetition (A B C, B C A, C A B, ...), so slow drifts of a shared machine
// hit every path alike. Besides medians and min–max, the report gives paired
// ratios: for each repetition path X / path Y of that same repetition, their
// median and a distribution-free 95 % confidence interval of that median
// (sign test / binomial order statistics), and the sign test's p-value. CPU
// pressure is recorded: the machine's own, and in the VM the host's (the VM
// runner copies the host's /proc/pressure/cpu into the run share every
// second). Client on CPU 0, server on CPU 1.

import (
	"bytes"
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/bench"
	"github.com/axonhq/axon/internal/cpustat"
	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/datapath/podpath"
	"github.com/axonhq/axon/internal/stats"
	"github.com/axonhq/axon/internal/testutil"
)

type benchNode struct {
	e    *env
	ip4  string
	dp   *podpath.Datapath
	name string
}

// newBenchNode builds node i (1 or 2): netns, test agent with its own pools,
// eth0 (created by the caller as one end of the wire), datapath loaded.
func newBenchNode(t *testing.T, i int) *benchNode {
	e := &env{t: t, bin: pluginBinary(t)}
	e.node = testutil.NewNetnsKernelDAD(t, fmt.Sprintf("axt-cni-bn%d-", i))
	e.startNodeAgent(i)
	if err := e.inNode(func() error {
		for _, s := range [][2]string{{"net.ipv4.ip_forward", "1"}, {"net.ipv6.conf.all.forwarding", "1"}, {"net.ipv6.conf.default.accept_dad", "0"}} {
			if err := writeSysctl(s[0], s[1]); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return &benchNode{e: e, ip4: fmt.Sprintf("198.18.0.1%d", i), name: fmt.Sprintf("node%d", i)}
}

// wireNodes connects a and b with a veth pair (eth0 in both), addresses and
// pod-CIDR routes, and sets the wire's GSO/GRO limits to gso (0 = default).
func wireNodes(t *testing.T, a, b *benchNode, gso int) {
	run(t, "ip", "link", "add", "axtw0", "netns", a.e.node, "type", "veth", "peer", "name", "axtw1", "netns", b.e.node)
	for i, n := range []*benchNode{a, b} {
		other := 3 - (i + 1)
		dev := fmt.Sprintf("axtw%d", i)
		run(t, "ip", "-n", n.e.node, "link", "set", dev, "name", "eth0")
		run(t, "ip", "-n", n.e.node, "addr", "add", n.ip4+"/24", "dev", "eth0")
		run(t, "ip", "-n", n.e.node, "addr", "add", fmt.Sprintf("fd00:198:18::1%d/64", i+1), "dev", "eth0", "nodad")
		run(t, "ip", "-n", n.e.node, "link", "set", "eth0", "up")
		run(t, "ip", "-n", n.e.node, "route", "add", fmt.Sprintf("10.244.%d.0/24", other), "via", fmt.Sprintf("198.18.0.1%d", other))
		run(t, "ip", "-n", n.e.node, "-6", "route", "add", fmt.Sprintf("fd00:10:244:%d::/64", other), "via", fmt.Sprintf("fd00:198:18::1%d", other))
		if gso > 0 {
			if err := n.e.inNode(func() error {
				l, err := netlink.LinkByName("eth0")
				if err != nil {
					return err
				}
				return applyBigTCP(l, api.DeviceConfig{GSOMaxSize: uint32(gso), GROMaxSize: uint32(gso), GSOIPv4MaxSize: uint32(gso), GROIPv4MaxSize: uint32(gso)})
			}); err != nil {
				t.Fatal(err)
			}
		}
		n.dp = n.e.loadDatapath(podpath.DeviceModeAuto)
	}
}

// addBenchPod wires a pod on n with deviceMode and GSO size (0 = default),
// registers it with n's datapath and returns its netns and IPv4.
func (n *benchNode) addBenchPod(t *testing.T, cid, mode string, gso uint32) (netns, ip string) {
	n.e.agent.mu.Lock()
	n.e.agent.device = &api.DeviceConfig{Type: api.DeviceVeth, GSOMaxSize: gso, GROMaxSize: gso, GSOIPv4MaxSize: gso, GROIPv4MaxSize: gso}
	n.e.agent.mu.Unlock()
	pod := testutil.NewNetnsKernelDAD(t, "axt-cni-bp-")
	stdin := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"axon","type":"axon-cni","socket":%q,"mtu":1500,"deviceMode":%q}`, n.e.sock, mode)
	n.e.mustOK(call{cmd: "ADD", cid: cid, netns: "/run/netns/" + pod, stdin: stdin})
	ep := n.e.register(n.dp, cid)
	for _, a := range ep.IPs {
		if a.Is4() {
			ip = a.String()
		}
	}
	return pod, ip
}

// softnetProcessed sums column 1 (packets processed) of /proc/net/softnet_stat.
func softnetProcessed(t *testing.T) uint64 {
	b, err := os.ReadFile("/proc/net/softnet_stat")
	if err != nil {
		t.Fatal(err)
	}
	var sum uint64
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseUint(f[0], 16, 64)
		if err != nil {
			t.Fatal(err)
		}
		sum += v
	}
	return sum
}

// wirePackets counts packets (rx+tx) on node a's eth0.
func (n *benchNode) wirePackets(t *testing.T) uint64 {
	var c uint64
	if err := n.e.inNode(func() error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		c = l.Attrs().Statistics.RxPackets + l.Attrs().Statistics.TxPackets
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return c
}

// busyTicks sums the busy CPU time (USER_HZ ticks) of all CPUs: user, system,
// irq and softirq, not idle, iowait or steal (cpustat.Times.Busy).
func busyTicks(t *testing.T) uint64 {
	n, err := cpustat.ReadBusy(nil)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

type benchPath struct {
	name           string
	client, server string // netns names
	serverIP       string
	port           int
}

func nsCmd(netns string, cpu int, argv ...string) *exec.Cmd {
	args := append([]string{"--net=/run/netns/" + netns, "taskset", "-c", strconv.Itoa(cpu)}, argv...)
	return exec.Command("nsenter", args...)
}

func startServer(t *testing.T, p benchPath, argv ...string) {
	cmd := nsCmd(p.server, 1, argv...)
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %v: %v", argv, err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
}

func minOf(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	return slices.Min(v)
}

func maxOf(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	return slices.Max(v)
}

// hostPressureFile is where the VM runner (internal/vmtest) mirrors the
// host's /proc/pressure/cpu once a second, through the run share.
const hostPressureFile = "/run/axon-vm/host-pressure"

// readPressure returns the "some avg10" of a /proc/pressure/cpu-format file,
// NaN when it is missing.
func readPressure(path string) float64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return math.NaN()
	}
	avg, _, err := bench.ParsePressure(b)
	if err != nil {
		return math.NaN()
	}
	return avg
}

// pressure returns this machine's CPU pressure (some avg10), -1 when
// unavailable (also used by latency_test.go).
func pressure() float64 {
	v := readPressure("/proc/pressure/cpu")
	if math.IsNaN(v) {
		return -1
	}
	return v
}

// pressures returns the CPU pressure of this machine and of the host running
// it: the same reading outside a VM, the runner's mirror inside one (NaN when
// absent).
func pressures() (own, host float64) {
	own = readPressure("/proc/pressure/cpu")
	if os.Getenv("AXON_VM") == "1" {
		return own, readPressure(hostPressureFile)
	}
	return own, own
}

// rotated is the order of n paths in repetition r: 0..n-1 shifted by r.
func rotated(n, r int) []int {
	o := make([]int, n)
	for i := range o {
		o[i] = (i + r) % n
	}
	return o
}

// binomCDF is P(B ≤ k) for B ~ Binomial(n, 1/2).
func binomCDF(k, n int) float64 {
	if k < 0 {
		return 0
	}
	if k >= n {
		return 1
	}
	var p float64
	for i := 0; i <= k; i++ {
		lc, _ := math.Lgamma(float64(n + 1))
		la, _ := math.Lgamma(float64(i + 1))
		lb, _ := math.Lgamma(float64(n - i + 1))
		p += math.Exp(lc - la - lb - float64(n)*math.Ln2)
	}
	return min(p, 1)
}

// pairedSummary summarises per-repetition ratios num[r]/den[r].
type pairedSummary struct {
	n            int
	median       float64
	lo, hi, conf float64 // distribution-free CI of the median and its exact coverage
	below, above int     // repetitions with ratio < 1 and > 1
	p            float64 // two-sided sign test of "median ratio = 1"
}

// paired computes the ratios of two series measured in the same repetitions
// and the order-statistic confidence interval of their median: with the
// ratios sorted, [x(k), x(n+1-k)] covers the median with probability
// 1 - 2·P(B ≤ k-1), B ~ Bin(n, 1/2); k is the largest index reaching level
// (k = 1, the whole range, when n is too small to reach it).
func paired(num, den []float64, level float64) pairedSummary {
	var r []float64
	for i := range min(len(num), len(den)) {
		if den[i] > 0 && !math.IsNaN(num[i]) && !math.IsNaN(den[i]) {
			r = append(r, num[i]/den[i])
		}
	}
	s := pairedSummary{n: len(r), median: stats.Median(r), lo: math.NaN(), hi: math.NaN(), p: math.NaN()}
	if s.n == 0 {
		return s
	}
	slices.Sort(r)
	k := 1
	for j := 1; j <= s.n/2; j++ {
		if 1-2*binomCDF(j-1, s.n) >= level {
			k = j
		}
	}
	s.lo, s.hi, s.conf = r[k-1], r[s.n-k], 1-2*binomCDF(k-1, s.n)
	for _, v := range r {
		switch {
		case v < 1:
			s.below++
		case v > 1:
			s.above++
		}
	}
	s.p = min(1, 2*binomCDF(min(s.below, s.above), s.below+s.above))
	return s
}

func TestPairedSummary(t *testing.T) {
	for _, tc := range []struct {
		name             string
		num, den         []float64
		median, lo, hi   float64
		conf, p          float64
		below, above, nn int
	}{
		// ratios 0.1 … 0.9 and 0.5; n = 10: k = 2, [x(2), x(9)], 1 - 2·P(B ≤ 1) = 1 - 2·11/1024 = 0.9785
		{name: "ten reps, all lower", num: []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, den: []float64{10, 10, 10, 10, 10, 10, 10, 10, 10, 20},
			median: 0.5, lo: 0.2, hi: 0.8, conf: 1 - 2*11.0/1024, p: 2.0 / 1024, below: 10, nn: 10},
		// n = 5 cannot reach 95 %: the whole range, coverage 1 - 2/32
		{name: "five reps, mixed", num: []float64{9, 11, 10, 8, 12}, den: []float64{10, 10, 10, 10, 10},
			median: 1.0, lo: 0.8, hi: 1.2, conf: 1 - 2.0/32, p: 1, below: 2, above: 2, nn: 5},
		{name: "failed sample skipped", num: []float64{1, math.NaN(), 3}, den: []float64{2, 2, 0},
			median: 0.5, lo: 0.5, hi: 0.5, conf: 0, p: 1, below: 1, nn: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := paired(tc.num, tc.den, 0.95)
			near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
			if s.n != tc.nn || !near(s.median, tc.median) || !near(s.lo, tc.lo) || !near(s.hi, tc.hi) ||
				!near(s.conf, tc.conf) || !near(s.p, tc.p) || s.below != tc.below || s.above != tc.above {
				t.Errorf("paired = %+v, want n %d median %g CI [%g, %g] conf %g p %g below %d above %d",
					s, tc.nn, tc.median, tc.lo, tc.hi, tc.conf, tc.p, tc.below, tc.above)
			}
		})
	}
	if got := rotated(3, 4); !slices.Equal(got, []int{1, 2, 0}) {
		t.Errorf("rotated(3, 4) = %v, want [1 2 0]", got)
	}
}

func hasTool(tools []string, name string) bool { return slices.Contains(tools, name) }

type benchSeries struct{ gbps, p50, softRR, softBulk, cpuRR []float64 }

// comparison is one paired ratio the report states: path num over path den.
type comparison struct {
	num, den int
	metric   string // "throughput" or "p50"
	target   string // what the issue asks, shown next to the result
}

func (s benchSeries) values(metric string) []float64 {
	if metric == "throughput" {
		return s.gbps
	}
	return s.p50
}

func TestDatapathBench(t *testing.T) {
	// A benchmark program, not a test: it runs only when asked for, by
	// AXON_NK_BENCH=1 or by naming it in -run (make test-vm ... VM_RUN=TestDatapathBench).
	if os.Getenv("AXON_NK_BENCH") != "1" && !strings.Contains(flag.Lookup("test.run").Value.String(), "DatapathBench") {
		t.Skip("benchmark program, not a test: set AXON_NK_BENCH=1 or -run TestDatapathBench to run it")
	}
	tools := strings.Split(os.Getenv("AXON_NK_BENCH_TOOLS"), ",")
	if os.Getenv("AXON_NK_BENCH_TOOLS") == "" {
		tools = []string{"iperf3", "sockperf"}
	}
	for _, tool := range append([]string{"taskset", "nsenter"}, tools...) {
		if tool != "iperf3" && tool != "sockperf" && tool != "taskset" && tool != "nsenter" {
			t.Fatalf("AXON_NK_BENCH_TOOLS: unknown tool %q: want iperf3 and/or sockperf", tool)
		}
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
	reps, secs := testutil.EnvInt(t, "AXON_NK_BENCH_REPS", 12), testutil.EnvInt(t, "AXON_NK_BENCH_SECS", 3)
	warm := 1
	if v, err := strconv.Atoi(os.Getenv("AXON_NK_BENCH_WARMUP")); err == nil && v >= 0 {
		warm = v
	}
	bigTCP := os.Getenv("AXON_NK_BENCH_BIGTCP") == "1"
	haveNetkit := datapath.ProbeNetkit().Available

	a, b := newBenchNode(t, 1), newBenchNode(t, 2)
	wireGSO := 0
	if bigTCP {
		wireGSO = podpath.BigTCPMaxSize
	}
	wireNodes(t, a, b, wireGSO)

	var paths []benchPath
	paths = append(paths, benchPath{name: "host-to-host", client: a.e.node, server: b.e.node, serverIP: b.ip4})
	type podSpec struct {
		label, mode string
		gso         uint32
	}
	specs := []podSpec{{"veth", ModeVeth, 0}}
	var cmps []comparison
	switch {
	case bigTCP:
		specs = []podSpec{{"veth, GSO 192 KiB (BIG TCP on)", ModeVeth, podpath.BigTCPMaxSize}, {"veth, GSO 64 KiB (BIG TCP off)", ModeVeth, 0}}
		cmps = []comparison{
			{1, 2, "throughput", "BIG TCP on / off: report"},
			{1, 0, "throughput", "pod (BIG TCP) / host, same GSO: ≥ 0.98"},
			{1, 2, "p50", "BIG TCP on / off"},
		}
		if haveNetkit { // the same with netkit pods (6.12 VM)
			specs = append(specs, podSpec{"netkit, GSO 192 KiB (BIG TCP on)", ModeNetkit, podpath.BigTCPMaxSize})
			cmps = append(cmps,
				comparison{3, 0, "throughput", "netkit pod (BIG TCP) / host, same GSO: ≥ 0.98"},
				comparison{3, 1, "throughput", "netkit / veth, both BIG TCP"},
				comparison{3, 1, "p50", "netkit / veth, both BIG TCP"})
		}
	case haveNetkit:
		specs = append(specs, podSpec{"netkit", ModeNetkit, 0})
		cmps = []comparison{
			{2, 1, "p50", "netkit / veth: ≤ 1"},
			{2, 0, "p50", "netkit / host"},
			{1, 0, "p50", "veth / host"},
			{2, 1, "throughput", "netkit / veth"},
		}
	default:
		cmps = []comparison{{1, 0, "p50", "veth / host"}, {1, 0, "throughput", "veth / host"}}
	}
	for i, s := range specs {
		cns, _ := a.addBenchPod(t, fmt.Sprintf("bc%d", i), s.mode, s.gso)
		sns, sip := b.addBenchPod(t, fmt.Sprintf("bs%d", i), s.mode, s.gso)
		paths = append(paths, benchPath{name: "pod-to-pod cross-node, " + s.label, client: cns, server: sns, serverIP: sip})
	}
	for i := range paths {
		paths[i].port = 15201 + i
		if hasTool(tools, "iperf3") {
			startServer(t, paths[i], "iperf3", "-s", "-B", paths[i].serverIP, "-p", strconv.Itoa(paths[i].port))
		}
		if hasTool(tools, "sockperf") {
			startServer(t, paths[i], "sockperf", "server", "--tcp", "-i", paths[i].serverIP, "-p", strconv.Itoa(paths[i].port+100))
		}
	}
	time.Sleep(time.Second)

	res := make([]benchSeries, len(paths))
	var ownP, hostP []float64
	started := time.Now()
	for r := 0; r < warm+reps; r++ {
		keep := r >= warm
		for _, i := range rotated(len(paths), r) {
			p := paths[i]
			if hasTool(tools, "iperf3") {
				o, h := pressures()
				s0, w0 := softnetProcessed(t), a.wirePackets(t)
				out, err := nsCmd(p.client, 0, "iperf3", "-c", p.serverIP, "-p", strconv.Itoa(p.port), "-t", strconv.Itoa(secs), "-J").CombinedOutput()
				s1, w1 := softnetProcessed(t), a.wirePackets(t)
				if err != nil {
					t.Fatalf("%s iperf3: %v\n%s", p.name, err, out)
				}
				ir, err := bench.ParseIperfJSON(out)
				if err != nil {
					t.Fatalf("%s iperf3: %v", p.name, err)
				}
				if keep {
					ownP, hostP = append(ownP, o), append(hostP, h)
					res[i].gbps = append(res[i].gbps, ir.BitsPerSecond/1e9)
					res[i].softBulk = append(res[i].softBulk, float64(s1-s0)/float64(w1-w0)*10000)
				}
			}
			if hasTool(tools, "sockperf") {
				o, h := pressures()
				s0, w0 := softnetProcessed(t), a.wirePackets(t)
				c0 := busyTicks(t)
				out, err := nsCmd(p.client, 0, "sockperf", "ping-pong", "--tcp", "-i", p.serverIP, "-p", strconv.Itoa(p.port+100), "-t", strconv.Itoa(secs), "-m", "64", "--full-rtt").CombinedOutput()
				s1, w1 := softnetProcessed(t), a.wirePackets(t)
				c1 := busyTicks(t)
				if err != nil {
					t.Fatalf("%s sockperf: %v\n%s", p.name, err, out)
				}
				sr, err := bench.ParseSockperf(out)
				if err != nil {
					t.Fatalf("%s sockperf: %v\n%s", p.name, err, out)
				}
				p50, _ := sr.P(50)
				if keep {
					ownP, hostP = append(ownP, o), append(hostP, h)
					res[i].p50 = append(res[i].p50, p50)
					res[i].softRR = append(res[i].softRR, float64(s1-s0)/float64(w1-w0)*10000)
					if sr.Observations > 0 { // CPU µs (all CPUs, whole machine) per round trip; USER_HZ = 100
						res[i].cpuRR = append(res[i].cpuRR, float64(c1-c0)*1e4/float64(sr.Observations))
					}
				}
			}
		}
		what := "done"
		if !keep {
			what = "done (warm-up, discarded)"
		}
		t.Logf("repetition %d/%d %s", r+1, warm+reps, what)
	}

	md := benchReport(paths, res, cmps, benchRun{reps: reps, warm: warm, secs: secs, tools: tools, bigTCP: bigTCP,
		took: time.Since(started), ownP: ownP, hostP: hostP})
	t.Log("\n" + md)
	out := os.Getenv("AXON_NK_BENCH_OUT")
	if out == "" && os.Getenv("AXON_RESULTS") != "" {
		out = filepath.Join(os.Getenv("AXON_RESULTS"), "datapath-bench-"+kernelRelease()+".md")
	}
	if out != "" {
		if err := os.WriteFile(out, []byte(md), 0o644); err != nil {
			t.Error(err)
		}
	}
}

func kernelRelease() string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}

type benchRun struct {
	reps, warm, secs int
	tools            []string
	bigTCP           bool
	took             time.Duration
	ownP, hostP      []float64
}

func pressureLine(v []float64) string {
	var ok []float64
	for _, x := range v {
		if !math.IsNaN(x) {
			ok = append(ok, x)
		}
	}
	if len(ok) == 0 {
		return "not recorded"
	}
	return fmt.Sprintf("median %.1f %% (min %.1f, max %.1f)", stats.Median(ok), slices.Min(ok), slices.Max(ok))
}

// benchReport renders the Markdown report: per-path medians (min–max) and
// ratios of medians, then the paired per-repetition ratios with their CIs.
func benchReport(paths []benchPath, res []benchSeries, cmps []comparison, run benchRun) string {
	var md bytes.Buffer
	inVM := os.Getenv("AXON_VM") == "1"
	fmt.Fprintf(&md, "kernel %s%s, %d repetitions (+%d warm-up discarded) × %d s per tool, paths rotated each repetition (A B C, B C A, ...), tools %s, BIG TCP mode %v, took %s\n\n",
		kernelRelease(), map[bool]string{true: " (QEMU VM)", false: ""}[inVM], run.reps, run.warm, run.secs, strings.Join(run.tools, "+"), run.bigTCP, run.took.Round(time.Second))
	if os.Getenv("AXON_VM_ICOUNT") == "1" {
		md.WriteString("**Instruction-counted VM** (`hack/vm -icount`: QEMU TCG with `-icount shift=0,sleep=off`): both vCPUs run in turn on one host thread and the guest's clock advances 1 ns per instruction either of them executes, skipping idle time, so every duration below (µs, Gbit/s) counts the guest's instructions, not host time: a latency is the work done during the round trip, a throughput bytes per work. Host load does not enter it.\n\n")
	}
	if inVM {
		fmt.Fprintf(&md, "CPU pressure (some avg10) at each measurement: host %s; guest %s\n\n", pressureLine(run.hostP), pressureLine(run.ownP))
	} else {
		fmt.Fprintf(&md, "CPU pressure (some avg10) at each measurement: %s\n\n", pressureLine(run.ownP))
	}
	fmt.Fprintf(&md, "| path | Gbit/s median (min–max) | ratio | TCP_RR p50 µs median (min–max) | ratio | CPU µs per RR | ratio | softnet passes per 10k wire pkts, RR | bulk |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for i, p := range paths {
		s := res[i]
		name := p.name
		if i == 0 {
			name += " (reference)"
		}
		fmt.Fprintf(&md, "| %s | %.2f (%.2f–%.2f) | %.2f× | %.1f (%.1f–%.1f) | %.2f× | %.1f | %.2f× | %.0f | %.0f |\n", name,
			stats.Median(s.gbps), minOf(s.gbps), maxOf(s.gbps), stats.Median(s.gbps)/stats.Median(res[0].gbps),
			stats.Median(s.p50), minOf(s.p50), maxOf(s.p50), stats.Median(s.p50)/stats.Median(res[0].p50),
			stats.Median(s.cpuRR), stats.Median(s.cpuRR)/stats.Median(res[0].cpuRR),
			stats.Median(s.softRR), stats.Median(s.softBulk))
	}
	fmt.Fprintf(&md, "\nPaired ratios: per repetition, X / Y measured in that repetition; median, distribution-free CI of the median (sign test order statistics, ≥ 95 %% where the number of repetitions allows), repetitions with X < Y / X > Y, two-sided sign-test p:\n\n")
	fmt.Fprintf(&md, "| X / Y | metric | paired ratio median | CI (coverage) | X<Y / X>Y | sign test p | asked |\n|---|---|---:|---|---:|---:|---|\n")
	for _, c := range cmps {
		s := paired(res[c.num].values(c.metric), res[c.den].values(c.metric), 0.95)
		if s.n == 0 {
			continue
		}
		metric := "TCP_RR p50 (lower is better)"
		if c.metric == "throughput" {
			metric = "throughput (higher is better)"
		}
		fmt.Fprintf(&md, "| %s / %s | %s | %.3f× | %.3f–%.3f (%.1f %%) | %d / %d | %.3g | %s |\n",
			strings.TrimPrefix(paths[c.num].name, "pod-to-pod cross-node, "), strings.TrimPrefix(paths[c.den].name, "pod-to-pod cross-node, "),
			metric, s.median, s.lo, s.hi, 100*s.conf, s.below, s.above, s.p, c.target)
	}
	return md.String()
}
