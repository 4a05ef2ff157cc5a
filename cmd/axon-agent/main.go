// Command axon-agent runs the axon node agent: it watches the kube-apiserver,
// programs node routes and the BPF datapath, and serves the local API used by
// axon-cni and the axon CLI. Run one per node, in the node's network namespace.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"syscall"

	flag "github.com/spf13/pflag"
	"k8s.io/klog/v2"

	"github.com/axonhq/axon/internal/agent"
	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/flagdir"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	cfg := agent.Defaults()
	cfg.Socket = api.DefaultSocket
	fs := flag.NewFlagSet("axon-agent", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: axon-agent [flags]\n\nThe axon node agent. Runs in the node's network namespace; SIGTERM stops it and\nleaves the BPF programs attached (pods keep forwarding).\n\nFlags:\n")
		fs.PrintDefaults()
	}
	fs.StringVar(&cfg.NodeName, "node-name", cfg.NodeName, "name of this node's Node object ($NODE_NAME, else the hostname)")
	fs.StringVar(&cfg.Kubeconfig, "kubeconfig", "", "kubeconfig file for the kube-apiserver; empty = in-cluster service account")
	fs.StringVar(&cfg.APIServer, "k8s-api-server", os.Getenv(agent.APIServerEnv), "the kube-apiserver as https://host:port or host:port, used with the in-cluster service account (or instead of the --kubeconfig's server); needed where kube-proxy does not run, since the kubernetes Service's ClusterIP works only once axon serves it ($"+agent.APIServerEnv+"); empty = the kubernetes Service")
	fs.StringVar(&cfg.CNIConfDir, "cni-conf-dir", "", "directory where the agent writes "+agent.CNIConfFile+" (axon-cni naming --socket) once it is ready to serve CNI ADD, e.g. /host/etc/cni/net.d; kept on exit; empty = never write it")
	fs.IntVar(&cfg.CNIMTU, "cni-mtu", cfg.CNIMTU, "pod MTU written into the CNI configuration (1280..65535)")
	fs.StringVar(&cfg.StateDir, "state-dir", cfg.StateDir, "directory for IPAM allocations and the endpoint registry")
	fs.StringVar(&cfg.Socket, "socket", cfg.Socket, "unix socket of the local API (axon-cni, axon CLI)")
	fs.IntVar(&cfg.APIGroup, "api-group", cfg.APIGroup, "gid owning the local API socket, then mode 0660, whose members (primary gid) may also call its mutating routes; -1: the socket is 0600 and only root may use it")
	fs.IntVar(&cfg.APIUser, "api-user", cfg.APIUser, "one more uid that may call the local API's mutating routes (it must be able to open the socket: see --api-group); -1: none. Root always may")
	fs.StringVar(&cfg.BPFRoot, "bpf-root", cfg.BPFRoot, "bpffs directory where maps and links are pinned")
	fs.StringVar(&cfg.Uplink, "uplink", "", "node uplink device; empty = device of the default route, else the one holding the Node's InternalIP")
	fs.StringVar(&cfg.AttachMode, "attach-mode", cfg.AttachMode, "BPF attach mode: auto (tcx when the kernel has it), tcx or legacy (clsact + cls_bpf)")
	fs.StringVar(&cfg.HostRouting, "host-routing", cfg.HostRouting, "host routing: auto, bpf (redirect in BPF) or legacy (kernel routing)")
	fs.StringVar(&cfg.HealthAddr, "health-addr", "", "host:port serving /livez (liveness), /readyz (readiness), /healthz and Prometheus /metrics, e.g. 127.0.0.1:9876; empty = off")
	fs.StringVar(&cfg.KubeProxyHealthzAddr, "kube-proxy-healthz-addr", "", "host:port serving kube-proxy's healthz (its --healthz-bind-address, e.g. 0.0.0.0:10256): GET /healthz and /livez with kube-proxy's JSON, 200 while the Service sync is current and the Node is not being removed; cloud load balancers probe it. A port in use is retried. Empty = off")
	fs.StringVar(&cfg.KubeProxyMetricsAddr, "kube-proxy-metrics-addr", "", "host:port serving kube-proxy's metrics port (its --metrics-bind-address, e.g. 127.0.0.1:10249): GET /proxyMode (\"axon\") and /metrics (the agent's). Empty = off")
	fs.BoolVar(&cfg.SocketLB, "socket-lb", cfg.SocketLB, "translate Service addresses at the socket (cgroup connect/sendmsg/recvmsg hooks on --cgroup-root)")
	fs.StringVar(&cfg.CgroupRoot, "cgroup-root", cfg.CgroupRoot, "cgroup v2 directory whose processes get socket load balancing (default: the cgroup2 mount in /proc/mounts)")
	fs.StringVar(&cfg.SocketLBMode, "socket-lb-mode", cfg.SocketLBMode, "all: translate every socket under --cgroup-root; hostns-only: only the node's own netns (each pod reaches Services through its own per-packet pod LB). Pods opt out with the annotation axon.io/socket-lb=disabled (Pod or Namespace) and get the pod LB too")
	fs.Uint32Var(&cfg.LBServiceMapSize, "lb-service-map-size", cfg.LBServiceMapSize, "entries of the socket LB service map (one per frontend + one per backend slot); 0 = 262144. A Service that does not fit is not programmed (Event + status)")
	fs.Uint32Var(&cfg.LBBackendMapSize, "lb-backend-map-size", cfg.LBBackendMapSize, "entries of the socket LB backend map (one per backend of every frontend); 0 = 262144")
	fs.StringVar(&cfg.DeviceMode, "device-mode", cfg.DeviceMode, "pod device for new pods: veth, netkit (L3), netkit-l2 or auto (netkit where the kernel has it, else veth); existing pods keep theirs")
	fs.BoolVar(&cfg.EnableIPv4BigTCP, "enable-ipv4-big-tcp", cfg.EnableIPv4BigTCP, "BIG TCP for IPv4 (GSO/GRO up to 192 KiB) on pod devices where the kernel and the uplink allow it")
	fs.BoolVar(&cfg.EnableIPv6BigTCP, "enable-ipv6-big-tcp", cfg.EnableIPv6BigTCP, "BIG TCP for IPv6 (GSO/GRO up to 192 KiB) on pod devices where the kernel and the uplink allow it")
	fs.BoolVar(&cfg.FibCache, "fib-cache", cfg.FibCache, "cache IPv4 routes to other nodes per CPU in the pod egress program, and the north-south LB's IPv4 next hops (device and MACs, also checked against the neighbours), checked against the kernel's route generation on every packet (needs Linux 6.3+; false = a FIB lookup per packet)")
	cfg.NodePortLB.RegisterFlags(fs) // --nodeport, --lb-acceleration, --nodeport-mode, --ct-*, --maglev-table-size, --lb-algorithm
	// Bandwidth Manager (internal/agent/bandwidth.go)
	fs.BoolVar(&cfg.BandwidthManager, "bandwidth-manager", cfg.BandwidthManager, "enforce the Pod annotations kubernetes.io/egress-bandwidth (EDT + fq on the uplink) and kubernetes.io/ingress-bandwidth (token bucket before the redirect into the pod)")
	fs.BoolVar(&cfg.BandwidthBBR, "bandwidth-manager-bbr", cfg.BandwidthBBR, "set BBR as TCP congestion control in every pod netns (needs --bandwidth-manager and bbr in net.ipv4.tcp_allowed_congestion_control)")
	fs.DurationVar(&cfg.BandwidthHorizon, "bandwidth-horizon", cfg.BandwidthHorizon, "drop egress packets of a limited pod whose departure time is further ahead than this (also fq's horizon)")
	// same-node TCP bypass (internal/agent/sockmap.go)
	fs.StringVar(&cfg.Sockmap, "sockmap", cfg.Sockmap, "same-node TCP bypass (default disabled): enabled (TCP between two local pods, and loopback inside a pod, skips the TCP/IP stack: sock_ops + sk_msg on --cgroup-root, after a kernel self-test) or disabled. Pods opt out with the annotation axon.io/sockmap=disabled (Pod or Namespace); pods with a bandwidth annotation are never bypassed")
	fs.StringVar(&cfg.VMBypass, "vm-bypass", cfg.VMBypass, "VM-pod bridge bypass (KubeVirt's bridge binding: frames go between the guest's tap and the pod interface without the in-pod bridge): annotated (pods annotated axon.io/vm-bypass=enabled), all (every pod with the layout, unless annotated disabled) or off (none; bypasses in place are removed)")
	fs.StringVar(&cfg.Mode, "mode", cfg.Mode, "what the agent runs: full (axon networks the node's pods: datapath, routes, IPAM, socket LB, ...) or bypass-only (another CNI plugin networks them, e.g. ptp or any plugin giving each pod its own netns; the agent runs only the same-node TCP bypass, turns --sockmap on, finds pods from the kube-apiserver and their netns by address, and changes nothing else on the node)")
	fs.DurationVar(&cfg.ReconcileInterval, "reconcile-interval", cfg.ReconcileInterval, "period of the full reconcile of routes and BPF maps")
	fs.DurationVar(&cfg.APIServerProbeInterval, "apiserver-probe-interval", cfg.APIServerProbeInterval, "period of GET /version to the kube-apiserver while connected: /readyz says it is unreachable at most this plus 5 s after it went away; while it is, the probe backs off from 1 s to three of these periods (at most 30 s)")
	// profiling and the Go memory limit (runtime.go)
	pprofAddr := fs.String("pprof-address", "", "loopback host:port serving net/http/pprof (e.g. 127.0.0.1:6060); empty = off")
	memLimit := fs.String("memory-limit", defaultMemoryLimit, "Go soft memory limit (GOMEMLIMIT) as a quantity, e.g. 100Mi; 0 = none. $GOMEMLIMIT applies when this flag is not given")
	watchList := fs.Bool("kube-watch-list", false, "fill the informer caches with a streamed watch-list instead of paginated LISTs (client-go's WatchListClient; $KUBE_FEATURE_WatchListClient applies when this flag is not given). Off: at 10 000 Services the LIST fills them ~20 % sooner here")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn or error")
	logFormat := fs.String("log-format", "text", "log format: text or json")
	version := fs.Bool("version", false, "print the version and exit")
	// options from a directory (a ConfigMap volume: deploy/helm/axon), and a dry run of them
	configDir := fs.String("config-dir", "", "directory with one file per option (file name = flag name without --, content = value), e.g. a ConfigMap volume; each value is checked like the flag, an unknown name is an error; an option also given on the command line keeps its command-line value")
	checkConfig := fs.Bool("check-config", false, "check the options (command line and --config-dir) as a start would, print each one's value and source (default, config-dir, command-line), and exit: 0 valid, 2 invalid")
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	var fromDir flagdir.Result
	if *configDir != "" {
		var err error
		// process-level flags never come from the directory
		fromDir, err = flagdir.Apply(fs, *configDir, "config-dir", "check-config", "version", "help")
		if err != nil {
			fmt.Fprintf(stderr, "axon-agent: --config-dir: %v\n", err)
			return 2
		}
	}
	if cfg.Mode == agent.ModeBypassOnly && !fs.Changed("sockmap") {
		cfg.Sockmap = agent.SockmapEnabled // the one feature of the mode
	}
	if *version {
		fmt.Fprintln(stdout, "axon-agent", agent.Version)
		return 0
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "axon-agent: unexpected arguments %q: it takes flags only (see --help)\n", fs.Args())
		return 2
	}
	level, err := agent.ParseLogLevel(*logLevel)
	if err != nil {
		fmt.Fprintln(stderr, "axon-agent:", err)
		return 2
	}
	log, err := agent.NewLogger(*logFormat, level, os.Stderr) // the log always goes to the process's stderr
	if err != nil {
		fmt.Fprintln(stderr, "axon-agent:", err)
		return 2
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintln(stderr, "axon-agent: invalid configuration:", err)
		return 2
	}
	if *pprofAddr != "" {
		if err := checkPprofAddr(*pprofAddr); err != nil {
			fmt.Fprintln(stderr, "axon-agent:", err)
			return 2
		}
	}
	if *checkConfig {
		if _, err := parseMemoryLimit(*memLimit); err != nil {
			fmt.Fprintln(stderr, "axon-agent:", err)
			return 2
		}
		printOptions(stdout, fs, fromDir)
		return 0
	}
	if len(fromDir.Set)+len(fromDir.Overridden) > 0 {
		log.Info("options loaded", "config-dir", *configDir, "from-dir", fromDir.Set, "command-line-wins", fromDir.Overridden)
	}
	if err := applyMemoryLimit(*memLimit, fs.Changed("memory-limit"), log); err != nil {
		fmt.Fprintln(stderr, "axon-agent:", err)
		return 2
	}
	if err := applyWatchList(*watchList, fs.Changed("kube-watch-list")); err != nil {
		fmt.Fprintln(stderr, "axon-agent:", err)
		return 2
	}
	// client-go logs through klog: send it to our logger.
	klog.SetSlogLogger(log.With("component", "client-go"))

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if *pprofAddr != "" {
		if err := servePprof(ctx, *pprofAddr, log); err != nil {
			log.Error("axon-agent failed", "error", err)
			return 1
		}
	}
	if err := agent.Run(ctx, cfg, log); err != nil {
		log.Error("axon-agent failed", "error", err)
		return 1
	}
	return 0
}

// printOptions writes one line per option, "name<TAB>value<TAB>source", in
// name order; --check-config's output (deploy/deploy_test.go reads it).
func printOptions(w io.Writer, fs *flag.FlagSet, fromDir flagdir.Result) {
	fs.VisitAll(func(f *flag.Flag) {
		if f.Name == "config-dir" || f.Name == "check-config" || f.Name == "version" {
			return
		}
		src := flagdir.SourceDefault
		switch {
		case slices.Contains(fromDir.Set, f.Name):
			src = flagdir.SourceConfigDir
		case f.Changed:
			src = flagdir.SourceCommandLine
		}
		fmt.Fprintf(w, "%s\t%s\t%s\n", f.Name, f.Value.String(), src)
	})
}
