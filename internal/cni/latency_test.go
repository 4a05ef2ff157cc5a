package cni

// Veth latency breakdown: where the extra round-trip
// time of a veth pod goes compared with host-to-host, on a lab-shaped
// topology that needs no kube-apiserver and no lab lock: two node netns whose
// eth0 are veths into a "wire" netns holding a bridge (as `axon lab`), the
// real axon datapath loaded in each node, pods wired by the plugin binary.
//
//	AXON_LAT_BENCH=1 go test -count=1 -run TestVethLatency -v ./internal/cni/
//
// Every variant is its own pod pair, so the paths are interleaved in every
// repetition (A B C, A B C, ...) without touching a device between samples.
// Knobs: AXON_LAT_REPS (7), AXON_LAT_SECS (4), AXON_LAT_OUT (Markdown file),
// AXON_LAT_PERF (a directory: one `perf record -C 0,1` profile (cpu-clock, one sample per 20 µs of CPU) plus the round-trip count per path in the
// last repetition), AXON_LAT_BPFSTATS=1 (turn kernel.bpf_stats_enabled on for
// one extra measurement per pod path and report ns per program run; the
// sysctl is restored right after).

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/axonhq/axon/internal/bench"
	"github.com/axonhq/axon/internal/brnf"
	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/stats"
	"github.com/axonhq/axon/internal/testutil"
)

// wireBridge joins a and b through a bridge in a wire netns, as the lab does:
// node eth0 <-veth-> wire netns port, both ports in bridge br0, without
// br_netfilter.
func wireBridge(t *testing.T, a, b *benchNode) {
	wire := testutil.NewNetnsKernelDAD(t, "axt-cni-lw-")
	if err := brnf.Disable("/run/netns/" + wire); err != nil {
		t.Fatal(err)
	}
	run(t, "ip", "-n", wire, "link", "add", "br0", "type", "bridge")
	run(t, "ip", "-n", wire, "link", "set", "br0", "up")
	for i, n := range []*benchNode{a, b} {
		other := 3 - (i + 1)
		port := fmt.Sprintf("p%d", i+1)
		run(t, "ip", "link", "add", "axtlat"+port, "netns", n.e.node, "type", "veth", "peer", "name", port, "netns", wire)
		run(t, "ip", "-n", wire, "link", "set", port, "master", "br0")
		run(t, "ip", "-n", wire, "link", "set", port, "up")
		run(t, "ip", "-n", n.e.node, "link", "set", "axtlat"+port, "name", "eth0")
		run(t, "ip", "-n", n.e.node, "addr", "add", n.ip4+"/24", "dev", "eth0")
		run(t, "ip", "-n", n.e.node, "addr", "add", fmt.Sprintf("fd00:198:18::1%d/64", i+1), "dev", "eth0", "nodad")
		run(t, "ip", "-n", n.e.node, "link", "set", "eth0", "up")
		run(t, "ip", "-n", n.e.node, "route", "add", fmt.Sprintf("10.244.%d.0/24", other), "via", fmt.Sprintf("198.18.0.1%d", other))
		run(t, "ip", "-n", n.e.node, "-6", "route", "add", fmt.Sprintf("fd00:10:244:%d::/64", other), "via", fmt.Sprintf("fd00:198:18::1%d", other))
		n.dp = n.e.loadDatapath(ModeVeth)
	}
}

// latVariant is one pod pair: tweak runs after both pods exist.
type latVariant struct {
	label string
	tweak func(t *testing.T, a, b *benchNode, cns, sns string, chost, shost string)
}

// hostIfOf returns the host-side device of the pod wired with container id cid.
func (n *benchNode) hostIfOf(t *testing.T, cid string) string {
	ep, ok := n.e.agent.endpoint(cid, "eth0")
	if !ok {
		t.Fatalf("no endpoint %s", cid)
	}
	return ep.HostIfName
}

// bpfStatsTable appends to md a table of what the BPF programs of node1 (a)
// and node2 (b) cost per path: for every path one measure run with
// kernel.bpf_stats_enabled on (restored right after), then per program its
// runs and ns per run. header gets the sysctl's old value and writes the
// lines above the table. Programs with fewer than minRuns runs are left out;
// with dedupe, so is a program whose counters equal one already listed.
func bpfStatsTable(t *testing.T, md *bytes.Buffer, a, b *benchNode, paths []benchPath, minRuns uint64, dedupe bool,
	header func(old string) string, measure func(benchPath) error) {
	t.Helper()
	old, err := os.ReadFile("/proc/sys/kernel/bpf_stats_enabled")
	if err != nil {
		t.Fatal(err)
	}
	md.WriteString(header(strings.TrimSpace(string(old))) + "| path | program | runs | ns per run |\n|---|---|---:|---:|\n")
	for _, p := range paths {
		if err := os.WriteFile("/proc/sys/kernel/bpf_stats_enabled", []byte("1"), 0o644); err != nil {
			t.Fatal(err)
		}
		a0, b0 := progStats(t, a), progStats(t, b)
		merr := measure(p)
		a1, b1 := progStats(t, a), progStats(t, b)
		_ = os.WriteFile("/proc/sys/kernel/bpf_stats_enabled", old, 0o644)
		if merr != nil {
			t.Fatal(merr)
		}
		for _, side := range []struct {
			node       string
			before, at map[string][2]uint64
		}{{"node1", a0, a1}, {"node2", b0, b1}} {
			seen := map[[2]uint64]bool{}
			names := make([]string, 0, len(side.at))
			for n := range side.at {
				names = append(names, n)
			}
			slices.Sort(names)
			for _, n := range names {
				cnt := side.at[n][0] - side.before[n][0]
				ns := side.at[n][1] - side.before[n][1]
				if cnt == 0 || cnt < minRuns || (dedupe && seen[side.at[n]]) {
					continue
				}
				seen[side.at[n]] = true
				fmt.Fprintf(md, "| %s | %s %s | %d | %.0f |\n", p.name, side.node, n, cnt, float64(ns)/float64(cnt))
			}
		}
	}
}

// progStats reads run_cnt/run_time_ns, summed per program name, of the
// programs behind the links pinned for node n (<pin dir>/links/*).
func progStats(t *testing.T, n *benchNode) map[string][2]uint64 {
	links, err := filepath.Glob(filepath.Join(datapath.BPFFSRoot, "axt-cni-"+n.e.node, "links", "*"))
	if err != nil || len(links) == 0 {
		t.Fatalf("no pinned links for %s: %v", n.e.node, err)
	}
	res := map[string][2]uint64{}
	for _, l := range links {
		lo, err := exec.Command("bpftool", "-j", "link", "show", "pinned", l).Output()
		if err != nil {
			continue
		}
		var link struct {
			ProgID int `json:"prog_id"`
		}
		if json.Unmarshal(lo, &link) != nil || link.ProgID == 0 {
			continue
		}
		po, err := exec.Command("bpftool", "-j", "prog", "show", "id", strconv.Itoa(link.ProgID)).Output()
		if err != nil {
			continue
		}
		var info struct {
			Name    string `json:"name"`
			RunCnt  uint64 `json:"run_cnt"`
			RunTime uint64 `json:"run_time_ns"`
		}
		if json.Unmarshal(po, &info) != nil {
			continue
		}
		key := fmt.Sprintf("%s (%s)", info.Name, filepath.Base(l))
		v := res[key]
		res[key] = [2]uint64{v[0] + info.RunCnt, v[1] + info.RunTime}
	}
	return res
}

// latSetup builds the two nodes, the bridge wire and one pod pair per
// variant, and starts a TCP sockperf server (port) and a UDP one (port+50)
// per path. paths[0] is host-to-host.
func latSetup(t *testing.T) (a, b *benchNode, paths []benchPath) {
	a, b = newBenchNode(t, 1), newBenchNode(t, 2)
	wireBridge(t, a, b)

	ethtool := func(t *testing.T, netns string, args ...string) {
		run(t, append([]string{"ip", "netns", "exec", netns, "ethtool"}, args...)...)
	}
	variants := []latVariant{
		{label: "veth (default)"},
		{label: "veth, host-side GRO on (NAPI)", tweak: func(t *testing.T, a, b *benchNode, cns, sns, chost, shost string) {
			ethtool(t, a.e.node, "-K", chost, "gro", "on")
			ethtool(t, b.e.node, "-K", shost, "gro", "on")
		}},
	}

	paths = []benchPath{{name: "host-to-host", client: a.e.node, server: b.e.node, serverIP: b.ip4}}
	for i, v := range variants {
		ccid, scid := fmt.Sprintf("lc%d", i), fmt.Sprintf("ls%d", i)
		cns, _ := a.addBenchPod(t, ccid, ModeVeth, 0)
		sns, sip := b.addBenchPod(t, scid, ModeVeth, 0)
		if v.tweak != nil {
			v.tweak(t, a, b, cns, sns, a.hostIfOf(t, ccid), b.hostIfOf(t, scid))
		}
		paths = append(paths, benchPath{name: "pod-to-pod cross-node, " + v.label, client: cns, server: sns, serverIP: sip})
	}
	for i := range paths {
		paths[i].port = 16111 + i
		startServer(t, paths[i], "sockperf", "server", "--tcp", "-i", paths[i].serverIP, "-p", strconv.Itoa(paths[i].port))
		startServer(t, paths[i], "sockperf", "server", "-i", paths[i].serverIP, "-p", strconv.Itoa(paths[i].port+50))
	}
	time.Sleep(time.Second)
	if hold := testutil.EnvInt(t, "AXON_LAT_HOLD", 0); hold > 0 { // inspect the setup by hand
		t.Logf("holding the setup for %d s: nodes %s %s, paths %+v", hold, a.e.node, b.e.node, paths)
		time.Sleep(time.Duration(hold) * time.Second)
	}
	return a, b, paths
}

func TestVethLatency(t *testing.T) {
	if os.Getenv("AXON_LAT_BENCH") != "1" && !strings.Contains(flag.Lookup("test.run").Value.String(), "VethLatency") {
		t.Skip("benchmark program, not a test: set AXON_LAT_BENCH=1 or -run TestVethLatency to run it")
	}
	for _, tool := range []string{"sockperf", "taskset", "nsenter", "ethtool", "bpftool"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
	reps, secs := testutil.EnvInt(t, "AXON_LAT_REPS", 7), testutil.EnvInt(t, "AXON_LAT_SECS", 4)
	perfDir := os.Getenv("AXON_LAT_PERF")

	a, b, paths := latSetup(t)

	rr := func(p benchPath, secs int) (bench.SockperfResult, error) {
		out, err := nsCmd(p.client, 0, "sockperf", "ping-pong", "--tcp", "-i", p.serverIP, "-p", strconv.Itoa(p.port),
			"-t", strconv.Itoa(secs), "-m", "64", "--full-rtt").CombinedOutput()
		if err != nil {
			return bench.SockperfResult{}, fmt.Errorf("%s sockperf: %v\n%s", p.name, err, out)
		}
		return bench.ParseSockperf(out)
	}

	type series struct{ p50, avg, soft, cpu []float64 }
	res := make([]series, len(paths))
	var press []float64
	for r := 0; r < reps; r++ {
		for i, p := range paths {
			press = append(press, latPressure())
			var perf *exec.Cmd
			if perfDir != "" && r == reps-1 {
				_ = os.MkdirAll(perfDir, 0o755)
				perf = exec.Command("perf", "record", "-q", "-C", "0,1", "-e", "cpu-clock", "-c", "20000",
					"-o", filepath.Join(perfDir, fmt.Sprintf("path%d.data", i)), "--", "sleep", strconv.Itoa(secs))
				if err := perf.Start(); err != nil {
					t.Fatalf("perf: %v", err)
				}
			}
			s0, c0 := softnetProcessed(t), busyTicks(t)
			sr, err := rr(p, secs)
			s1, c1 := softnetProcessed(t), busyTicks(t)
			if perf != nil {
				_ = perf.Wait()
			}
			if err != nil {
				t.Fatal(err)
			}
			if perf != nil {
				_ = os.WriteFile(filepath.Join(perfDir, fmt.Sprintf("path%d.rts", i)), []byte(fmt.Sprintf("%d %s\n", sr.Observations, p.name)), 0o644)
			}
			p50, _ := sr.P(50)
			res[i].p50 = append(res[i].p50, p50)
			res[i].avg = append(res[i].avg, sr.Avg)
			if sr.Observations > 0 {
				res[i].soft = append(res[i].soft, float64(s1-s0)/float64(sr.Observations))
				res[i].cpu = append(res[i].cpu, float64(c1-c0)*1e4/float64(sr.Observations))
			}
		}
		t.Logf("repetition %d/%d done", r+1, reps)
	}

	var md bytes.Buffer
	uname, _ := exec.Command("uname", "-r").Output()
	fmt.Fprintf(&md, "kernel %s, lab-shaped topology (bridge wire), %d reps × %ds interleaved, sockperf ping-pong TCP 64 B, client CPU 0, server CPU 1; CPU pressure avg10 median %.1f %% (min %.1f, max %.1f)\n\n",
		strings.TrimSpace(string(uname)), reps, secs, stats.Median(press), slices.Min(press), slices.Max(press))
	fmt.Fprintf(&md, "| path | RTT p50 µs median (min–max) | ratio | Δ vs host µs | RTT avg µs | softnet passes per RT | CPU µs per RT (machine) |\n|---|---:|---:|---:|---:|---:|---:|\n")
	for i, p := range paths {
		s := res[i]
		fmt.Fprintf(&md, "| %s | %.2f (%.2f–%.2f) | %.3f× | %+.2f | %.2f | %.2f | %.1f |\n", p.name,
			stats.Median(s.p50), slices.Min(s.p50), slices.Max(s.p50), stats.Median(s.p50)/stats.Median(res[0].p50),
			stats.Median(s.p50)-stats.Median(res[0].p50), stats.Median(s.avg), stats.Median(s.soft), stats.Median(s.cpu))
	}

	if os.Getenv("AXON_LAT_BPFSTATS") == "1" {
		bpfStatsTable(t, &md, a, b, paths, 1, false,
			func(old string) string {
				return fmt.Sprintf("\nBPF program cost (kernel.bpf_stats_enabled=1 for one %ds run per path, then restored to %s):\n\n", secs, old)
			},
			func(p benchPath) error {
				_, err := rr(p, secs)
				return err
			})
	}
	t.Log("\n" + md.String())
	if out := os.Getenv("AXON_LAT_OUT"); out != "" {
		if err := os.WriteFile(out, md.Bytes(), 0o644); err != nil {
			t.Error(err)
		}
	}
}

// latPressure is the machine's CPU pressure (avg10 of /proc/pressure/cpu "some"), -1 when unknown.
func latPressure() float64 {
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

// TestVethCost measures the CPU cost per packet of each path: a UDP stream
// of 64-byte messages at a fixed rate (AXON_LAT_MPS, 50000/s) from the client
// on CPU 0, where the whole send chain (pod stack, veth, backlog, tc/BPF,
// redirect, wire bridge, the other node's uplink, redirect_peer, the
// receiving socket) runs in the sender's softirq. perf samples CPU 0
// (cpu-clock, one sample per 20 µs); samples of the sender and of ksoftirqd
// per packet sent give ns per packet per kernel function, and the difference
// to host-to-host is the pod path's extra cost by stage.
// BPF programs get their own ns/run from bpf_stats.
//
//	AXON_LAT_BENCH=1 AXON_LAT_PERF=/tmp/lat go test -count=1 -run TestVethCost -v ./internal/cni/
func TestVethCost(t *testing.T) {
	if os.Getenv("AXON_LAT_BENCH") != "1" && !strings.Contains(flag.Lookup("test.run").Value.String(), "VethCost") {
		t.Skip("benchmark program, not a test: set AXON_LAT_BENCH=1 or -run TestVethCost to run it")
	}
	for _, tool := range []string{"sockperf", "taskset", "nsenter", "ethtool", "bpftool", "perf"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
	perfDir := os.Getenv("AXON_LAT_PERF")
	if perfDir == "" {
		perfDir = t.TempDir()
	}
	if err := os.MkdirAll(perfDir, 0o755); err != nil {
		t.Fatal(err)
	}
	reps, secs, mps := testutil.EnvInt(t, "AXON_LAT_REPS", 3), testutil.EnvInt(t, "AXON_LAT_SECS", 4), testutil.EnvInt(t, "AXON_LAT_MPS", 50000)
	a, b, paths := latSetup(t)

	var md bytes.Buffer
	fmt.Fprintf(&md, "UDP 64 B at %d msg/s, %d s per sample, %d reps interleaved; CPU pressure at start %.1f %%\n\n| path | rep | packets | sender CPU0 µs per packet | CPU pressure |\n|---|---:|---:|---:|---:|\n", mps, secs, reps, latPressure())
	for r := 0; r < reps; r++ {
		for i, p := range paths {
			out := filepath.Join(perfDir, fmt.Sprintf("cost-r%d-path%d", r, i))
			args := []string{"record", "-q", "-C", "0", "-e", "cpu-clock", "-c", "20000", "-o", out + ".data"}
			if os.Getenv("AXON_LAT_PERFG") == "1" {
				args = append(args, "-g")
			}
			perf := exec.Command("perf", append(args, "--", "sleep", strconv.Itoa(secs))...)
			if err := perf.Start(); err != nil {
				t.Fatalf("perf: %v", err)
			}
			w0 := a.wireTx(t)
			o, err := nsCmd(p.client, 0, "sockperf", "throughput", "-i", p.serverIP, "-p", strconv.Itoa(p.port+50),
				"-t", strconv.Itoa(secs), "-m", "64", "--mps", strconv.Itoa(mps)).CombinedOutput()
			w1 := a.wireTx(t)
			_ = perf.Wait()
			if err != nil {
				t.Fatalf("%s: sockperf throughput: %v\n%s", p.name, err, o)
			}
			pkts := w1 - w0
			if err := os.WriteFile(out+".rts", []byte(fmt.Sprintf("%d %s\n", pkts, p.name)), 0o644); err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&md, "| %s | %d | %d | | %.1f |\n", p.name, r+1, pkts, latPressure())
		}
	}
	if os.Getenv("AXON_LAT_BPFSTATS") == "1" {
		bpfStatsTable(t, &md, a, b, paths, 1000, true,
			func(old string) string {
				return fmt.Sprintf("\nBPF programs, ns per run (bpf_stats on for one %d s UDP run per path, then restored to %s):\n\n", secs, old)
			},
			func(p benchPath) error {
				o, err := nsCmd(p.client, 0, "sockperf", "throughput", "-i", p.serverIP, "-p", strconv.Itoa(p.port+50),
					"-t", strconv.Itoa(secs), "-m", "64", "--mps", strconv.Itoa(mps)).CombinedOutput()
				if err != nil {
					return fmt.Errorf("%s: %v\n%s", p.name, err, o)
				}
				return nil
			})
	}
	t.Log("\n" + md.String())
	if out := os.Getenv("AXON_LAT_OUT"); out != "" {
		if err := os.WriteFile(out, md.Bytes(), 0o644); err != nil {
			t.Error(err)
		}
	}
}

// wireTx is the tx packet count of node n's eth0.
func (n *benchNode) wireTx(t *testing.T) uint64 {
	var c uint64
	if err := n.e.inNode(func() error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		c = l.Attrs().Statistics.TxPackets
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return c
}
