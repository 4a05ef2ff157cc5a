package lab

// `axon lab check`, Service part: every demo Service type (ClusterIP,
// NodePort on every node address and on the node's loopback, externalIP,
// LoadBalancer ingress IP) over TCP and UDP, IPv4 and IPv6, from every pod
// and from every node. Node probes run in the node's cgroup, so that the
// node's socket load balancer sees them as the node's own processes.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/lab/kubeproxy"
	"github.com/axonhq/axon/internal/lab/probe"
)

// Service types the check reports on, in column order.
const (
	SvcTypeClusterIP    = "ClusterIP"
	SvcTypeNodePort     = "NodePort"
	SvcTypeExternalIP   = "ExternalIP"
	SvcTypeLoadBalancer = "LoadBalancer"
	SvcTypeHostPort     = "HostPort" // a Pod hostPort (check_external_hostport.go)
)

var svcTypes = []string{SvcTypeClusterIP, SvcTypeNodePort, SvcTypeExternalIP, SvcTypeLoadBalancer, SvcTypeHostPort}

// plannedProbe is one cell entry of the service check: a probe from source
// for a Service type, or the reason it is not applicable.
type plannedProbe struct {
	Source string
	Type   string
	Probe  probe.Service
	NA     string // not empty: not run, with the reason
}

// serviceImpl names what serves Services in the lab: "axon socket LB",
// "kube-proxy <mode>" or "" (nothing).
func serviceImpl(st *State) string {
	switch {
	case st.KubeProxy != "" && st.KubeProxy != kubeproxy.None:
		return "kube-proxy " + st.KubeProxy
	case st.Datapath == DatapathAxon:
		return "axon socket LB"
	}
	return ""
}

// planServiceProbes lists every probe of the service check (pure logic).
func planServiceProbes(st *State) []plannedProbe {
	impl := serviceImpl(st)
	var out []plannedProbe
	type source struct {
		name   string
		isNode bool
	}
	var sources []source
	for _, p := range st.Pods {
		sources = append(sources, source{p.Name, false})
	}
	for _, n := range st.Nodes {
		sources = append(sources, source{n.Name, true})
	}
	demo := map[string]DemoService{}
	for _, d := range DemoServices() {
		demo[d.Name] = d
	}
	for _, src := range sources {
		add := func(typ string, addr netip.Addr, port uint16, na string) {
			for _, proto := range []string{"tcp", "udp"} {
				if impl == "" {
					na = "no Service implementation: --datapath baseline runs no agent; add --kube-proxy iptables|nftables"
				}
				out = append(out, plannedProbe{Source: src.name, Type: typ, NA: na,
					Probe: probe.Service{Proto: proto, Addr: netip.AddrPortFrom(addr, port)}})
			}
		}
		for _, ip := range demo[DemoClusterIP].ClusterIPs {
			add(SvcTypeClusterIP, ip, DemoPort, "")
		}
		for _, n := range st.Nodes {
			for _, ip := range n.IPs {
				add(SvcTypeNodePort, ip, DemoNodePortPort, "")
			}
		}
		if src.isNode {
			for _, lo := range []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.IPv6Loopback()} {
				add(SvcTypeNodePort, lo, DemoNodePortPort, loopbackNodePortNA(st.KubeProxy, lo))
			}
		}
		for _, ip := range demo[DemoExternalIP].ExternalIPs {
			add(SvcTypeExternalIP, ip, DemoPort, "")
		}
		for _, ip := range demo[DemoLoadBalancer].LBIngress {
			add(SvcTypeLoadBalancer, ip, DemoPort, "")
		}
		for _, hp := range hostPortServiceTargets(st, src.name, src.isNode) { // demo hostPorts (check_external_hostport.go)
			add(SvcTypeHostPort, hp.addr, DemoHostPort, hp.na)
		}
	}
	return out
}

// loopbackNodePortNA says why kube-proxy cannot serve a NodePort on lo.
func loopbackNodePortNA(kubeProxy string, lo netip.Addr) string {
	switch {
	case kubeProxy == kubeproxy.NFTables:
		return "n/a (kube-proxy nftables does not serve NodePorts on loopback)"
	case kubeProxy == kubeproxy.IPTables && lo.Is6():
		return "n/a (kube-proxy iptables serves localhost NodePorts for IPv4 only)"
	}
	return ""
}

// ServiceCheckResult is the Service part of `axon lab check`.
type ServiceCheckResult struct {
	Impl    string // what serves Services: "axon socket LB", "kube-proxy nftables", ...
	Sources []string
	Types   []string
	Cells   map[[2]string][]probe.ServiceResult // (source, type) → results of probes that ran
	NA      map[[2]string][]plannedProbe        // (source, type) → probes not applicable
	// Explained says, for each failed probe to another node's NodePort or
	// HostPort, what that node's north-south LB does with such a flow
	// right after the check (explainFailures): a failure that does not
	// recur still shows whether the LB held the frontend.
	Explained []string
	Elapsed   time.Duration
}

// Failed returns the failed probes as "src → TYPE proto/addr: err" lines.
func (r *ServiceCheckResult) Failed() []string {
	return failedCells(r.Sources, r.Types, r.Cells, func(p probe.ServiceResult) bool { return !p.OK },
		func(s, t string, p probe.ServiceResult) string {
			return fmt.Sprintf("%s → %s %s: %s", s, t, p.Service, p.Err)
		})
}

// Counts returns (passed, ran, not applicable).
func (r *ServiceCheckResult) Counts() (ok, ran, na int) {
	ok, ran, _ = countCells(r.Cells, func(p probe.ServiceResult) outcome { return passedIf(p.OK) })
	_, _, na = countCells(r.NA, func(plannedProbe) outcome { return notApplicable })
	return ok, ran, na
}

// Print writes the per-type table, the failures, the n/a reasons and a summary.
func (r *ServiceCheckResult) Print(w io.Writer) {
	impl := r.Impl
	if impl == "" {
		impl = "nothing"
	}
	fmt.Fprintf(w, "Services (served by %s): TCP+UDP, IPv4+IPv6, port %d (NodePort %d) → pods:%d\n", impl, DemoPort, DemoNodePortPort, probe.EchoPort)
	printMatrix(w, "FROM \\ TYPE", r.Sources, r.Types, func(s, t string) string {
		return svcCellText(r.Cells[[2]string{s, t}], len(r.NA[[2]string{s, t}]))
	})
	for _, f := range r.Failed() {
		fmt.Fprintln(w, "FAIL", f)
	}
	for _, e := range r.Explained {
		fmt.Fprintln(w, "     ", e)
	}
	reasons := map[string][]string{}
	var order []string
	for _, s := range r.Sources {
		for _, t := range r.Types {
			for _, p := range r.NA[[2]string{s, t}] {
				key := t + " " + p.Probe.Addr.Addr().String() + ": " + p.NA
				if _, seen := reasons[key]; !seen {
					order = append(order, key)
				}
				reasons[key] = append(reasons[key], s)
			}
		}
	}
	for _, k := range order {
		fmt.Fprintf(w, "n/a  %s [%d probes]\n", k, len(reasons[k]))
	}
	ok, ran, na := r.Counts()
	fmt.Fprintf(w, "%d/%d service probes passed, %d n/a, in %s\n", ok, ran, na, r.Elapsed.Round(time.Millisecond))
}

func svcCellText(ps []probe.ServiceResult, na int) string {
	if len(ps) == 0 {
		if na > 0 {
			return "n/a"
		}
		return "?"
	}
	ok := 0
	for _, p := range ps {
		if p.OK {
			ok++
		}
	}
	s := fmt.Sprintf("ok %d/%d", ok, len(ps))
	if ok < len(ps) {
		s = fmt.Sprintf("FAIL %d/%d", ok, len(ps))
	}
	if na > 0 {
		s += fmt.Sprintf(" (+%d n/a)", na)
	}
	return s
}

// CheckServices probes every demo Service type from every pod and node.
// It returns an error only when the check itself could not run (no demo
// Services, echo servers that do not start); failed probes are in the result.
func (l *Lab) CheckServices(ctx context.Context, timeout time.Duration) (*ServiceCheckResult, error) {
	t0 := time.Now()
	st := l.State()
	if !st.DemoServices {
		return nil, errors.New("the lab has no demo Services: bring it up without --no-demo")
	}
	backends := demoBackends(&st)
	if len(backends) == 0 {
		return nil, errors.New("the demo Services have no backends: `axon lab up --pods-per-node 2`")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var names []string
	for _, p := range backends {
		names = append(names, p.Name)
	}
	stop, err := l.startServers(ctx, names, filepath.Join(l.State().BinDir, "axon"), "lab", "_echo", "serve", "--port", strconv.Itoa(probe.EchoPort))
	if err != nil {
		return nil, err
	}
	defer stop()

	res := &ServiceCheckResult{Impl: serviceImpl(&st), Types: svcTypes,
		Cells: map[[2]string][]probe.ServiceResult{}, NA: map[[2]string][]plannedProbe{}}
	bySource := map[string][]plannedProbe{}
	seen := map[string]bool{}
	for _, p := range planServiceProbes(&st) {
		if !seen[p.Source] {
			seen[p.Source] = true
			res.Sources = append(res.Sources, p.Source)
		}
		if p.NA != "" {
			key := [2]string{p.Source, p.Type}
			res.NA[key] = append(res.NA[key], p)
			continue
		}
		bySource[p.Source] = append(bySource[p.Source], p)
	}
	self := filepath.Join(st.BinDir, "axon")
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	errs := make([]error, len(res.Sources))
	for i, src := range res.Sources {
		args := []string{self, "lab", "_probe", "--timeout", timeout.String()}
		typeOf := map[probe.Service]string{}
		for _, p := range bySource[src] {
			if p.Type == "" {
				continue
			}
			typeOf[p.Probe] = p.Type
			args = append(args, p.Probe.String())
		}
		if len(typeOf) == 0 {
			continue
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			errs[i] = runProbes(l.CommandInCgroup(ctx, src, args...), "service probes in "+src, func(r probe.ServiceResult) {
				key := [2]string{src, typeOf[r.Service]}
				mu.Lock()
				res.Cells[key] = append(res.Cells[key], r)
				mu.Unlock()
			})
		})
	}
	wg.Wait()
	for _, ps := range res.Cells {
		sort.Slice(ps, func(i, j int) bool { return ps[i].Service.String() < ps[j].Service.String() })
	}
	if st.Datapath == DatapathAxon && (st.KubeProxy == "" || st.KubeProxy == kubeproxy.None) {
		res.Explained = explainFailures(ctx, &st, res)
	}
	res.Elapsed = time.Since(t0)
	return res, errors.Join(errs...)
}

// explainFailures asks, for every failed probe to another node's address
// (NodePort, HostPort: the source's own socket LB leaves those to the
// owning node), that node's north-south LB what it does now with a new
// flow from the source's address (GET /v1/lb/explain, as `axon lb explain`).
func explainFailures(ctx context.Context, st *State, res *ServiceCheckResult) []string {
	owner := map[netip.Addr]*Node{}
	for i := range st.Nodes {
		for _, ip := range st.Nodes[i].IPs {
			owner[ip] = &st.Nodes[i]
		}
	}
	var out []string
	for _, s := range res.Sources {
		var from []netip.Addr
		srcNode := ""
		if n, ok := st.Node(s); ok {
			from, srcNode = n.IPs, n.Name
		} else if p, ok := st.pod(s); ok {
			from, srcNode = p.IPs, p.Node
		}
		for _, t := range []string{SvcTypeNodePort, SvcTypeHostPort} {
			for _, p := range res.Cells[[2]string{s, t}] {
				dst := p.Service.Addr
				n := owner[dst.Addr()]
				if p.OK || n == nil || n.Name == srcNode {
					continue
				}
				i := slices.IndexFunc(from, func(a netip.Addr) bool { return a.Is4() == dst.Addr().Is4() })
				if i < 0 {
					continue
				}
				src := netip.AddrPortFrom(from[i], 40000)
				line := fmt.Sprintf("%s's north-south LB now, for %s %s → %s: ", n.Name, p.Service.Proto, src, dst)
				ectx, cancel := context.WithTimeout(ctx, 2*time.Second)
				rep, err := api.NewClient(n.Socket).Explain(ectx, p.Service.Proto, src.String(), dst.String())
				cancel()
				if err != nil {
					out = append(out, line+"explain failed: "+err.Error())
					continue
				}
				out = append(out, line+strings.Join(rep.Steps, "; "))
			}
		}
	}
	return out
}

// CommandInCgroup is Command, but a node's process also starts in the
// node's cgroup (<cgroup2>/axon-lab/<node>; --kubelet: the node's kubelet
// cgroup root, KubeletNodeCgroup), as the node's own processes (kubelet,
// host daemons) would be: the node's socket load balancer then translates
// its connections. Pods are in their pod cgroup either way; Command keeps
// node processes in the caller's cgroup.
func (l *Lab) CommandInCgroup(ctx context.Context, target string, argv ...string) *exec.Cmd {
	cmd := l.Command(ctx, target, argv...)
	st := l.State()
	if n, ok := st.Node(target); ok && cmd.Err == nil && cmd.SysProcAttr == nil {
		cg := n.Cgroup
		if st.Kubelet {
			var err error
			if cg, err = KubeletNodeCgroup(n.Name); err != nil {
				cmd.Err = err
				return cmd
			}
		}
		fd, err := syscall.Open(cg, syscall.O_DIRECTORY|syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
		if err != nil {
			cmd.Err = fmt.Errorf("open node cgroup %s: %w", cg, err)
			return cmd
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
		runtime.AddCleanup(cmd, func(fd int) { syscall.Close(fd) }, fd)
	}
	return cmd
}
