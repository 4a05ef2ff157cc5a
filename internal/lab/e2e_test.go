package lab_test

// Lab end-to-end tests. They need root, the cached dependencies (`make deps`)
// and build axon, axon-agent and axon-cni themselves (TestMain). They use the
// default state dir and the machine-wide axonlab-* names: one lab per machine,
// so they skip when a lab they did not create is already up.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/axonhq/axon/internal/lab"
	"github.com/axonhq/axon/internal/testutil"
)

var (
	binDir   string // built binaries
	buildErr error  // why they could not be built
)

func TestMain(m *testing.M) {
	code := func() int {
		if os.Geteuid() != 0 {
			return m.Run() // tests skip themselves
		}
		dir, err := os.MkdirTemp("", "axt-lab-bin-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		binDir = dir
		cmd := exec.Command("go", "build", "-o", dir+"/", "./cmd/axon", "./cmd/axon-agent", "./cmd/axon-cni")
		cmd.Dir = "../.."
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/...: %w\n%s", err, out)
		}
		return m.Run()
	}()
	os.Exit(code)
}

// need skips without root or cached deps and fails when the binaries the
// test needs did not build.
func need(t *testing.T, bins ...string) {
	t.Helper()
	testutil.RequireRoot(t, "network namespaces, bpffs, cgroups")
	for _, d := range []string{"etcd", "kube-apiserver", "kubectl", "ptp", "host-local"} {
		if _, err := lab.DepPath(d); errors.Is(err, lab.ErrDepMissing) {
			t.Skipf("cached dependency missing (%v): run `make deps`", err)
		}
	}
	for _, b := range bins {
		if _, err := os.Stat(filepath.Join(binDir, b)); err != nil {
			t.Fatalf("%s was not built: %v", b, buildErr)
		}
	}
	if _, err := os.Stat(filepath.Join(lab.DefaultStateDir, "lab.json")); err == nil {
		t.Skipf("a lab is already up in %s (not created by this test): run `axon lab down` to let the test run", lab.DefaultStateDir)
	}
	if ents, _ := filepath.Glob("/run/netns/" + lab.NetnsPrefix + "*"); len(ents) > 0 {
		t.Skipf("lab namespaces exist (%v): run `axon lab down` to let the test run", ents)
	}
}

// axon runs the built CLI and returns stdout; it fails the test on error.
func axon(t *testing.T, args ...string) string {
	t.Helper()
	out, err := axonErr(t, args...)
	if err != nil {
		t.Fatalf("axon %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func axonErr(t *testing.T, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute) // also used in Cleanup, after t.Context() is done
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "axon"), append([]string{"lab"}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		return stdout.String() + stderr.String(), err
	}
	return stdout.String(), nil
}

// up brings a lab up through the CLI and registers `down` + the
// nothing-left assertions as cleanup.
func up(t *testing.T, args ...string) *lab.Lab {
	t.Helper()
	t.Cleanup(func() { downAndAssertClean(t) })
	t0 := time.Now()
	axon(t, append([]string{"up"}, args...)...)
	t.Logf("axon lab up %s: %s", strings.Join(args, " "), time.Since(t0).Round(time.Millisecond))
	l, err := lab.Load(lab.DefaultStateDir)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// downAndAssertClean runs `axon lab down` twice and checks that nothing of the lab is left.
func downAndAssertClean(t *testing.T) {
	t.Helper()
	var procs []*lab.Proc
	var cpPIDs []int
	var cg string
	if l, err := lab.Load(lab.DefaultStateDir); err == nil {
		st := l.State()
		procs = append(procs, st.Forwarder)
		for _, n := range st.Nodes {
			procs = append(procs, n.Agent, n.KubeProxy)
		}
		for _, v := range st.VMPods { // --vm-pods: the guests' QEMU and DHCP responders
			procs = append(procs, v.QEMU, v.DHCP)
		}
		cpPIDs, cg = st.ControlPlane.PIDs, st.Cgroup
	}
	for i := range 2 { // safe to run twice
		if out, err := axonErr(t, "down"); err != nil {
			t.Errorf("axon lab down (run %d): %v\n%s", i+1, err, out)
		}
	}
	if ents, _ := filepath.Glob("/run/netns/" + lab.NetnsPrefix + "*"); len(ents) > 0 {
		t.Errorf("namespaces left after down: %v", ents)
	}
	for _, p := range procs {
		if p.Alive() {
			t.Errorf("process %d left after down", p.PID)
		}
	}
	for _, pid := range cpPIDs {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil && bytes.Contains(b, []byte("axon-lab")) {
			t.Errorf("control plane process %d left after down: %s", pid, b)
		}
	}
	for _, p := range []string{lab.PinRoot, cg, filepath.Join(lab.DefaultStateDir, "lab.json"), filepath.Join(lab.DefaultStateDir, "vm")} {
		if _, err := os.Stat(p); p != "" && err == nil {
			t.Errorf("%s left after down", p)
		}
	}
}

func podsOn(l *lab.Lab, node string) []lab.Pod {
	var out []lab.Pod
	for _, p := range l.Pods() {
		if p.Node == node {
			out = append(out, p)
		}
	}
	return out
}

// checkMatrix runs `axon lab check`, requires it to pass and returns its output.
func checkMatrix(t *testing.T) string {
	t.Helper()
	t0 := time.Now()
	out, err := axonErr(t, "check")
	t.Logf("axon lab check (%s):\n%s", time.Since(t0).Round(time.Millisecond), out)
	if err != nil {
		t.Fatalf("axon lab check failed: %v", err)
	}
	return out
}

func TestLabListShape(t *testing.T) {
	need(t, "axon")
	l := up(t, "--nodes", "2", "--pods-per-node", "1", "--datapath", "baseline")
	t.Run("bad input keeps state", func(t *testing.T) { badInput(t, l) })
	var got map[string]json.RawMessage
	out := axon(t, "list", "-o", "json")
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("list -o json: %v\n%s", err, out)
	}
	keys := func(raw json.RawMessage) []string {
		var m map[string]any
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
		var ks []string
		for k := range m {
			ks = append(ks, k)
		}
		slices.Sort(ks)
		return ks
	}
	var nodes, pods []json.RawMessage
	if err := json.Unmarshal(got["nodes"], &nodes); err != nil || len(nodes) != 2 {
		t.Fatalf("nodes: %v %s", err, got["nodes"])
	}
	if err := json.Unmarshal(got["pods"], &pods); err != nil || len(pods) != 2 {
		t.Fatalf("pods: %v %s", err, got["pods"])
	}
	tests := []struct {
		what string
		raw  json.RawMessage
		want []string
	}{
		{"node", nodes[0], []string{"ip", "ips", "name", "netns", "podCIDRs"}},
		{"pod", pods[0], []string{"datapath", "ip", "ips", "name", "namespace", "netns", "node"}},
		{"external", got["external"], []string{"ip", "name", "netns"}},
	}
	for _, tc := range tests {
		if k := keys(tc.raw); !slices.Equal(k, tc.want) {
			t.Errorf("%s keys = %v, want %v", tc.what, k, tc.want)
		}
	}
	var n struct {
		Name     string         `json:"name"`
		IP       netip.Addr     `json:"ip"`
		IPs      []netip.Addr   `json:"ips"`
		PodCIDRs []netip.Prefix `json:"podCIDRs"`
	}
	_ = json.Unmarshal(nodes[0], &n)
	if n.Name != "node1" || n.IP != netip.MustParseAddr("198.18.0.11") || len(n.IPs) != 2 ||
		n.IPs[1] != netip.MustParseAddr("fd00:198:18::11") || len(n.PodCIDRs) != 2 ||
		n.PodCIDRs[0] != netip.MustParsePrefix("10.244.1.0/24") {
		t.Errorf("node1 = %+v", n)
	}
	var p struct {
		Name string       `json:"name"`
		IP   netip.Addr   `json:"ip"`
		IPs  []netip.Addr `json:"ips"`
	}
	_ = json.Unmarshal(pods[0], &p)
	if p.Name != "node1-pod1" || !p.IP.Is4() || len(p.IPs) != 2 || !p.IPs[1].Is6() ||
		!netip.MustParsePrefix("10.245.1.0/24").Contains(p.IP) {
		t.Errorf("pod = %+v (want a baseline address in 10.245.1.0/24 and one IPv6)", p)
	}
}

// badInput: rejected AddPod/DeletePod calls say why and change nothing.
func badInput(t *testing.T, l *lab.Lab) {
	ctx := t.Context()
	before := axon(t, "list", "-o", "json")
	tests := []struct {
		node, name, datapath, want string
	}{
		{"node9", "p", lab.DatapathBaseline, `no node "node9"`},
		{"node1", "Bad_Name", lab.DatapathBaseline, "not a valid pod name"},
		{"node1", "node1-pod1", lab.DatapathBaseline, "the name is taken"},
		{"node1", "node2", lab.DatapathBaseline, "taken by a node"},
		{"node1", "p", "calico", `unknown datapath "calico"`},
		{"node1", "p", lab.DatapathAxon, "runs no axon-agent"},
	}
	for _, tc := range tests {
		_, err := l.AddPod(ctx, tc.node, tc.name, tc.datapath)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("AddPod(%s, %s, %s) error = %v, want %q", tc.node, tc.name, tc.datapath, err, tc.want)
		}
	}
	if err := l.DeletePod(ctx, "nope"); err == nil || !strings.Contains(err.Error(), `no pod "nope"`) {
		t.Errorf("DeletePod(nope) error = %v", err)
	}
	if err := l.Command(ctx, "nope", "true").Run(); err == nil || !strings.Contains(err.Error(), "unknown lab target") {
		t.Errorf("Command(nope) error = %v", err)
	}
	if after := axon(t, "list", "-o", "json"); after != before {
		t.Errorf("bad input changed the lab:\nbefore %s\nafter  %s", before, after)
	}
	if _, err := os.Stat("/run/netns/" + lab.NetnsPrefix + "p"); err == nil {
		t.Error("a rejected pod left its netns behind")
	}
}

// TestLabBaselineRecover: a baseline lab passes the check, `up` after a
// crash (forwarder killed, a netns deleted behind the lab's back) recovers,
// and `exec` propagates exit codes and places pods in their cgroup.
func TestLabBaselineRecover(t *testing.T) {
	need(t, "axon")
	l := up(t, "--nodes", "2", "--pods-per-node", "2", "--datapath", "baseline")
	checkMatrix(t)

	// exec: exit code and cgroup.
	pod := l.Pods()[0]
	if _, err := axonErr(t, "exec", pod.Name, "--", "sh", "-c", "exit 7"); err == nil {
		t.Error("exec: want exit status 7, got success")
	} else if ee := (*exec.ExitError)(nil); !errors.As(err, &ee) || ee.ExitCode() != 7 {
		t.Errorf("exec: want exit status 7, got %v", err)
	}
	out := axon(t, "exec", pod.Name, "--", "cat", "/proc/self/cgroup")
	if !strings.Contains(out, "/axon-lab/"+pod.Node+"/"+pod.Name) {
		t.Errorf("exec in pod %s: cgroup = %q, want .../axon-lab/%s/%s", pod.Name, out, pod.Node, pod.Name)
	}

	// Crash: kill the forwarder, delete a pod netns.
	st := l.State()
	if err := stopPID(st.Forwarder.PID); err != nil {
		t.Fatal(err)
	}
	if err := exec.Command("ip", "netns", "del", st.Pods[1].Netns).Run(); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	axon(t, "up", "--nodes", "2", "--pods-per-node", "2", "--datapath", "baseline")
	t.Logf("up after crash: %s", time.Since(t0).Round(time.Millisecond))
	checkMatrix(t)
}

func stopPID(pid int) error {
	p, err := os.FindProcess(pid)
	if err != nil {
		return err
	}
	return p.Kill()
}

// TestLabE2E is the lab's two-node, four-pod scenario under the axon datapath.
func TestLabE2E(t *testing.T) {
	need(t, "axon", "axon-agent", "axon-cni")
	l := up(t, "--nodes", "2", "--pods-per-node", "2")
	if n := len(l.Pods()); n != 4 {
		t.Fatalf("want 4 pods, have %d", n)
	}
	checkMatrix(t)
	ctx := t.Context()

	src, dst := podsOn(l, "node1")[0], podsOn(l, "node2")[0]
	t.Run("restart agent under traffic", func(t *testing.T) {
		restartUnderTraffic(t, ctx, l, src, dst, "node1")
	})
	t.Run("churn 50 pods", func(t *testing.T) {
		churn(t, ctx, l, "node1", 50)
	})
	t.Run("no IP forwarding on the fast path", func(t *testing.T) {
		axonDelta := forwardedDuring(t, ctx, l, src, dst)
		if axonDelta > 5 {
			t.Errorf("axon pod-to-pod cross-node: node IpForwDatagrams grew by %d, want ~0 (BPF host routing bypasses the stack)", axonDelta)
		}
		// Control: baseline pods in the same lab are forwarded by the kernel.
		b1, err := l.AddPod(ctx, "node1", "base1", lab.DatapathBaseline)
		if err != nil {
			t.Fatal(err)
		}
		b2, err := l.AddPod(ctx, "node2", "base2", lab.DatapathBaseline)
		if err != nil {
			t.Fatal(err)
		}
		baseDelta := forwardedDuring(t, ctx, l, b1, b2)
		if baseDelta < 100 {
			t.Errorf("baseline control: IpForwDatagrams grew by only %d, want >= 100: is the counter read in the right netns?", baseDelta)
		}
		t.Logf("IpForwDatagrams delta (node1+node2) for 200 pings + 1 s TCP: axon %d, baseline %d", axonDelta, baseDelta)
		for _, p := range []string{b1.Name, b2.Name} {
			if err := l.DeletePod(ctx, p); err != nil {
				t.Error(err)
			}
		}
	})
	checkMatrix(t)
}

// restartUnderTraffic restarts node's agent while a 10 s iperf3 stream and
// a 20 Hz ping run from src to dst.
func restartUnderTraffic(t *testing.T, ctx context.Context, l *lab.Lab, src, dst lab.Pod, node string) {
	if _, err := exec.LookPath("iperf3"); err != nil {
		t.Skip("iperf3 not installed: `make packages`")
	}
	iperfServer(t, ctx, l, dst.Name, 5201)

	// 20 Hz for 12 s with the lab's built-in pinger (raw ICMP socket).
	ping := l.Command(ctx, src.Name, filepath.Join(binDir, "axon"), "lab", "_echo", "ping", "-c", "240", "-i", "50ms", "-W", "1s", dst.IPs[0].String())
	var pingOut bytes.Buffer
	ping.Stdout = &pingOut
	cli := l.Command(ctx, src.Name, "iperf3", "-c", dst.IP.String(), "-p", "5201", "-t", "10", "-J")
	var cliOut, cliErr bytes.Buffer
	cli.Stdout, cli.Stderr = &cliOut, &cliErr
	if err := ping.Start(); err != nil {
		t.Fatal(err)
	}
	if err := cli.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	t0 := time.Now()
	if err := l.RestartAgent(ctx, node); err != nil {
		t.Fatalf("restart agent: %v", err)
	}
	t.Logf("agent on %s restarted and healthy in %s", node, time.Since(t0).Round(time.Millisecond))
	cliErrRun := cli.Wait()
	_ = ping.Wait() // exit 1 if any loss; judged below
	var res struct {
		Error string `json:"error"`
		End   struct {
			SumReceived struct {
				Bytes         float64 `json:"bytes"`
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if err := json.Unmarshal(cliOut.Bytes(), &res); err != nil {
		t.Fatalf("iperf3 output: %v (exit %v)\n%s%s", err, cliErrRun, cliOut.String(), cliErr.String())
	}
	if cliErrRun != nil || res.Error != "" || res.End.SumReceived.Bytes == 0 {
		t.Errorf("iperf3 stream broken by the agent restart: exit %v, error %q", cliErrRun, res.Error)
	}
	m := regexp.MustCompile(`(\d+) packets transmitted, (\d+) received`).FindStringSubmatch(pingOut.String())
	if m == nil {
		t.Fatalf("ping summary not found:\n%s", pingOut.String())
	}
	sent, _ := strconv.Atoi(m[1])
	recv, _ := strconv.Atoi(m[2])
	t.Logf("during restart: ping %d/%d received, iperf3 %.2f Gbit/s", recv, sent, res.End.SumReceived.BitsPerSecond/1e9)
	if sent-recv > 1 || sent < 100 {
		t.Errorf("ping lost %d of %d packets across the agent restart, want at most 1", sent-recv, sent)
	}
}

// iperfServer starts a one-off iperf3 server in target and waits until it listens.
func iperfServer(t *testing.T, ctx context.Context, l *lab.Lab, target string, port int) *exec.Cmd {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second) // bounds a server that never gets its client
	t.Cleanup(cancel)
	srv := l.Command(ctx, target, "iperf3", "-s", "-1", "--forceflush", "-p", strconv.Itoa(port))
	out, err := srv.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer // iperf3 says why it did not listen here ("Address already in use")
	srv.Stderr = &stderr
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Process.Kill(); _ = srv.Wait() })
	timer := time.AfterFunc(10*time.Second, cancel) // no "Server listening" line: give up
	defer timer.Stop()
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if strings.Contains(sc.Text(), "Server listening") {
			go func() { _, _ = io.Copy(io.Discard, out) }()
			return srv
		}
	}
	werr := srv.Wait() // stdout ended: the server exited, or the 10 s timer killed it
	t.Fatalf("iperf3 server in %s on port %d did not start (read: %v, exit: %v): %s", target, port, sc.Err(), werr, bytes.TrimSpace(stderr.Bytes()))
	return nil
}

// awaitIperfServer waits until a one-shot server of iperfServer has exited
// after its client, so that the next server can bind the same port (a
// server started while the last one still printed its summary failed with
// "Address already in use").
func awaitIperfServer(t *testing.T, srv *exec.Cmd) {
	t.Helper()
	done := make(chan struct{})
	go func() { _ = srv.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("iperf3 server %d still runs 10 s after its client finished", srv.Process.Pid)
	}
}

// allocatedIPs lists the files named like an IP address under dir (the agent's IPAM store).
func allocatedIPs(t *testing.T, dir string) []string {
	t.Helper()
	var ips []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if _, perr := netip.ParseAddr(d.Name()); perr == nil && !d.IsDir() {
			ips = append(ips, d.Name())
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walk IPAM dir %s: %v", dir, err)
	}
	slices.Sort(ips)
	return ips
}

type snapshot struct {
	ips, links, endpoints []string
}

func snap(t *testing.T, ctx context.Context, l *lab.Lab, node string) snapshot {
	t.Helper()
	n := nodeByName(t, l, node)
	links, err := l.HostLinks(node)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(links)
	c, err := l.Agent(node)
	if err != nil {
		t.Fatal(err)
	}
	eps, err := c.Endpoints(ctx)
	if err != nil {
		t.Fatalf("agent endpoints on %s: %v", node, err)
	}
	var ids []string
	for _, e := range eps {
		ids = append(ids, e.ContainerID+"/"+e.IfName)
	}
	slices.Sort(ids)
	return snapshot{ips: allocatedIPs(t, n.StateDir), links: links, endpoints: ids}
}

func nodeByName(t *testing.T, l *lab.Lab, name string) lab.Node {
	t.Helper()
	for _, n := range l.Nodes() {
		if n.Name == name {
			return n
		}
	}
	t.Fatalf("no node %s", name)
	return lab.Node{}
}

func churn(t *testing.T, ctx context.Context, l *lab.Lab, node string, count int) {
	before := snap(t, ctx, l, node)
	if want := len(podsOn(l, node)); len(before.endpoints) != want || len(before.ips) != 2*want {
		t.Errorf("before churn on %s: %d endpoints and %d IPAM allocations, want %d and %d (one endpoint, two addresses per pod)",
			node, len(before.endpoints), len(before.ips), want, 2*want)
	}
	t0 := time.Now()
	seen := map[netip.Addr]bool{}
	for i := range count {
		name := fmt.Sprintf("churn%d", i)
		p, err := l.AddPod(ctx, node, name, lab.DatapathAxon)
		if err != nil {
			t.Fatalf("churn %d add: %v", i, err)
		}
		if len(p.IPs) != 2 {
			t.Errorf("churn pod %s has IPs %v, want one IPv4 and one IPv6", name, p.IPs)
		}
		seen[p.IP] = true
		if err := l.DeletePod(ctx, name); err != nil {
			t.Fatalf("churn %d del: %v", i, err)
		}
	}
	t.Logf("churn: %d ADD/DEL on %s in %s (%d distinct IPv4)", count, node, time.Since(t0).Round(time.Millisecond), len(seen))
	after := snap(t, ctx, l, node)
	for _, c := range []struct {
		what          string
		before, after []string
	}{
		{"IPAM allocations", before.ips, after.ips},
		{"host-side links", before.links, after.links},
		{"agent endpoints", before.endpoints, after.endpoints},
	} {
		if !slices.Equal(c.before, c.after) {
			t.Errorf("%s leaked by churn on %s:\n before %v\n after  %v", c.what, node, c.before, c.after)
		}
	}
}

// forwardedDuring returns how much IpForwDatagrams grew on both nodes while
// src sent 200 pings and 1 s of TCP to dst.
func forwardedDuring(t *testing.T, ctx context.Context, l *lab.Lab, src, dst lab.Pod) uint64 {
	t.Helper()
	read := func() uint64 {
		var sum uint64
		for _, n := range l.Nodes() {
			v, err := lab.ReadSNMP(n.Netns, "Ip", "ForwDatagrams")
			if err != nil {
				t.Fatal(err)
			}
			sum += v
		}
		return sum
	}
	before := read()
	if out, err := l.Command(ctx, src.Name, filepath.Join(binDir, "axon"), "lab", "_echo", "ping", "-c", "200", "-i", "2ms", dst.IP.String()).CombinedOutput(); err != nil {
		t.Fatalf("ping %s -> %s: %v\n%s", src.Name, dst.Name, err, out)
	}
	if _, err := exec.LookPath("iperf3"); err == nil {
		iperfServer(t, ctx, l, dst.Name, 5202)
		if out, err := l.Command(ctx, src.Name, "iperf3", "-c", dst.IP.String(), "-p", "5202", "-t", "1").CombinedOutput(); err != nil {
			t.Errorf("iperf3 %s -> %s: %v\n%s", src.Name, dst.Name, err, out)
		}
	}
	return read() - before
}
