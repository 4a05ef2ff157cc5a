package lab

// The real kube-proxy as the lab's service baseline: one process per node,
// inside the node's network namespace, talking to the apiserver through the
// node's 127.0.0.1:<APIPort> forwarder.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/axonhq/axon/internal/lab/labns"
	"github.com/axonhq/axon/internal/proc"
)

// Modes of `axon lab up --kube-proxy`.
const (
	KubeProxyNone     = "none"     // no kube-proxy (default): axon's socket LB serves Services, or nothing does (baseline)
	KubeProxyIPTables = "iptables" // kube-proxy --proxy-mode=iptables (iptables-nft here)
	KubeProxyNFTables = "nftables" // kube-proxy --proxy-mode=nftables
)

// KubeProxyModes lists the accepted --kube-proxy values.
var KubeProxyModes = []string{KubeProxyNone, KubeProxyIPTables, KubeProxyNFTables}

// Addresses kube-proxy is told about (docs/contracts.md "Lab topology").
const (
	// ServiceCIDRs is the apiserver's --service-cluster-ip-range (dual-stack).
	ServiceCIDRs = "10.96.0.0/16,fd00:10:96::/112"
	// clusterCIDRs covers the axon (10.244/16, fd00:10:244::/48) and the
	// baseline (10.245/16, fd00:10:245::/48) pod ranges in one prefix per family.
	clusterCIDRs = "10.244.0.0/15,fd00:10:244::/47"
	// kube-proxy's health and metrics servers, on the node netns' loopback.
	kubeProxyHealthzAddr = "127.0.0.1:10256"
	KubeProxyMetricsAddr = "127.0.0.1:10249" // also read by the Service benchmark
)

func validKubeProxyMode(m string) bool {
	for _, k := range KubeProxyModes {
		if m == k {
			return true
		}
	}
	return false
}

// kubeProxyTools are the binaries kube-proxy execs in each mode.
func kubeProxyTools(mode string) []string {
	switch mode {
	case KubeProxyIPTables:
		return []string{"iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore"}
	case KubeProxyNFTables:
		return []string{"nft"}
	}
	return nil
}

// kubeProxyArgs is KubeProxyArgs for node n.
func kubeProxyArgs(bin, mode, kubeconfig string, n Node, masqueradeAll bool) []string {
	return KubeProxyArgs(bin, mode, kubeconfig, n.Name, masqueradeAll)
}

// KubeProxyArgs is kube-proxy's command line (binary first) for the node
// named node; the lab and the Service benchmark (internal/bench) both run
// kube-proxy with it, so the two cannot drift. Conntrack flags are
// all "leave as is": nf_conntrack_max and the hash size are machine-wide
// (root netns / module parameters), which the lab never changes. What
// kube-proxy still writes (route_localnet in iptables mode, its own
// oom_score_adj) is per network namespace or per process.
func KubeProxyArgs(bin, mode, kubeconfig, node string, masqueradeAll bool) []string {
	args := []string{
		bin,
		"--proxy-mode=" + mode,
		"--kubeconfig=" + kubeconfig,
		"--hostname-override=" + node,
		"--cluster-cidr=" + clusterCIDRs,
		"--detect-local-mode=ClusterCIDR",
		"--healthz-bind-address=" + kubeProxyHealthzAddr,
		"--metrics-bind-address=" + KubeProxyMetricsAddr,
		"--conntrack-max-per-core=0",
		"--conntrack-min=0",
		"--conntrack-tcp-timeout-established=0",
		"--conntrack-tcp-timeout-close-wait=0",
		"--conntrack-udp-timeout=0",
		"--conntrack-udp-timeout-stream=0",
		"--oom-score-adj=0",
		"--v=2", // logs "SyncProxyRules complete" elapsed=... (KubeProxySyncTimes)
	}
	if masqueradeAll {
		// axon pods: replies from a local backend go pod-to-pod through
		// bpf_redirect_peer and would skip the conntrack entry that undoes
		// the DNAT. SNAT to the node makes every reply cross the stack.
		args = append(args, "--masquerade-all")
	}
	return args
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
	argv := append([]string{nsenter, "--net=" + labns.Path(n.Netns), "--"},
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

// KubeProxyHealth is kube-proxy's /healthz answer inside a node netns.
type KubeProxyHealth struct {
	OK          bool      // HTTP 200
	Status      string    // HTTP status line or the error
	LastUpdated time.Time // last successful sync
}

// KubeProxyHealthz asks the kube-proxy of node for /healthz (127.0.0.1:10256 in the node netns).
func (l *Lab) KubeProxyHealthz(ctx context.Context, node string) (KubeProxyHealth, error) {
	st := l.State()
	n, ok := st.node(node)
	if !ok {
		return KubeProxyHealth{}, fmt.Errorf("no node %q in the lab (have %s)", node, l.nodeNames())
	}
	return kubeProxyHealthz(ctx, n.Netns)
}

func kubeProxyHealthz(ctx context.Context, nsName string) (KubeProxyHealth, error) {
	body, status, err := httpGetInNetns(ctx, nsName, kubeProxyHealthzAddr, "/healthz")
	if err != nil {
		return KubeProxyHealth{Status: err.Error()}, err
	}
	h := KubeProxyHealth{Status: status, OK: strings.HasPrefix(status, "200 ")}
	var j struct {
		LastUpdated string `json:"lastUpdated"`
	}
	if json.Unmarshal(body, &j) == nil {
		h.LastUpdated, _ = time.Parse(time.RFC3339Nano, j.LastUpdated)
	}
	return h, nil
}

// httpGetInNetns is HTTPGetInNetns in the lab netns nsName, 3s at most.
func httpGetInNetns(ctx context.Context, nsName, addr, path string) (body []byte, status string, err error) {
	return HTTPGetInNetns(ctx, labns.Path(nsName), addr, path, 3*time.Second)
}

// HTTPGetInNetns does a plain HTTP/1.0 GET of addr+path with a socket
// created inside the netns at nsPath (sockets keep the netns they were made
// in), within timeout or ctx's deadline if sooner. status is the status line
// without the protocol ("200 OK"); the body is read up to 16 MiB. The lab and
// the Service benchmark read kube-proxy's /healthz and /metrics with it.
func HTTPGetInNetns(ctx context.Context, nsPath, addr, path string, timeout time.Duration) (body []byte, status string, err error) {
	var c net.Conn
	if err := labns.DoAt(nsPath, func() (err error) {
		d := net.Dialer{Timeout: 2 * time.Second}
		c, err = d.DialContext(ctx, "tcp", addr)
		return err
	}); err != nil {
		if ctx.Err() != nil {
			return nil, "", ctx.Err()
		}
		return nil, "", err
	}
	defer c.Close()
	dl := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(dl) {
		dl = d
	}
	_ = c.SetDeadline(dl)
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n", path, addr); err != nil {
		return nil, "", err
	}
	br := bufio.NewReader(c)
	status, err = br.ReadString('\n')
	if err != nil {
		return nil, "", fmt.Errorf("read %s%s: %w", addr, path, err)
	}
	status = strings.TrimSpace(status)
	if _, code, ok := strings.Cut(status, " "); ok { // "HTTP/1.0 200 OK" → "200 OK"
		status = code
	}
	for { // headers
		line, err := br.ReadString('\n')
		if err != nil {
			return nil, status, err
		}
		if strings.TrimSpace(line) == "" {
			break
		}
	}
	body, _ = io.ReadAll(io.LimitReader(br, 16<<20)) // /metrics is a few hundred KiB
	return body, status, nil
}

// waitKubeProxies waits until every node's kube-proxy answers /healthz with 200.
func waitKubeProxies(ctx context.Context, st *State, timeout time.Duration) error {
	return pollKubeProxies(ctx, st, timeout, func(ctx context.Context, n Node) string {
		h, err := kubeProxyHealthz(ctx, n.Netns)
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

// SyncTime is one "SyncProxyRules complete" line of a kube-proxy log.
type SyncTime struct {
	At      time.Time     // when kube-proxy logged it (klog has no year: the log file's year)
	Family  string        // "IPv4" or "IPv6" (one proxier per family in dual-stack)
	Elapsed time.Duration // kube-proxy's own measurement of the sync
}

// klog text: I1122 06:50:00.123456 1234 proxier.go:812] "SyncProxyRules complete" ipFamily="IPv4" elapsed="3.45ms"
var (
	klogHeader  = regexp.MustCompile(`^[IWEF](\d{4} \d{2}:\d{2}:\d{2}\.\d{6})`)
	syncFamily  = regexp.MustCompile(`ipFamily="(IPv[46])"`)
	syncElapsed = regexp.MustCompile(`elapsed="([^"]+)"`)
)

// ParseKubeProxySyncTimes reads every "SyncProxyRules complete" line of a
// kube-proxy (-v=2, text format) log; year is the year to give the timestamps.
func ParseKubeProxySyncTimes(r io.Reader, year int) ([]SyncTime, error) {
	var out []SyncTime
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, `"SyncProxyRules complete"`) {
			continue
		}
		h := klogHeader.FindStringSubmatch(line)
		e := syncElapsed.FindStringSubmatch(line)
		if h == nil || e == nil {
			continue
		}
		at, err := time.Parse("0102 15:04:05.000000", h[1])
		if err != nil {
			continue
		}
		d, err := time.ParseDuration(e[1])
		if err != nil {
			continue
		}
		s := SyncTime{At: at.AddDate(year, 0, 0), Elapsed: d}
		if f := syncFamily.FindStringSubmatch(line); f != nil {
			s.Family = f[1]
		}
		out = append(out, s)
	}
	return out, sc.Err()
}

// KubeProxySyncTimes returns the sync timings kube-proxy logged on node,
// oldest first. It fails when the node runs no kube-proxy.
func (l *Lab) KubeProxySyncTimes(node string) ([]SyncTime, error) {
	st := l.State()
	n, ok := st.node(node)
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
	return ParseKubeProxySyncTimes(f, year)
}

// KubeProxyMode is the lab's --kube-proxy mode ("none" when unset).
func (l *Lab) KubeProxyMode() string {
	if m := l.State().KubeProxy; m != "" {
		return m
	}
	return KubeProxyNone
}

// kubeProxyModeOf is the recorded mode of a lab ("none" for labs before --kube-proxy).
func kubeProxyModeOf(st *State) string {
	if st.KubeProxy == "" {
		return KubeProxyNone
	}
	return st.KubeProxy
}

// upKubeProxies starts kube-proxy on every node (when the lab has a mode),
// records the PIDs and waits until each answers /healthz.
func upKubeProxies(ctx context.Context, st *State, save func() error) error {
	if kubeProxyModeOf(st) == KubeProxyNone {
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
// (kubeProxyArgs).
func agentExtraArgs(st *State) []string {
	if kubeProxyModeOf(st) != KubeProxyNone {
		return []string{"--socket-lb=false", "--nodeport=false", "--host-routing=legacy"}
	}
	return nil
}

// addServiceRoutes gives node n on-link routes to the service CIDRs via its
// uplink. A real node reaches ClusterIPs through its default route: the
// socket's route lookup happens before kube-proxy's DNAT in OUTPUT, so
// without a route a node process gets ENETUNREACH. (The socket load
// balancer translates before any route lookup and does not need it.)
func addServiceRoutes(n Node) error {
	var routes []netlink.Route
	for _, c := range strings.Split(ServiceCIDRs, ",") {
		dst, err := netip.ParsePrefix(c)
		if err != nil {
			return fmt.Errorf("service CIDR %q: %w", c, err)
		}
		routes = append(routes, netlink.Route{Dst: prefixToIPNet(dst), Scope: netlink.SCOPE_LINK})
	}
	return replaceEth0Routes(n.Netns, routes)
}
