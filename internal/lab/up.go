package lab

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/axonhq/axon/internal/lab/controlplane"
	"github.com/axonhq/axon/internal/lab/kubeproxy"
	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/proc"
)

// UpOptions describes the lab `axon lab up` creates.
type UpOptions struct {
	Nodes       int    // 1..50
	PodsPerNode int    // 0..50
	VMPods      int    // VM pods per node, 0..MaxVMPodsPerNode: QEMU guests behind KubeVirt's bridge binding (vmpods.go)
	Datapath    string // axon (agents + axon-cni) or baseline (ptp + host-local; agents only with the bypass, --mode=bypass-only)
	BinDir      string // holds axon, axon-agent, axon-cni
	APIPort     int    // kube-apiserver port on 127.0.0.1 (root netns and, forwarded, every node netns); 0 = 6443
	EtcdPort    int    // 0 = 2379
	KubeProxy   string // none (default), iptables or nftables: real kube-proxy in every node netns
	NoDemo      bool   // do not create the demo Services (services.go)
	Device      string // pod device of the agents: veth (default), netkit or auto (bigtcp.go)
	BigTCP      bool   // BIG TCP on the wire, the uplinks and (through the agents) the pod devices
	NoFibCache  bool   // agents run with --fib-cache=false (every packet to another node looked up in the FIB)
	NoSockmap   bool   // agents run with --sockmap=disabled (no same-node TCP bypass; sockmap.go)
	// Kubelet: every node runs containerd + runc + kubelet, axon comes from its chart (kubelet.go);
	// the lab starts no agents and no pods of its own. With Datapath baseline the nodes' CNI is
	// the reference ptp + host-local + portmap chain and KubeProxy (iptables or nftables) serves
	// Services instead: the conformance suite's baseline.
	Kubelet bool
	Image   string // --kubelet: axon's image archive; "" = <BinDir>/image/axon-image.tar (`make image`)
	Logger  *slog.Logger
	// ReadyTimeout bounds each readiness wait (etcd, kube-apiserver, agents); 0 = 90 s.
	// Raise it where CPU is slow, e.g. under QEMU TCG (the kernel matrix passes 6m).
	ReadyTimeout time.Duration

	// agents' --bandwidth-manager: on or off (bandwidth.go)
	BandwidthManager string

	// north-south LB: agents' --lb-acceleration (native|best-effort|disabled) and
	// --nodeport-mode (snat|dsr); "" = the agent's default (check_external.go)
	LBAcceleration string
	NodePortMode   string
}

// readyTimeout is ReadyTimeout or its 90 s default.
func (o *UpOptions) readyTimeout() time.Duration {
	if o.ReadyTimeout > 0 {
		return o.ReadyTimeout
	}
	return 90 * time.Second
}

func (o *UpOptions) validate() error {
	if o.Nodes < 1 || o.Nodes > 50 {
		return fmt.Errorf("--nodes %d: want 1..50", o.Nodes)
	}
	if o.PodsPerNode < 0 || o.PodsPerNode > 50 {
		return fmt.Errorf("--pods-per-node %d: want 0..50", o.PodsPerNode)
	}
	if o.Datapath != DatapathAxon && o.Datapath != DatapathBaseline {
		return fmt.Errorf("--datapath %q: want %s or %s", o.Datapath, DatapathAxon, DatapathBaseline)
	}
	if o.KubeProxy == "" {
		o.KubeProxy = kubeproxy.None
	}
	if !kubeproxy.ValidMode(o.KubeProxy) {
		return fmt.Errorf("--kube-proxy %q: want one of %s", o.KubeProxy, strings.Join(kubeproxy.Modes, ", "))
	}
	if err := validateVMPods(o); err != nil { // vmpods.go
		return err
	}
	if err := validateBandwidthMode(o.BandwidthManager); err != nil { // bandwidth.go
		return err
	}
	if err := validateNorthSouth(o.LBAcceleration, o.NodePortMode); err != nil { // north-south LB: check_external.go
		return err
	}
	if o.Kubelet {
		if err := validateKubelet(o); err != nil { // kubelet.go
			return err
		}
		o.NoDemo = true // the demo Services select the lab's own pods
	}
	if o.Image != "" {
		abs, err := filepath.Abs(o.Image)
		if err != nil {
			return fmt.Errorf("--image %q: %w", o.Image, err)
		}
		o.Image = abs
	}
	if o.Device == "" { // BIG TCP and pod devices: bigtcp.go
		o.Device = DeviceVeth
	}
	if err := validateDevice(o.Device); err != nil {
		return err
	}
	if o.APIPort == 0 {
		o.APIPort = controlplane.DefaultAPIPort
	}
	if o.EtcdPort == 0 {
		o.EtcdPort = controlplane.DefaultEtcdPort
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	abs, err := filepath.Abs(o.BinDir)
	if err != nil {
		return fmt.Errorf("--bin-dir %q: %w", o.BinDir, err)
	}
	o.BinDir = abs
	return nil
}

// preflight checks everything `up` needs and says how to get what is missing.
func preflight(o UpOptions) error {
	var errs []error
	if os.Geteuid() != 0 {
		return errors.New("axon lab needs root (network namespaces, bpffs, cgroups): run it with sudo")
	}
	for _, tool := range []string{"nsenter", "ping"} {
		if _, err := exec.LookPath(tool); err != nil {
			errs = append(errs, fmt.Errorf("%s not found in PATH: install it (`make packages`)", tool))
		}
	}
	bins := []string{"axon"}
	if o.Datapath == DatapathAxon {
		bins = append(bins, "axon-cni")
	}
	if runsAgents(o.Datapath, o.NoSockmap) {
		bins = append(bins, "axon-agent")
	}
	for _, b := range bins {
		p := filepath.Join(o.BinDir, b)
		if st, err := os.Stat(p); err != nil || st.IsDir() || st.Mode().Perm()&0o111 == 0 {
			errs = append(errs, fmt.Errorf("%s missing or not executable: run `make build` (or pass --bin-dir)", p))
		}
	}
	deps := []string{"etcd", "kube-apiserver", "kubectl"}
	if o.Datapath == DatapathBaseline {
		deps = append(deps, "ptp", "host-local")
	}
	for _, d := range deps {
		if _, err := DepPath(d); err != nil {
			errs = append(errs, err)
		}
	}
	if _, err := cgroup2Mount(); err != nil {
		errs = append(errs, err)
	}
	if o.Kubelet {
		errs = append(errs, preflightKubelet(o)...) // kubelet.go
	}
	errs = append(errs, preflightVMPods(o)...) // vmpods.go
	if o.KubeProxy != kubeproxy.None {
		if _, err := DepPath("kube-proxy"); err != nil {
			errs = append(errs, err)
		}
		for _, tool := range kubeproxy.Tools(o.KubeProxy) {
			if _, err := exec.LookPath(tool); err != nil {
				errs = append(errs, fmt.Errorf("%s not found in PATH (kube-proxy --proxy-mode=%s runs it): `apt-get install iptables nftables`", tool, o.KubeProxy))
			}
		}
	}
	return errors.Join(errs...)
}

// ensureBPFFS mounts bpffs at /sys/fs/bpf when it is not mounted yet.
func ensureBPFFS() error {
	var st syscall.Statfs_t
	if err := syscall.Statfs("/sys/fs/bpf", &st); err == nil && st.Type == 0xcafe4a11 { // BPF_FS_MAGIC
		return nil
	}
	if err := os.MkdirAll("/sys/fs/bpf", 0o755); err != nil {
		return fmt.Errorf("create /sys/fs/bpf: %w", err)
	}
	if err := syscall.Mount("bpffs", "/sys/fs/bpf", "bpf", 0, "mode=700"); err != nil {
		return fmt.Errorf("mount bpffs at /sys/fs/bpf: %w (mount it yourself: `mount -t bpf bpffs /sys/fs/bpf`)", err)
	}
	return nil
}

// Up creates the lab described by o in stateDir: control plane, forwarder,
// wire, nodes (+ Node objects), agents and pods. If a healthy lab of the same
// shape is already up it is returned as is; leftovers of a crashed or
// different lab are removed first (a healthy lab of another shape is an error).
func Up(ctx context.Context, stateDir string, o UpOptions) (*Lab, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	if err := preflight(o); err != nil {
		return nil, fmt.Errorf("preflight:\n%w", err)
	}
	log := o.Logger
	stateDir, err := filepath.Abs(stateDir)
	if err != nil {
		return nil, fmt.Errorf("state dir: %w", err)
	}
	unlock, err := lockState(stateDir)
	if err != nil {
		return nil, err
	}
	defer unlock()

	if old, err := readState(stateDir); err == nil {
		healthy := labHealthy(ctx, old) == nil
		same := len(old.Nodes) == o.Nodes && old.PodsPerNode == o.PodsPerNode && old.Datapath == o.Datapath
		same = same && kubeProxyModeOf(old) == o.KubeProxy
		same = same && old.LBAcceleration == o.LBAcceleration && old.NodePortMode == o.NodePortMode // north-south LB
		same = same && old.NoSockmap == o.NoSockmap                                                 // same-node TCP bypass
		same = same && old.Kubelet == o.Kubelet
		same = same && old.VMPodsPerNode == o.VMPods
		switch {
		case healthy && same:
			log.Info("lab already up", "nodes", len(old.Nodes), "pods", len(old.Pods))
			l := &Lab{dir: stateDir, log: log, st: old}
			return l, nil
		case healthy:
			return nil, fmt.Errorf("a lab with %d nodes × %d pods (%s) is already up in %s: run `axon lab down` first",
				len(old.Nodes), old.PodsPerNode, old.Datapath, stateDir)
		}
		log.Info("removing leftovers of a previous lab", "stateDir", stateDir)
	} else {
		log.Debug("no previous lab state", "err", err)
	}
	// Leftovers by name (axonlab-* netns, pins, cgroups) even without lab.json.
	if err := teardown(stateDir, log); err != nil {
		return nil, fmt.Errorf("remove leftovers of a previous lab: %w", err)
	}

	t0 := time.Now()
	if err := ensureBPFFS(); err != nil {
		return nil, err
	}
	cg2, err := cgroup2Mount()
	if err != nil {
		return nil, err
	}
	st := &State{
		Version: stateVersion, Created: time.Now().UTC(), StateDir: stateDir, BinDir: o.BinDir,
		Datapath: o.Datapath, PodsPerNode: o.PodsPerNode, KubeProxy: o.KubeProxy,
		Cgroup:   filepath.Join(cg2, cgroupSubtree),
		External: newExternal(),
		Device:   o.Device, BigTCP: o.BigTCP, NoFibCache: o.NoFibCache, // BIG TCP and pod devices
		NoSockmap:        o.NoSockmap,        // same-node TCP bypass
		BandwidthManager: o.BandwidthManager, // bandwidth manager
		Kubelet:          o.Kubelet,
		VMPodsPerNode:    o.VMPods, // vmpods.go
	}
	st.LBAcceleration, st.NodePortMode = o.LBAcceleration, o.NodePortMode // north-south LB: check_external.go
	for i := 1; i <= o.Nodes; i++ {
		st.Nodes = append(st.Nodes, newNode(stateDir, st.Cgroup, i))
	}
	// Record intent first: a crash from here on is cleaned up by `down` / next `up`.
	if err := writeState(stateDir, st); err != nil {
		return nil, err
	}
	save := func() error { return writeState(stateDir, st) }

	cp, err := upControlPlane(ctx, st, o, log)
	if err != nil {
		_ = save()
		return nil, err
	}
	if err := save(); err != nil {
		return nil, err
	}
	log.Info("control plane ready", "elapsed", time.Since(t0).Round(time.Millisecond))

	if err := upTopology(st); err != nil {
		return nil, err
	}
	log.Info("namespaces and wire ready", "nodes", len(st.Nodes), "elapsed", time.Since(t0).Round(time.Millisecond))
	if err := xdpPassOnWirePorts(st); err != nil { // check_external.go
		return nil, err
	}
	if st.BigTCP { // bigtcp.go
		if err := setWireBigTCP(st); err != nil {
			return nil, err
		}
	}

	fwd, err := startForwarder(st, o)
	if err != nil {
		return nil, err
	}
	st.Forwarder = fwd
	if err := save(); err != nil {
		return nil, err
	}

	kube, err := kubeClient(st.ControlPlane.Kubeconfig)
	if err != nil {
		return nil, err
	}
	if o.Kubelet { // kubelet.go
		if err := upKubelet(ctx, st, cp, kube, o, save, t0); err != nil {
			_ = save()
			return nil, err
		}
		return &Lab{dir: stateDir, log: log, st: st}, nil
	}
	for _, n := range st.Nodes {
		if err := ensureNodeObject(ctx, kube, n); err != nil {
			return nil, err
		}
	}

	if runsAgents(o.Datapath, o.NoSockmap) {
		for i := range st.Nodes {
			n := &st.Nodes[i]
			p, err := startAgent(o.BinDir, *n, filepath.Join(stateDir, "nodes", n.Name, "agent.log"), append(append(append(append(agentExtraArgs(st), deviceAgentArgs(st)...), bandwidthAgentArgs(st)...), northSouthAgentArgs(st)...), sockmapAgentArgs(st)...)...)
			if err != nil {
				_ = save()
				return nil, fmt.Errorf("start agent on %s: %w", n.Name, err)
			}
			n.Agent = p
		}
		if err := save(); err != nil {
			return nil, err
		}
		if err := waitAgents(ctx, st.Nodes, o.readyTimeout()); err != nil {
			return nil, err
		}
		log.Info("agents healthy", "elapsed", time.Since(t0).Round(time.Millisecond))
	}
	if err := upKubeProxies(ctx, st, save); err != nil {
		return nil, err
	}
	if st.KubeProxy != kubeproxy.None {
		log.Info("kube-proxy healthy", "mode", st.KubeProxy, "elapsed", time.Since(t0).Round(time.Millisecond))
	}

	// Pods: one goroutine per node, pods of a node in order.
	var mu sync.Mutex
	var wg sync.WaitGroup
	var errs []error
	for _, n := range st.Nodes {
		wg.Go(func() {
			for i := 1; i <= o.PodsPerNode; i++ {
				mu.Lock()
				snap := *st
				snap.Pods = append([]Pod(nil), st.Pods...)
				mu.Unlock()
				p, err := addPod(ctx, &snap, kube, n.Name, fmt.Sprintf("%s-pod%d", n.Name, i), o.Datapath)
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				} else {
					st.Pods = append(st.Pods, p)
				}
				mu.Unlock()
				if err != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	sortPods(st)
	if err := errors.Join(errs...); err != nil {
		_ = save()
		return nil, err
	}
	if err := upVMPods(ctx, st, kube, o); err != nil { // vmpods.go
		_ = save()
		return nil, err
	}
	if len(st.VMPods) > 0 {
		log.Info("VM pods up and bypassed", "pods", len(st.VMPods), "elapsed", time.Since(t0).Round(time.Millisecond))
	}
	if !o.NoDemo {
		if err := upDemoServices(ctx, st, kube, log); err != nil {
			_ = save()
			return nil, err
		}
		log.Info("demo services ready", "elapsed", time.Since(t0).Round(time.Millisecond))
		if err := upDemoVMServices(ctx, st, kube); err != nil { // vmpods.go; before the external demo's Services with allocated ClusterIPs
			_ = save()
			return nil, err
		}
		if err := upExternalDemo(ctx, st, kube, log); err != nil { // check_external.go
			_ = save()
			return nil, err
		}
	}
	st.Ready = true
	if err := save(); err != nil {
		return nil, err
	}
	log.Info("lab up", "nodes", len(st.Nodes), "pods", len(st.Pods), "datapath", o.Datapath, "elapsed", time.Since(t0).Round(time.Millisecond))
	return &Lab{dir: stateDir, log: log, st: st}, nil
}

func sortPods(st *State) {
	idx := map[string]int{}
	for _, n := range st.Nodes {
		idx[n.Name] = n.Index
	}
	// Stable: by node index, then creation order within the node.
	pods := st.Pods
	for i := 1; i < len(pods); i++ {
		for j := i; j > 0 && idx[pods[j-1].Node] > idx[pods[j].Node]; j-- {
			pods[j-1], pods[j] = pods[j], pods[j-1]
		}
	}
}

func upControlPlane(ctx context.Context, st *State, o UpOptions, log *slog.Logger) (*controlplane.ControlPlane, error) {
	etcd, err := DepPath("etcd")
	if err != nil {
		return nil, err
	}
	apiserver, err := DepPath("kube-apiserver")
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(st.StateDir, "controlplane")
	st.ControlPlane = ControlPlaneState{Dir: dir, APIPort: o.APIPort, EtcdPort: o.EtcdPort,
		Kubeconfig: controlplane.AdminKubeconfigPath(dir)}
	cfg := controlplane.Config{
		Dir: dir, APIPort: o.APIPort, EtcdPort: o.EtcdPort, ServiceCIDR: kubeproxy.ServiceCIDRs,
		Logger: log, EtcdBinary: etcd, APIServerBinary: apiserver, ReadyTimeout: o.readyTimeout(),
	}
	if o.Kubelet { // real kubelets: scheduler, controller-manager, Node authorizer (kubelet.go)
		cfg.Controllers = true
		cfg.SchedulerBinary, _ = DepPath("kube-scheduler")
		cfg.ControllerManagerBinary, _ = DepPath("kube-controller-manager")
		cfg.EgressProxySocket = egressSocket(st.StateDir)             // exec/logs to kubelets: startForwarder serves it
		cfg.ExtraSANs = kubernetesServiceSANs(kubeproxy.ServiceCIDRs) // pods reach it at the `kubernetes` ClusterIP
	}
	cp, err := controlplane.Start(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("start control plane: %w", err)
	}
	st.ControlPlane.Kubeconfig = cp.AdminKubeconfig()
	st.ControlPlane.PIDs = cp.PIDs()
	for i := range st.Nodes {
		kc, err := cp.AgentKubeconfig(st.Nodes[i].Name)
		if err != nil {
			return nil, err
		}
		st.Nodes[i].Kubeconfig = kc
	}
	return cp, nil
}

func upTopology(st *State) error {
	if err := createWire(); err != nil {
		return err
	}
	for i := range st.Nodes {
		n := &st.Nodes[i]
		for _, d := range []string{n.StateDir, filepath.Dir(n.Socket)} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return fmt.Errorf("create %s: %w", d, err)
			}
		}
		if err := os.MkdirAll(n.Cgroup, 0o755); err != nil {
			return fmt.Errorf("create cgroup %s: %w", n.Cgroup, err)
		}
		if err := plugIntoWire(n.Netns, n.Name, wirePrefixes(n.IPs), true); err != nil {
			return err
		}
	}
	for _, n := range st.Nodes {
		if err := addBaselineRoutes(n, st.Nodes); err != nil {
			return err
		}
		if err := addServiceRoutes(n); err != nil {
			return err
		}
	}
	return plugIntoWire(st.External.Netns, ExternalName, wirePrefixes(st.External.IPs), false)
}

// startForwarder starts `axon lab _forward` (detached): it listens on
// 127.0.0.1:<APIPort> inside every node netns and dials the apiserver.
func startForwarder(st *State, o UpOptions) (*Proc, error) {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(o.APIPort))
	listen := addr
	if st.Kubelet { // also on the node IP: the `kubernetes` Service's endpoints (kubelet.go)
		listen = net.JoinHostPort("0.0.0.0", strconv.Itoa(o.APIPort))
	}
	argv := []string{filepath.Join(o.BinDir, "axon"), "lab", "_forward", "--listen", listen, "--target", addr}
	for _, n := range st.Nodes {
		argv = append(argv, "--netns", netnsutil.Path(n.Netns))
	}
	if st.Kubelet { // the apiserver's egress to kubelets and pods (kubelet.go)
		argv = append(argv, egressProxyArgs(st)...)
	}
	p, _, err := proc.Start(proc.Spec{Argv: argv, Env: os.Environ(), Log: filepath.Join(st.StateDir, "forwarder.log")})
	if err != nil {
		return nil, fmt.Errorf("start apiserver forwarder: %w", err)
	}
	return &p, nil
}

// labHealthy reports why a recorded lab is not fully running, or nil.
func labHealthy(ctx context.Context, st *State) error {
	if !st.Ready {
		return errors.New("lab did not finish coming up")
	}
	if !st.Forwarder.Alive() {
		return errors.New("apiserver forwarder is not running")
	}
	for _, n := range st.Nodes {
		if _, err := os.Stat(netnsutil.Path(n.Netns)); err != nil {
			return fmt.Errorf("netns of %s is gone", n.Name)
		}
		if n.Agent != nil && !n.Agent.Alive() {
			return fmt.Errorf("axon-agent of %s is not running", n.Name)
		}
		if n.KubeProxy != nil && !n.KubeProxy.Alive() {
			return fmt.Errorf("kube-proxy of %s is not running", n.Name)
		}
	}
	for _, p := range st.Pods {
		if _, err := os.Stat(netnsutil.Path(p.Netns)); err != nil {
			return fmt.Errorf("netns of pod %s is gone", p.Name)
		}
	}
	for _, v := range st.VMPods {
		if !v.QEMU.Alive() {
			return fmt.Errorf("the guest of VM pod %s is not running", v.Name)
		}
	}
	c, err := kubeClient(st.ControlPlane.Kubeconfig)
	if err != nil {
		return err
	}
	hctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if _, err := c.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(hctx); err != nil {
		return fmt.Errorf("apiserver not ready: %w", err)
	}
	return nil
}

// Down removes everything a lab in stateDir created; safe to run twice and
// after a crash (it also removes axonlab-* leftovers found by name).
func Down(ctx context.Context, stateDir string, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	stateDir, err := filepath.Abs(stateDir)
	if err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	unlock, err := lockState(stateDir)
	if err != nil {
		return err
	}
	defer unlock()
	if err := teardown(stateDir, log); err != nil {
		return err
	}
	// Remove the state dir itself when nothing foreign is left in it.
	_ = os.Remove(filepath.Join(stateDir, lockFile))
	_ = os.Remove(stateDir)
	return nil
}

// teardown stops recorded processes, removes lab namespaces, pins, cgroups
// and the lab's files in stateDir. The caller holds the state lock.
func teardown(stateDir string, log *slog.Logger) error {
	var errs []error
	st, err := readState(stateDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		log.Warn("lab state unreadable; cleaning up by name", "err", err)
	}
	if st != nil {
		errs = append(errs, stopKubeletNodes(st)...) // --kubelet: kubelet.go
		errs = append(errs, stopVMPods(st)...)       // --vm-pods: vmpods.go
		for _, n := range st.Nodes {
			if err := n.KubeProxy.Stop(10 * time.Second); err != nil {
				errs = append(errs, fmt.Errorf("stop kube-proxy of %s: %w", n.Name, err))
			}
			if err := n.Agent.Stop(10 * time.Second); err != nil {
				errs = append(errs, fmt.Errorf("stop agent of %s: %w", n.Name, err))
			}
		}
		if err := st.Forwarder.Stop(5 * time.Second); err != nil {
			errs = append(errs, fmt.Errorf("stop forwarder: %w", err))
		}
	}
	cpDir := filepath.Join(stateDir, "controlplane")
	if st != nil && st.ControlPlane.Dir != "" {
		cpDir = st.ControlPlane.Dir
	}
	if err := controlplane.Stop(cpDir); err != nil {
		errs = append(errs, err)
	}
	if err := deleteAllLabNetns(); err != nil {
		errs = append(errs, err)
	}
	// Devices are gone with their namespaces (tcx links detach with them):
	// what remains on bpffs are the pins of maps and links.
	if err := os.RemoveAll(PinRoot); err != nil {
		errs = append(errs, fmt.Errorf("remove pins %s: %w", PinRoot, err))
	}
	cgRoot := ""
	if st != nil {
		cgRoot = st.Cgroup
	} else if cg2, err := cgroup2Mount(); err == nil {
		cgRoot = filepath.Join(cg2, cgroupSubtree)
	}
	if err := removeCgroupTree(cgRoot); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return err // keep lab.json so that `down` can be retried
	}
	for _, f := range []string{"nodes", "controlplane", "forwarder.log", "axon.yaml", "helm", egressSocketName, vmDir, stateFile} { // axon.yaml, helm, egress.sock: --kubelet
		if err := os.RemoveAll(filepath.Join(stateDir, f)); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", f, err))
		}
	}
	return errors.Join(errs...)
}
