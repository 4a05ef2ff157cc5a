package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/lab"
	"github.com/axonhq/axon/internal/lab/controlplane"
	"github.com/axonhq/axon/internal/lab/kubeproxy"
	"github.com/axonhq/axon/internal/lab/probe"
)

// labFlags are the flags shared by every `axon lab` subcommand.
type labFlags struct {
	stateDir string
	binDir   string
	verbose  bool
}

func (f *labFlags) logger() *slog.Logger {
	lvl := slog.LevelInfo
	if f.verbose {
		lvl = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
}

func (f *labFlags) load() (*lab.Lab, error) {
	l, err := lab.Load(f.stateDir)
	if err != nil {
		return nil, err
	}
	l.SetLogger(f.logger())
	return l, nil
}

func defaultBinDir() string {
	exe, err := os.Executable()
	if err != nil {
		return "bin"
	}
	if p, err := filepath.EvalSymlinks(exe); err == nil {
		exe = p
	}
	return filepath.Dir(exe)
}

func newLabCmd() *cobra.Command {
	f := &labFlags{}
	cmd := &cobra.Command{
		Use:   "lab",
		Short: "Run a whole multi-node cluster on this machine (network namespaces + real kube-apiserver)",
		Long: "axon lab runs a Kubernetes-like cluster on one machine: nodes are network namespaces\n" +
			"joined by a bridge namespace (axonlab-wire), pods are namespaces wired by axon-cni\n" +
			"(or the reference ptp plugin), etcd + kube-apiserver run on loopback and one\n" +
			"axon-agent runs per node. Everything it creates is named axonlab-* and recorded in\n" +
			"<state-dir>/lab.json; `axon lab down` removes it. One lab per machine. Needs root.",
	}
	cmd.PersistentFlags().StringVar(&f.stateDir, "state-dir", lab.DefaultStateDir, "lab state directory (lab.json, logs, per-node state)")
	cmd.PersistentFlags().StringVar(&f.binDir, "bin-dir", defaultBinDir(), "directory holding axon, axon-agent and axon-cni")
	cmd.PersistentFlags().BoolVarP(&f.verbose, "verbose", "v", false, "debug logging")
	cmd.AddCommand(
		newLabUpCmd(f), newLabDownCmd(f), newLabStatusCmd(f), newLabListCmd(f),
		newLabExecCmd(f), newLabKubectlCmd(f), newLabCheckCmd(f),
		newLabBenchCmd(&f.stateDir), newLabForwardCmd(f), newLabEchoCmd(),
		newLabProbeCmd(),
		newLabXProbeCmd(), newLabPeerEchoCmd(), // labbench_ns.go
	)
	return cmd
}

func newLabUpCmd(f *labFlags) *cobra.Command {
	o := lab.UpOptions{}
	fibCache := true
	sockmap := false
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Create the lab: control plane, wire, nodes, agents and pods",
		Long: "Create the lab: etcd + kube-apiserver on 127.0.0.1, the wire bridge, N node namespaces\n" +
			"(198.18.0.1i, fd00:198:18::1i) with Node objects, one axon-agent per node, then M pods per\n" +
			"node wired through CNI ADD exactly as a kubelet does. A healthy lab of the same shape is\n" +
			"left as it is; leftovers of a crashed run are removed first.\n" +
			"--datapath baseline wires pods with the reference ptp + host-local plugins and static\n" +
			"routes instead (no agents), for comparison.\n" +
			"--vm-pods N adds N VM pods per node (<node>-vm<i>): after CNI ADD the lab does what KubeVirt's\n" +
			"virt-launcher does for the bridge binding and boots a QEMU guest with the pod's IPv4 address and\n" +
			"MAC; the node's agent attaches the VM bypass (axon.io/vm-bypass: enabled). Needs make vm-packages\n" +
			"and make vm-kernels; the guests are stopped by PID at `axon lab down` (docs/vm-bypass.md).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.BinDir = f.binDir
			o.Logger = f.logger()
			o.NoFibCache = !fibCache
			o.NoSockmap = !sockmap
			t0 := time.Now()
			l, err := lab.Up(cmd.Context(), f.stateDir, o)
			if err != nil {
				return fmt.Errorf("lab up: %w\n(logs under %s; `axon lab down` removes what was created)", err, f.stateDir)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "lab up in %s: %d nodes, %d pods (%s). Try: axon lab check; axon lab exec %s -- ip addr\n",
				time.Since(t0).Round(time.Millisecond), len(l.Nodes()), len(l.Pods()), o.Datapath, firstTarget(l))
			return nil
		},
	}
	cmd.Flags().IntVar(&o.Nodes, "nodes", 2, "number of nodes (1..50)")
	cmd.Flags().IntVar(&o.PodsPerNode, "pods-per-node", 2, "pods per node (0..50)")
	cmd.Flags().IntVar(&o.VMPods, "vm-pods", 0, fmt.Sprintf("VM pods per node (0..%d): each a QEMU guest (%s kernel from `make vm-kernels`, 1 vCPU, 256 MiB) wired like KubeVirt's bridge binding (bridge %s, tap %s, the pod's IPv4 and MAC moved to the guest by DHCP, its IPv6 address set in the guest as cloud-init would), annotated %s=enabled so the node's agent attaches the bridge bypass; `axon lab check` covers them (docs/vm-bypass.md)", lab.MaxVMPodsPerNode, lab.VMGuestKernel, lab.VMBridge, lab.VMTap, "axon.io/vm-bypass"))
	cmd.Flags().DurationVar(&o.ReadyTimeout, "ready-timeout", 90*time.Second, "bound on each readiness wait (etcd, kube-apiserver, agents); raise it on slow CPUs such as QEMU TCG")
	cmd.Flags().StringVar(&o.Datapath, "datapath", lab.DatapathAxon, "pod datapath: axon or baseline")
	cmd.Flags().StringVar(&o.KubeProxy, "kube-proxy", kubeproxy.None, "run the real kube-proxy in every node: none, iptables or nftables (agents then run with --socket-lb=false)")
	// pod device and BIG TCP
	cmd.Flags().StringVar(&o.Device, "device", lab.DeviceVeth, "pod device of the axon agents (--device-mode): veth, netkit, or auto (netkit where the kernel has it, else veth)")
	cmd.Flags().Var(&onOff{&o.BigTCP}, "big-tcp", "BIG TCP (192 KiB GSO/GRO) on the wire, node uplinks and pod devices: on or off")
	cmd.Flags().Var(&onOff{&sockmap}, "sockmap", "axon agents' --sockmap: TCP between two pods of a node (and loopback inside a pod) skips the TCP/IP stack (on), or takes it (off, the default). With --datapath baseline, on starts an agent per node in --mode=bypass-only (the bypass alone; the pods stay ptp's)")
	cmd.Flags().Var(&onOff{&fibCache}, "fib-cache", "axon agents' --fib-cache: IPv4 routes to other nodes cached in the pod egress program (on), or looked up per packet (off)")
	cmd.Flags().StringVar(&o.BandwidthManager, "bandwidth-manager", lab.BandwidthOff, "Pod annotations kubernetes.io/{egress,ingress}-bandwidth: on (axon agents: EDT + fq, ingress token bucket), off, or cni-plugin (baseline: the reference bandwidth plugin's TBF chained after axon-cni, pods kernel-routed)")
	// north-south LB of the axon agents (check_external.go)
	cmd.Flags().StringVar(&o.LBAcceleration, "lb-acceleration", "", "axon agents' --lb-acceleration: native, best-effort or disabled (default: the agent's, disabled = tc only)")
	cmd.Flags().StringVar(&o.NodePortMode, "nodeport-mode", "", "axon agents' --nodeport-mode: snat or dsr (default: the agent's, snat)")
	cmd.Flags().BoolVar(&o.Kubelet, "kubelet", false, "real nodes: containerd + runc + kubelet in every node, kube-scheduler and kube-controller-manager, and axon installed from its Helm chart (deploy/helm/axon) as a DaemonSet; no lab agents or pods (--pods-per-node 0). Needs `make deps images image` (docs/kubelet.md). With --datapath baseline and --kube-proxy iptables|nftables the nodes run the reference ptp + host-local + portmap chain and kube-proxy instead of axon")
	cmd.Flags().StringVar(&o.Image, "image", "", "with --kubelet: axon's image archive (docker or OCI tar) the nodes import (default <bin-dir>/image/axon-image.tar, `make image`)")
	cmd.Flags().BoolVar(&o.NoDemo, "no-demo", false, "do not create the demo Services (ClusterIP, NodePort, externalIPs, LoadBalancer) that `axon lab check` probes")
	return cmd
}

func firstTarget(l *lab.Lab) string {
	if p := l.Pods(); len(p) > 0 {
		return p[0].Name
	}
	return "node1"
}

func newLabDownCmd(f *labFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "down",
		Short: "Remove everything the lab created (processes, namespaces, pins, cgroups, state); safe to run twice",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if os.Geteuid() != 0 {
				return errors.New("axon lab down needs root: run it with sudo")
			}
			if err := lab.Down(cmd.Context(), f.stateDir, f.logger()); err != nil {
				return fmt.Errorf("lab down: %w (fix the cause and run `axon lab down` again)", err)
			}
			fmt.Fprintln(cmd.OutOrStdout(), "lab down")
			return nil
		},
	}
}

func newLabStatusCmd(f *labFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Show the lab's processes, nodes (agent health) and pods",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			l, err := f.load()
			if err != nil {
				return err
			}
			return printLabStatus(cmd.Context(), cmd.OutOrStdout(), l)
		},
	}
}

func printLabStatus(ctx context.Context, w io.Writer, l *lab.Lab) error {
	st := l.State()
	rep := l.Health(ctx)
	fmt.Fprintf(w, "lab %s (%s datapath, created %s, state %s)\n", map[bool]string{true: "UP", false: "DEGRADED"}[rep.OK()],
		st.Datapath, st.Created.Format(time.RFC3339), st.StateDir)
	if st.DaemonSetAgents() {
		fmt.Fprintf(w, "  agents: DaemonSet %s/%s, the chart's settings (same-node TCP bypass: each node's state in the DATAPATH column, sockmap=...)\n", lab.AxonNamespace, lab.AxonDaemonSet)
	} else if st.Datapath == lab.DatapathAxon {
		fmt.Fprintf(w, "  agents: --sockmap %s (same-node TCP bypass; each node's state in the DATAPATH column, sockmap=...)\n", st.SockmapMode())
	}
	for _, p := range rep.Processes {
		fmt.Fprintf(w, "  %-24s pid %-8d %s\n", p.Name, p.PID, p.State)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tIP\tPODCIDRS\tAGENT\tENDPOINTS\tROUTES\tDATAPATH")
	for _, n := range st.Nodes {
		agent, eps, routes, dp := "-", "-", "-", "-"
		if st.RunsAgent(n) {
			ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			s, err := api.NewClient(n.Socket).Status(ctx)
			cancel()
			switch {
			case err != nil:
				agent = "unreachable"
			case s.Ready:
				agent = "ready"
			default:
				agent = "not ready: " + s.Message
			}
			if err == nil {
				eps, routes = fmt.Sprint(s.Endpoints), fmt.Sprint(s.Routes)
				var ds []string
				for _, d := range s.Datapath {
					ds = append(ds, d.Name+"="+d.Value)
				}
				dp = strings.Join(ds, ",")
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", n.Name, joinAddrs(n.IPs), joinPrefixes(n.PodCIDRs), agent, eps, routes, dp)
	}
	tw.Flush()
	if st.Kubelet { // no lab pods: kubelet runs the cluster's
		printKubeletPods(ctx, w, l)
	} else {
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "POD\tNODE\tDATAPATH\tIPS")
		for _, p := range st.Pods {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", p.Name, p.Node, p.Datapath, joinAddrs(p.IPs))
		}
		tw.Flush()
	}
	if len(st.VMPods) > 0 { // --vm-pods
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "VM POD\tNODE\tGUEST IPS\tGUEST MAC\tBOOT\tCONSOLE")
		for _, v := range st.VMPods {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", v.Name, v.Node, joinAddrs(v.IPs), v.GuestMAC, v.Boot, filepath.Join(v.Dir, "console.log"))
		}
		tw.Flush()
	}
	printKubeProxyStatus(ctx, w, l)
	for _, p := range rep.Problems {
		fmt.Fprintln(w, "PROBLEM:", p)
	}
	return nil
}

// printKubeletPods lists the pods kubelet runs in a --kubelet lab (the lab has none of its own;
// `axon lab exec <namespace>/<pod>` enters one).
func printKubeletPods(ctx context.Context, w io.Writer, l *lab.Lab) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	pods, err := l.KubeletPods(ctx)
	if err != nil {
		fmt.Fprintln(w, "PROBLEM: kubelet pods:", err)
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KUBELET POD\tNODE\tPHASE\tNETWORK\tIPS")
	for _, p := range pods {
		network := "pod"
		if p.Spec.HostNetwork {
			network = "host"
		}
		var ips []string
		for _, ip := range p.Status.PodIPs {
			ips = append(ips, ip.IP)
		}
		fmt.Fprintf(tw, "%s/%s\t%s\t%s\t%s\t%s\n", p.Namespace, p.Name, p.Spec.NodeName, p.Status.Phase, network, strings.Join(ips, ","))
	}
	tw.Flush()
}

func joinAddrs(as []netip.Addr) string {
	var s []string
	for _, a := range as {
		s = append(s, a.String())
	}
	return strings.Join(s, ",")
}

// Shapes of `axon lab list -o json` (a stable contract: other tools parse it).
type listNode struct {
	Name     string         `json:"name"`
	IP       netip.Addr     `json:"ip"`
	IPs      []netip.Addr   `json:"ips"`
	PodCIDRs []netip.Prefix `json:"podCIDRs"`
	Netns    string         `json:"netns"`
}

type listPod struct {
	Name      string       `json:"name"`
	Namespace string       `json:"namespace"`
	Node      string       `json:"node"`
	IP        netip.Addr   `json:"ip"`
	IPs       []netip.Addr `json:"ips"`
	Netns     string       `json:"netns"`
	Datapath  string       `json:"datapath"`
}

type listExternal struct {
	Name  string     `json:"name"`
	IP    netip.Addr `json:"ip"`
	Netns string     `json:"netns"`
}

type listOutput struct {
	Nodes    []listNode   `json:"nodes"`
	Pods     []listPod    `json:"pods"`
	External listExternal `json:"external"`
}

func newLabListCmd(f *labFlags) *cobra.Command {
	var of outputFlag
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List nodes, pods and the external namespace with their addresses",
		Long: "List nodes, pods and the external namespace. -o json prints\n" +
			`{"nodes":[{"name","ip","ips","podCIDRs","netns"}],"pods":[{"name","namespace","node","ip","ips","netns","datapath"}],"external":{"name","ip","netns"}}` + "\n" +
			"where ip is the primary IPv4 address, ips all addresses and netns the namespace path.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := of.parse(); err != nil {
				return err
			}
			l, err := f.load()
			if err != nil {
				return err
			}
			st := l.State()
			out := listOutput{Nodes: []listNode{}, Pods: []listPod{}}
			for _, n := range st.Nodes {
				out.Nodes = append(out.Nodes, listNode{n.Name, n.IP, n.IPs, n.PodCIDRs, "/run/netns/" + n.Netns})
			}
			for _, p := range st.Pods {
				out.Pods = append(out.Pods, listPod{p.Name, p.Namespace, p.Node, p.IP, p.IPs, "/run/netns/" + p.Netns, p.Datapath})
			}
			out.External = listExternal{st.External.Name, st.External.IP, "/run/netns/" + st.External.Netns}
			w := cmd.OutOrStdout()
			if of.structured() {
				return of.write(cmd, out)
			}
			tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "KIND\tNAME\tNODE\tIPS\tNETNS")
			for _, n := range out.Nodes {
				fmt.Fprintf(tw, "node\t%s\t-\t%s\t%s\n", n.Name, joinAddrs(n.IPs), n.Netns)
			}
			for _, p := range out.Pods {
				fmt.Fprintf(tw, "pod\t%s\t%s\t%s\t%s\n", p.Name, p.Node, joinAddrs(p.IPs), p.Netns)
			}
			fmt.Fprintf(tw, "external\t%s\t-\t%s\t%s\n", st.External.Name, joinAddrs(st.External.IPs), out.External.Netns)
			return tw.Flush()
		},
	}
	of.register(cmd)
	return cmd
}

// runPassthrough runs cmd with the terminal's stdio and turns its exit
// status into the exit status of axon.
func runPassthrough(cmd *exec.Cmd) error {
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code := ee.ExitCode()
		if code < 0 {
			code = 128 + 9 // killed by a signal
		}
		return exitError{code: code}
	}
	return err
}

func newLabExecCmd(f *labFlags) *cobra.Command {
	var guest bool
	var guestTimeout time.Duration
	cmd := &cobra.Command{
		Use:   "exec [--guest] <node|pod|external|vm-pod> -- <cmd...>",
		Short: "Run a command in a node, pod or the external namespace (pods and nodes: also in their cgroup)",
		Long: "Run a command in the network namespace of a lab node, pod or \"external\". For a pod the\n" +
			"process starts in the pod's cgroup (<cgroup2>/axon-lab/<node>/<pod>), as a container\n" +
			"would; for a node in the node's cgroup (<cgroup2>/axon-lab/<node>), so the node's socket\n" +
			"load balancer translates its Service connections. In a --kubelet lab a pod is one that\n" +
			"kubelet runs, <namespace>/<pod> (or <pod> when one namespace has it): the command joins\n" +
			"the network namespace and cgroup of its first container; a node's cgroup is kubelet's\n" +
			"cgroup root of the node. With --guest the target is a VM pod (up --vm-pods) and the command\n" +
			"runs inside its QEMU guest. The command's exit code becomes axon's.",
		Example: "  axon lab exec node1-pod1 -- ping -c1 10.244.2.2\n  axon lab exec node2 -- ip route\n" +
			"  axon lab exec default/web-5d9c7-x2x8q -- ip addr   # --kubelet\n" +
			"  axon lab exec --guest node1-vm1 -- ip addr         # --vm-pods: inside the QEMU guest",
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			l, err := f.load()
			if err != nil {
				return err
			}
			argv := args[1:]
			if argv[0] == "--" { // kept by pflag when parsing stopped at the target
				argv = argv[1:]
			}
			if guest {
				if len(argv) == 0 {
					return errors.New("--guest: no command given")
				}
				out, rc, err := l.GuestRun(cmd.Context(), args[0], strings.Join(argv, " "), guestTimeout)
				fmt.Fprint(cmd.OutOrStdout(), out)
				if out != "" && !strings.HasSuffix(out, "\n") {
					fmt.Fprintln(cmd.OutOrStdout())
				}
				if err != nil {
					return err
				}
				if rc != 0 {
					return exitError{code: rc}
				}
				return nil
			}
			return runPassthrough(l.CommandInCgroup(cmd.Context(), args[0], argv...))
		},
	}
	cmd.Flags().BoolVar(&guest, "guest", false, "the target is a VM pod (up --vm-pods): run the command inside its QEMU guest, through the guest's command port (a second serial port; the words joined into one shell line, stdin /dev/null, output and exit code returned when it ends)")
	cmd.Flags().DurationVar(&guestTimeout, "guest-timeout", time.Minute, "with --guest: how long the command may run in the guest")
	cmd.Flags().SetInterspersed(false)
	return cmd
}

func newLabKubectlCmd(f *labFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "kubectl -- <args...>",
		Short:   "Run the cached kubectl against the lab's apiserver (admin kubeconfig)",
		Example: "  axon lab kubectl -- get nodes -o wide",
		RunE: func(cmd *cobra.Command, args []string) error {
			l, err := f.load()
			if err != nil {
				return err
			}
			kubectl, err := lab.DepPath("kubectl")
			if err != nil {
				return err
			}
			if len(args) > 0 && args[0] == "--" {
				args = args[1:]
			}
			c := exec.CommandContext(cmd.Context(), kubectl, append([]string{"--kubeconfig", l.AdminKubeconfig()}, args...)...)
			return runPassthrough(c)
		},
	}
	cmd.Flags().SetInterspersed(false)
	return cmd
}

func newLabCheckCmd(f *labFlags) *cobra.Command {
	var timeout time.Duration
	var services bool
	var external bool
	var sockmap bool
	cmd := &cobra.Command{
		Use:   "check",
		Short: "Connectivity matrix: every pod to every pod and node, IPv4+IPv6, TCP/UDP/ICMP",
		Long: "Probe every pod to every other pod and every node over IPv4 and IPv6 with TCP and UDP\n" +
			"(a built-in echo on port 5657) and ICMP (ping). Probes run in the source pod's namespace\n" +
			"and cgroup. Prints the matrix (ok = all 6 probes passed) and exits non-zero on any failure.\n" +
			"With --sockmap (default): on each node whose agent has the same-node TCP bypass on (its kernel\n" +
			"self-test passed; with --datapath baseline --sockmap on, in bypass-only mode) one connection\n" +
			"between two of its pods must echo 256 KiB intact with both sockets in the SOCKHASH (the agent's\n" +
			"connection list) and bytes redirected; where the agent keeps the bypass off: n/a and its reason.\n" +
			"With VM pods (`up --vm-pods`): each guest answers ICMP and TCP over IPv4 from a pod on its node, a\n" +
			"pod on another node and its node, its agent reports the bypass (`bypassed`), its Service demo-<pod>\n" +
			"answers with the guest as its backend (ClusterIP from those sources, NodePort from external), from inside\n" +
			"the guest (its command port) those pods and node answer TCP and ICMP and the demo ClusterIP TCP (through\n" +
			"the VM pod's pod LB; n/a where the agent gives it none), the bypass's counters moved both ways; a VM\n" +
			"pod that is not bypassed fails with the agent's reason.\n" +
			"The sidecar chain (HAProxy, nat REDIRECT) is not part of check: `axon lab bench sockmap --chain`.\n" +
			"In a --kubelet lab (no lab pods) the sources are two pause pods per node that kubelet runs, from\n" +
			"the DaemonSets probe-a and probe-b in namespace " + lab.CheckNamespace + " (created on first use, left\n" +
			"for the next check).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			l, err := f.load()
			if err != nil {
				return err
			}
			res, err := l.Check(cmd.Context(), timeout)
			if res != nil {
				res.Print(cmd.OutOrStdout())
			}
			if err != nil {
				return fmt.Errorf("lab check: %w", err)
			}
			failed := len(res.Failed())
			if services && l.State().DemoServices {
				fmt.Fprintln(cmd.OutOrStdout())
				sres, err := l.CheckServices(cmd.Context(), timeout)
				if sres != nil {
					sres.Print(cmd.OutOrStdout())
				}
				if err != nil {
					return fmt.Errorf("lab check (services): %w", err)
				}
				failed += len(sres.Failed())
			}
			if external && l.State().DemoServices { // check_external.go
				fmt.Fprintln(cmd.OutOrStdout())
				xres, err := l.CheckExternal(cmd.Context(), timeout)
				if xres != nil {
					xres.Print(cmd.OutOrStdout())
					failed += len(xres.Failed())
				}
				if err != nil {
					return fmt.Errorf("lab check (external): %w", err)
				}
			}
			if len(l.State().VMPods) > 0 { // --vm-pods: check_vmpods.go
				fmt.Fprintln(cmd.OutOrStdout())
				vres, err := l.CheckVMPods(cmd.Context(), timeout)
				if vres != nil {
					vres.Print(cmd.OutOrStdout())
					failed += len(vres.Failed())
				}
				if err != nil {
					return fmt.Errorf("lab check (VM pods): %w", err)
				}
			}
			if sockmap { // check_sockmap.go
				fmt.Fprintln(cmd.OutOrStdout())
				mres, err := l.CheckSockmap(cmd.Context(), timeout)
				if mres != nil {
					mres.Print(cmd.OutOrStdout())
					failed += len(mres.Failed())
				}
				if err != nil {
					return fmt.Errorf("lab check (sockmap): %w", err)
				}
			}
			if failed > 0 {
				return fmt.Errorf("lab check: %d probes failed", failed)
			}
			return nil
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 3*time.Second, "per-probe timeout")
	cmd.Flags().BoolVar(&external, "external", true, "also probe NodePort, LoadBalancer, externalIP, HostPort and externalTrafficPolicy Local from the external namespace (n/a with the reason when nothing serves north-south traffic)")
	cmd.Flags().BoolVar(&sockmap, "sockmap", true, "also check the same-node TCP bypass on each node whose agent has it on: a pod-to-pod connection echoes 256 KiB intact with both sockets in the agent's SOCKHASH list (n/a with the agent's reason where it is off)")
	cmd.Flags().BoolVar(&services, "services", true, "also probe every demo Service type from every pod and node (labs brought up without --no-demo)")
	return cmd
}

// newLabProbeCmd is the hidden Service prober of `axon lab check`; the
// checker starts it in a pod (pod cgroup) or a node (node cgroup).
func newLabProbeCmd() *cobra.Command {
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:    "_probe tcp|udp/ADDR:PORT...",
		Short:  "internal: Service prober of `axon lab check` (one JSON line per probe)",
		Hidden: true,
		Args:   cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var ps []probe.Service
			for _, a := range args {
				p, err := probe.ParseService(a)
				if err != nil {
					return err
				}
				ps = append(ps, p)
			}
			return probe.RunServices(cmd.Context(), ps, timeout, os.Stdout)
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 3*time.Second, "per-probe timeout")
	return cmd
}

// newLabForwardCmd is the hidden daemon started by `up`: it listens on
// 127.0.0.1:<port> inside each node netns and forwards to the apiserver.
func newLabForwardCmd(f *labFlags) *cobra.Command {
	var listen, target, connectSocket, connectNetns string
	var netns, connectAllow []string
	cmd := &cobra.Command{
		Use:    "_forward --netns PATH... --listen ADDR --target ADDR [--connect-socket PATH --connect-netns PATH --connect-allow CIDR...]",
		Short:  "internal: forward the apiserver into node namespaces",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(netns) == 0 {
				return errors.New("_forward: give at least one --netns")
			}
			if connectSocket == "" {
				return controlplane.ServeForwarder(cmd.Context(), netns, listen, target, f.logger())
			}
			return serveForwarderAndEgress(cmd.Context(), netns, listen, target, connectSocket, connectNetns, connectAllow, f.logger())
		},
	}
	cmd.Flags().StringVar(&connectSocket, "connect-socket", "", "also serve the apiserver's egress: HTTP CONNECT on this unix socket")
	cmd.Flags().StringVar(&connectNetns, "connect-netns", "", "network namespace path the CONNECT targets are dialed in")
	cmd.Flags().StringArrayVar(&connectAllow, "connect-allow", nil, "CIDR a CONNECT target must be in (repeatable)")
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:6443", "address to listen on inside each netns")
	cmd.Flags().StringVar(&target, "target", "127.0.0.1:6443", "apiserver address in the root netns")
	cmd.Flags().StringArrayVar(&netns, "netns", nil, "network namespace path (repeatable)")
	return cmd
}

func newLabEchoCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:    "_echo",
		Short:  "internal: echo server and prober of `axon lab check`",
		Hidden: true,
	}
	var port int
	serve := &cobra.Command{
		Use:  "serve",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// Exits when stdin closes (the checker went away).
			return probe.ServeEcho(cmd.Context(), port, os.Stdout, os.Stdin)
		},
	}
	serve.Flags().IntVar(&port, "port", probe.EchoPort, "TCP and UDP port")
	var timeout time.Duration
	probeCmd := &cobra.Command{
		Use:  "probe proto/addr...",
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var ps []probe.Pod
			for _, a := range args {
				p, err := probe.ParsePod(a)
				if err != nil {
					return err
				}
				ps = append(ps, p)
			}
			return probe.RunPods(cmd.Context(), ps, timeout, os.Stdout)
		},
	}
	probeCmd.Flags().DurationVar(&timeout, "timeout", 3*time.Second, "per-probe timeout")
	var count int
	var interval, wait time.Duration
	ping := &cobra.Command{
		Use:  "ping addr",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			a, err := netip.ParseAddr(args[0])
			if err != nil {
				return err
			}
			sent, recv, err := probe.Ping(cmd.Context(), a, count, interval, wait, false)
			fmt.Printf("%d packets transmitted, %d received\n", sent, recv)
			if err == nil && recv < sent {
				return exitError{code: 1}
			}
			return err
		},
	}
	ping.Flags().IntVarP(&count, "count", "c", 1, "echo requests to send")
	ping.Flags().DurationVarP(&interval, "interval", "i", 200*time.Millisecond, "time between requests")
	ping.Flags().DurationVarP(&wait, "wait", "W", time.Second, "how long to wait for the last reply")
	var streamBytes int
	stream := &cobra.Command{
		Use:   "stream addr:port",
		Short: "write random bytes, check their echo, print the connection as JSON, hold it open until stdin closes",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			a, err := netip.ParseAddrPort(args[0])
			if err != nil {
				return err
			}
			if streamBytes < 1 || streamBytes > 64<<20 {
				return fmt.Errorf("--bytes %d: want 1..64 MiB", streamBytes)
			}
			return probe.Stream(cmd.Context(), a, streamBytes, timeout, os.Stdout, os.Stdin)
		},
	}
	stream.Flags().IntVar(&streamBytes, "bytes", 256<<10, "bytes to send and check")
	stream.Flags().DurationVar(&timeout, "timeout", 5*time.Second, "bound of the exchange")
	cmd.AddCommand(serve, probeCmd, ping, stream)
	return cmd
}

// printKubeProxyStatus prints the lab's Service implementation and each
// node's /healthz on kube-proxy's port: kube-proxy's with --kube-proxy,
// else the agent's (it answers there for the node's Service proxy).
func printKubeProxyStatus(ctx context.Context, w io.Writer, l *lab.Lab) {
	st := l.State()
	mode := l.KubeProxyMode()
	fmt.Fprintf(w, "kube-proxy: %s", mode)
	if st.DemoServices {
		fmt.Fprint(w, " (demo Services: ", strings.Join([]string{lab.DemoClusterIP, lab.DemoNodePort, lab.DemoExternalIP, lab.DemoLoadBalancer}, ", "), ")")
	}
	fmt.Fprintln(w)
	if mode == kubeproxy.None {
		for _, n := range st.Nodes {
			fmt.Fprintf(w, "  axon-agent/%-8s healthz on kube-proxy's port %s: %s\n", n.Name, kubeproxy.HealthzAddr, healthzLine(ctx, l, n.Name, "last updated"))
		}
		return
	}
	for _, n := range st.Nodes {
		state := "gone"
		if n.KubeProxy.Alive() {
			state = "running"
		}
		pid := 0
		if n.KubeProxy != nil {
			pid = n.KubeProxy.PID
		}
		health := healthzLine(ctx, l, n.Name, "last sync")
		syncs := ""
		if ts, err := l.KubeProxySyncTimes(n.Name); err == nil && len(ts) > 0 {
			syncs = fmt.Sprintf(", %d syncs logged, last took %s", len(ts), ts[len(ts)-1].Elapsed)
		}
		fmt.Fprintf(w, "  kube-proxy/%-8s pid %-8d %s; healthz: %s%s\n", n.Name, pid, state, health, syncs)
	}
}

// healthzLine is node's answer on kube-proxy's healthz port: the status and
// its lastUpdated, named last.
func healthzLine(ctx context.Context, l *lab.Lab, node, last string) string {
	hctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	h, err := l.KubeProxyHealthz(hctx, node)
	if err == nil && !h.LastUpdated.IsZero() {
		return h.Status + ", " + last + " " + h.LastUpdated.UTC().Format(time.RFC3339)
	}
	return h.Status
}

// serveForwarderAndEgress runs the node forwarders and the apiserver's egress CONNECT proxy
// until ctx ends or one of them fails.
func serveForwarderAndEgress(ctx context.Context, netns []string, listen, target, socket, dialNetns string, allowS []string, log *slog.Logger) error {
	var allow []netip.Prefix
	for _, a := range allowS {
		p, err := netip.ParsePrefix(a)
		if err != nil {
			return fmt.Errorf("_forward --connect-allow %q: %w", a, err)
		}
		allow = append(allow, p.Masked())
	}
	fwd, err := controlplane.ListenForwarder(netns, listen, target, log)
	if err != nil {
		return err
	}
	px, err := controlplane.ListenConnectProxy(socket, dialNetns, allow, log)
	if err != nil {
		fwd.Close()
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 2)
	go func() { errc <- fwd.Serve(ctx) }()
	go func() { errc <- px.Serve(ctx) }()
	err = <-errc
	cancel()
	return errors.Join(err, <-errc)
}
