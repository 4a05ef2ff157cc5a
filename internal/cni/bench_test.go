package cni

// A small, self-contained two-node datapath benchmark (issue 5): two node
// netns joined by a veth "wire", the real axon datapath loaded in each, pods
// wired by the plugin binary; no kube-apiserver, so it also runs in the
// kernel-matrix VM (netkit), where the lab benchmark cannot (one node):
//
//	AXON_NK_BENCH=1 go test -count=1 -run TestDatapathBench -v ./internal/cni/
//	make test-vm KERNEL=debian-6.12 VM_PKGS=./internal/cni VM_RUN=TestDatapathBench VM_LAB=0
//
// Knobs: AXON_NK_BENCH_REPS (5), AXON_NK_BENCH_SECS (4), AXON_NK_BENCH_OUT
// (a Markdown file for the table), AXON_NK_BENCH_BIGTCP=1 (pods of both GSO
// sizes, wire at 192 KiB: BIG TCP on vs off, and pod vs host with the same
// GSO settings). Paths are interleaved in every repetition; CPU pressure is
// recorded. Client on CPU 0, server on CPU 1.

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/bench"
	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/ipam"
)

type benchNode struct {
	e    *env
	ip4  string
	dp   *datapath.Datapath
	name string
}

// newBenchNode builds node i (1 or 2): netns, test agent with its own pools,
// eth0 (created by the caller as one end of the wire), datapath loaded.
func newBenchNode(t *testing.T, i int) *benchNode {
	e := &env{t: t, bin: pluginBinary(t)}
	e.node = newNetns(t, fmt.Sprintf("bn%d-", i))
	var err error
	e.nodeNS, err = ns.GetNS("/run/netns/" + e.node)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.nodeNS.Close() })
	dir := t.TempDir()
	e.sock = filepath.Join(dir, "run", "axon.sock")
	e.state = filepath.Join(dir, "state", "ipam")
	alloc, err := ipam.New(e.state, quiet())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { alloc.Close() })
	if err := alloc.SetPools([]netip.Prefix{netip.MustParsePrefix(fmt.Sprintf("10.244.%d.0/24", i)), netip.MustParsePrefix(fmt.Sprintf("fd00:10:244:%d::/64", i))}); err != nil {
		t.Fatal(err)
	}
	e.agent = &testAgent{ipam: alloc, eps: map[api.Attachment]api.Endpoint{}}
	e.startAgent()
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
		n.dp = n.e.loadDatapath(datapath.DeviceModeAuto)
	}
}

// addBenchPod wires a pod on n with deviceMode and GSO size (0 = default),
// registers it with n's datapath and returns its netns and IPv4.
func (n *benchNode) addBenchPod(t *testing.T, cid, mode string, gso uint32) (netns, ip string) {
	n.e.agent.mu.Lock()
	n.e.agent.device = &api.DeviceConfig{Type: api.DeviceVeth, GSOMaxSize: gso, GROMaxSize: gso, GSOIPv4MaxSize: gso, GROIPv4MaxSize: gso}
	n.e.agent.mu.Unlock()
	pod := newNetns(t, "bp")
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

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
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

// busyTicks sums the non-idle CPU time (USER_HZ ticks) of all CPUs in /proc/stat.
func busyTicks(t *testing.T) uint64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		t.Fatal(err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal ...
	var busy uint64
	for i, v := range f[1:] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		n, _ := strconv.ParseUint(v, 10, 64)
		busy += n
	}
	return busy
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

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func pressure() float64 {
	b, err := os.ReadFile("/proc/pressure/cpu")
	if err != nil {
		return -1
	}
	avg, _, err := bench.ParsePressure(b)
	if err != nil {
		return -1
	}
	return avg
}

func TestDatapathBench(t *testing.T) {
	// A benchmark program, not a test: it runs only when asked for, by
	// AXON_NK_BENCH=1 or by naming it in -run (the VM runner passes no
	// environment: make test-vm ... VM_RUN=TestDatapathBench).
	if os.Getenv("AXON_NK_BENCH") != "1" && !strings.Contains(flag.Lookup("test.run").Value.String(), "DatapathBench") {
		t.Skip("benchmark program, not a test: set AXON_NK_BENCH=1 or -run TestDatapathBench to run it")
	}
	for _, tool := range []string{"iperf3", "sockperf", "taskset", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
	reps, secs := envInt("AXON_NK_BENCH_REPS", 5), envInt("AXON_NK_BENCH_SECS", 4)
	bigTCP := os.Getenv("AXON_NK_BENCH_BIGTCP") == "1"
	haveNetkit := datapath.ProbeNetkit().Available

	a, b := newBenchNode(t, 1), newBenchNode(t, 2)
	wireGSO := 0
	if bigTCP {
		wireGSO = datapath.BigTCPMaxSize
	}
	wireNodes(t, a, b, wireGSO)

	var paths []benchPath
	paths = append(paths, benchPath{name: "host-to-host", client: a.e.node, server: b.e.node, serverIP: b.ip4})
	type podSpec struct {
		label, mode string
		gso         uint32
	}
	specs := []podSpec{{"veth", ModeVeth, 0}}
	if haveNetkit {
		specs = append(specs, podSpec{"netkit", ModeNetkit, 0})
	}
	if bigTCP {
		specs = []podSpec{{"veth, GSO 192 KiB", ModeVeth, datapath.BigTCPMaxSize}, {"veth, GSO 64 KiB", ModeVeth, 0}}
	}
	for i, s := range specs {
		cns, _ := a.addBenchPod(t, fmt.Sprintf("bc%d", i), s.mode, s.gso)
		sns, sip := b.addBenchPod(t, fmt.Sprintf("bs%d", i), s.mode, s.gso)
		paths = append(paths, benchPath{name: "pod-to-pod cross-node, " + s.label, client: cns, server: sns, serverIP: sip})
	}
	for i := range paths {
		paths[i].port = 15201 + i
		startServer(t, paths[i], "iperf3", "-s", "-B", paths[i].serverIP, "-p", strconv.Itoa(paths[i].port))
		startServer(t, paths[i], "sockperf", "server", "--tcp", "-i", paths[i].serverIP, "-p", strconv.Itoa(paths[i].port+100))
	}
	time.Sleep(time.Second)

	type series struct{ gbps, p50, softRR, softBulk, cpuRR []float64 }
	res := make([]series, len(paths))
	var press []float64
	ctx := context.Background()
	for r := 0; r < reps; r++ {
		for i, p := range paths {
			press = append(press, pressure())
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
			res[i].gbps = append(res[i].gbps, ir.BitsPerSecond/1e9)
			res[i].softBulk = append(res[i].softBulk, float64(s1-s0)/float64(w1-w0)*10000)

			s0, w0 = softnetProcessed(t), a.wirePackets(t)
			c0 := busyTicks(t)
			out, err = nsCmd(p.client, 0, "sockperf", "ping-pong", "--tcp", "-i", p.serverIP, "-p", strconv.Itoa(p.port+100), "-t", strconv.Itoa(secs), "-m", "64", "--full-rtt").CombinedOutput()
			s1, w1 = softnetProcessed(t), a.wirePackets(t)
			c1 := busyTicks(t)
			if err != nil {
				t.Fatalf("%s sockperf: %v\n%s", p.name, err, out)
			}
			sr, err := bench.ParseSockperf(out)
			if err != nil {
				t.Fatalf("%s sockperf: %v\n%s", p.name, err, out)
			}
			p50, _ := sr.P(50)
			res[i].p50 = append(res[i].p50, p50)
			res[i].softRR = append(res[i].softRR, float64(s1-s0)/float64(w1-w0)*10000)
			if sr.Observations > 0 { // CPU µs (all CPUs, whole machine) per round trip; USER_HZ = 100
				res[i].cpuRR = append(res[i].cpuRR, float64(c1-c0)*1e4/float64(sr.Observations))
			}
		}
		t.Logf("repetition %d/%d done", r+1, reps)
	}
	_ = ctx

	var md bytes.Buffer
	uname, _ := exec.Command("uname", "-r").Output()
	fmt.Fprintf(&md, "kernel %s, %d reps × %ds interleaved, BIG TCP mode %v, CPU pressure avg10 median %.1f %% (min %.1f, max %.1f)\n\n",
		strings.TrimSpace(string(uname)), reps, secs, bigTCP, median(press), slices.Min(press), slices.Max(press))
	fmt.Fprintf(&md, "| path | Gbit/s median (min–max) | ratio | TCP_RR p50 µs (min–max) | ratio | CPU µs per RR | ratio | softnet passes per 10k wire pkts, RR | bulk |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for i, p := range paths {
		s := res[i]
		fmt.Fprintf(&md, "| %s | %.2f (%.2f–%.2f) | %.2f× | %.1f (%.1f–%.1f) | %.2f× | %.1f | %.2f× | %.0f | %.0f |\n", p.name,
			median(s.gbps), slices.Min(s.gbps), slices.Max(s.gbps), median(s.gbps)/median(res[0].gbps),
			median(s.p50), slices.Min(s.p50), slices.Max(s.p50), median(s.p50)/median(res[0].p50),
			median(s.cpuRR), median(s.cpuRR)/median(res[0].cpuRR),
			median(s.softRR), median(s.softBulk))
	}
	t.Log("\n" + md.String())
	if out := os.Getenv("AXON_NK_BENCH_OUT"); out != "" {
		if err := os.WriteFile(out, md.Bytes(), 0o644); err != nil {
			t.Error(err)
		}
	}
}
