package lab

// The real kube-proxy as the lab's service baseline: one process per node,
// inside the node's network namespace, talking to the apiserver through the
// node's 127.0.0.1:<APIPort> forwarder.

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/axonhq/axon/internal/lab/kubeproxy"
	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/proc"
)

// kubeProxyArgs is kubeproxy.Args for node n.
func kubeProxyArgs(bin, mode, kubeconfig string, n Node, masqueradeAll bool) []string {
	return kubeproxy.Args(bin, mode, kubeconfig, n.Name, kubeproxy.OwnPorts, masqueradeAll)
}

// startKubeProxy starts kube-proxy for node n (detached, PID recorded by the caller).
func startKubeProxy(st *State, n Node) (*Proc, error) {
	bin, err := DepPath("kube-proxy")
	if err != nil {
		return nil, err
	}
	nsenter, err := exec.LookPath("nsenter")
	if err != nil {
		return nil, fmt.Errorf("nsenter not found: install util-linux: %w", err)
	}
	argv := append([]string{nsenter, "--net=" + netnsutil.Path(n.Netns), "--"},
		kubeProxyArgs(bin, st.KubeProxy, st.ControlPlane.Kubeconfig, n, st.Datapath == DatapathAxon)...)
	p, _, err := proc.Start(proc.Spec{
		// TZ=UTC: klog stamps its lines in local time without a zone; KubeProxySyncTimes reads them as UTC.
		Argv: argv, Env: append(os.Environ(), "TZ=UTC"), Log: kubeProxyLog(st, n.Name),
		Banner: fmt.Sprintf("--- %s %s\n", time.Now().UTC().Format(time.RFC3339), strings.Join(argv, " ")),
	})
	if err != nil {
		return nil, fmt.Errorf("start kube-proxy on %s: %w", n.Name, err)
	}
	return &p, nil
}

func kubeProxyLog(st *State, node string) string {
	return filepath.Join(st.StateDir, "nodes", node, "kube-proxy.log")
}

// KubeProxyHealthz asks the kube-proxy of node for /healthz (127.0.0.1:10256 in the node netns;
// without --kube-proxy the node's agent answers there).
func (l *Lab) KubeProxyHealthz(ctx context.Context, node string) (kubeproxy.Health, error) {
	st := l.State()
	n, ok := st.Node(node)
	if !ok {
		return kubeproxy.Health{}, fmt.Errorf("no node %q in the lab (have %s)", node, l.nodeNames())
	}
	return kubeproxy.Healthz(ctx, n.Netns)
}

// waitKubeProxies waits until every node's kube-proxy answers /healthz with 200.
func waitKubeProxies(ctx context.Context, st *State, timeout time.Duration) error {
	return pollKubeProxies(ctx, st, timeout, func(ctx context.Context, n Node) string {
		h, err := kubeproxy.Healthz(ctx, n.Netns)
		switch {
		case err != nil:
			return err.Error()
		case !h.OK:
			return h.Status
		}
		return ""
	}, func(n Node, why string, exited bool) error {
		if exited {
			return fmt.Errorf("kube-proxy on %s exited (%s); see %s:\n%s", n.Name, why, n.KubeProxy.Log, logTail(n.KubeProxy.Log, 15))
		}
		return fmt.Errorf("kube-proxy on %s not healthy after %s: %s; see %s:\n%s", n.Name, timeout, why, n.KubeProxy.Log, logTail(n.KubeProxy.Log, 15))
	})
}

// pollKubeProxies runs check for every node's kube-proxy every 100 ms until
// it says "" (done), the kube-proxy exits or timeout; fail turns the last
// reason into the node's error.
func pollKubeProxies(ctx context.Context, st *State, timeout time.Duration,
	check func(context.Context, Node) (why string), fail func(n Node, why string, exited bool) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	errs := make([]error, len(st.Nodes))
	var wg sync.WaitGroup
	for i, n := range st.Nodes {
		if n.KubeProxy == nil {
			continue
		}
		wg.Go(func() {
			for {
				why := check(ctx, n)
				if why == "" {
					return
				}
				if !n.KubeProxy.Alive() {
					errs[i] = fail(n, why, true)
					return
				}
				select {
				case <-ctx.Done():
					errs[i] = fail(n, why, false)
					return
				case <-time.After(100 * time.Millisecond):
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// KubeProxySyncTimes returns the sync timings kube-proxy logged on node,
// oldest first. It fails when the node runs no kube-proxy.
func (l *Lab) KubeProxySyncTimes(node string) ([]kubeproxy.SyncTime, error) {
	st := l.State()
	n, ok := st.Node(node)
	if !ok {
		return nil, fmt.Errorf("no node %q in the lab (have %s)", node, l.nodeNames())
	}
	if n.KubeProxy == nil {
		return nil, fmt.Errorf("node %s runs no kube-proxy: bring the lab up with --kube-proxy iptables|nftables", node)
	}
	f, err := os.Open(n.KubeProxy.Log)
	if err != nil {
		return nil, fmt.Errorf("kube-proxy log of %s: %w", node, err)
	}
	defer f.Close()
	year := time.Now().UTC().Year()
	if fi, err := f.Stat(); err == nil {
		year = fi.ModTime().UTC().Year()
	}
	return kubeproxy.ParseSyncTimes(f, year)
}

// KubeProxyMode is the lab's --kube-proxy mode ("none" when unset).
func (l *Lab) KubeProxyMode() string {
	if m := l.State().KubeProxy; m != "" {
		return m
	}
	return kubeproxy.None
}

// kubeProxyModeOf is the recorded mode of a lab ("none" for labs before --kube-proxy).
func kubeProxyModeOf(st *State) string {
	if st.KubeProxy == "" {
		return kubeproxy.None
	}
	return st.KubeProxy
}

// upKubeProxies starts kube-proxy on every node (when the lab has a mode),
// records the PIDs and waits until each answers /healthz.
func upKubeProxies(ctx context.Context, st *State, save func() error) error {
	if kubeProxyModeOf(st) == kubeproxy.None {
		return nil
	}
	for i := range st.Nodes {
		n := &st.Nodes[i]
		p, err := startKubeProxy(st, *n)
		if err != nil {
			_ = save()
			return err
		}
		n.KubeProxy = p
	}
	if err := save(); err != nil {
		return err
	}
	return waitKubeProxies(ctx, st, 60*time.Second)
}

// agentExtraArgs are the agent flags the lab's kube-proxy mode implies.
// With kube-proxy, kube-proxy is the Service implementation, so the agents
// load neither their socket load balancer nor their NodePort load balancer,
// and route non-local pod traffic through the kernel (legacy host routing):
// bpf_fib_lookup + redirect out of the uplink would skip the node's
// netfilter, i.e. kube-proxy's DNAT of ClusterIPs, externalIPs and
// LoadBalancer IPs (the same reason Cilium needs kube-proxy replacement for
// BPF host routing). kube-proxy runs with --masquerade-all for the replies
// (kubeProxyArgs). Without kube-proxy, the agent answers on kube-proxy's
// healthz and metrics ports in its node netns, where tools (and the
// upstream conformance suite) look for the node's Service proxy.
func agentExtraArgs(st *State) []string {
	if kubeProxyModeOf(st) != kubeproxy.None {
		return []string{"--socket-lb=false", "--nodeport=false", "--host-routing=legacy"}
	}
	return []string{"--kube-proxy-healthz-addr=" + kubeproxy.HealthzAddr, "--kube-proxy-metrics-addr=" + kubeproxy.MetricsAddr}
}

// addServiceRoutes gives node n on-link routes to the service CIDRs via its
// uplink. A real node reaches ClusterIPs through its default route: the
// socket's route lookup happens before kube-proxy's DNAT in OUTPUT, so
// without a route a node process gets ENETUNREACH. (The socket load
// balancer translates before any route lookup and does not need it.)
func addServiceRoutes(n Node) error {
	var routes []netlink.Route
	for _, c := range strings.Split(kubeproxy.ServiceCIDRs, ",") {
		dst, err := netip.ParsePrefix(c)
		if err != nil {
			return fmt.Errorf("service CIDR %q: %w", c, err)
		}
		routes = append(routes, netlink.Route{Dst: prefixToIPNet(dst), Scope: netlink.SCOPE_LINK})
	}
	return replaceEth0Routes(n.Netns, routes)
}

// waitKubeProxyRules waits until every node's kube-proxy has wants in its
// rules. It is a no-op without --kube-proxy.
func waitKubeProxyRules(ctx context.Context, st *State, wants []kubeproxy.Want, timeout time.Duration) error {
	mode := kubeProxyModeOf(st)
	if mode == kubeproxy.None {
		return nil
	}
	return pollKubeProxies(ctx, st, timeout, func(ctx context.Context, n Node) string {
		why, err := kubeproxy.Lacks(ctx, n.Netns, mode, wants)
		if err != nil {
			return err.Error()
		}
		return why
	}, func(n Node, why string, exited bool) error {
		if exited {
			return fmt.Errorf("kube-proxy on %s exited before it programmed the demo Services (%s); see %s", n.Name, why, n.KubeProxy.Log)
		}
		return fmt.Errorf("kube-proxy on %s has not programmed the demo Services within %s: %s (log %s)", n.Name, timeout, why, n.KubeProxy.Log)
	})
}
