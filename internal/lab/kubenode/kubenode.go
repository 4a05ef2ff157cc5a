// Package kubenode runs one lab node's container runtime and kubelet: a real containerd 2.x with
// runc and a real kubelet, inside the node's network namespace and a private mount namespace of
// their own, registered with the lab's kube-apiserver as a Node. Pods then get their network from
// containerd's CRI plugin through libcni and the CNI config in Config.CNIConfDir.
//
// Layout of Config.Dir:
//
//	node.json                 the running processes (PID + start time) and the cgroup root, used by Stop
//	containerd.toml           containerd's config (version 3)
//	containerd/root, state    containerd's root and state
//	containerd/runc           runc's state root
//	containerd.sock(.ttrpc)   containerd's gRPC and ttrpc sockets
//	kubelet.yaml              the KubeletConfiguration
//	sysctl/                   files holding kubelet's expected kernel tunables (see sysctl.go)
//	kubelet/, pod-logs/, container-logs/, cni-bin/, run-containerd/, run-netns/, private/...
//	                          the node's /var/lib/kubelet, /var/log/pods, /var/log/containers,
//	                          /opt/cni/bin, /run/containerd, /run/netns (the pods' netns mounts)
//	                          and Config.PrivateDirs (see mounts.go); besides them the node has
//	                          its own bpffs at /sys/fs/bpf (see mountNodeFilesystems)
//	logs/{containerd,kubelet}.log
//
// Processes: a holder (`unshare --mount --uts --propagation private sleep infinity`, entered
// into the node netns) owns the mount namespace and the UTS one (hostname: the node's name);
// containerd and kubelet are started with `nsenter -t <holder> -m -n -u`. All three, and everything containerd starts (shims, containers), live in
// cgroups under Config.CgroupRoot, so Stop finds every process by cgroup, not by name.
package kubenode

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/axonhq/axon/internal/proc"
)

// DefaultPauseImage is the sandbox image containerd pins: the name of the pause image `make
// images` builds. It must be imported (Config.Images): the lab has no registry.
const DefaultPauseImage = "registry.k8s.io/pause:3.10.2"

// Binaries are the programs a node runs, e.g. from the lab's dependency cache (`make deps`).
type Binaries struct {
	Containerd string // containerd 2.x
	ShimDir    string // directory holding containerd-shim-runc-v2 (put first on containerd's PATH)
	Ctr        string // ctr, for image import
	Runc       string // runc, containerd's BinaryName
	Kubelet    string
}

// Config describes one node.
type Config struct {
	Name      string // Node name (--hostname-override); a DNS label
	NetnsPath string // the node's network namespace, e.g. /run/netns/axonlab-node1; it must have NodeIP
	NodeIP    net.IP // --node-ip: the node's primary (IPv4) address
	// NodeIPv6, when set, is the node's IPv6 address on the same uplink: --node-ip becomes the
	// dual-stack pair "NodeIP,NodeIPv6", and the Node gets an InternalIP of each family.
	NodeIPv6   net.IP
	Kubeconfig string // kubelet's kubeconfig; its server must be reachable from inside the netns
	// ClientCAFile authenticates clients of the kubelet's API (x509); usually the cluster CA.
	ClientCAFile string
	Binaries     Binaries
	// CNIBinDir holds the CNI plugins the node may use without installing them (e.g. the
	// reference plugins in the dependency cache); it is searched after the node's /opt/cni/bin.
	CNIBinDir string
	// CNIConfDir is the node's /etc/cni/net.d: containerd loads the conflist from it, and a CNI
	// DaemonSet writes its conflist into it (the Node is NotReady until one is there).
	CNIConfDir string
	// PrivateDirs are more host paths that the node gets a private, initially empty directory
	// for, in its mount namespace: hostPath volumes of DaemonSets that must not be shared by the
	// lab's nodes (e.g. axon's /run/axon and /var/lib/axon).
	PrivateDirs []string
	// CgroupV2Dir, when set, is a path inside the node where its own cgroup2 subtree (CgroupRoot)
	// is bound, e.g. for a CNI DaemonSet's hostPath to the cgroup2 root its socket hooks attach
	// to. It must be below one of PrivateDirs (so that no directory is created on the host).
	CgroupV2Dir string
	Dir         string // state dir, see the package comment
	// CgroupRoot is kubelet's cgroupRoot and the parent of the node's own processes, created in
	// every cgroup v1 hierarchy and in cgroup2 (default /axon-kubenode-<Name>).
	CgroupRoot string
	PauseImage string   // default DefaultPauseImage
	Images     []string // OCI/docker archives imported into containerd namespace k8s.io at Start
	Logger     *slog.Logger
	// ReadyTimeout bounds each wait: containerd's socket, kubelet's healthz (default 60s).
	ReadyTimeout time.Duration
	// ServeOnNodeIP makes kubelet's API (port 10250: exec, logs, port-forward) listen on NodeIP
	// instead of 127.0.0.1 of the node netns, for an apiserver that reaches the node through
	// an egress proxy (the lab's --kubelet mode). Its healthz stays on 127.0.0.1.
	ServeOnNodeIP bool
	// ClusterDNS, when set, is the nameserver kubelet gives pods (clusterDNS), with
	// ClusterDomain (default cluster.local) as their search domains' base.
	ClusterDNS    net.IP
	ClusterDomain string
}

var nodeNameRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

func (c *Config) setDefaults() error {
	if !nodeNameRE.MatchString(c.Name) {
		return fmt.Errorf("config Name=%q: want a DNS label (lowercase letters, digits, '-', at most 63)", c.Name)
	}
	if c.CgroupRoot == "" {
		c.CgroupRoot = "/axon-kubenode-" + c.Name
	}
	if !strings.HasPrefix(c.CgroupRoot, "/") || strings.Contains(c.CgroupRoot, "..") || filepath.Clean(c.CgroupRoot) != c.CgroupRoot || c.CgroupRoot == "/" {
		return fmt.Errorf("config CgroupRoot=%q: want an absolute, clean path below the root cgroup, e.g. /axon-kubenode-%s", c.CgroupRoot, c.Name)
	}
	if c.PauseImage == "" {
		c.PauseImage = DefaultPauseImage
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.ReadyTimeout == 0 {
		c.ReadyTimeout = 60 * time.Second
	}
	if c.Dir == "" {
		return errors.New("config Dir is empty: give the node a state dir, e.g. /run/axon-lab/kubenode/<node>")
	}
	abs, err := filepath.Abs(c.Dir)
	if err != nil {
		return fmt.Errorf("state dir %q: %w", c.Dir, err)
	}
	c.Dir = abs
	// sun_path holds 108 bytes; containerd appends ".ttrpc" to the socket path.
	if n := len(c.socket()) + len(".ttrpc"); n >= 108 {
		return fmt.Errorf("config Dir=%q is too long for a unix socket path (%d bytes, limit 107): choose a shorter state dir", c.Dir, n)
	}
	for _, p := range c.PrivateDirs {
		if !filepath.IsAbs(p) || filepath.Clean(p) != p || p == "/" || strings.ContainsAny(p, "\x00\n") {
			return fmt.Errorf("config PrivateDirs: %q is not an absolute, clean path below / (e.g. /run/axon)", p)
		}
	}
	if c.CgroupV2Dir != "" {
		under := false
		for _, p := range c.PrivateDirs {
			under = under || strings.HasPrefix(c.CgroupV2Dir, p+"/")
		}
		if !filepath.IsAbs(c.CgroupV2Dir) || filepath.Clean(c.CgroupV2Dir) != c.CgroupV2Dir || !under {
			return fmt.Errorf("config CgroupV2Dir=%q: want an absolute, clean path below one of PrivateDirs %v (e.g. /run/kubenode/cgroup2 with /run/kubenode private)", c.CgroupV2Dir, c.PrivateDirs)
		}
	}
	if err := c.checkNotShadowed(); err != nil {
		return err
	}
	if c.NodeIP == nil || c.NodeIP.IsUnspecified() || c.NodeIP.IsLoopback() {
		return fmt.Errorf("config NodeIP=%v: want the node's address on its uplink (not empty, 0.0.0.0 or loopback)", c.NodeIP)
	}
	if c.NodeIPv6 != nil && (c.NodeIPv6.To4() != nil || c.NodeIPv6.IsUnspecified() || c.NodeIPv6.IsLoopback() || c.NodeIP.To4() == nil) {
		return fmt.Errorf("config NodeIPv6=%v with NodeIP=%v: want an IPv4 NodeIP and the node's IPv6 address on the same uplink (not ::, ::1 or IPv4)", c.NodeIPv6, c.NodeIP)
	}
	if st, err := os.Stat(c.NetnsPath); err != nil || st.IsDir() {
		return fmt.Errorf("config NetnsPath=%q: not a network namespace file (%v): create it first (ip netns add)", c.NetnsPath, err)
	}
	for name, f := range map[string]string{"Kubeconfig": c.Kubeconfig, "ClientCAFile": c.ClientCAFile} {
		if _, err := os.Stat(f); err != nil {
			return fmt.Errorf("config %s=%q: %w", name, f, err)
		}
	}
	for name, d := range map[string]string{"CNIBinDir": c.CNIBinDir, "CNIConfDir": c.CNIConfDir, "Binaries.ShimDir": c.Binaries.ShimDir} {
		if st, err := os.Stat(d); err != nil || !st.IsDir() {
			return fmt.Errorf("config %s=%q is not a directory (%v): run `make deps` (hack/deps.sh) for binaries, create the CNI conf dir", name, d, err)
		}
	}
	for name, b := range map[string]string{
		"Binaries.Containerd": c.Binaries.Containerd, "Binaries.Ctr": c.Binaries.Ctr,
		"Binaries.Runc": c.Binaries.Runc, "Binaries.Kubelet": c.Binaries.Kubelet,
		"containerd-shim-runc-v2 in Binaries.ShimDir": filepath.Join(c.Binaries.ShimDir, "containerd-shim-runc-v2"),
	} {
		if err := executable(b); err != nil {
			return fmt.Errorf("config %s: %w: run `make deps` (hack/deps.sh)", name, err)
		}
	}
	for _, img := range c.Images {
		if _, err := os.Stat(img); err != nil {
			return fmt.Errorf("config Images: %w (build it first, e.g. `make image`)", err)
		}
	}
	return nil
}

// checkNotShadowed rejects inputs that live under a host path the node replaces with its own
// directory (privateDirs): containerd and kubelet would not find them, e.g. CNIBinDir=/opt/cni/bin.
func (c *Config) checkNotShadowed() error {
	paths := map[string]string{
		"Kubeconfig": c.Kubeconfig, "ClientCAFile": c.ClientCAFile, "CNIBinDir": c.CNIBinDir,
		"Binaries.Containerd": c.Binaries.Containerd, "Binaries.ShimDir": c.Binaries.ShimDir,
		"Binaries.Ctr": c.Binaries.Ctr, "Binaries.Runc": c.Binaries.Runc, "Binaries.Kubelet": c.Binaries.Kubelet,
	}
	for i, img := range c.Images {
		paths[fmt.Sprintf("Images[%d]", i)] = img
	}
	for name, p := range paths {
		abs, err := filepath.Abs(p)
		if err != nil {
			return fmt.Errorf("config %s=%q: %w", name, p, err)
		}
		for _, pd := range c.privateDirs() {
			if abs == pd.host || strings.HasPrefix(abs, pd.host+"/") {
				return fmt.Errorf("config %s=%q is under %s, which the node replaces with its own directory: keep it elsewhere (e.g. the dependency cache)", name, p, pd.host)
			}
		}
	}
	return nil
}

func executable(p string) error {
	if p == "" {
		return errors.New("empty path")
	}
	st, err := os.Stat(p)
	if err != nil {
		return err
	}
	if st.IsDir() || st.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("%s is not an executable file", p)
	}
	return nil
}

func (c *Config) socket() string { return filepath.Join(c.Dir, "containerd.sock") }

// Node is a running node.
type Node struct {
	cfg   Config
	state nodeState
}

// Start starts the node: cgroups, the mount namespace holder with kubelet's kernel tunables
// bound over /proc/sys in it, containerd (and the image imports), then kubelet, and waits for
// kubelet's healthz. It does not wait for the Node object to be Ready (that needs the CNI config
// and the apiserver). On failure everything started is stopped again and the error carries the
// tail of the failing process's log.
func Start(ctx context.Context, cfg Config) (*Node, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	tools, err := lookTools()
	if err != nil {
		return nil, err
	}
	if st, err := readState(cfg.Dir); err != nil {
		return nil, err
	} else if len(st.Processes) > 0 {
		return nil, fmt.Errorf("node %s: %s lists processes of an earlier start: stop it first (kubenode.Stop(%q), or `axon lab down`)", cfg.Name, filepath.Join(cfg.Dir, stateFile), cfg.Dir)
	}
	for _, d := range []string{cfg.Dir, filepath.Join(cfg.Dir, "logs")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("create state dir: %w", err)
		}
	}
	n := &Node{cfg: cfg, state: nodeState{Name: cfg.Name, NetnsPath: cfg.NetnsPath, CgroupRoot: cfg.CgroupRoot, OwnedDirs: cfg.ownedDirs()}}
	if err := n.start(ctx, tools); err != nil {
		if serr := Stop(cfg.Dir); serr != nil {
			cfg.Logger.Warn("stop after failed start", "node", cfg.Name, "err", serr)
		}
		return nil, fmt.Errorf("node %s: %w", cfg.Name, err)
	}
	return n, nil
}

func (n *Node) start(ctx context.Context, tools tools) error {
	log := n.cfg.Logger.With("component", "kubenode", "node", n.cfg.Name)
	cg, err := createCgroups(n.cfg.CgroupRoot)
	if err != nil {
		return err
	}
	// Record the cgroup root before anything runs, so Stop cleans up after a half start.
	if err := writeState(n.cfg.Dir, n.state); err != nil {
		return err
	}

	// The holder owns the node's mount and UTS namespaces: the UTS one carries the node's name
	// as hostname, which a hostNetwork pod (host UTS namespace: containerd's) reports, as on a
	// real node (the conformance specs of hostNetwork endpoints compare it with the Node's name).
	holder, err := n.spawn("holder", []string{tools.nsenter, "--net=" + n.cfg.NetnsPath, "--", tools.unshare, "--mount", "--uts", "--propagation", "private", "--", tools.sleep, "infinity"}, cg)
	if err != nil {
		return err
	}
	if err := waitOwnMountNS(ctx, holder, 5*time.Second); err != nil {
		return err
	}
	if out, err := exec.CommandContext(ctx, tools.nsenter, "-t", fmt.Sprint(holder.PID), "-u", "--", tools.hostname, n.cfg.Name).CombinedOutput(); err != nil {
		return fmt.Errorf("set the node's hostname %s: %w: %s", n.cfg.Name, err, out)
	}
	if err := bindKernelTunables(ctx, tools, holder.PID, filepath.Join(n.cfg.Dir, "sysctl"), log); err != nil {
		return err
	}
	if err := bindPrivateDirs(ctx, tools, holder.PID, n.cfg.privateDirs()); err != nil {
		return err
	}
	if err := mountNodeFilesystems(ctx, tools, holder.PID, n.cfg, cg); err != nil {
		return err
	}
	inNode := []string{tools.nsenter, "-t", fmt.Sprint(holder.PID), "-m", "-n", "-u", "--"}

	if err := os.WriteFile(filepath.Join(n.cfg.Dir, "containerd.toml"), []byte(containerdConfig(n.cfg)), 0o600); err != nil {
		return fmt.Errorf("write containerd config: %w", err)
	}
	ctrd, err := n.spawn("containerd", append(inNode, n.cfg.Binaries.Containerd, "--config", filepath.Join(n.cfg.Dir, "containerd.toml")), cg)
	if err != nil {
		return err
	}
	if err := waitUnixSocket(ctx, n.cfg.socket(), n.cfg.ReadyTimeout, ctrd); err != nil {
		return fmt.Errorf("containerd not ready: %w; its log %s ends:\n%s", err, ctrd.Log, logTail(ctrd.Log, 15))
	}
	for _, img := range n.cfg.Images {
		t0 := time.Now()
		cmd := exec.CommandContext(ctx, inNode[0], append(inNode[1:], n.cfg.Binaries.Ctr, "-a", n.cfg.socket(), "-n", "k8s.io", "images", "import", img)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("import image %s into containerd namespace k8s.io: %w: %s", img, err, out)
		}
		log.Info("image imported", "archive", img, "took", time.Since(t0).Round(time.Millisecond))
	}

	if err := os.WriteFile(filepath.Join(n.cfg.Dir, "kubelet.yaml"), []byte(kubeletConfig(n.cfg)), 0o600); err != nil {
		return fmt.Errorf("write kubelet config: %w", err)
	}
	kl, err := n.spawn("kubelet", append(append(inNode, n.cfg.Binaries.Kubelet), kubeletArgs(n.cfg)...), cg)
	if err != nil {
		return err
	}
	if err := waitHealthz(ctx, n.cfg.NetnsPath, n.cfg.ReadyTimeout, kl); err != nil {
		return fmt.Errorf("kubelet not healthy: %w; its log %s ends:\n%s", err, kl.Log, logTail(kl.Log, 15))
	}
	log.Info("node started", "netns", n.cfg.NetnsPath, "cgroupRoot", n.cfg.CgroupRoot, "pids", n.PIDs())
	return nil
}

// spawn starts one process, moves it into the node's runtime cgroups and records it in node.json.
func (n *Node) spawn(name string, argv []string, cg cgroups) (proc.Named, error) {
	logPath := filepath.Join(n.cfg.Dir, "logs", name+".log")
	banner := fmt.Sprintf("\n=== %s start %s: %s\n", time.Now().UTC().Format(time.RFC3339), name, strings.Join(argv, " "))
	p, _, err := proc.Start(proc.Spec{Argv: argv, Log: logPath, Banner: banner, Env: nodeEnv(n.cfg)})
	if err != nil {
		return proc.Named{}, fmt.Errorf("%s: %w", name, err)
	}
	r := proc.Named{Name: name, Record: p, Args: argv, Env: nodeEnv(n.cfg)}
	n.state.Processes = append(n.state.Processes, r)
	if err := writeState(n.cfg.Dir, n.state); err != nil {
		return r, err
	}
	// Before the process forks anything worth tracking (containerd starts shims only on request).
	if err := cg.join(runtimeCgroup, p.PID); err != nil {
		if !r.Alive() {
			return r, fmt.Errorf("%s (pid %d) exited at once; its log %s ends:\n%s", name, p.PID, logPath, logTail(logPath, 15))
		}
		return r, fmt.Errorf("%s: %w", name, err)
	}
	return r, nil
}

// RestartKubelet stops the kubelet of the node recorded in dir and starts it again with the same
// arguments, in the same namespaces and cgroup, as a node's service manager would; containerd and
// the pods keep running. It waits for kubelet's healthz.
func RestartKubelet(ctx context.Context, dir string, timeout time.Duration) error {
	st, err := readState(dir)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(st.Processes, func(r proc.Named) bool { return r.Name == "kubelet" })
	if i < 0 || st.NetnsPath == "" {
		return fmt.Errorf("restart kubelet: %s records no running kubelet (start the node with kubenode.Start)", filepath.Join(dir, stateFile))
	}
	old := st.Processes[i]
	if err := old.Stop(10 * time.Second); err != nil {
		return fmt.Errorf("restart kubelet of %s: stop pid %d: %w", st.Name, old.PID, err)
	}
	banner := fmt.Sprintf("\n=== %s restart kubelet: %s\n", time.Now().UTC().Format(time.RFC3339), strings.Join(old.Args, " "))
	p, _, err := proc.Start(proc.Spec{Argv: old.Args, Log: old.Log, Banner: banner, Env: old.Env})
	if err != nil {
		return fmt.Errorf("restart kubelet of %s: %w", st.Name, err)
	}
	r := old
	r.Record = p // same log
	st.Processes[i] = r
	if err := writeState(dir, st); err != nil {
		return err
	}
	cg, err := findCgroups(st.CgroupRoot)
	if err == nil {
		err = cg.join(runtimeCgroup, p.PID)
	}
	if err != nil {
		return fmt.Errorf("restart kubelet of %s: %w", st.Name, err)
	}
	if err := waitHealthz(ctx, st.NetnsPath, timeout, r); err != nil {
		return fmt.Errorf("restarted kubelet of %s not healthy: %w; its log %s ends:\n%s", st.Name, err, r.Log, logTail(r.Log, 15))
	}
	return nil
}

// nodeEnv is the environment of the node's processes: the shim directory first on PATH
// (containerd looks the shim up there), nothing else inherited but the locale-free basics.
func nodeEnv(cfg Config) []string {
	return []string{
		"PATH=" + cfg.Binaries.ShimDir + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=/root",
	}
}

// Dir is the node's state dir.
func (n *Node) Dir() string { return n.cfg.Dir }

// ContainerdSocket is containerd's gRPC socket (reachable from the root namespace: it is a file).
func (n *Node) ContainerdSocket() string { return n.cfg.socket() }

// PIDs are the holder's, containerd's and kubelet's PIDs, in start order.
func (n *Node) PIDs() []int {
	var out []int
	for _, p := range n.state.Processes {
		out = append(out, p.PID)
	}
	return out
}

// HolderPID is the PID of the process owning the node's mount namespace: `nsenter -t <pid> -m -n -u`
// enters the node as containerd and kubelet see it.
func (n *Node) HolderPID() int {
	for _, p := range n.state.Processes {
		if p.Name == "holder" {
			return p.PID
		}
	}
	return 0
}

// Ctr runs ctr against the node's containerd (namespace k8s.io) inside the node's namespaces
// and returns its combined output.
func (n *Node) Ctr(ctx context.Context, args ...string) (string, error) {
	tools, err := lookTools()
	if err != nil {
		return "", err
	}
	argv := append([]string{"-t", fmt.Sprint(n.HolderPID()), "-m", "-n", "--", n.cfg.Binaries.Ctr, "-a", n.cfg.socket(), "-n", "k8s.io"}, args...)
	out, err := exec.CommandContext(ctx, tools.nsenter, argv...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// tools are the util-linux and coreutils programs the node is built with.
type tools struct{ nsenter, unshare, sleep, mount, mkdir, hostname string }

func lookTools() (tools, error) {
	var t tools
	for _, x := range []struct {
		name string
		dst  *string
	}{{"nsenter", &t.nsenter}, {"unshare", &t.unshare}, {"sleep", &t.sleep}, {"mount", &t.mount}, {"mkdir", &t.mkdir}, {"hostname", &t.hostname}} {
		p, err := exec.LookPath(x.name)
		if err != nil {
			return t, fmt.Errorf("%s not found: install util-linux, coreutils and hostname (hack/install-packages.sh): %w", x.name, err)
		}
		*x.dst = p
	}
	return t, nil
}

func logTail(path string, n int) string {
	t, err := proc.LogTail(path, n)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	return t
}
