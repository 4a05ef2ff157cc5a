package lab

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/proc"
)

// Lab is a handle on a lab recorded in a state dir. Methods that change the
// lab take the state lock, re-read lab.json, apply the change and write it
// back, so several processes (CLI, benchmark, tests) can share one lab.
type Lab struct {
	dir string
	log *slog.Logger

	mu   sync.Mutex // guards st within this process
	st   *State
	kube kubernetes.Interface
}

// ErrNoLab: Load found no lab in its state directory.
var ErrNoLab = errors.New("no lab")

// Load opens the lab recorded in stateDir; an error wrapping ErrNoLab when
// there is none.
func Load(stateDir string) (*Lab, error) {
	st, err := readState(stateDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w in %s: run `axon lab up` first", ErrNoLab, stateDir)
	}
	if err != nil {
		return nil, err
	}
	return &Lab{dir: stateDir, log: slog.New(slog.DiscardHandler), st: st}, nil
}

// SetLogger sets where the lab logs its progress (default: nowhere).
func (l *Lab) SetLogger(log *slog.Logger) { l.log = log }

// State returns a copy of the lab's recorded state.
func (l *Lab) State() State {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := *l.st
	s.Nodes = slices.Clone(l.st.Nodes)
	s.Pods = slices.Clone(l.st.Pods)
	s.VMPods = slices.Clone(l.st.VMPods)
	return s
}

// Nodes returns the lab nodes in index order.
func (l *Lab) Nodes() []Node { return l.State().Nodes }

// Pods returns the lab pods in creation order.
func (l *Lab) Pods() []Pod { return l.State().Pods }

// External returns the namespace playing a client outside the cluster.
func (l *Lab) External() External { return l.State().External }

// StateDir is where lab.json lives.
func (l *Lab) StateDir() string { return l.dir }

// AdminKubeconfig is the cluster-admin kubeconfig of the lab's apiserver.
func (l *Lab) AdminKubeconfig() string { return l.State().ControlPlane.Kubeconfig }

// Kube returns an admin client of the lab's apiserver.
func (l *Lab) Kube() (kubernetes.Interface, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.kube == nil {
		c, err := kubeClient(l.st.ControlPlane.Kubeconfig)
		if err != nil {
			return nil, err
		}
		l.kube = c
	}
	return l.kube, nil
}

// Agent returns an API client for the agent of node.
func (l *Lab) Agent(node string) (*api.Client, error) {
	st := l.State()
	n, ok := st.Node(node)
	if !ok {
		return nil, fmt.Errorf("no node %q in the lab (have %s)", node, l.nodeNames())
	}
	return api.NewClient(n.Socket), nil
}

func (l *Lab) nodeNames() string {
	var names []string
	for _, n := range l.Nodes() {
		names = append(names, n.Name)
	}
	return strings.Join(names, ", ")
}

// mutate runs fn on the freshest lab.json under the state lock and writes
// the result back (also when fn fails, so partial progress is recorded).
func (l *Lab) mutate(fn func(st *State) error) error {
	unlock, err := lockState(l.dir)
	if err != nil {
		return err
	}
	defer unlock()
	st, err := readState(l.dir)
	if err != nil {
		return err
	}
	l.mu.Lock()
	l.st = st
	l.mu.Unlock()
	ferr := fn(st)
	l.mu.Lock()
	l.st = st
	l.mu.Unlock()
	if err := writeState(l.dir, st); err != nil {
		return errors.Join(ferr, err)
	}
	return ferr
}

// Command returns a command that runs argv in target's network namespace
// (target: a node name, a pod name or "external"; in a --kubelet lab also a
// pod kubelet runs, "<namespace>/<pod>" or "<pod>"); for a pod, the process
// starts directly in the pod's cgroup, as a container would. An unknown
// target makes Start/Run fail with an error listing the known ones.
func (l *Lab) Command(ctx context.Context, target string, argv ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "nsenter")
	if len(argv) == 0 {
		cmd.Err = errors.New("no command given: use `axon lab exec <target> -- <cmd...>`")
		return cmd
	}
	netns, cg, err := l.target(ctx, target)
	if err != nil {
		cmd.Err = err
		return cmd
	}
	cmd.Args = append([]string{"nsenter", "--net=" + netns, "--"}, argv...)
	if cg != "" {
		fd, err := syscall.Open(cg, syscall.O_DIRECTORY|syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
		if err != nil {
			cmd.Err = fmt.Errorf("open pod cgroup %s: %w", cg, err)
			return cmd
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
		// The fd must stay open until Start: close it once the Cmd is garbage.
		runtime.AddCleanup(cmd, func(fd int) { syscall.Close(fd) }, fd)
	}
	return cmd
}

// target resolves a node, pod or "external" to its netns path and cgroup.
func (l *Lab) target(ctx context.Context, name string) (netns, cgroup string, err error) {
	st := l.State()
	if n, ok := st.Node(name); ok {
		return netnsutil.Path(n.Netns), "", nil
	}
	if p, ok := st.pod(name); ok {
		return netnsutil.Path(p.Netns), p.Cgroup, nil
	}
	if v := st.vmPod(name); v != nil { // the virt-launcher netns (vmpods.go)
		return netnsutil.Path(v.Netns), v.Cgroup, nil
	}
	if name == st.External.Name && name != "" {
		return netnsutil.Path(st.External.Netns), "", nil
	}
	if st.Kubelet { // a pod kubelet runs (kubeletpods.go)
		p, err := l.kubeletPod(ctx, name)
		if err != nil {
			return "", "", fmt.Errorf("lab target %q: not a node or %q, and %w", name, ExternalName, err)
		}
		c, err := KubeletContainer(p, "")
		if err != nil {
			return "", "", err
		}
		return c.Netns, c.Cgroup, nil
	}
	var names []string
	for _, n := range st.Nodes {
		names = append(names, n.Name)
	}
	for _, p := range st.Pods {
		names = append(names, p.Name)
	}
	for _, v := range st.VMPods {
		names = append(names, v.Name)
	}
	names = append(names, ExternalName)
	return "", "", fmt.Errorf("unknown lab target %q: use one of %s", name, strings.Join(names, ", "))
}

var dns1123 = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

func newContainerID() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// AddPod creates pod name on node, wired by datapath ("axon" or "baseline"),
// with its Pod object Running and its IPs in status. On failure nothing of
// the pod is left behind.
func (l *Lab) AddPod(ctx context.Context, node, name, datapath string) (Pod, error) {
	var out Pod
	err := l.mutate(func(st *State) error {
		kube, err := l.Kube()
		if err != nil {
			return err
		}
		p, err := addPod(ctx, st, kube, node, name, datapath)
		if err != nil {
			return err
		}
		st.Pods = append(st.Pods, p)
		out = p
		return nil
	})
	return out, err
}

func addPod(ctx context.Context, st *State, kube kubernetes.Interface, node, name, datapath string) (Pod, error) {
	return addPodWith(ctx, st, kube, node, name, datapath, podExtras{})
}

// podExtras is what a VM pod adds to the pod path (vmpods.go): annotations on
// its Pod object and virt-launcher's wiring after CNI ADD, before the pod is
// Running. afterADD returns how to undo what it did.
type podExtras struct {
	annotations map[string]string
	afterADD    func(p *Pod) (undo func(), err error)
}

func addPodWith(ctx context.Context, st *State, kube kubernetes.Interface, node, name, datapath string, x podExtras) (p Pod, err error) {
	n, ok := st.Node(node)
	if !ok {
		return Pod{}, fmt.Errorf("add pod %s: no node %q in the lab", name, node)
	}
	if !dns1123.MatchString(name) || len(name) > 63 {
		return Pod{}, fmt.Errorf("add pod %q: not a valid pod name (lower-case letters, digits and '-', at most 63)", name)
	}
	if _, dup := st.pod(name); dup || name == ExternalName || name == "wire" || st.vmPod(name) != nil {
		return Pod{}, fmt.Errorf("add pod %s: the name is taken", name)
	}
	if _, dup := st.Node(name); dup {
		return Pod{}, fmt.Errorf("add pod %s: the name is taken by a node", name)
	}
	if datapath == DatapathAxon && n.Agent == nil {
		return Pod{}, fmt.Errorf("add pod %s: node %s runs no axon-agent (lab is %s); use --datapath %s", name, node, st.Datapath, DatapathBaseline)
	}
	plugin, err := pluginFor(st, *n, datapath)
	if err != nil {
		return Pod{}, fmt.Errorf("add pod %s: %w", name, err)
	}
	p = Pod{
		Name: name, Namespace: "default", Node: node, Netns: NetnsPrefix + name,
		Datapath: datapath, ContainerID: newContainerID(), IfName: "eth0",
		Cgroup: filepath.Join(n.Cgroup, name),
	}
	var undo []func()
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
		}
	}()
	if err := os.Mkdir(p.Cgroup, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return Pod{}, fmt.Errorf("add pod %s: create cgroup: %w", name, err)
	}
	undo = append(undo, func() { _ = removeCgroupTree(p.Cgroup) })
	if err := createNetns(p.Netns); err != nil {
		return Pod{}, fmt.Errorf("add pod %s: %w", name, err)
	}
	undo = append(undo, func() { _ = deleteNetns(p.Netns) })
	if err := preparePodNetns(p.Netns); err != nil {
		return Pod{}, fmt.Errorf("add pod %s: %w", name, err)
	}
	if err := createPodObject(ctx, kube, p, x.annotations); err != nil {
		return Pod{}, err
	}
	undo = append(undo, func() { _ = deletePodObject(context.WithoutCancel(ctx), kube, p) })
	ips, err := plugin.add(ctx, *n, p)
	if err != nil {
		// A failed ADD may have left half a wiring: DEL is idempotent.
		_ = plugin.del(context.WithoutCancel(ctx), *n, p)
		return Pod{}, err
	}
	undo = append(undo, func() { _ = plugin.del(context.WithoutCancel(ctx), *n, p) })
	p.IPs = ips
	p.IP = ips[0]
	if err := bandwidthChainAdd(ctx, st, kube, *n, p); err != nil { // chained bandwidth plugin (bandwidth.go)
		_ = bandwidthChainDel(context.WithoutCancel(ctx), st, *n, p)
		return Pod{}, err
	}
	if x.afterADD != nil {
		u, err := x.afterADD(&p)
		if u != nil {
			undo = append(undo, u)
		}
		if err != nil {
			return Pod{}, fmt.Errorf("add pod %s: %w", name, err)
		}
	}
	if err := setPodRunning(ctx, kube, p, n.IPs); err != nil {
		return Pod{}, err
	}
	return p, nil
}

// preparePodNetns brings lo up and disables DAD, as a container runtime would.
func preparePodNetns(nsName string) error {
	if err := writeSysctls(nsName, [][2]string{
		{"net.ipv6.conf.default.accept_dad", "0"},
		{"net.ipv6.conf.all.accept_dad", "0"},
	}); err != nil {
		return err
	}
	nl, h, err := netlinkAt(nsName)
	if err != nil {
		return err
	}
	defer h.Close()
	defer nl.Close()
	lo, err := nl.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find lo in %s: %w", nsName, err)
	}
	if err := nl.LinkSetUp(lo); err != nil {
		return fmt.Errorf("set lo up in %s: %w", nsName, err)
	}
	return nil
}

// DeletePod runs CNI DEL for the pod, deletes its Pod object, kills what
// still runs in it and removes its netns and cgroup.
func (l *Lab) DeletePod(ctx context.Context, name string) error {
	return l.mutate(func(st *State) error {
		p, ok := st.pod(name)
		if !ok {
			return fmt.Errorf("delete pod: no pod %q in the lab", name)
		}
		kube, err := l.Kube()
		if err != nil {
			return err
		}
		if err := deletePod(ctx, st, kube, *p); err != nil {
			return err
		}
		st.Pods = slices.DeleteFunc(st.Pods, func(q Pod) bool { return q.Name == name })
		return nil
	})
}

func deletePod(ctx context.Context, st *State, kube kubernetes.Interface, p Pod) error {
	n, ok := st.Node(p.Node)
	if !ok {
		return fmt.Errorf("delete pod %s: its node %s is not in the lab", p.Name, p.Node)
	}
	plugin, err := pluginFor(st, *n, p.Datapath)
	if err != nil {
		return fmt.Errorf("delete pod %s: %w", p.Name, err)
	}
	// Kill the pod's processes first (as the runtime stops containers), then DEL.
	if err := removeCgroupTree(p.Cgroup); err != nil {
		return fmt.Errorf("delete pod %s: %w", p.Name, err)
	}
	pids, _ := pidsInNetns(p.Netns)
	killPIDs(pids)
	if err := bandwidthChainDel(ctx, st, *n, p); err != nil { // chained plugins are deleted in reverse order (bandwidth.go)
		return fmt.Errorf("delete pod %s: %w (fix the cause and run it again; the pod stays recorded)", p.Name, err)
	}
	if err := plugin.del(ctx, *n, p); err != nil {
		return fmt.Errorf("delete pod %s: %w (fix the cause and run it again; the pod stays recorded)", p.Name, err)
	}
	if err := deleteNetns(p.Netns); err != nil {
		return fmt.Errorf("delete pod %s: %w", p.Name, err)
	}
	return deletePodObject(ctx, kube, p)
}

// RestartAgent stops the node's agent (SIGTERM) and starts a new one, then
// waits until it is healthy. The datapath keeps forwarding meanwhile.
func (l *Lab) RestartAgent(ctx context.Context, node string) error {
	return l.mutate(func(st *State) error {
		n, ok := st.Node(node)
		if !ok {
			return fmt.Errorf("restart agent: no node %q in the lab", node)
		}
		if n.Agent == nil {
			return fmt.Errorf("restart agent: node %s runs no agent (the lab datapath is %s)", node, st.Datapath)
		}
		if err := n.Agent.Stop(15 * time.Second); err != nil {
			return fmt.Errorf("restart agent on %s: %w", node, err)
		}
		agent, err := startAgent(st.BinDir, *n, filepath.Join(st.StateDir, "nodes", n.Name, "agent.log"), append(append(append(append(agentExtraArgs(st), deviceAgentArgs(st)...), bandwidthAgentArgs(st)...), northSouthAgentArgs(st)...), sockmapAgentArgs(st)...)...)
		if err != nil {
			return fmt.Errorf("restart agent on %s: %w", node, err)
		}
		n.Agent = agent
		return waitAgents(ctx, []Node{*n}, 60*time.Second)
	})
}

// AgentMetricsAddr is where each node's agent serves /healthz and
// Prometheus /metrics (--health-addr): the loopback of its node netns, so
// every node uses the same port. Also read by the Service benchmark.
const AgentMetricsAddr = "127.0.0.1:9962"

func startAgent(binDir string, n Node, logPath string, extra ...string) (*Proc, error) {
	agent := filepath.Join(binDir, "axon-agent")
	argv := []string{
		"nsenter", "--net=" + netnsutil.Path(n.Netns), "--", agent,
		"--node-name", n.Name,
		"--kubeconfig", n.Kubeconfig,
		"--state-dir", n.StateDir,
		"--socket", n.Socket,
		"--bpf-root", n.PinDir,
		"--cgroup-root", n.Cgroup, // socket LB for this node's pods only, never the machine's root
		"--uplink", "eth0",
		"--log-format", "text",
		"--health-addr", AgentMetricsAddr,
	}
	argv = append(argv, extra...)
	nsenter, err := exec.LookPath("nsenter")
	if err != nil {
		return nil, fmt.Errorf("nsenter not found: install util-linux: %w", err)
	}
	argv[0] = nsenter
	p, _, err := proc.Start(proc.Spec{Argv: argv, Env: os.Environ(), Log: logPath})
	if err != nil {
		return nil, err
	}
	return &p, nil
}

// waitAgents waits until every node's agent answers /healthz with 200.
func waitAgents(ctx context.Context, nodes []Node, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() {
			c := api.NewClient(n.Socket)
			var last error
			for {
				hctx, hcancel := context.WithTimeout(ctx, 2*time.Second)
				last = c.Healthy(hctx)
				hcancel()
				if last == nil {
					return
				}
				if !n.Agent.Alive() {
					errs[i] = fmt.Errorf("axon-agent on %s exited: %v; see %s:\n%s", n.Name, last, n.Agent.Log, logTail(n.Agent.Log, 15))
					return
				}
				select {
				case <-ctx.Done():
					errs[i] = fmt.Errorf("axon-agent on %s not healthy after %s: %v; see %s:\n%s", n.Name, timeout, last, n.Agent.Log, logTail(n.Agent.Log, 15))
					return
				case <-time.After(100 * time.Millisecond):
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// logTail returns the last n lines of a log, indented, or "" if it cannot be read.
func logTail(path string, n int) string {
	t, err := proc.LogTail(path, n)
	if err != nil {
		return ""
	}
	return "  " + strings.ReplaceAll(t, "\n", "\n  ")
}

// HostLinks lists the links of a node's netns other than lo and eth0 (the
// host sides of pod devices), for leak checks.
func (l *Lab) HostLinks(node string) ([]string, error) {
	st := l.State()
	n, ok := st.Node(node)
	if !ok {
		return nil, fmt.Errorf("no node %q in the lab", node)
	}
	nl, h, err := netlinkAt(n.Netns)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	defer nl.Close()
	links, err := nl.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list links in %s: %w", n.Netns, err)
	}
	var out []string
	for _, lk := range links {
		if name := lk.Attrs().Name; name != "lo" && name != "eth0" {
			out = append(out, name)
		}
	}
	return out, nil
}
