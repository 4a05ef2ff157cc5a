package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/axonhq/axon/internal/cni"
)

// Defaults used by axon-agent on a real node (see docs/architecture.md, "Files and paths").
const (
	DefaultStateDir          = "/var/lib/axon"
	DefaultBPFRoot           = "/sys/fs/bpf/axon"
	DefaultReconcileInterval = 30 * time.Second
	// DefaultAPIServerProbeInterval is how often the agent asks the kube-apiserver for
	// GET /version while connected (kube.go's probeLoop): at most this long plus the
	// probe's 5 s timeout before /readyz says the apiserver is gone; while it is gone the
	// probe backs off from 1 s to three intervals (at most 30 s).
	DefaultAPIServerProbeInterval = 10 * time.Second

	// RouteProtocol marks the routes the agent owns ("axon"); routes with any
	// other protocol are never touched.
	RouteProtocol = 0xA0
)

// Config is everything Run needs. The zero value is not valid: use Defaults
// and then override.
type Config struct {
	NodeName   string // Kubernetes Node this agent runs for
	Kubeconfig string // path; empty = in-cluster config
	// APIServer is the kube-apiserver (https://host:port or host:port),
	// used instead of the kubernetes Service (in-cluster) or the
	// kubeconfig's server; empty = theirs (apiserver.go)
	APIServer string
	// ServiceAccountDir holds the in-cluster token and ca.crt; empty =
	// DefaultServiceAccountDir (tests point it elsewhere)
	ServiceAccountDir string
	StateDir          string // IPAM allocations and endpoint registry
	// CNI configuration file written once ready (cniconf.go)
	CNIConfDir string // directory of CNIConfFile; empty = never write it
	CNIMTU     int    // pod MTU in it; 0 = cni.DefaultMTU
	Socket     string // local API unix socket
	// who may use the local API (api.Serve): APIGroup owns the socket, which
	// is then 0660 (-1: 0600, root only), and its members (primary gid) may
	// call the mutating routes; APIUser is one more uid that may (-1: none).
	// Root always may.
	APIGroup    int
	APIUser     int
	BPFRoot     string // bpffs pin directory
	Uplink      string // node uplink device; empty = auto-detect
	AttachMode  string // auto|tcx|legacy
	HostRouting string // auto|bpf|legacy
	HealthAddr  string // host:port for /healthz and /metrics; empty = off
	// kube-proxy's healthz and metrics ports (kubeproxy.go); empty = off
	KubeProxyHealthzAddr string
	KubeProxyMetricsAddr string
	SocketLB             bool   // attach the socket load balancer (cgroup hooks)
	CgroupRoot           string // cgroup v2 directory the socket LB hooks attach to
	// socket LB mode and map sizes (socklb.go, optout.go)
	SocketLBMode     string // all|hostns-only
	LBServiceMapSize uint32 // axon_lb_svc entries (frontends + backend slots); 0 = default
	LBBackendMapSize uint32 // axon_lb_be entries; 0 = default
	// pod device type and BIG TCP (device.go)
	DeviceMode       string // veth|netkit|netkit-l2|auto
	EnableIPv4BigTCP bool   // BIG TCP for IPv4 where kernel and uplink allow it
	EnableIPv6BigTCP bool   // BIG TCP for IPv6 where kernel and uplink allow it
	FibCache         bool   // per-CPU IPv4 route cache in axon_pod_egress and the north-south LB's next-hop cache, where the kernel loads them
	// north-south load balancer on the uplink (nodeport*.go)
	NodePortLB NodePortConfig
	// Bandwidth Manager (bandwidth.go)
	BandwidthManager bool          // enforce kubernetes.io/{egress,ingress}-bandwidth (EDT + fq, ingress token bucket)
	BandwidthBBR     bool          // set BBR as congestion control in pod netns
	BandwidthHorizon time.Duration // EDT drop horizon (fq's horizon too)
	// same-node TCP bypass (sockmap.go)
	Sockmap string // enabled|disabled; "" (a Config built by hand) = disabled
	// VM-pod bridge bypass (vmbypass.go): which pods get it
	VMBypass string // annotated|all|off; "" (a Config built by hand) = annotated
	// what the agent runs (mode.go): full, or only the same-node TCP bypass
	// on a node whose pods another CNI plugin networks
	Mode string // full|bypass-only; "" = full

	ReconcileInterval time.Duration // periodic full reconcile
	// GET /version every this long while connected; 0 (a Config built by hand) =
	// DefaultAPIServerProbeInterval
	APIServerProbeInterval time.Duration
}

// Defaults returns the product defaults. NodeName comes from $NODE_NAME or
// the hostname.
func Defaults() Config {
	node := os.Getenv("NODE_NAME")
	if node == "" {
		node, _ = os.Hostname()
	}
	return Config{
		NodeName:          node,
		StateDir:          DefaultStateDir,
		CNIMTU:            cni.DefaultMTU,
		Socket:            "/var/run/axon/axon.sock",
		APIGroup:          -1,
		APIUser:           -1,
		BPFRoot:           DefaultBPFRoot,
		AttachMode:        "auto",
		HostRouting:       "auto",
		SocketLB:          true,
		SocketLBMode:      SocketLBModeAll,
		DeviceMode:        DefaultDeviceMode,
		EnableIPv4BigTCP:  true,
		EnableIPv6BigTCP:  true,
		FibCache:          true,
		NodePortLB:        DefaultNodePortConfig(),
		BandwidthHorizon:  DefaultBandwidthHorizon,
		Sockmap:           SockmapDisabled, // opt in: see docs/sockmap.md for what it costs the node
		VMBypass:          VMBypassAnnotated,
		Mode:              ModeFull,
		CgroupRoot:        Cgroup2Mount(),
		ReconcileInterval: DefaultReconcileInterval,

		APIServerProbeInterval: DefaultAPIServerProbeInterval,
	}
}

var (
	attachModes  = []string{"auto", "tcx", "legacy"}
	hostRoutings = []string{"auto", "bpf", "legacy"}
)

// Validate checks the configuration and says what to fix.
func (c Config) Validate() error {
	var errs []error
	if c.NodeName == "" {
		errs = append(errs, errors.New("--node-name is empty: pass it or set $NODE_NAME"))
	}
	if strings.ContainsAny(c.NodeName, "/ ") {
		errs = append(errs, fmt.Errorf("--node-name %q is not a valid Node name", c.NodeName))
	}
	if c.APIServer != "" {
		if _, err := ParseAPIServer(c.APIServer); err != nil { // apiserver.go
			errs = append(errs, err)
		}
	}
	if c.StateDir == "" {
		errs = append(errs, errors.New("--state-dir is empty: pass a writable directory such as "+DefaultStateDir))
	}
	if c.Socket == "" {
		errs = append(errs, errors.New("--socket is empty: pass a path such as /var/run/axon/axon.sock"))
	}
	if c.BPFRoot == "" {
		errs = append(errs, errors.New("--bpf-root is empty: pass a directory on bpffs such as "+DefaultBPFRoot))
	}
	if !oneOf(c.AttachMode, attachModes) {
		errs = append(errs, fmt.Errorf("--attach-mode %q is invalid: use one of %s", c.AttachMode, strings.Join(attachModes, "|")))
	}
	if !oneOf(c.HostRouting, hostRoutings) {
		errs = append(errs, fmt.Errorf("--host-routing %q is invalid: use one of %s", c.HostRouting, strings.Join(hostRoutings, "|")))
	}
	if c.HealthAddr != "" {
		if _, port, err := net.SplitHostPort(c.HealthAddr); err != nil || port == "" {
			errs = append(errs, fmt.Errorf("--health-addr %q is invalid: use host:port such as 127.0.0.1:9876, or empty to disable", c.HealthAddr))
		}
	}
	if c.SocketLB {
		if err := checkCgroup2Dir(c.CgroupRoot); err != nil {
			errs = append(errs, err)
		}
	}
	if err := c.validateCNIConf(); err != nil { // cniconf.go
		errs = append(errs, err)
	}
	if err := c.validateSocketLB(); err != nil { // socklb.go
		errs = append(errs, err)
	}
	if err := c.validateDevice(); err != nil { // device.go
		errs = append(errs, err)
	}
	if err := c.NodePortLB.Validate(); err != nil { // nodeport_config.go
		errs = append(errs, err)
	}
	if err := c.validateBandwidth(); err != nil { // bandwidth.go
		errs = append(errs, err)
	}
	if err := c.validateSockmap(); err != nil { // sockmap.go
		errs = append(errs, err)
	}
	if err := c.validateVMBypass(); err != nil { // vmbypass.go
		errs = append(errs, err)
	}
	if err := c.validateKubeProxy(); err != nil { // kubeproxy.go
		errs = append(errs, err)
	}
	if err := c.validateMode(); err != nil { // mode.go
		errs = append(errs, err)
	}
	if c.ReconcileInterval <= 0 {
		errs = append(errs, fmt.Errorf("reconcile interval %s must be positive", c.ReconcileInterval))
	}
	if c.APIServerProbeInterval < 0 {
		errs = append(errs, fmt.Errorf("--apiserver-probe-interval %s must not be negative (0 = the default, %s)", c.APIServerProbeInterval, DefaultAPIServerProbeInterval))
	}
	return errors.Join(errs...)
}

func oneOf(v string, set []string) bool {
	for _, s := range set {
		if v == s {
			return true
		}
	}
	return false
}

// ParseLogLevel maps --log-level to a slog level.
func ParseLogLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("--log-level %q is invalid: use debug, info, warn or error", s)
	}
	return l, nil
}

// NewLogger builds the agent's logger for --log-format text|json.
func NewLogger(format string, level slog.Level, w *os.File) (*slog.Logger, error) {
	opts := &slog.HandlerOptions{Level: level}
	switch format {
	case "text", "":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	default:
		return nil, fmt.Errorf("--log-format %q is invalid: use text or json", format)
	}
}
