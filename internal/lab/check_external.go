package lab

// `axon lab check --external`: the north-south checks. A client
// outside the cluster (the axonlab-external namespace on the wire,
// 198.18.0.250) reaches every Service type that is meant for it: NodePort on
// every node address, LoadBalancer ingress IPs and externalIPs, TCP and UDP,
// IPv4 and IPv6, with backends local and remote to the entry node, and
// externalTrafficPolicy Local (client address preserved at the backend, no
// service on nodes without a local backend, health check node port 200/503).
//
// How the wire reaches LoadBalancer and externalIP addresses: nobody owns
// them, so an on-link ARP/ND for them goes unanswered. A real cluster has a
// BGP or L2 announcer (MetalLB, kube-vip, Cilium's BGP/L2 announcements); the
// lab has a fixed one: the external namespace gets static /32 and /128 routes
// to every demo LoadBalancer/externalIP address via the FIRST node
// (LBAnnouncer), added by `up` and re-added (idempotently) by the check.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/datapath/nodeport"
	"github.com/axonhq/axon/internal/ethtool"
	"github.com/axonhq/axon/internal/lab/kubeproxy"
	"github.com/axonhq/axon/internal/lab/probe"
	"github.com/axonhq/axon/internal/netnsutil"
)

// External demo Services (created by `up` next to the demo Services). Both
// are backed by the pods of the FIRST node only, on PeerEchoPort, so that
// every other node is an entry node without a local backend.
const (
	// DemoPinned: NodePort, externalTrafficPolicy Cluster: on the first node
	// the backends are local, on every other node remote.
	DemoPinned         = "demo-pinned"
	DemoPinnedNodePort = 30083
	// DemoLocal: LoadBalancer (ingress 198.18.0.201, fd00:198:18::201) with
	// externalTrafficPolicy Local, NodePort 30081, healthCheckNodePort 30082.
	DemoLocal           = "demo-local"
	DemoLocalNodePort   = 30081
	DemoLocalHealthPort = 30082
)

// DemoLocalIngress are the LoadBalancer ingress IPs of demo-local.
func DemoLocalIngress() []netip.Addr {
	return []netip.Addr{netip.MustParseAddr("198.18.0.201"), netip.MustParseAddr("fd00:198:18::201")}
}

// LBAnnouncer is the node the external client routes LoadBalancer and
// externalIP addresses to (the lab's stand-in for a BGP/L2 announcer).
func LBAnnouncer(st *State) Node { return st.Nodes[0] }

// announcedAddrs are the addresses routed via the announcer.
func announcedAddrs() []netip.Addr {
	var out []netip.Addr
	for _, d := range DemoServices() {
		out = append(out, d.ExternalIPs...)
		out = append(out, d.LBIngress...)
	}
	return append(out, DemoLocalIngress()...)
}

// addExternalRoutes routes the announced addresses from the external
// namespace via the announcer node (idempotent: RouteReplace).
func addExternalRoutes(st *State) error {
	if len(st.Nodes) == 0 {
		return nil
	}
	ann := LBAnnouncer(st)
	var routes []netlink.Route
	for _, a := range announcedAddrs() {
		var gw netip.Addr
		for _, ip := range ann.IPs {
			if ip.Is4() == a.Is4() {
				gw = ip
			}
		}
		if !gw.IsValid() {
			continue
		}
		routes = append(routes, netlink.Route{Dst: prefixToIPNet(netip.PrefixFrom(a, a.BitLen())), Gw: net.IP(gw.AsSlice())})
	}
	return replaceEth0Routes(st.External.Netns, routes)
}

// externalDemoObjects builds demo-pinned and demo-local (pure logic).
func externalDemoObjects() []*corev1.Service {
	dual := corev1.IPFamilyPolicyRequireDualStack
	local := corev1.ServiceExternalTrafficPolicyLocal
	mk := func(name string, typ corev1.ServiceType, nodePort int32) *corev1.Service {
		s := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: DemoNamespace,
				Labels: map[string]string{"app.kubernetes.io/managed-by": demoManagedBy, "axon.dev/demo": "true"}},
			Spec: corev1.ServiceSpec{Type: typ, IPFamilyPolicy: &dual,
				IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}},
		}
		for _, proto := range []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP} {
			s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: portName(proto), Protocol: proto,
				Port: DemoPort, TargetPort: intstr.FromInt32(probe.PeerEchoPort), NodePort: nodePort})
		}
		return s
	}
	pinned := mk(DemoPinned, corev1.ServiceTypeNodePort, DemoPinnedNodePort)
	lbs := mk(DemoLocal, corev1.ServiceTypeLoadBalancer, DemoLocalNodePort)
	lbs.Spec.ExternalTrafficPolicy = local
	lbs.Spec.HealthCheckNodePort = DemoLocalHealthPort
	return []*corev1.Service{pinned, lbs}
}

// externalDemoBackends are the pods behind demo-pinned and demo-local: the
// first node's pods of the lab's datapath.
func externalDemoBackends(st *State) []Pod {
	if len(st.Nodes) == 0 {
		return nil
	}
	var out []Pod
	for _, p := range demoBackends(st) {
		if p.Node == st.Nodes[0].Name {
			out = append(out, p)
		}
	}
	return out
}

// EnsureExternalDemoServices creates demo-pinned and demo-local, their
// EndpointSlices (first node's pods, PeerEchoPort) and demo-local's
// LoadBalancer status, and routes the announced addresses from the external
// namespace via the announcer. Idempotent.
func (l *Lab) EnsureExternalDemoServices(ctx context.Context) error {
	kube, err := l.Kube()
	if err != nil {
		return err
	}
	st := l.State()
	return ensureExternalDemo(ctx, kube, &st)
}

func ensureExternalDemo(ctx context.Context, kube kubernetes.Interface, st *State) error {
	if err := addExternalRoutes(st); err != nil {
		return err
	}
	backends := externalDemoBackends(st)
	svcs := kube.CoreV1().Services(DemoNamespace)
	for _, want := range externalDemoObjects() {
		cur, err := svcs.Get(ctx, want.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			if cur, err = svcs.Create(ctx, want, metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("create demo service %s: %w", want.Name, err)
			}
		case err != nil:
			return fmt.Errorf("get demo service %s: %w", want.Name, err)
		}
		if want.Name == DemoLocal {
			ing := lbIngress(DemoLocalIngress())
			if fmt.Sprint(cur.Status.LoadBalancer.Ingress) != fmt.Sprint(ing) {
				cur.Status.LoadBalancer.Ingress = ing
				if _, err := svcs.UpdateStatus(ctx, cur, metav1.UpdateOptions{}); err != nil {
					return fmt.Errorf("set status.loadBalancer.ingress of %s: %w", want.Name, err)
				}
			}
		}
		for _, s := range externalDemoSlices(want.Name, backends) {
			if err := ensureEndpointSlice(ctx, kube, s); err != nil {
				return err
			}
		}
	}
	return nil
}

// externalDemoSlices are the EndpointSlices of the external demo Service
// name: the backends on PeerEchoPort.
func externalDemoSlices(name string, backends []Pod) []*discoveryv1.EndpointSlice {
	slices := DemoService{Name: name}.endpointSlices(backends)
	for _, s := range slices {
		for i := range s.Ports {
			p := int32(probe.PeerEchoPort)
			s.Ports[i].Port = &p
		}
	}
	return slices
}

// externalDemoKubeProxyWants is what the external demo Services ask of
// every kube-proxy.
func externalDemoKubeProxyWants(st *State) []kubeproxy.Want {
	var out []kubeproxy.Want
	backends := externalDemoBackends(st)
	for _, svc := range externalDemoObjects() {
		if svc.Name == DemoLocal {
			svc.Status.LoadBalancer.Ingress = lbIngress(DemoLocalIngress())
		}
		out = append(out, kubeproxy.Wants(svc, externalDemoSlices(svc.Name, backends))...)
	}
	return out
}

// ---------------------------------------------------------------------------
// Peer-echo server and external prober (hidden `axon lab _xprobe`).

// ---------------------------------------------------------------------------
// Planning and evaluation (pure logic).

// What an external probe expects.
const (
	ExpectOK       = "ok"        // the exchange completes
	ExpectClientIP = "client-ip" // ... and the backend saw the external client's own address
	ExpectBlocked  = "blocked"   // no answer (dropped or refused)
	ExpectHealthy  = "200"       // health check: 200 with localEndpoints > 0
	ExpectNoLocal  = "503"       // health check: 503
)

// ExtPlanned is one planned probe of the external check.
type ExtPlanned struct {
	Case   string // row, e.g. "NodePort node1 (demo-nodeport)"
	Col    string // column: tcp/v4, tcp/v6, udp/v4, udp/v6, http/v4, http/v6
	Probe  probe.External
	Expect string
	NA     string // not empty: not run, with the reason
}

func famCol(proto string, a netip.Addr) string {
	if a.Is4() {
		return proto + "/v4"
	}
	return proto + "/v6"
}

// externalImpl says what serves north-south traffic in the lab, or why
// nothing does (na != "").
func externalImpl(st *State, nodeport map[string]string) (impl, na string) {
	switch {
	case st.KubeProxy != "" && st.KubeProxy != kubeproxy.None:
		return "kube-proxy " + st.KubeProxy, ""
	case st.Datapath != DatapathAxon:
		return "", "no Service implementation: --datapath baseline runs no agent; add --kube-proxy iptables|nftables"
	}
	var bad []string
	var modes []string
	for _, n := range st.Nodes {
		v, ok := nodeport[n.Name]
		switch {
		case !ok:
			bad = append(bad, n.Name+": agent status unavailable")
		case v == "" || strings.HasPrefix(v, "disabled") || strings.HasPrefix(v, "pending") || strings.HasPrefix(v, "failed"):
			bad = append(bad, n.Name+": nodeport_lb "+orDash(v))
		default:
			modes = append(modes, strings.Fields(v)[0])
		}
	}
	if len(bad) > 0 {
		return "", "the axon north-south LB is not attached (" + strings.Join(bad, "; ") + "): start the agents with --nodeport"
	}
	sort.Strings(modes)
	return "axon north-south LB (" + strings.Join(compactStrings(modes), ",") + ")", ""
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func compactStrings(s []string) []string {
	var out []string
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	return out
}

// planExternalProbes lists every probe of the external check.
func planExternalProbes(st *State, na string) []ExtPlanned {
	var out []ExtPlanned
	masqAll := st.Datapath == DatapathAxon && kubeProxyModeOf(st) != kubeproxy.None
	add := func(c, proto string, a netip.Addr, port uint16, expect, why string) {
		if masqAll && expect == ExpectClientIP {
			why = masqueradeAllNA
		}
		if na != "" {
			why = na
		}
		out = append(out, ExtPlanned{Case: c, Col: famCol(proto, a), Probe: probe.External{Proto: proto, Addr: netip.AddrPortFrom(a, port)},
			Expect: expect, NA: why})
	}
	both := func(c string, a netip.Addr, port uint16, expect, why string) {
		add(c, "tcp", a, port, expect, why)
		add(c, "udp", a, port, expect, why)
	}
	demo := map[string]DemoService{}
	for _, d := range DemoServices() {
		demo[d.Name] = d
	}
	if len(st.Nodes) == 0 {
		return nil
	}
	first := st.Nodes[0].Name
	for _, n := range st.Nodes {
		for _, ip := range n.IPs {
			both("NodePort "+n.Name+" (all pods)", ip, DemoNodePortPort, ExpectOK, "")
		}
	}
	dsr := st.NodePortMode == "dsr" && st.Datapath == DatapathAxon && kubeProxyModeOf(st) == kubeproxy.None
	for _, n := range st.Nodes {
		where, expect := "remote backends", ExpectOK
		if n.Name == first {
			where = "local backends"
		} else if dsr {
			// DSR: the backend sees the client itself and answers it directly
			where, expect = "remote backends, DSR: client IP kept", ExpectClientIP
		}
		for _, ip := range n.IPs {
			both(fmt.Sprintf("NodePort %s (%s pods: %s)", n.Name, first, where), ip, DemoPinnedNodePort, expect, "")
		}
	}
	ann := LBAnnouncer(st).Name
	for _, ip := range demo[DemoLoadBalancer].LBIngress {
		both("LoadBalancer IP via "+ann, ip, DemoPort, ExpectOK, "")
	}
	for _, ip := range demo[DemoExternalIP].ExternalIPs {
		both("externalIP via "+ann, ip, DemoPort, ExpectOK, "")
	}
	for _, n := range st.Nodes {
		expect, hc, what := ExpectClientIP, ExpectHealthy, "local backends: client IP kept"
		if n.Name != first {
			expect, hc, what = ExpectBlocked, ExpectNoLocal, "no local backend: not served"
		}
		for _, ip := range n.IPs {
			both(fmt.Sprintf("ETP Local NodePort %s (%s)", n.Name, what), ip, DemoLocalNodePort, expect, "")
		}
		for _, ip := range n.IPs {
			add(fmt.Sprintf("ETP Local health check %s (want %s)", n.Name, hc), "http", ip, DemoLocalHealthPort, hc, "")
		}
	}
	for _, ip := range DemoLocalIngress() {
		both("ETP Local LoadBalancer IP via "+ann+" (client IP kept)", ip, DemoPort, ExpectClientIP, "")
	}
	planHostPortExternal(st, both) // check_external_hostport.go
	return out
}

// masqueradeAllNA: in an axon-datapath lab kube-proxy runs with
// --masquerade-all (docs/lab.md), so no client address survives.
const masqueradeAllNA = "n/a (kube-proxy runs with --masquerade-all next to the axon datapath: the client address is not preserved)"

// evalExternal decides whether a result meets its expectation; "" = pass.
func evalExternal(p ExtPlanned, r probe.ExternalResult, client []netip.Addr) string {
	switch p.Expect {
	case ExpectOK:
		if !r.OK {
			return r.Err
		}
	case ExpectClientIP:
		if !r.OK {
			return r.Err
		}
		seen, err := netip.ParseAddrPort(r.Seen)
		if err != nil {
			return fmt.Sprintf("the backend did not report the client address (answer from a plain echo?): %q", r.Seen)
		}
		for _, c := range client {
			if seen.Addr() == c {
				return ""
			}
		}
		return fmt.Sprintf("the backend saw %s, not the client's address (externalTrafficPolicy Local must keep it)", seen.Addr())
	case ExpectBlocked:
		if r.OK {
			return fmt.Sprintf("answered (backend %s saw %s) although the node has no local backend", orDash(r.Server), orDash(r.Seen))
		}
	case ExpectHealthy, ExpectNoLocal:
		if !r.OK {
			return r.Err
		}
		want, _ := strconv.Atoi(p.Expect)
		if r.Status != want {
			return fmt.Sprintf("status %d, want %d (body %s)", r.Status, want, r.Body)
		}
		var body struct {
			LocalEndpoints int `json:"localEndpoints"`
		}
		if err := json.Unmarshal([]byte(r.Body), &body); err != nil {
			return fmt.Sprintf("body %q is not the kube-proxy health JSON: %v", r.Body, err)
		}
		if (want == 200) != (body.LocalEndpoints > 0) {
			return fmt.Sprintf("localEndpoints %d with status %d", body.LocalEndpoints, r.Status)
		}
	}
	return ""
}

// ExtCell is one evaluated probe.
type ExtCell struct {
	ExtPlanned
	Result probe.ExternalResult
	Fail   string // "" = passed
}

// ExternalCheckResult is `axon lab check --external`.
type ExternalCheckResult struct {
	Impl      string
	NA        string // not empty: nothing ran, with the reason
	Client    []netip.Addr
	Announcer string
	Cases     []string
	Cols      []string
	Cells     map[[2]string][]ExtCell
	Elapsed   time.Duration
}

// Counts returns (passed, ran, not applicable).
func (r *ExternalCheckResult) Counts() (ok, ran, na int) {
	return countCells(r.Cells, func(c ExtCell) outcome {
		if c.NA != "" {
			return notApplicable
		}
		return passedIf(c.Fail == "")
	})
}

// Failed returns the failed probes as "CASE proto/addr: why" lines.
func (r *ExternalCheckResult) Failed() []string {
	return failedCells(r.Cases, r.Cols, r.Cells, func(x ExtCell) bool { return x.NA == "" && x.Fail != "" },
		func(c, _ string, x ExtCell) string { return fmt.Sprintf("%s %s: %s", c, x.Probe, x.Fail) })
}

// Print writes the table, failures, n/a reasons and a summary.
func (r *ExternalCheckResult) Print(w io.Writer) {
	fmt.Fprintf(w, "External client (%s) → Services, served by %s; LoadBalancer/externalIP addresses routed via %s\n",
		joinAddrList(r.Client), orDash(r.Impl), orDash(r.Announcer))
	if r.NA != "" && len(r.Cases) == 0 {
		fmt.Fprintf(w, "n/a  %s\n", r.NA)
		return
	}
	printMatrix(w, "CASE", r.Cases, r.Cols, func(c, col string) string { return extCellText(r.Cells[[2]string{c, col}]) })
	for _, f := range r.Failed() {
		fmt.Fprintln(w, "FAIL", f)
	}
	seen := map[string]int{}
	var order []string
	for _, c := range r.Cases {
		for _, col := range r.Cols {
			for _, x := range r.Cells[[2]string{c, col}] {
				if x.NA != "" {
					if seen[x.NA] == 0 {
						order = append(order, x.NA)
					}
					seen[x.NA]++
				}
			}
		}
	}
	for _, why := range order {
		fmt.Fprintf(w, "n/a  %s [%d probes]\n", why, seen[why])
	}
	ok, ran, na := r.Counts()
	fmt.Fprintf(w, "%d/%d external probes passed, %d n/a, in %s\n", ok, ran, na, r.Elapsed.Round(time.Millisecond))
}

func joinAddrList(as []netip.Addr) string {
	var s []string
	for _, a := range as {
		s = append(s, a.String())
	}
	return strings.Join(s, ", ")
}

func extCellText(cs []ExtCell) string {
	if len(cs) == 0 {
		return "-"
	}
	ok, ran := 0, 0
	var detail string
	for _, c := range cs {
		if c.NA != "" {
			continue
		}
		ran++
		if c.Fail == "" {
			ok++
		}
		switch c.Expect {
		case ExpectBlocked:
			detail = "blocked"
		case ExpectClientIP:
			detail = "client IP"
		case ExpectHealthy, ExpectNoLocal:
			detail = c.Expect
		}
	}
	if ran == 0 {
		return "n/a"
	}
	s := "ok"
	if ok < ran {
		s = fmt.Sprintf("FAIL %d/%d", ok, ran)
	}
	if detail != "" {
		s += " (" + detail + ")"
	}
	return s
}

// nodePortStatus returns each agent's nodeport_lb decision value ("" when
// its status has none); agents that do not answer are left out. It waits up
// to 15 s in all for LBs that are still pending.
func nodePortStatus(ctx context.Context, st *State) map[string]string {
	out := map[string]string{}
	deadline := time.Now().Add(15 * time.Second)
	for _, n := range st.Nodes {
		if n.Agent == nil {
			continue
		}
		if v, _, err := NodePortDecision(ctx, n.Socket, time.Until(deadline)); err == nil {
			out[n.Name] = v
		}
	}
	return out
}

// NodePortDecision returns the nodeport_lb decision (value and reason) of the
// agent at socket: how its north-south LB attached, or why not; "" when its
// status has no such decision. While the LB is still pending, or the agent
// does not answer, it asks again for up to wait: the agent loads the LB after
// the tc datapath and the first Service sync, at most 10 s after it starts,
// so a lab that is just up may not have it yet (CI, 2026-11-26: an XDP
// benchmark sample skipped as "pending"); with no time left it asks once. The
// error is the last failure to reach the agent.
func NodePortDecision(ctx context.Context, socket string, wait time.Duration) (value, reason string, err error) {
	deadline := time.Now().Add(wait)
	for {
		cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		s, serr := api.NewClient(socket).Status(cctx)
		cancel()
		value, reason, err = "", "", nil
		if serr != nil {
			err = fmt.Errorf("agent status: %w", serr)
		} else {
			for _, d := range s.Datapath {
				if d.Name == "nodeport_lb" {
					value, reason = d.Value, d.Reason
				}
			}
		}
		if err == nil && value != "pending" || time.Now().After(deadline) {
			return value, reason, err
		}
		select {
		case <-ctx.Done():
			return value, reason, err
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// CheckExternal runs the external check: it makes sure demo-pinned,
// demo-local and the external routes exist, starts the echo servers (plain
// echo on EchoPort in every demo backend, peer echo on PeerEchoPort in the
// first node's pods) and probes from the external namespace. It returns an
// error only when the check itself could not run.
func (l *Lab) CheckExternal(ctx context.Context, timeout time.Duration) (*ExternalCheckResult, error) {
	t0 := time.Now()
	st := l.State()
	res := &ExternalCheckResult{Client: st.External.IPs, Cells: map[[2]string][]ExtCell{},
		Cols: []string{"tcp/v4", "tcp/v6", "udp/v4", "udp/v6", "http/v4", "http/v6"}}
	if len(st.Nodes) > 0 {
		res.Announcer = LBAnnouncer(&st).Name
	}
	if !st.DemoServices {
		return nil, errors.New("the lab has no demo Services: bring it up without --no-demo")
	}
	impl, na := externalImpl(&st, nodePortStatus(ctx, &st))
	res.Impl, res.NA = impl, na
	plan := planExternalProbes(&st, na)
	if na == "" {
		if err := l.EnsureExternalDemoServices(ctx); err != nil {
			return nil, fmt.Errorf("external demo Services: %w", err)
		}
		if err := l.waitExternalProgrammed(ctx, &st, 20*time.Second); err != nil {
			l.log.Warn("external demo Services may not be programmed yet", "err", err)
		}
	}
	seenCase := map[string]bool{}
	for _, p := range plan {
		if !seenCase[p.Case] {
			seenCase[p.Case] = true
			res.Cases = append(res.Cases, p.Case)
		}
	}
	run := map[probe.External]ExtPlanned{}
	var normal, blocked []probe.External
	for _, p := range plan {
		if p.NA != "" {
			key := [2]string{p.Case, p.Col}
			res.Cells[key] = append(res.Cells[key], ExtCell{ExtPlanned: p})
			continue
		}
		run[p.Probe] = p
		if p.Expect == ExpectBlocked {
			blocked = append(blocked, p.Probe)
		} else {
			normal = append(normal, p.Probe)
		}
	}
	if len(run) > 0 {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		var echo, peer []string
		for _, p := range demoBackends(&st) {
			echo = append(echo, p.Name)
		}
		for _, p := range externalDemoBackends(&st) {
			peer = append(peer, p.Name)
		}
		if hp, ok := hostPortPod(&st); ok && !slices.Contains(peer, hp.Name) {
			peer = append(peer, hp.Name) // DemoHostPortPeer → probe.PeerEchoPort
		}
		self := filepath.Join(st.BinDir, "axon")
		stop1, err := l.startServers(ctx, echo, self, "lab", "_echo", "serve", "--port", strconv.Itoa(probe.EchoPort))
		if err != nil {
			return nil, err
		}
		defer stop1()
		stop2, err := l.startServers(ctx, peer, self, "lab", "_peerecho", "--port", strconv.Itoa(probe.PeerEchoPort))
		if err != nil {
			return nil, err
		}
		defer stop2()
		// externalTrafficPolicy Local on a node without a local backend:
		// the silence must be that node's LB dropping (the frontend has no
		// backend there: drop_no_backend, or drop_not_local), not an LB
		// that has not written the Service (not_service)
		drops := notLocalCounter(&st)
		before, berr := drops.read()
		var mu sync.Mutex
		var errs []error
		var wg sync.WaitGroup
		for _, batch := range []struct {
			probes  []probe.External
			timeout time.Duration
		}{{normal, timeout}, {blocked, min(timeout, 1500*time.Millisecond)}} {
			if len(batch.probes) == 0 {
				continue
			}
			wg.Go(func() {
				rs, err := l.RunXProbesFromExternal(ctx, batch.probes, batch.timeout)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, err)
				}
				for _, r := range rs {
					p := run[r.External]
					key := [2]string{p.Case, p.Col}
					res.Cells[key] = append(res.Cells[key], ExtCell{ExtPlanned: p, Result: r, Fail: evalExternal(p, r, st.External.IPs)})
				}
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return res, err
		}
		after, aerr := drops.read()
		drops.judge(res.Cells, before, after, errors.Join(berr, aerr))
	}
	res.Elapsed = time.Since(t0)
	return res, nil
}

// RunXProbesFromExternal runs `axon lab _xprobe` in the external namespace.
func (l *Lab) RunXProbesFromExternal(ctx context.Context, probes []probe.External, timeout time.Duration) ([]probe.ExternalResult, error) {
	st := l.State()
	args := []string{filepath.Join(st.BinDir, "axon"), "lab", "_xprobe", "--timeout", timeout.String()}
	for _, p := range probes {
		args = append(args, p.String())
	}
	cmd := l.Command(ctx, ExternalName, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var rs []probe.ExternalResult
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		var r probe.ExternalResult
		if json.Unmarshal(sc.Bytes(), &r) == nil {
			rs = append(rs, r)
		}
	}
	if err != nil {
		return rs, fmt.Errorf("external probes: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return rs, nil
}

// waitExternalProgrammed waits until every kube-proxy's rules hold the
// external demo Services, or every axon agent's desired Service table holds
// demo-local's health check port (the watch saw the Services).
func (l *Lab) waitExternalProgrammed(ctx context.Context, st *State, timeout time.Duration) error {
	if kubeProxyModeOf(st) != kubeproxy.None {
		return waitKubeProxyRules(ctx, st, externalDemoKubeProxyWants(st), 30*time.Second)
	}
	if st.Datapath != DatapathAxon {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	want := []string{strconv.Itoa(DemoLocalNodePort), strconv.Itoa(DemoPinnedNodePort)}
	var errs []error
	for _, n := range st.Nodes {
		c := api.NewClient(n.Socket)
		for {
			mr, err := c.LBMaps(ctx)
			sr, err2 := c.Services(ctx)
			if err == nil && err2 == nil && mr.Text == sr.Text && strings.Contains(mr.Text, ":"+want[0]+"/") && strings.Contains(mr.Text, ":"+want[1]+"/") {
				break
			}
			if ctx.Err() != nil {
				errs = append(errs, fmt.Errorf("agent of %s has not programmed %s and %s", n.Name, DemoLocal, DemoPinned))
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	// The agents apply the same table to the north-south LB right after the
	// socket LB, count local endpoints for the health check and open its
	// server: wait until the announcer's health check reports its local
	// backends and every other node's answers at all (503: none local).
	var probes []probe.External
	announcer := LBAnnouncer(st)
	for _, n := range st.Nodes {
		probes = append(probes, probe.External{Proto: "http", Addr: netip.AddrPortFrom(n.IP, DemoLocalHealthPort)})
	}
	why := "no answer yet"
	for ctx.Err() == nil {
		rs, err := l.RunXProbesFromExternal(ctx, probes, time.Second)
		why = ""
		if err != nil || len(rs) != len(probes) {
			why = fmt.Sprintf("probes: %v", err)
		}
		for _, r := range rs {
			switch {
			case !r.OK:
				why = fmt.Sprintf("%s: %s", r.Addr, r.Err)
			case r.Addr.Addr() == announcer.IP && r.Status != http.StatusOK:
				why = fmt.Sprintf("%s answers %d, want 200 (local backends)", r.Addr, r.Status)
			}
		}
		if why == "" {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if why != "" {
		errs = append(errs, fmt.Errorf("the %s health checks are not all up within %s: %s", DemoLocal, timeout, why))
	}
	return errors.Join(errs...)
}

// ---------------------------------------------------------------------------
// Lab options for the north-south LB (agents' flags).

// Values of `axon lab up --lb-acceleration` and `--nodeport-mode` ("" = the
// agent's default: disabled, snat).
var (
	LBAccelerations = []string{"native", "best-effort", "disabled"}
	NodePortModes   = []string{"snat", "dsr"}
)

func validateNorthSouth(accel, mode string) error {
	ok := func(v string, in []string) bool {
		if v == "" {
			return true
		}
		for _, x := range in {
			if v == x {
				return true
			}
		}
		return false
	}
	var errs []error
	if !ok(accel, LBAccelerations) {
		errs = append(errs, fmt.Errorf("--lb-acceleration %q: want one of %s", accel, strings.Join(LBAccelerations, ", ")))
	}
	if !ok(mode, NodePortModes) {
		errs = append(errs, fmt.Errorf("--nodeport-mode %q: want one of %s", mode, strings.Join(NodePortModes, ", ")))
	}
	return errors.Join(errs...)
}

// northSouthAgentArgs are the agents' north-south flags for the lab (none
// when kube-proxy serves Services: the agents then run with --nodeport=false).
func northSouthAgentArgs(st *State) []string {
	if kubeProxyModeOf(st) != kubeproxy.None {
		return nil
	}
	var out []string
	if st.LBAcceleration != "" {
		out = append(out, "--lb-acceleration="+st.LBAcceleration)
	}
	if st.NodePortMode != "" {
		out = append(out, "--nodeport-mode="+st.NodePortMode)
	}
	return out
}

// upExternalDemo is called by Up after the demo Services.
func upExternalDemo(ctx context.Context, st *State, kube kubernetes.Interface, log *slog.Logger) error {
	if err := ensureExternalDemo(ctx, kube, st); err != nil {
		return err
	}
	log.Debug("external demo services ready", "announcer", LBAnnouncer(st).Name)
	return nil
}

// StartPeerEcho starts the peer-echo server (PeerEchoPort, TCP and UDP) in
// the given pods; stop ends them. For tests and benchmarks.
func (l *Lab) StartPeerEcho(ctx context.Context, pods []string) (stop func(), err error) {
	self := filepath.Join(l.State().BinDir, "axon")
	return l.startServers(ctx, pods, self, "lab", "_peerecho", "--port", strconv.Itoa(probe.PeerEchoPort))
}

// xdpPassOnWirePorts attaches a one-instruction XDP_PASS program in driver
// mode to every node's wire-side veth port (w-<node>, in axonlab-wire), when
// the lab's agents may run the north-south LB at native XDP. A veth whose
// XDP program answers XDP_TX (or redirects) hands the frame to its peer's
// NAPI ring, which exists only when the peer has an XDP program of its own:
// without it, XDP_TX from a node's eth0 is dropped. It
// also turns transmit checksum offload off on those ports (see below).
// Both go away with the wire namespace.
func xdpPassOnWirePorts(st *State) error {
	if st.LBAcceleration != "native" && st.LBAcceleration != "best-effort" {
		return nil
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name: "axonlab_xdp_pass", Type: ebpf.XDP, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2 /* XDP_PASS */), asm.Return()},
	})
	if err != nil {
		return fmt.Errorf("load the wire ports' XDP_PASS program: %w", err)
	}
	defer prog.Close()
	return netnsutil.Do(WireNetns, func() error {
		for _, n := range st.Nodes {
			port := WirePort(n.Name)
			link, err := netlink.LinkByName(port)
			if err != nil {
				return fmt.Errorf("find %s in %s: %w", port, WireNetns, err)
			}
			if err := netlink.LinkSetXdpFdWithFlags(link, prog.FD(), nl.XDP_FLAGS_DRV_MODE); err != nil {
				return fmt.Errorf("attach XDP_PASS to %s in %s (the peer of %s's eth0, so that XDP_TX works there): %w", port, WireNetns, n.Name, err)
			}
			// Frames from other lab namespaces may carry CHECKSUM_PARTIAL
			// (only a pseudo-header sum in the TCP/UDP checksum); XDP sees
			// the raw bytes and XDP_TX sends them on without the skb that
			// knew it, so the receiver would drop them. Checksums of frames
			// entering a node are completed here instead.
			if err := ethtool.Set(port, ethtool.TxChecksum, false); err != nil {
				return fmt.Errorf("%w (frames XDP_TX'd by %s would carry partial checksums)", err, n.Name)
			}
		}
		return nil
	})
}

// notLocalDrops ties the "no local backend: not served" cells of
// externalTrafficPolicy Local to the LB's own drop counters: the agent
// writes such a frontend with no backend on a node without a local one
// (drop_no_backend; drop_not_local if a remote one slipped in), while a
// node whose LB has not written the Service yet is silent too, counting
// not_service. Zero value (nodes nil): not axon's north-south LB, no
// check.
type notLocalDrops struct {
	nodes map[netip.Addr]Node // node address → node
}

func notLocalCounter(st *State) notLocalDrops {
	if st.Datapath != DatapathAxon || kubeProxyModeOf(st) != kubeproxy.None {
		return notLocalDrops{}
	}
	d := notLocalDrops{nodes: map[netip.Addr]Node{}}
	for _, n := range st.Nodes {
		for _, ip := range n.IPs {
			d.nodes[ip] = n
		}
	}
	return d
}

// read returns every node's drop_no_backend + drop_not_local (tc and XDP hooks).
func (d notLocalDrops) read() (map[string]uint64, error) {
	if d.nodes == nil {
		return nil, nil
	}
	out := map[string]uint64{}
	var errs []error
	for _, n := range d.nodes {
		if _, done := out[n.Name]; done {
			continue
		}
		m, err := nodeport.PinnedMetrics(n.PinDir)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", n.Name, err))
			continue
		}
		for _, hook := range []string{"tc", "xdp"} {
			out[n.Name] += m[hook]["drop_no_backend"] + m[hook]["drop_not_local"]
		}
	}
	return out, errors.Join(errs...)
}

// judge fails each passed "not served" cell of ETP Local NodePort probes
// to a node whose drops did not move at least once per such probe.
func (d notLocalDrops) judge(cells map[[2]string][]ExtCell, before, after map[string]uint64, readErr error) {
	if d.nodes == nil {
		return
	}
	sent := map[string]int{}
	for _, cs := range cells {
		for _, c := range cs {
			if c.Expect == ExpectBlocked && c.NA == "" && c.Probe.Addr.Port() == DemoLocalNodePort {
				sent[d.nodes[c.Probe.Addr.Addr()].Name]++
			}
		}
	}
	for key, cs := range cells {
		for i, c := range cs {
			if c.Expect != ExpectBlocked || c.NA != "" || c.Fail != "" || c.Probe.Addr.Port() != DemoLocalNodePort {
				continue
			}
			n := d.nodes[c.Probe.Addr.Addr()].Name
			moved := after[n] - before[n]
			switch {
			case readErr != nil:
				cs[i].Fail = fmt.Sprintf("not answered, but the LB's drop counters could not be read: %v", readErr)
			case moved < uint64(sent[n]):
				cs[i].Fail = fmt.Sprintf("not answered, but %s's LB counted %d drop_no_backend/drop_not_local for %d such probes: the silence is not the LB's (Service not programmed yet?)", n, moved, sent[n])
			}
		}
		cells[key] = cs
	}
}
