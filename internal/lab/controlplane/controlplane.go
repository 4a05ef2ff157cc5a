// Package controlplane runs the lab's real Kubernetes control plane: etcd and kube-apiserver as
// detached processes on 127.0.0.1 of the root network namespace, with a generated PKI, an admin
// kubeconfig (system:masters), per-node agent kubeconfigs bound to least-privilege RBAC, and a
// forwarder that makes the apiserver reachable from node network namespaces. With
// Config.Controllers (real-kubelet labs) it adds kube-scheduler and kube-controller-manager,
// Node,RBAC authorization, and issues kubelet kubeconfigs.
//
// State lives in Config.Dir:
//
//	pki/                 CA, apiserver serving cert, admin cert, service-account keys, agents/<node>.{crt,key}
//	                     (Controllers: apiserver-kubelet-client.*, components/*, kubelets/<node>.{crt,key})
//	etcd-data/           etcd's data dir
//	logs/etcd.log        stdout+stderr of etcd (appended across restarts)
//	logs/kube-apiserver.log (Controllers: logs/kube-scheduler.log, logs/kube-controller-manager.log)
//	pids.json            the running processes (PID + start time), used by Stop
//	admin.kubeconfig     cluster admin
//	kubeconfigs/agent-<node>.kubeconfig
//	kubeconfigs/kubelet-<node>.kubeconfig, kube-scheduler.kubeconfig, kube-controller-manager.kubeconfig
package controlplane

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/axonhq/axon/internal/atomicfile"
	"github.com/axonhq/axon/internal/proc"
)

// Defaults for Config.
const (
	DefaultDir         = "/run/axon-lab/controlplane"
	DefaultAPIPort     = 6443
	DefaultEtcdPort    = 2379
	DefaultServiceCIDR = "10.96.0.0/16"
)

// Config describes one lab control plane.
type Config struct {
	Dir         string // state dir (default DefaultDir): pki/, etcd-data/, logs/, pids.json
	APIPort     int    // kube-apiserver on 127.0.0.1:<APIPort> (default 6443)
	EtcdPort    int    // etcd client port on 127.0.0.1 (default 2379); the peer port is EtcdPort+1
	ServiceCIDR string // --service-cluster-ip-range (default 10.96.0.0/16)
	Logger      *slog.Logger

	// Binaries, e.g. from lab.DepPath("etcd") and lab.DepPath("kube-apiserver"). Required.
	EtcdBinary      string
	APIServerBinary string

	// ExtraSANs are added to the apiserver serving certificate (e.g. a wire address).
	ExtraSANs []net.IP
	// ReadyTimeout bounds each wait for etcd and the apiserver to become ready (default 90s).
	ReadyTimeout time.Duration

	// Controllers adds kube-scheduler and kube-controller-manager (for labs whose nodes run a
	// real kubelet) and switches the apiserver to --authorization-mode=Node,RBAC with the
	// ServiceAccount and NodeRestriction admission plugins. Off by default: the lab's agents
	// need none of it, and without a ServiceAccount controller the ServiceAccount admission
	// would reject every Pod.
	Controllers bool
	// Binaries of the controllers, e.g. from lab.DepPath; required with Controllers.
	SchedulerBinary         string
	ControllerManagerBinary string
	// HTTPS health ports of the controllers on 127.0.0.1 (defaults 10259 and 10257).
	SchedulerPort         int
	ControllerManagerPort int
	// EgressProxySocket (with Controllers) is a unix socket where an HTTP CONNECT proxy (a
	// ConnectProxy) reaches the nodes: the apiserver's egress selector sends its "cluster"
	// egress (kubelets' exec/logs/port-forward, the proxy to pods) there, and it reaches
	// kubelets by their InternalIP. Empty: the apiserver dials kubelets directly.
	EgressProxySocket string
}

// ControlPlane is a running (or adopted) lab control plane.
type ControlPlane struct {
	cfg   Config
	ca    *authority
	procs []proc.Named
}

func (c *Config) setDefaults() error {
	if c.Dir == "" {
		c.Dir = DefaultDir
	}
	abs, err := filepath.Abs(c.Dir)
	if err != nil {
		return fmt.Errorf("state dir %q: %w", c.Dir, err)
	}
	c.Dir = abs
	if c.APIPort == 0 {
		c.APIPort = DefaultAPIPort
	}
	if c.EtcdPort == 0 {
		c.EtcdPort = DefaultEtcdPort
	}
	if c.ServiceCIDR == "" {
		c.ServiceCIDR = DefaultServiceCIDR
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.ReadyTimeout == 0 {
		c.ReadyTimeout = 90 * time.Second
	}
	if c.SchedulerPort == 0 {
		c.SchedulerPort = DefaultSchedulerPort
	}
	if c.ControllerManagerPort == 0 {
		c.ControllerManagerPort = DefaultControllerManagerPort
	}
	ports := c.ports()
	for _, p := range ports {
		if p.port < 1 || p.port > 65535 {
			return fmt.Errorf("config %s=%d: want a TCP port in 1..65535", p.what, p.port)
		}
	}
	for i := range ports {
		for j := i + 1; j < len(ports); j++ {
			if ports[i].port == ports[j].port {
				return fmt.Errorf("config %s=%d collides with %s", ports[i].what, ports[i].port, ports[j].what)
			}
		}
	}
	for _, cidr := range strings.Split(c.ServiceCIDR, ",") { // dual-stack: "v4,v6"
		if _, _, err := net.ParseCIDR(cidr); err != nil {
			return fmt.Errorf("config ServiceCIDR=%q: %w (want e.g. %s or %s,fd00:10:96::/112)", c.ServiceCIDR, err, DefaultServiceCIDR, DefaultServiceCIDR)
		}
	}
	bins := map[string]string{"EtcdBinary": c.EtcdBinary, "APIServerBinary": c.APIServerBinary}
	if c.Controllers {
		bins["SchedulerBinary"] = c.SchedulerBinary
		bins["ControllerManagerBinary"] = c.ControllerManagerBinary
	}
	for name, b := range bins {
		if b == "" {
			return fmt.Errorf("config %s is empty: resolve it with lab.DepPath (built by `make deps`, hack/deps.sh)", name)
		}
		st, err := os.Stat(b)
		if err != nil {
			return fmt.Errorf("config %s: %w: run `make deps` (hack/deps.sh)", name, err)
		}
		if st.IsDir() || st.Mode().Perm()&0o111 == 0 {
			return fmt.Errorf("config %s=%s is not an executable file: run `make deps` (hack/deps.sh)", name, b)
		}
	}
	return nil
}

type namedPort struct {
	what string
	port int
}

// ports lists the TCP ports on 127.0.0.1 the configured processes listen on.
func (c *Config) ports() []namedPort {
	ps := []namedPort{{"EtcdPort", c.EtcdPort}, {"etcd peer port (EtcdPort+1)", c.EtcdPort + 1}, {"APIPort", c.APIPort}}
	if c.Controllers {
		ps = append(ps, namedPort{"SchedulerPort", c.SchedulerPort}, namedPort{"ControllerManagerPort", c.ControllerManagerPort})
	}
	return ps
}

// planned is one process of the control plane, in start order.
type planned struct {
	name string
	bin  string
	args []string
	// ready waits until the process serves; exited is closed when it dies first.
	ready func(ctx context.Context, exited <-chan struct{}) error
}

// ProcessNames are the control plane's processes in start order, the order of PIDs: the last
// two run with Config.Controllers only.
var ProcessNames = []string{"etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager"}

// plan lists the processes this config runs, in start order (Stop goes in reverse).
func (cp *ControlPlane) plan() []planned {
	ps := []planned{
		{ProcessNames[0], cp.cfg.EtcdBinary, cp.etcdArgs(), cp.waitEtcd},
		{ProcessNames[1], cp.cfg.APIServerBinary, cp.apiserverArgs(), cp.waitReady},
	}
	if cp.cfg.Controllers {
		ps = append(ps,
			planned{ProcessNames[2], cp.cfg.SchedulerBinary, cp.schedulerArgs(), func(ctx context.Context, exited <-chan struct{}) error {
				return cp.waitHealthz(ctx, cp.cfg.SchedulerPort, exited)
			}},
			planned{ProcessNames[3], cp.cfg.ControllerManagerBinary, cp.controllerManagerArgs(), func(ctx context.Context, exited <-chan struct{}) error {
				return cp.waitHealthz(ctx, cp.cfg.ControllerManagerPort, exited)
			}})
	}
	return ps
}

// Start brings up etcd and kube-apiserver, and with Config.Controllers kube-scheduler and
// kube-controller-manager (or adopts them when the ones recorded in Dir are already running and
// healthy), waits for each to serve and applies the agent RBAC. Processes are
// detached: they outlive the caller until Stop(Dir). On failure, processes started by this call
// are stopped again and the error carries the tail of the failing process's log.
func Start(ctx context.Context, cfg Config) (*ControlPlane, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	log := cfg.Logger.With("component", "controlplane")
	for _, d := range []string{cfg.Dir, filepath.Join(cfg.Dir, "logs"), filepath.Join(cfg.Dir, "etcd-data"), filepath.Join(cfg.Dir, "kubeconfigs")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("create state dir: %w", err)
		}
	}
	unlock, err := lockDir(cfg.Dir)
	if err != nil {
		return nil, err
	}
	defer unlock()

	ca, err := ensurePKI(filepath.Join(cfg.Dir, "pki"), cfg.ExtraSANs)
	if err != nil {
		return nil, fmt.Errorf("pki in %s: %w", cfg.Dir, err)
	}
	cp := &ControlPlane{cfg: cfg, ca: ca}
	if err := cp.writeAdminKubeconfig(); err != nil {
		return nil, err
	}
	if cfg.Controllers {
		if err := cp.ensureControllerPKI(); err != nil {
			return nil, fmt.Errorf("pki in %s: %w", cfg.Dir, err)
		}
		if cfg.EgressProxySocket != "" {
			// the apiserver dials the socket on demand: the proxy may start after it
			if err := os.WriteFile(filepath.Join(cfg.Dir, egressSelectorFile), []byte(egressSelectorConfig(cfg.EgressProxySocket)), 0o600); err != nil {
				return nil, fmt.Errorf("write egress selector config: %w", err)
			}
		}
	}

	st, err := readPIDs(cfg.Dir)
	if err != nil {
		return nil, err
	}
	if adopted, err := cp.adopt(ctx, st, log); err != nil {
		return nil, err
	} else if adopted {
		return cp, nil
	}

	if err := cp.startProcesses(ctx, log); err != nil {
		for i := len(cp.procs) - 1; i >= 0; i-- {
			if serr := cp.procs[i].Stop(10 * time.Second); serr != nil {
				log.Warn("stop after failed start", "process", cp.procs[i].Name, "err", serr)
			}
		}
		_ = os.Remove(filepath.Join(cfg.Dir, pidsFile))
		return nil, err
	}
	if err := cp.applyRBAC(ctx); err != nil {
		return nil, err
	}
	log.Info("control plane ready", "apiserver", cp.Server(), "etcd", cp.etcdURL(), "dir", cfg.Dir, "pids", cp.PIDs())
	return cp, nil
}

// adopt reuses the recorded processes when all of them run and the apiserver answers /readyz.
// Otherwise it stops whatever is left of them and reports false.
func (cp *ControlPlane) adopt(ctx context.Context, st pidState, log *slog.Logger) (bool, error) {
	if len(st.Processes) == 0 {
		return false, nil
	}
	// Adopt only the exact processes this config would start (same binaries, ports, dir).
	plan := cp.plan()
	allAlive := len(st.Processes) == len(plan)
	for i, p := range st.Processes {
		allAlive = allAlive && slices.Equal(p.Args, append([]string{plan[i].bin}, plan[i].args...)) && p.Alive()
	}
	if allAlive {
		cp.procs = st.Processes
		wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		var err error
		for _, p := range plan[1:] { // etcd serves if the apiserver does
			if err = p.ready(wctx, nil); err != nil {
				err = fmt.Errorf("%s: %w", p.name, err)
				break
			}
		}
		cancel()
		if err == nil {
			if err := cp.applyRBAC(ctx); err != nil {
				return false, err
			}
			log.Info("control plane already running", "apiserver", cp.Server(), "pids", cp.PIDs())
			return true, nil
		}
		log.Warn("recorded control plane is running but not healthy; restarting it", "err", err)
	} else {
		log.Info("recorded control plane is gone, incomplete or configured differently; starting a new one")
	}
	cp.procs = nil
	for i := len(st.Processes) - 1; i >= 0; i-- {
		if err := st.Processes[i].Stop(10 * time.Second); err != nil {
			return false, fmt.Errorf("stop stale %s: %w", st.Processes[i].Name, err)
		}
	}
	return false, os.Remove(filepath.Join(cp.cfg.Dir, pidsFile))
}

func (cp *ControlPlane) startProcesses(ctx context.Context, log *slog.Logger) error {
	for _, p := range cp.cfg.ports() {
		if err := portFree(p.port); err != nil {
			return fmt.Errorf("%s 127.0.0.1:%d: %w; stop it or choose another port", p.what, p.port, err)
		}
	}
	for _, p := range cp.plan() {
		logPath := filepath.Join(cp.cfg.Dir, "logs", p.name+".log")
		rec, exited, err := spawn(p.name, p.bin, p.args, logPath)
		if err != nil {
			return err
		}
		cp.procs = append(cp.procs, rec)
		if err := writePIDs(cp.cfg.Dir, pidState{Processes: cp.procs}); err != nil {
			return err
		}
		t0 := time.Now()
		if err := p.ready(ctx, exited); err != nil {
			return fmt.Errorf("%s not ready: %w\n--- tail of %s ---\n%s", p.name, err, logPath, logTail(logPath, 30))
		}
		log.Debug(p.name+" ready", "pid", rec.PID, "after", time.Since(t0).Round(time.Millisecond))
	}
	return nil
}

func (cp *ControlPlane) etcdURL() string {
	return "http://127.0.0.1:" + strconv.Itoa(cp.cfg.EtcdPort)
}

func (cp *ControlPlane) etcdArgs() []string {
	peer := "http://127.0.0.1:" + strconv.Itoa(cp.cfg.EtcdPort+1)
	return []string{
		"--name=axon-lab",
		"--data-dir=" + filepath.Join(cp.cfg.Dir, "etcd-data"),
		"--listen-client-urls=" + cp.etcdURL(),
		"--advertise-client-urls=" + cp.etcdURL(),
		"--listen-peer-urls=" + peer,
		"--initial-advertise-peer-urls=" + peer,
		"--initial-cluster=axon-lab=" + peer,
		"--listen-metrics-urls=",
		"--unsafe-no-fsync", // disposable lab data: trade durability for speed
		"--quota-backend-bytes=2147483648",
		"--log-level=warn",
	}
}

func (cp *ControlPlane) apiserverArgs() []string {
	pki := func(f string) string { return filepath.Join(cp.cfg.Dir, "pki", f) }
	// Without Controllers the arguments stay exactly as they were before Controllers existed:
	// adopt compares them, so a running lab stays adopted across an upgrade.
	authz := "--authorization-mode=RBAC"
	// No kube-controller-manager creates the "default" ServiceAccount in the lab, and the
	// lab's Pods need none: without this the ServiceAccount admission rejects every Pod.
	admission := []string{"--disable-admission-plugins=ServiceAccount"}
	if cp.cfg.Controllers {
		authz = "--authorization-mode=Node,RBAC"
		admission = []string{
			"--enable-admission-plugins=NodeRestriction", // ServiceAccount is on by default
			"--kubelet-client-certificate=" + pki(kubeletClientCertFile),
			"--kubelet-client-key=" + pki(kubeletClientKeyFile),
		}
		if cp.cfg.EgressProxySocket != "" {
			admission = append(admission,
				"--egress-selector-config-file="+filepath.Join(cp.cfg.Dir, egressSelectorFile),
				// the Node's hostname ("node1") resolves nowhere; the proxy takes IP:port only
				"--kubelet-preferred-address-types=InternalIP")
		}
	}
	args := []string{
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(cp.cfg.APIPort),
		"--etcd-servers=" + cp.etcdURL(),
		"--endpoint-reconciler-type=none", // the default reconciler rejects a loopback endpoint
		"--service-cluster-ip-range=" + cp.cfg.ServiceCIDR,
		authz,
		"--client-ca-file=" + pki(caCertFile),
		"--tls-cert-file=" + pki(apiserverCertFile),
		"--tls-private-key-file=" + pki(apiserverKeyFile),
		"--cert-dir=" + pki("apiserver-generated"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + pki(saPubFile),
		"--service-account-signing-key-file=" + pki(saKeyFile),
	}
	args = append(args, admission...)
	return append(args,
		"--allow-privileged=true",
		"--profiling=false",
		"--v=0",
	)
}

// waitEtcd polls etcd's /health until it reports healthy.
func (cp *ControlPlane) waitEtcd(ctx context.Context, exited <-chan struct{}) error {
	hc := &http.Client{Timeout: 2 * time.Second}
	return poll(ctx, cp.cfg.ReadyTimeout, exited, func(ctx context.Context) error {
		return getOK(ctx, hc, cp.etcdURL()+"/health")
	})
}

// waitReady polls the apiserver's /readyz (as admin) until it answers 200.
func (cp *ControlPlane) waitReady(ctx context.Context, exited <-chan struct{}) error {
	hc, err := cp.adminHTTPClient()
	if err != nil {
		return err
	}
	return poll(ctx, cp.cfg.ReadyTimeout, exited, func(ctx context.Context) error {
		return getOK(ctx, hc, cp.Server()+"/readyz")
	})
}

// getOK GETs url and wants 200; any other answer is an error with the
// status and the start of the body (what the server says is wrong).
func getOK(ctx context.Context, hc *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", req.URL.Path, resp.Status, body)
	}
	return nil
}

// poll calls check every 100ms until it succeeds, the process exits, or timeout/ctx ends.
func poll(ctx context.Context, timeout time.Duration, exited <-chan struct{}, check func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		cctx, ccancel := context.WithTimeout(ctx, 3*time.Second)
		last = check(cctx)
		ccancel()
		if last == nil {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("process exited (last check: %v)", last)
		case <-ctx.Done():
			return fmt.Errorf("%w (last check: %v)", ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (cp *ControlPlane) applyRBAC(ctx context.Context) error {
	cs, err := cp.Client()
	if err != nil {
		return err
	}
	// /readyz includes the RBAC bootstrap hook, but give a fresh server a few retries.
	var last error
	for i := 0; i < 20; i++ {
		if last = applyAgentRBAC(ctx, cs); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("apply agent RBAC: %w", last)
		case <-time.After(250 * time.Millisecond):
		}
	}
	return fmt.Errorf("apply agent RBAC: %w", last)
}

// Stop stops the processes recorded in dir/pids.json (in reverse start order: the controllers,
// kube-apiserver, then etcd) by PID:
// SIGTERM, up to 10 s grace, then SIGKILL. It removes pids.json and nothing else (PKI, etcd
// data and logs stay). Safe to call twice or when nothing runs.
func Stop(dir string) error {
	if dir == "" {
		dir = DefaultDir
	}
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	unlock, err := lockDir(dir)
	if err != nil {
		return err
	}
	defer unlock()
	st, err := readPIDs(dir)
	if err != nil {
		return err
	}
	var errs []error
	for i := len(st.Processes) - 1; i >= 0; i-- {
		if err := st.Processes[i].Stop(10 * time.Second); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", st.Processes[i].Name, err))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("stop control plane in %s: %w", dir, errors.Join(errs...))
	}
	if err := os.Remove(filepath.Join(dir, pidsFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", pidsFile, err)
	}
	return nil
}

// lockDir takes an exclusive flock on dir/.lock so concurrent Start/Stop calls on one state
// dir serialize.
func lockDir(dir string) (func(), error) {
	f, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	return func() { f.Close() }, nil
}

// portFree reports an error naming the owner when 127.0.0.1:port cannot be bound.
func portFree(port int) error {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err == nil {
		return l.Close()
	}
	if owner := portOwner(port); owner != "" {
		return fmt.Errorf("port in use by %s", owner)
	}
	return fmt.Errorf("port unavailable: %w", err)
}

// Dir is the state directory.
func (cp *ControlPlane) Dir() string { return cp.cfg.Dir }

// Server is the apiserver URL, https://127.0.0.1:<APIPort>.
func (cp *ControlPlane) Server() string {
	return "https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(cp.cfg.APIPort))
}

// CAFile is the path of the CA certificate (PEM) that signed the apiserver and client certs.
func (cp *ControlPlane) CAFile() string { return filepath.Join(cp.cfg.Dir, "pki", caCertFile) }

// CACertPEM is the CA certificate in PEM.
func (cp *ControlPlane) CACertPEM() []byte { return cp.ca.CertPEM }

// PIDs returns the PIDs of etcd and kube-apiserver (and with Controllers kube-scheduler and
// kube-controller-manager), in start order.
func (cp *ControlPlane) PIDs() []int {
	out := make([]int, 0, len(cp.procs))
	for _, p := range cp.procs {
		out = append(out, p.PID)
	}
	return out
}

// AdminKubeconfigPath is where Start writes the admin kubeconfig for a state dir.
func AdminKubeconfigPath(dir string) string { return filepath.Join(dir, "admin.kubeconfig") }

// AdminKubeconfig is the path of a kubeconfig for user axon-lab-admin in group system:masters.
func (cp *ControlPlane) AdminKubeconfig() string { return AdminKubeconfigPath(cp.cfg.Dir) }

func (cp *ControlPlane) writeAdminKubeconfig() error {
	pki := filepath.Join(cp.cfg.Dir, "pki")
	cert, err := os.ReadFile(filepath.Join(pki, adminCertFile))
	if err != nil {
		return fmt.Errorf("admin kubeconfig: %w", err)
	}
	key, err := os.ReadFile(filepath.Join(pki, adminKeyFile))
	if err != nil {
		return fmt.Errorf("admin kubeconfig: %w", err)
	}
	return writeKubeconfig(cp.AdminKubeconfig(), cp.Server(), cp.ca.CertPEM, cert, key, AdminUser)
}

var nodeNameRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$`)

// AgentKubeconfig returns the path of a kubeconfig for the agent of node: a client certificate
// with CN=system:axon-agent:<node> and O=axon:agents (bound to ClusterRole axon-agent), server
// https://127.0.0.1:<APIPort>. The certificate is issued once and reused.
func (cp *ControlPlane) AgentKubeconfig(node string) (string, error) {
	if !nodeNameRE.MatchString(node) {
		return "", fmt.Errorf("agent kubeconfig: node name %q is not a valid DNS subdomain (lowercase letters, digits, '-', '.')", node)
	}
	return cp.clientKubeconfig(filepath.Join(cp.cfg.Dir, "pki", "agents"), node,
		leafSpec{CommonName: AgentUserPfx + node, Organization: []string{AgentGroup}},
		filepath.Join(cp.cfg.Dir, "kubeconfigs", "agent-"+node+".kubeconfig"))
}

// writeKubeconfig writes a self-contained kubeconfig (certificates embedded).
func writeKubeconfig(path, server string, caPEM, certPEM, keyPEM []byte, user string) error {
	b64 := base64.StdEncoding.EncodeToString
	content := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: axon-lab
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: %q
  user:
    client-certificate-data: %s
    client-key-data: %s
contexts:
- name: axon-lab
  context:
    cluster: axon-lab
    user: %q
current-context: axon-lab
`, server, b64(caPEM), user, b64(certPEM), b64(keyPEM), user)
	if err := atomicfile.Write(path, []byte(content), 0o600); err != nil {
		return fmt.Errorf("write kubeconfig: %w", err)
	}
	return nil
}

func (cp *ControlPlane) adminRESTConfig() (*rest.Config, error) {
	pki := filepath.Join(cp.cfg.Dir, "pki")
	cert, err := os.ReadFile(filepath.Join(pki, adminCertFile))
	if err != nil {
		return nil, fmt.Errorf("admin client: %w", err)
	}
	key, err := os.ReadFile(filepath.Join(pki, adminKeyFile))
	if err != nil {
		return nil, fmt.Errorf("admin client: %w", err)
	}
	return &rest.Config{
		Host:            cp.Server(),
		TLSClientConfig: rest.TLSClientConfig{CAData: cp.ca.CertPEM, CertData: cert, KeyData: key},
		UserAgent:       "axon-lab",
		QPS:             50,
		Burst:           100,
	}, nil
}

// Client returns a clientset authenticated as the lab admin (system:masters).
func (cp *ControlPlane) Client() (kubernetes.Interface, error) {
	rc, err := cp.adminRESTConfig()
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("admin clientset: %w", err)
	}
	return cs, nil
}

func (cp *ControlPlane) adminHTTPClient() (*http.Client, error) {
	pki := filepath.Join(cp.cfg.Dir, "pki")
	pair, err := tls.LoadX509KeyPair(filepath.Join(pki, adminCertFile), filepath.Join(pki, adminKeyFile))
	if err != nil {
		return nil, fmt.Errorf("load admin certificate: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cp.ca.Cert)
	return &http.Client{
		Timeout: 3 * time.Second,
		Transport: &http.Transport{
			TLSClientConfig:   &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12},
			DisableKeepAlives: true,
		},
	}, nil
}
