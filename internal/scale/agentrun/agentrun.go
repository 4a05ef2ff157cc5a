// Package agentrun runs one real axon agent process against a real
// kube-apiserver holding N generated Services (internal/scale) and measures
// what the Services benchmark's control-plane targets ask for, from outside the process:
//
//   - full sync: process start → every generated ClusterIP present in the
//     agent's pinned axon_lb_svc with all its endpoints (read from bpffs,
//     not through the agent);
//   - one EndpointSlice change → the pinned map shows it (add one endpoint,
//     then remove it again);
//   - memory: VmHWM and VmRSS of the agent process (/proc/<pid>/status).
//
// The agent runs in a network namespace of its own (axt-svc-<hex>, uplink
// eth0 = one end of a veth pair), attaches its socket LB to a private cgroup
// (<cgroup2>/axt-svc-<hex>) and pins under /sys/fs/bpf/axt-svc-<hex>; a
// forwarder makes the loopback apiserver reachable inside the namespace.
// Everything is removed when Run returns. Nothing in the root namespace is
// changed.
package agentrun

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	mrand "math/rand/v2"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/axonhq/axon/internal/bench/services"
	"github.com/axonhq/axon/internal/lab/controlplane"
	"github.com/axonhq/axon/internal/proc"
	"github.com/axonhq/axon/internal/scale"
	"github.com/axonhq/axon/internal/stats"
)

// NodeName is the Node the measured agent runs for.
const NodeName = "node1"

// Options configure one agent run.
type Options struct {
	// Argv starts the agent: argv[0] is the binary; the agent flags
	// (--node-name, --kubeconfig, --state-dir, --socket, --bpf-root,
	// --cgroup-root, --uplink) are appended unless Flags is false (a test
	// binary in helper mode takes its configuration from Env instead).
	Argv  []string
	Env   []string // extra environment
	Flags bool
	// ConfigEnv, when set, is called with the paths of this run and returns
	// extra environment (the test binary's helper-mode config).
	ConfigEnv func(p Paths) []string

	CP        *controlplane.ControlPlane
	Kube      kubernetes.Interface // admin client (changes)
	Spec      scale.Spec           // the generated Services (already applied)
	IPs       []netip.Addr         // their ClusterIPs
	Changes   int                  // EndpointSlice changes (each adds then removes one endpoint: 2 samples)
	Seed      uint64
	Timeout   time.Duration // full sync bound; default 5 min
	Log       *slog.Logger
	KeepLogOn func() bool // keep the agent log when this returns true (a failure)
	LogCopy   string      // when set, the agent log is copied here at the end
	// Hook, when set, runs right after the agent process started (e.g. a
	// profiler attaching to its pid).
	Hook func(pid int)
}

// Paths are the per-run locations given to the agent.
type Paths struct {
	Netns, Cgroup, PinDir, StateDir, Socket, Kubeconfig, Log string
}

// Result is what one run measured.
type Result struct {
	FullSync   time.Duration // process start → every ClusterIP with all endpoints in the pinned map
	StartDelay time.Duration // exec → process start as the kernel recorded it (not in FullSync)
	ChangesMs  []float64     // EndpointSlice update call → the pinned map shows it, ms
	Settle     time.Duration // full sync → the agent's CPU use falls below 10 % of a core (bounded: 60 s)
	HWMAfter   uint64        // VmHWM bytes right after the full sync
	HWM        uint64        // VmHWM bytes at the end (after the changes)
	RSS        uint64        // VmRSS bytes at the end
	Logged     string        // took= of the agent's own "services synced" log line
	PSI        [2]float64    // /proc/pressure/cpu some avg10 before, after
	Paths      Paths         `json:"-"`
	LogTail    string        `json:"-"` // last agent log lines, on failure
}

// P returns the q-quantile (0..1) of the change latencies in ms, by nearest
// rank: always one of the measured latencies.
func (r Result) P(q float64) float64 { return stats.NearestRank(r.ChangesMs, q) }

func randHex() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// EnsureNode creates the measured agent's Node (podCIDR 10.244.1.0/24,
// InternalIP 198.18.0.11) unless it exists.
func EnsureNode(ctx context.Context, kube kubernetes.Interface) error {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: NodeName},
		Spec:       corev1.NodeSpec{PodCIDR: "10.244.1.0/24", PodCIDRs: []string{"10.244.1.0/24"}},
	}
	created, err := kube.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("create node %s: %w", NodeName, err)
	}
	created.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "198.18.0.11"}}
	created.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
	if _, err := kube.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("set node %s status: %w", NodeName, err)
	}
	return nil
}

func cgroup2Mount() (string, error) {
	f, err := os.Open("/proc/mounts")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fs := strings.Fields(sc.Text()); len(fs) >= 3 && fs[2] == "cgroup2" {
			return fs[1], nil
		}
	}
	return "", errors.New("no cgroup2 filesystem in /proc/mounts")
}

func ipCmd(args ...string) error {
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Run starts the agent, measures, stops it and removes what it created.
func Run(ctx context.Context, o Options) (res Result, err error) {
	if o.Timeout == 0 {
		o.Timeout = 5 * time.Minute
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	id := "axt-svc-" + randHex()
	mnt, err := cgroup2Mount()
	if err != nil {
		return res, err
	}
	dir, err := os.MkdirTemp("", id+"-")
	if err != nil {
		return res, err
	}
	p := Paths{Netns: id, Cgroup: filepath.Join(mnt, id), PinDir: filepath.Join("/sys/fs/bpf", id),
		StateDir: filepath.Join(dir, "state"), Socket: filepath.Join(dir, "axon.sock"), Log: filepath.Join(dir, "agent.log")}
	res.Paths = p
	var cleanups []func()
	defer func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
		if err == nil || o.KeepLogOn == nil || !o.KeepLogOn() {
			os.RemoveAll(dir)
		}
	}()

	// network namespace with an uplink
	if err = ipCmd("netns", "add", id); err != nil {
		return res, err
	}
	cleanups = append(cleanups, func() { _ = ipCmd("netns", "del", id) })
	for _, args := range [][]string{
		{"-n", id, "link", "set", "lo", "up"},
		{"-n", id, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0peer"},
		{"-n", id, "addr", "add", "198.18.0.11/24", "dev", "eth0"},
		{"-n", id, "link", "set", "eth0peer", "up"},
		{"-n", id, "link", "set", "eth0", "up"},
	} {
		if err = ipCmd(args...); err != nil {
			return res, err
		}
	}
	nsPath := "/run/netns/" + id
	// the apiserver, reachable inside the namespace at the same address
	u, err := url.Parse(o.CP.Server())
	if err != nil {
		return res, fmt.Errorf("apiserver address %q: %w", o.CP.Server(), err)
	}
	fwd, err := controlplane.ListenForwarder([]string{nsPath}, u.Host, u.Host, o.Log)
	if err != nil {
		return res, fmt.Errorf("forward the apiserver into %s: %w", id, err)
	}
	fctx, stopFwd := context.WithCancel(context.WithoutCancel(ctx))
	fdone := make(chan struct{})
	go func() { defer close(fdone); _ = fwd.Serve(fctx) }()
	cleanups = append(cleanups, func() { stopFwd(); fwd.Close(); <-fdone })
	// cgroup and pins: removed after the agent (cleanups run in reverse)
	if err = os.Mkdir(p.Cgroup, 0o755); err != nil {
		return res, fmt.Errorf("create cgroup: %w", err)
	}
	cleanups = append(cleanups, func() {
		for range 100 {
			if e := os.Remove(p.Cgroup); e == nil || errors.Is(e, os.ErrNotExist) {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
	cleanups = append(cleanups, func() { _ = os.RemoveAll(p.PinDir) })
	if p.Kubeconfig, err = o.CP.AgentKubeconfig(NodeName); err != nil {
		return res, err
	}
	res.Paths = p

	argv := slices.Clone(o.Argv)
	if o.Flags {
		argv = append(argv, "--node-name", NodeName, "--kubeconfig", p.Kubeconfig, "--state-dir", p.StateDir,
			"--socket", p.Socket, "--bpf-root", p.PinDir, "--cgroup-root", p.Cgroup, "--uplink", "eth0")
	}
	logf, err := os.Create(p.Log)
	if err != nil {
		return res, err
	}
	defer logf.Close()
	cmd := exec.Command("nsenter", append([]string{"--net=" + nsPath}, argv...)...)
	cmd.Env = append(os.Environ(), o.Env...)
	if o.ConfigEnv != nil {
		cmd.Env = append(cmd.Env, o.ConfigEnv(p)...)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	res.PSI[0] = cpuPressure()
	t0 := time.Now()
	if err = cmd.Start(); err != nil {
		return res, fmt.Errorf("start agent: %w", err)
	}
	pid := cmd.Process.Pid
	if o.Hook != nil {
		o.Hook(pid)
	}
	if o.LogCopy != "" {
		defer func() {
			if b, e := os.ReadFile(p.Log); e == nil {
				_ = os.WriteFile(o.LogCopy, b, 0o644)
			}
		}()
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	cleanups = append(cleanups, func() {
		if cmd.ProcessState != nil {
			return
		}
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	defer func() {
		if err != nil {
			res.LogTail = tail(p.Log, 30)
		}
	}()

	start := t0
	if st, e := proc.StartTime(pid); e == nil && st.After(t0.Add(-20*time.Millisecond)) {
		start = st
	}
	res.StartDelay = start.Sub(t0)
	// full sync: poll the pinned map
	deadline := t0.Add(o.Timeout)
	next := 0 // index of the first IP not yet seen complete
	for {
		select {
		case e := <-exited:
			return res, fmt.Errorf("agent exited during the full sync: %v", e)
		default:
		}
		if m, e := services.OpenLBSvcMap(p.PinDir); e == nil {
			for next < len(o.IPs) {
				act, ok, e := m.Active(o.IPs[next], scale.ServicePort)
				if e != nil || !ok || act != o.Spec.Endpoints {
					break
				}
				next++
			}
			m.Close()
		}
		if next == len(o.IPs) {
			res.FullSync = time.Since(start)
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return res, fmt.Errorf("agent: %d of %d Services in the pinned map after %s", next, len(o.IPs), o.Timeout)
		}
		time.Sleep(2 * time.Millisecond)
	}
	res.HWMAfter, _, _ = vmStatus(pid)
	res.Logged = loggedTook(p.Log)
	// steady state: the changes are measured once the agent is done with
	// what follows the sync (writes of other maps, GC)
	synced := time.Now()
	for time.Since(synced) < time.Minute && ctx.Err() == nil {
		c0, _ := cpuTicks(pid)
		time.Sleep(500 * time.Millisecond)
		c1, err := cpuTicks(pid)
		if err != nil || c1-c0 <= 5 { // ≤ 50 ms of CPU in 500 ms (USER_HZ 100)
			break
		}
	}
	res.Settle = time.Since(synced)

	// changes
	m, err := services.OpenLBSvcMap(p.PinDir)
	if err != nil {
		return res, err
	}
	defer m.Close()
	rng := mrand.New(mrand.NewPCG(o.Seed, 7))
	for range o.Changes {
		i := rng.IntN(len(o.IPs))
		for _, n := range []int{o.Spec.Endpoints + 1, o.Spec.Endpoints} {
			change, err := scale.PrepareEndpoints(ctx, o.Kube, o.Spec, i, n)
			if err != nil {
				return res, err
			}
			w := time.Now() // the change exists from its write on, not from the read before it
			if err = change.Apply(ctx); err != nil {
				return res, err
			}
			for {
				act, ok, e := m.Active(o.IPs[i], scale.ServicePort)
				if e != nil {
					return res, e
				}
				if ok && act == n {
					res.ChangesMs = append(res.ChangesMs, float64(time.Since(w).Microseconds())/1e3)
					break
				}
				if time.Since(w) > 30*time.Second {
					return res, fmt.Errorf("change of Service %d to %d endpoints not in the map after 30s", i, n)
				}
				time.Sleep(250 * time.Microsecond)
			}
		}
	}
	res.HWM, res.RSS, _ = vmStatus(pid)
	res.PSI[1] = cpuPressure()
	return res, nil
}

// vmStatus reads VmHWM and VmRSS (bytes) of pid.
func vmStatus(pid int) (hwm, rss uint64, err error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.ParseUint(f[1], 10, 64)
		switch f[0] {
		case "VmHWM:":
			hwm = v << 10
		case "VmRSS:":
			rss = v << 10
		}
	}
	return hwm, rss, nil
}

// cpuTicks is utime+stime of pid in clock ticks.
func cpuTicks(pid int) (uint64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, errors.New("bad /proc stat")
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, errors.New("short /proc stat")
	}
	u, _ := strconv.ParseUint(f[11], 10, 64)
	st, _ := strconv.ParseUint(f[12], 10, 64)
	return u + st, nil
}

// cpuPressure is /proc/pressure/cpu "some avg10" (NaN when unavailable).
func cpuPressure() float64 {
	data, err := os.ReadFile("/proc/pressure/cpu")
	if err != nil {
		return math.NaN()
	}
	for _, f := range strings.Fields(string(data)) {
		if v, ok := strings.CutPrefix(f, "avg10="); ok {
			x, _ := strconv.ParseFloat(v, 64)
			return x
		}
	}
	return math.NaN()
}

// loggedTook is the took= of the agent's last "services synced" line with a writer.
func loggedTook(path string) string {
	data, _ := os.ReadFile(path)
	took := ""
	for _, l := range strings.Split(string(data), "\n") {
		if strings.Contains(l, `msg="services synced"`) && strings.Contains(l, "writer=true") {
			if _, v, ok := strings.Cut(l, "took="); ok {
				took, _, _ = strings.Cut(v, " ")
			}
		}
	}
	return took
}

func tail(path string, n int) string {
	data, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
