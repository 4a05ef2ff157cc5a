// Package services is the Service benchmark (`axon lab bench services`) on a
// running lab: axon's socket LB against real kube-proxy in nftables and
// iptables mode, in ONE lab and one interleaved run.
//
// Why one lab: the lab's nodes share one kernel and its two CPUs, so nodes
// are interchangeable measurement slots. Netfilter rules live per network
// namespace and socket-LB programs per cgroup, so different nodes can run
// different service implementations side by side:
//
//	node1  axon only (no kube-proxy): axon client pods; a baseline client pod (no rules)
//	node2  the backend: one axon pod running the connect-rate server
//	node3  + kube-proxy nftables: baseline (ptp) client pods
//	node4  + kube-proxy iptables: baseline (ptp) client pods, and an axon pod
//
// kube-proxy clients are ptp pods (kernel routing, as with a classic CNI)
// whose processes run in a cgroup OUTSIDE the node's socket-LB cgroup, so
// only kube-proxy's rules translate their ClusterIP connections. Every path
// connects to the same server pod on node2, client pinned to one CPU and the
// server to the other; paths are interleaved inside every repetition.
// Scale levels (10, 1 000, 10 000 Services) are cumulative, so they run one
// after the other; within a level the paths interleave.
package services

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/axonhq/axon/internal/bench"
	"github.com/axonhq/axon/internal/bench/clip"
	"github.com/axonhq/axon/internal/bench/connrate"
	labpkg "github.com/axonhq/axon/internal/lab"
	"github.com/axonhq/axon/internal/lab/kubeproxy"
	"github.com/axonhq/axon/internal/proc"
	"github.com/axonhq/axon/internal/scale"
)

// Service benchmark constants.
const (
	TargetNamespace   = "default"
	TargetName        = "svcbench-target"
	ServerPort        = 8080 // the connect-rate server in the backend pod
	ServicePort       = 80   // the target Service's port
	svcScaleNamespace = "svcbench"
	svcNoLBCgroup     = "axon-svcbench" // <cgroup2>/axon-svcbench: outside every node's socket-LB cgroup
)

// Service benchmark pods (node index into the lab's nodes, datapath). Every
// path has its own client pod: paths to the same backend from one pod would
// share 4-tuples (a DNATed connection and a direct one look alike to the
// server and to conntrack), and a reused port would then collide with the
// other path's TIME_WAIT and conntrack entries.
var svcPods = []struct {
	name, datapath string
	node           int
}{
	{"svcb-server", labpkg.DatapathAxon, 1},
	{"svcb-axon-c1", labpkg.DatapathAxon, 0},
	{"svcb-axon-d1", labpkg.DatapathAxon, 0},
	{"svcb-base-d1", labpkg.DatapathBaseline, 0},
	{"svcb-base-c3", labpkg.DatapathBaseline, 2},
	{"svcb-base-d3", labpkg.DatapathBaseline, 2},
	{"svcb-base-c4", labpkg.DatapathBaseline, 3},
	{"svcb-base-d4", labpkg.DatapathBaseline, 3},
	{"svcb-axon-d4", labpkg.DatapathAxon, 3},
}

// Path names of the Service benchmark, in measurement order. The first is
// the reference of every ratio.
const (
	PathAxonDirect     = "axon: pod → backend pod IP"
	PathAxonClusterIP  = "axon: pod → ClusterIP (socket LB)"
	PathNFTClusterIP   = "kube-proxy nftables: pod → ClusterIP"
	PathIPTClusterIP   = "kube-proxy iptables: pod → ClusterIP"
	PathDirectIPTRules = "ptp pod → pod IP, iptables rules on node"
	PathDirectNFTRules = "ptp pod → pod IP, nftables rules on node"
	PathDirectNoRules  = "ptp pod → pod IP, no rules on node"
	PathAxonDirectIPT  = "axon: pod → pod IP, iptables rules on node"
)

// Config describes one Service benchmark run.
type Config struct {
	Levels    []int         // numbers of generated Services, ascending; default 10, 1000, 10000
	Endpoints int           // endpoints per generated Service; default 10
	Reps      int           // connect-rate repetitions per level and path; default 5
	Duration  time.Duration // per connect-rate sample; default 3s
	Changes   int           // EndpointSlice changes measured at the last level; default 20 (0: skip)
	// PairedDuration is the length of each paired run at each level (250
	// ms slices); default Reps × Duration.
	PairedDuration time.Duration
	// Pairings are the paired runs to make (PairedClusterIP,
	// PairedRules); nil: all.
	Pairings []string
	// SyncTimeout bounds the wait for each kube-proxy to apply a level
	// (iptables at 10 000 Services may take many minutes); default 5m.
	SyncTimeout time.Duration
	// NoFullSync skips the agent and kube-proxy restart measurements.
	NoFullSync bool
	Axon       string // the axon binary (runs `axon lab bench _connrate`)
	OutDir     string
	Progress   io.Writer
	Logger     *slog.Logger
	ClientCPU  int // default 0
	ServerCPU  int // default 1
	Keep       bool
	// LeaveObjects leaves the generated Services and EndpointSlices in the
	// apiserver and the kube-proxies' rules in their node namespaces (for a
	// lab that is brought down right after: deleting 20 000 objects one by
	// one takes minutes, and `kube-proxy --cleanup` of 10 000 Services'
	// iptables rules on a busy machine more than two).
	LeaveObjects bool
}

func (c Config) withDefaults() (Config, error) {
	if len(c.Levels) == 0 {
		c.Levels = []int{10, 1000, 10000}
	}
	if c.Endpoints == 0 {
		c.Endpoints = 10
	}
	if c.Reps == 0 {
		c.Reps = 5
	}
	if c.Duration == 0 {
		c.Duration = 3 * time.Second
	}
	if c.SyncTimeout == 0 {
		c.SyncTimeout = 5 * time.Minute
	}
	if c.PairedDuration == 0 {
		c.PairedDuration = time.Duration(c.Reps) * c.Duration
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.ClientCPU == 0 && c.ServerCPU == 0 {
		c.ServerCPU = 1
	}
	if !slices.IsSorted(c.Levels) || c.Levels[0] < 1 {
		return c, fmt.Errorf("service levels %v: want ascending counts ≥ 1, e.g. 10,1000,10000", c.Levels)
	}
	if c.Levels[len(c.Levels)-1]*(c.Endpoints+1) > 1<<22 {
		return c, fmt.Errorf("%d Services × %d endpoints: too many fake endpoint addresses", c.Levels[len(c.Levels)-1], c.Endpoints)
	}
	if c.Reps < 1 || c.Duration < 100*time.Millisecond || c.Changes < 0 {
		return c, fmt.Errorf("reps %d, duration %s, changes %d: want ≥1, ≥100ms, ≥0", c.Reps, c.Duration, c.Changes)
	}
	if c.Axon == "" {
		return c, errors.New("no axon binary given for the connect-rate tool")
	}
	for _, k := range c.Pairings {
		if !slices.ContainsFunc(svcPairings, func(p svcPairing) bool { return p.kind == k }) {
			return c, fmt.Errorf("paired run %q: want %s or %s", k, PairedClusterIP, PairedRules)
		}
	}
	return c, nil
}

// svcPath is one measured path.
type svcPath struct {
	Name   string
	Client bench.Endpoint
	Target netip.AddrPort
	Needs  string // kube-proxy mode that must have synced ("" = none)
}

// svcRun is the state of one run.
type svcRun struct {
	cfg    Config
	l      *labpkg.Lab
	kube   kubernetes.Interface
	tools  bench.ToolPaths
	log    *slog.Logger
	rep    *Report
	nodes  []labpkg.Node
	pods   map[string]labpkg.Pod
	kps    map[string]*KubeProxy // mode → kube-proxy
	synced map[string]bool       // mode → applied the current level
	server *bench.Server
	srvArg []string
	noLB   string // cgroup outside the socket LB
	spec   scale.Spec
	ips    map[int]netip.Addr // scale Service index → ClusterIP
	target netip.Addr         // ClusterIP of the target Service
}

// Run runs the Service benchmark on the running lab l. The lab needs
// ≥ 4 nodes, the axon datapath and no lab-wide kube-proxy (the benchmark
// starts its own, one mode per node). It returns the report also when parts
// failed (the error joins what failed).
func Run(ctx context.Context, l *labpkg.Lab, cfg Config) (*Report, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("service bench config: %w", err)
	}
	st := l.State()
	switch {
	case len(st.Nodes) < 4:
		return nil, fmt.Errorf("the Service benchmark needs 4 lab nodes, this lab has %d: axon lab down && axon lab up --nodes 4", len(st.Nodes))
	case st.Datapath != labpkg.DatapathAxon:
		return nil, fmt.Errorf("the Service benchmark needs the axon datapath (this lab is %s): axon lab up --nodes 4", st.Datapath)
	case l.KubeProxyMode() != kubeproxy.None:
		return nil, fmt.Errorf("the lab runs kube-proxy %s on every node; the Service benchmark starts its own (nftables on node3, iptables on node4): bring the lab up with --kube-proxy none", l.KubeProxyMode())
	}
	tools, err := bench.ToolPaths{Iperf3: "true", Sockperf: "true"}.Resolve(false)
	if err != nil {
		return nil, err
	}
	kube, err := benchKube(l.AdminKubeconfig())
	if err != nil {
		return nil, err
	}
	r := &svcRun{cfg: cfg, l: l, kube: kube, tools: tools, log: cfg.Logger, nodes: st.Nodes,
		pods: map[string]labpkg.Pod{}, kps: map[string]*KubeProxy{}, synced: map[string]bool{},
		spec: scale.Spec{Namespace: svcScaleNamespace, Prefix: "svc", Endpoints: cfg.Endpoints}, ips: map[int]netip.Addr{}}
	r.rep = &Report{Started: time.Now().UTC(), Reps: cfg.Reps, Duration: cfg.Duration, Endpoints: cfg.Endpoints,
		ClientCPU: cfg.ClientCPU, ServerCPU: cfg.ServerCPU, Host: bench.HostInfo(ctx, bench.ToolPaths{}), Reference: PathAxonDirect}
	if cfg.OutDir != "" {
		if err := os.MkdirAll(filepath.Join(cfg.OutDir, "raw"), 0o755); err != nil {
			return nil, fmt.Errorf("create output dir: %w", err)
		}
	}
	runErr := r.run(ctx)
	if cerr := r.cleanup(); cerr != nil {
		runErr = errors.Join(runErr, cerr)
	}
	r.rep.Finished = time.Now().UTC()
	if runErr != nil {
		r.rep.Errors = append(r.rep.Errors, strings.Split(runErr.Error(), "\n")...)
	}
	if cfg.OutDir != "" {
		if err := r.rep.WriteFiles(cfg.OutDir); err != nil {
			runErr = errors.Join(runErr, err)
		}
	}
	return r.rep, runErr
}

// benchKube is an admin client without client-side rate limits (10 000
// Services must go in quickly; the apiserver's own limits still apply).
func benchKube(kubeconfig string) (kubernetes.Interface, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("load admin kubeconfig %s: %w", kubeconfig, err)
	}
	rc.QPS, rc.Burst = -1, 0
	rc.Timeout = 30 * time.Second
	rc.ContentType = "application/vnd.kubernetes.protobuf" // cheaper to encode and for the apiserver to decode
	return kubernetes.NewForConfig(rc)
}

func (r *svcRun) progress(format string, args ...any) {
	fmt.Fprintf(r.cfg.Progress, "%s "+format+"\n", append([]any{time.Now().UTC().Format("15:04:05")}, args...)...)
}

func (r *svcRun) run(ctx context.Context) error {
	if err := r.setup(ctx); err != nil {
		return err
	}
	paths := r.paths()
	for _, p := range paths {
		r.rep.Paths = append(r.rep.Paths, PathInfo{Name: p.Name, Client: p.Client, Target: p.Target.String(), Needs: p.Needs,
			Command: bench.ShellQuote(r.clientArgv(p))})
	}
	r.rep.ServerCommand = bench.ShellQuote(r.srvArg)
	var errs []error
	prev := 0
	for li, level := range r.cfg.Levels {
		lv, err := r.applyLevel(ctx, prev, level)
		r.rep.Levels = append(r.rep.Levels, lv)
		if err != nil {
			errs = append(errs, err)
			if ctx.Err() != nil || lv.Created == 0 && level > prev {
				return errors.Join(errs...)
			}
		}
		prev = level
		if err := r.measureLevel(ctx, level, paths); err != nil {
			errs = append(errs, err)
		}
		if err := r.measurePaired(ctx, level, paths); err != nil {
			errs = append(errs, err)
		}
		if ctx.Err() != nil {
			return errors.Join(append(errs, ctx.Err())...)
		}
		if li == len(r.cfg.Levels)-1 {
			cp, err := r.controlPlane(ctx, level)
			r.rep.ControlPlane = cp
			if err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// setup adds the pods, the target Service, the server and the kube-proxies.
func (r *svcRun) setup(ctx context.Context) error {
	cg2 := filepath.Dir(r.l.State().Cgroup)
	r.noLB = filepath.Join(cg2, svcNoLBCgroup)
	if err := os.MkdirAll(r.noLB, 0o755); err != nil {
		return fmt.Errorf("create cgroup %s: %w", r.noLB, err)
	}
	existing := map[string]bool{}
	for _, p := range r.l.Pods() {
		existing[p.Name] = true
	}
	r.progress("adding %d benchmark pods", len(svcPods))
	for _, sp := range svcPods {
		if existing[sp.name] { // left by an interrupted run
			if err := r.l.DeletePod(ctx, sp.name); err != nil {
				return fmt.Errorf("remove stale benchmark pod %s: %w", sp.name, err)
			}
		}
		p, err := r.l.AddPod(ctx, r.nodes[sp.node].Name, sp.name, sp.datapath)
		if err != nil {
			return fmt.Errorf("add benchmark pod %s (%s) on %s: %w", sp.name, sp.datapath, r.nodes[sp.node].Name, err)
		}
		r.pods[sp.name] = p
	}
	srv := r.pods["svcb-server"]
	r.srvArg = r.tools.Wrap("/run/netns/"+srv.Netns, r.cfg.ServerCPU, r.cfg.Axon, "lab", "bench", "_connrate", "serve",
		"--listen", netip.AddrPortFrom(srv.IP, ServerPort).String())
	if err := r.ensureServer(ctx); err != nil {
		return err
	}
	ip, err := r.ensureTarget(ctx, srv.IP)
	if err != nil {
		return err
	}
	r.target = ip
	// Stale objects of an interrupted run would distort the levels.
	if n, err := scale.Delete(ctx, r.kube, svcScaleNamespace, 16); err != nil {
		return err
	} else if n > 0 {
		r.progress("removed %d objects left by an earlier run", n)
	}
	bin, err := labpkg.DepPath("kube-proxy")
	if err != nil {
		return err
	}
	for mode, node := range map[string]labpkg.Node{"nftables": r.nodes[2], "iptables": r.nodes[3]} {
		kp, err := StartKubeProxy(KubeProxySpec{Binary: bin, Mode: mode, Node: node.Name, Netns: "/run/netns/" + node.Netns,
			Kubeconfig: r.l.AdminKubeconfig(), Log: r.kubeProxyLog(mode)})
		if err != nil {
			return err
		}
		r.kps[mode] = kp
		r.rep.KubeProxyCommands = append(r.rep.KubeProxyCommands, bench.ShellQuote(kp.Argv))
	}
	slices.Sort(r.rep.KubeProxyCommands)
	t := time.Now()
	for mode, kp := range r.kps {
		if _, err := kp.WaitSynced(ctx, t.Add(-time.Minute), time.Minute, 100*time.Millisecond); err != nil {
			return fmt.Errorf("kube-proxy %s did not come up: %w", mode, err)
		}
	}
	return nil
}

func (r *svcRun) kubeProxyLog(mode string) string {
	if r.cfg.OutDir != "" {
		return filepath.Join(r.cfg.OutDir, "raw", "kube-proxy-"+mode+".log")
	}
	return filepath.Join(r.l.StateDir(), "svcbench", "kube-proxy-"+mode+".log")
}

func (r *svcRun) ensureServer(ctx context.Context) error {
	if r.server != nil && !r.server.Exited() {
		return nil
	}
	srv := r.pods["svcb-server"]
	s, err := bench.StartServer(ctx, srv.Cgroup, r.srvArg, srv.IP, ServerPort, 10*time.Second)
	if err != nil {
		return fmt.Errorf("connect-rate server in %s: %w", srv.Name, err)
	}
	r.server = s
	return nil
}

// ensureTarget creates the Service the ClusterIP paths connect to and its
// EndpointSlice (the server pod), and returns the ClusterIP.
func (r *svcRun) ensureTarget(ctx context.Context, backend netip.Addr) (netip.Addr, error) {
	svcs := r.kube.CoreV1().Services(TargetNamespace)
	_ = svcs.Delete(ctx, TargetName, metav1.DeleteOptions{})
	_ = r.kube.DiscoveryV1().EndpointSlices(TargetNamespace).Delete(ctx, TargetName, metav1.DeleteOptions{})
	svc, err := svcs.Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: TargetName, Namespace: TargetNamespace},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "rr", Protocol: corev1.ProtocolTCP, Port: ServicePort,
			TargetPort: intstr.FromInt32(ServerPort)}}},
	}, metav1.CreateOptions{})
	if err != nil {
		return netip.Addr{}, fmt.Errorf("create Service %s: %w", TargetName, err)
	}
	ready := true
	name, proto, port := "rr", corev1.ProtocolTCP, int32(ServerPort)
	_, err = r.kube.DiscoveryV1().EndpointSlices(TargetNamespace).Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: TargetName, Namespace: TargetNamespace, Labels: map[string]string{discoveryv1.LabelServiceName: TargetName}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{backend.String()}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Protocol: &proto, Port: &port}},
	}, metav1.CreateOptions{})
	if err != nil {
		return netip.Addr{}, fmt.Errorf("create EndpointSlice %s: %w", TargetName, err)
	}
	ip, err := netip.ParseAddr(svc.Spec.ClusterIP)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("Service %s has no ClusterIP %q", TargetName, svc.Spec.ClusterIP)
	}
	return ip, nil
}

func (r *svcRun) paths() []svcPath {
	pod := func(name string, lbScope bool) bench.Endpoint {
		p := r.pods[name]
		cg := p.Cgroup
		if !lbScope {
			cg = r.noLB
		}
		return bench.Endpoint{Name: p.Name, Netns: "/run/netns/" + p.Netns, Cgroup: cg, IP: p.IP}
	}
	direct := netip.AddrPortFrom(r.pods["svcb-server"].IP, ServerPort)
	cip := netip.AddrPortFrom(r.target, ServicePort)
	return []svcPath{
		{Name: PathAxonDirect, Client: pod("svcb-axon-d1", true), Target: direct},
		{Name: PathAxonClusterIP, Client: pod("svcb-axon-c1", true), Target: cip},
		{Name: PathNFTClusterIP, Client: pod("svcb-base-c3", false), Target: cip, Needs: "nftables"},
		{Name: PathIPTClusterIP, Client: pod("svcb-base-c4", false), Target: cip, Needs: "iptables"},
		{Name: PathDirectIPTRules, Client: pod("svcb-base-d4", false), Target: direct, Needs: "iptables"},
		{Name: PathDirectNFTRules, Client: pod("svcb-base-d3", false), Target: direct, Needs: "nftables"},
		{Name: PathDirectNoRules, Client: pod("svcb-base-d1", false), Target: direct},
		{Name: PathAxonDirectIPT, Client: pod("svcb-axon-d4", true), Target: direct, Needs: "iptables"},
	}
}

func (r *svcRun) clientArgv(p svcPath) []string {
	return r.tools.Wrap(p.Client.Netns, r.cfg.ClientCPU, r.cfg.Axon, "lab", "bench", "_connrate", "client",
		"--target", p.Target.String(), "--duration", r.cfg.Duration.String())
}

// applyLevel grows the generated Services from prev to level and waits
// until the agents and the kube-proxies have applied them.
func (r *svcRun) applyLevel(ctx context.Context, prev, level int) (Level, error) {
	lv := Level{Services: level, Endpoints: r.cfg.Endpoints, KubeProxy: map[string]Sync{}, Agents: map[string]Sync{}}
	r.progress("level %d Services: creating %d Services + EndpointSlices (%d endpoints each)", level, level-prev, r.cfg.Endpoints)
	s := r.spec
	s.First, s.Services = prev, level-prev
	before := bench.ReadPressure()
	res, err := scale.Apply(ctx, r.kube, s, 16, func(done, total int) {
		if done%4000 == 0 {
			r.progress("  %d/%d objects", done, total)
		}
	})
	lv.Created, lv.Apply = res.Created, res.Elapsed
	maps.Copy(r.ips, res.ClusterIPs)
	if err != nil {
		return lv, err
	}
	written := time.Now()
	r.progress("  %d objects in %s (%.0f/s); waiting for agents and kube-proxies", res.Created, res.Elapsed.Round(time.Millisecond),
		float64(res.Created)/math.Max(res.Elapsed.Seconds(), 1e-3))

	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	for mode, kp := range r.kps {
		if kp == nil {
			lv.KubeProxy[mode] = Sync{Err: "stopped at an earlier level (did not sync in time)"}
			continue
		}
		wg.Go(func() {
			m, err := kp.WaitSynced(ctx, written, r.cfg.SyncTimeout, 200*time.Millisecond)
			ss := Sync{}
			if err != nil {
				ss.Err = err.Error()
			} else {
				ss.Synced = true
				ss.AfterLastWrite = time.Duration((m.LastSync - float64(written.UnixNano())/1e9) * 1e9)
				ss.RSS = m.RSS
			}
			if times, terr := r.syncTimes(mode, written.Add(-res.Elapsed)); terr == nil && len(times) > 0 {
				ss.LastLogged = times[len(times)-1]
				ss.MaxLogged = slices.Max(times)
				ss.Syncs = len(times)
			}
			mu.Lock()
			lv.KubeProxy[mode] = ss
			r.synced[mode] = ss.Synced
			mu.Unlock()
		})
	}
	for _, n := range r.nodes {
		wg.Go(func() {
			ss := r.waitAgent(ctx, n, level, written)
			mu.Lock()
			lv.Agents[n.Name] = ss
			if ss.Err != "" {
				errs = append(errs, fmt.Errorf("agent %s at %d Services: %s", n.Name, level, ss.Err))
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	lv.PSIBefore, lv.PSIAfter = before.Avg10, bench.ReadPressure().Avg10
	for mode, ss := range lv.KubeProxy {
		if ss.Synced {
			r.progress("  kube-proxy %-8s synced %s after the last write (last logged sync %s, %d syncs)", mode,
				ss.AfterLastWrite.Round(time.Millisecond), ss.LastLogged.Round(time.Millisecond), ss.Syncs)
			continue
		}
		r.progress("  kube-proxy %-8s NOT synced: %s — stopping it; its paths are skipped from now on", mode, ss.Err)
		if kp := r.kps[mode]; kp != nil {
			if err := kp.Stop(); err != nil {
				errs = append(errs, err)
			}
			r.kps[mode] = nil
		}
	}
	return lv, errors.Join(errs...)
}

// waitAgent waits until the node's agent has every Service of the level in
// its table and, for the client nodes, every generated ClusterIP with all
// its endpoints in the pinned BPF map.
func (r *svcRun) waitAgent(ctx context.Context, n labpkg.Node, level int, written time.Time) Sync {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.SyncTimeout)
	defer cancel()
	c, err := r.l.Agent(n.Name)
	if err != nil {
		return Sync{Err: err.Error()}
	}
	m, err := OpenLBSvcMap(n.PinDir)
	if err != nil {
		return Sync{Err: err.Error()}
	}
	defer m.Close()
	want := make([]netip.Addr, 0, level)
	for i := range level {
		if ip, ok := r.ips[i]; ok {
			want = append(want, ip)
		}
	}
	for {
		// Only what is still missing is looked up again (10 000 lookups per
		// pass on 4 nodes would compete with the syncs being measured).
		pending := want[:0]
		for _, ip := range want {
			if act, ok, err := m.Active(ip, scale.ServicePort); err != nil || !ok || act != r.cfg.Endpoints {
				pending = append(pending, ip)
			}
		}
		want = pending
		if len(want) == 0 {
			ss := Sync{Synced: true, AfterLastWrite: time.Since(written)}
			if n.Agent != nil {
				ss.RSS, _ = rssOf(n.Agent.PID)
			}
			if rep, err := c.Services(ctx); err == nil {
				ss.Frontends = rep.Frontends
			}
			return ss
		}
		select {
		case <-ctx.Done():
			return Sync{Err: fmt.Sprintf("%d generated ClusterIPs not (fully) in %s/%s after %s", len(want), n.PinDir, lbSvcMapName, r.cfg.SyncTimeout)}
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func rssOf(pid int) (float64, error) {
	hwm, _, err := VmHWM(pid)
	return float64(hwm), err
}

// syncTimes returns the elapsed times kube-proxy logged since t.
func (r *svcRun) syncTimes(mode string, since time.Time) ([]time.Duration, error) {
	f, err := os.Open(r.kubeProxyLog(mode))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	all, err := kubeproxy.ParseSyncTimes(f, time.Now().UTC().Year())
	if err != nil {
		return nil, err
	}
	var out []time.Duration
	for _, s := range all {
		// klog prints local time without a zone; the lab runs in UTC or
		// local time alike, so compare in the process's local zone.
		at := time.Date(s.At.Year(), s.At.Month(), s.At.Day(), s.At.Hour(), s.At.Minute(), s.At.Second(), s.At.Nanosecond(), time.Local)
		if !at.Before(since.Add(-time.Second)) {
			out = append(out, s.Elapsed)
		}
	}
	return out, nil
}

// measureLevel runs the connect-rate rounds of one level, interleaved.
func (r *svcRun) measureLevel(ctx context.Context, level int, paths []svcPath) error {
	var errs []error
	for n := 1; n <= r.cfg.Reps; n++ {
		for _, p := range paths {
			if err := ctx.Err(); err != nil {
				return errors.Join(append(errs, err)...)
			}
			s := Sample{Level: level, Rep: n, Path: p.Name}
			if why := r.unsynced(p); why != "" {
				s.Err = why
				r.rep.Samples = append(r.rep.Samples, s)
				continue
			}
			if err := r.ensureServer(ctx); err != nil {
				s.Err = err.Error()
				r.rep.Samples = append(r.rep.Samples, s)
				errs = append(errs, err)
				continue
			}
			argv := r.clientArgv(p)
			s.Start = time.Now().UTC()
			s.Before = bench.ReadPressure()
			out, stderr, runErr := bench.RunClient(ctx, p.Client.Cgroup, argv, r.cfg.Duration+30*time.Second)
			s.After = bench.ReadPressure()
			s.StallMicro = bench.Stall(s.Before, s.After)
			if r.cfg.OutDir != "" {
				name := filepath.Join(r.cfg.OutDir, "raw", fmt.Sprintf("L%d-rep%d-%s.json", level, n, bench.Slug(p.Name)))
				_ = os.WriteFile(name, append(out, stderr...), 0o644)
			}
			res, perr := connrate.Parse(out)
			switch {
			case perr != nil && runErr != nil:
				s.Err = fmt.Sprintf("%v: %v %s", runErr, perr, clip.String(strings.TrimSpace(string(stderr)), 300))
			case perr != nil:
				s.Err = perr.Error()
			case res.Conns == 0:
				s.Err = "no connection succeeded: " + res.FirstError
			}
			s.Result = res
			if s.Err != "" {
				errs = append(errs, fmt.Errorf("%d Services, rep %d, %s: %s", level, n, p.Name, s.Err))
			} else {
				r.progress("[%5d svc rep %d/%d] %-46s %7.0f conn/s  connect p50 %6.1f µs p99 %7.1f µs  err %d  psi %.1f%%",
					level, n, r.cfg.Reps, p.Name, res.Rate, res.ConnectP50, res.ConnectP99, res.Errors, s.After.Avg10)
			}
			r.rep.Samples = append(r.rep.Samples, s)
		}
	}
	return errors.Join(errs...)
}

// Paired runs of the Service benchmark (Paired.Kind): each pairs two
// paths in alternating slices, so the machine's load cancels out of the
// ratio.
const (
	// PairedClusterIP: axon's ClusterIP (A) against the backend pod IP
	// (B), one client (the ClusterIP path's pod).
	PairedClusterIP = "clusterip"
	// PairedRules: an axon pod's direct connections on the node that runs
	// kube-proxy iptables (A) against an axon pod's on a rules-free node
	// (B), one client process that moves between the two pods.
	PairedRules = "rules"
)

// svcPairing is one paired run: its kind and the paths of its two sides.
type svcPairing struct{ kind, a, b string }

var svcPairings = []svcPairing{
	{PairedClusterIP, PathAxonClusterIP, PathAxonDirect},
	{PairedRules, PathAxonDirectIPT, PathAxonDirect},
}

// unsynced says why path p cannot run at the current level: the kube-proxy
// it needs has not applied it; "" when it can.
func (r *svcRun) unsynced(p svcPath) string {
	if p.Needs != "" && !r.synced[p.Needs] {
		return "skipped: kube-proxy " + p.Needs + " has not applied this level"
	}
	return ""
}

// measurePaired runs each pairing (svcPairings) whose paths can run at this
// level for PairedDuration.
func (r *svcRun) measurePaired(ctx context.Context, level int, paths []svcPath) error {
	var errs []error
	for _, pg := range svcPairings {
		if r.cfg.Pairings != nil && !slices.Contains(r.cfg.Pairings, pg.kind) {
			continue
		}
		var a, b *svcPath
		for i := range paths {
			switch paths[i].Name {
			case pg.a:
				a = &paths[i]
			case pg.b:
				b = &paths[i]
			}
		}
		if a == nil || b == nil || ctx.Err() != nil {
			continue
		}
		pr := Paired{Kind: pg.kind, Services: level, Client: a.Client.Name}
		if why := cmp.Or(r.unsynced(*a), r.unsynced(*b)); why != "" {
			pr.Err = why
			r.rep.Paired = append(r.rep.Paired, pr)
			continue
		}
		d := r.cfg.PairedDuration
		args := []string{"lab", "bench", "_connrate", "paired",
			"--target", a.Target.String(), "--versus", b.Target.String(), "--duration", d.String(), "--slice", "250ms"}
		if a.Client.Name != b.Client.Name {
			pr.Client += " / " + b.Client.Name
			args = append(args, "--target-netns", a.Client.Netns, "--target-cgroup", a.Client.Cgroup,
				"--versus-netns", b.Client.Netns, "--versus-cgroup", b.Client.Cgroup)
		}
		argv := r.tools.Wrap(a.Client.Netns, r.cfg.ClientCPU, append([]string{r.cfg.Axon}, args...)...)
		out, stderr, err := bench.RunClient(ctx, a.Client.Cgroup, argv, d+30*time.Second)
		if r.cfg.OutDir != "" {
			_ = os.WriteFile(filepath.Join(r.cfg.OutDir, "raw", fmt.Sprintf("L%d-paired-%s.json", level, pg.kind)), append(out, stderr...), 0o644)
		}
		if err == nil {
			err = json.Unmarshal(bytes.TrimSpace(out), &pr.Result)
		}
		if err != nil {
			pr.Err = fmt.Sprintf("%v %s", err, clip.String(strings.TrimSpace(string(stderr)), 300))
			r.rep.Paired = append(r.rep.Paired, pr)
			errs = append(errs, fmt.Errorf("%d Services, paired %s: %s", level, pr.Label(), pr.Err))
			continue
		}
		x := pr.Result
		r.progress("[%5d svc paired] %s %.3f (IQR %.3f–%.3f) over %d pairs; %.0f vs %.0f conn/s",
			level, pr.Label(), x.RatioMedian, x.RatioP25, x.RatioP75, x.Pairs, x.A.Rate, x.B.Rate)
		r.rep.Paired = append(r.rep.Paired, pr)
	}
	return errors.Join(errs...)
}

// controlPlane measures, at the last level: EndpointSlice change → applied
// (axon: the pinned map of node1; kube-proxy: its own sync timestamp), then
// full syncs after a restart (axon agent of node2, kube-proxy nftables).
func (r *svcRun) controlPlane(ctx context.Context, level int) (*ControlPlane, error) {
	cp := &ControlPlane{Services: level + 1, Endpoints: r.cfg.Endpoints}
	var errs []error
	before := bench.ReadPressure()
	if r.cfg.Changes > 0 {
		if err := r.measureChanges(ctx, level, cp); err != nil {
			errs = append(errs, err)
		}
	}
	// RSS of the long-running processes after all levels and changes.
	for _, n := range r.nodes {
		if n.Agent != nil {
			if hwm, rss, err := VmHWM(n.Agent.PID); err == nil {
				cp.AgentRSS = append(cp.AgentRSS, RSS{Who: "axon-agent " + n.Name, HWM: hwm, RSS: rss})
			}
		}
	}
	for _, mode := range []string{"nftables", "iptables"} {
		if kp := r.kps[mode]; kp != nil {
			if hwm, rss, err := VmHWM(kp.Proc.PID); err == nil {
				cp.KubeProxyRSS = append(cp.KubeProxyRSS, RSS{Who: "kube-proxy " + mode + " " + kp.Spec.Node, HWM: hwm, RSS: rss})
			}
		}
	}
	if !r.cfg.NoFullSync {
		if err := r.agentFullSync(ctx, level, cp); err != nil {
			errs = append(errs, err)
		}
		for _, mode := range []string{"nftables", "iptables"} {
			if r.kps[mode] == nil {
				cp.Notes = append(cp.Notes, fmt.Sprintf("kube-proxy %s full sync not measured: it had not applied %d Services within %s", mode, level, r.cfg.SyncTimeout))
				continue
			}
			if err := r.kubeProxyFullSync(ctx, mode, cp); err != nil {
				errs = append(errs, err)
			}
		}
	}
	cp.PSIBefore, cp.PSIAfter = before.Avg10, bench.ReadPressure().Avg10
	return cp, errors.Join(errs...)
}

func (r *svcRun) measureChanges(ctx context.Context, level int, cp *ControlPlane) error {
	node1 := r.nodes[0]
	m, err := OpenLBSvcMap(node1.PinDir)
	if err != nil {
		return err
	}
	defer m.Close()
	rng := rand.New(rand.NewPCG(uint64(level), 42))
	r.progress("control plane: %d EndpointSlice changes at %d Services (axon: node1 map; kube-proxy: own sync timestamp)", r.cfg.Changes, level)
	var errs []error
	if err := r.idleChanges(ctx, level, m, rng, cp); err != nil {
		errs = append(errs, err)
	}
	for c := range r.cfg.Changes {
		i := rng.IntN(level)
		ip, ok := r.ips[i]
		if !ok {
			continue
		}
		for _, n := range []int{r.cfg.Endpoints + 1, r.cfg.Endpoints} { // add one endpoint, then remove it again
			change, err := scale.PrepareEndpoints(ctx, r.kube, r.spec, i, n)
			if err != nil {
				return err
			}
			written := time.Now() // the change exists from its write on
			if err := change.Apply(ctx); err != nil {
				return err
			}
			cp.ChangeWrite = append(cp.ChangeWrite, msSince(written))
			var wg sync.WaitGroup
			var mu sync.Mutex
			wg.Go(func() {
				d, err := waitActive(ctx, m, ip, n, written, 30*time.Second)
				own := math.NaN()
				if err == nil {
					own, err = r.agentChangeMs(ctx, node1, written)
				}
				mu.Lock()
				defer mu.Unlock()
				cp.AgentChange = append(cp.AgentChange, own)
				if err != nil {
					errs = append(errs, err)
					cp.AxonChange = append(cp.AxonChange, math.NaN())
					return
				}
				cp.AxonChange = append(cp.AxonChange, d.Seconds()*1e3)
			})
			for _, mode := range []string{"nftables", "iptables"} {
				kp := r.kps[mode]
				if kp == nil {
					continue
				}
				wg.Go(func() {
					mm, err := kp.WaitSynced(ctx, written, 60*time.Second, 20*time.Millisecond)
					v := math.NaN()
					if err == nil {
						v = (mm.LastSync - float64(written.UnixNano())/1e9) * 1e3
					}
					mu.Lock()
					defer mu.Unlock()
					if cp.KubeProxyChange == nil {
						cp.KubeProxyChange = map[string][]float64{}
					}
					cp.KubeProxyChange[mode] = append(cp.KubeProxyChange[mode], v)
				})
			}
			wg.Wait()
		}
		r.progress("  change %d/%d: axon %.1f ms, nftables %.0f ms, iptables %.0f ms", c+1, r.cfg.Changes,
			last(cp.AxonChange), last(cp.KubeProxyChange["nftables"]), last(cp.KubeProxyChange["iptables"]))
	}
	return errors.Join(errs...)
}

// pauseKubeProxies stops (SIGSTOP) every running kube-proxy, so a window
// of axon measurements does not share the CPU with their syncs, and waits
// (at most 30 s) for a rules restore they had already started to finish:
// iptables-restore and nft run as child processes, which the signal does not
// stop, and at 10 000 Services one takes seconds of CPU. The returned
// function resumes them (SIGCONT).
func (r *svcRun) pauseKubeProxies() (resume func()) {
	var pids []int
	for _, mode := range []string{"nftables", "iptables"} {
		if kp := r.kps[mode]; kp != nil && kp.Proc.PID > 0 {
			if err := syscall.Kill(kp.Proc.PID, syscall.SIGSTOP); err == nil {
				pids = append(pids, kp.Proc.PID)
			}
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, pid := range pids {
		for hasChildren(pid) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
	}
	return func() {
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	}
}

// hasChildren reports whether process pid has a running child process
// (from /proc/<pid>/task/*/children).
func hasChildren(pid int) bool {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, t := range tasks {
		if b, err := os.ReadFile(t); err == nil && len(strings.TrimSpace(string(b))) > 0 {
			return true
		}
	}
	return false
}

// waitKubeProxiesIdle waits (at most 90 s) until no kube-proxy has changes
// pending or a sync queued after its last one, so the next window starts
// without a sync in progress.
func (r *svcRun) waitKubeProxiesIdle(ctx context.Context) {
	deadline := time.Now().Add(90 * time.Second)
	for _, mode := range []string{"nftables", "iptables"} {
		kp := r.kps[mode]
		for kp != nil && time.Now().Before(deadline) && ctx.Err() == nil {
			m, err := kp.Metrics(ctx)
			if err == nil && m.EndpointsPending == 0 && m.ServicesPending == 0 && m.LastSync >= m.LastQueued {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// idleChanges measures axon's change latency alone: the kube-proxies are
// first left to finish their syncs, then paused for the window and resumed
// after it (they then apply the window's changes in one sync).
func (r *svcRun) idleChanges(ctx context.Context, level int, m *LBSvcMap, rng *rand.Rand, cp *ControlPlane) error {
	if len(r.kps) == 0 {
		return nil
	}
	r.waitKubeProxiesIdle(ctx)
	resume := r.pauseKubeProxies()
	defer resume()
	cp.AxonChangeIdlePSI[0] = bench.ReadPressure().Avg10
	r.progress("control plane: %d EndpointSlice changes, axon alone (kube-proxies paused)", r.cfg.Changes)
	for range r.cfg.Changes {
		i := rng.IntN(level)
		ip, ok := r.ips[i]
		if !ok {
			continue
		}
		for _, n := range []int{r.cfg.Endpoints + 1, r.cfg.Endpoints} {
			change, err := scale.PrepareEndpoints(ctx, r.kube, r.spec, i, n)
			if err != nil {
				return err
			}
			written := time.Now()
			if err := change.Apply(ctx); err != nil {
				return err
			}
			cp.ChangeIdleWrite = append(cp.ChangeIdleWrite, msSince(written))
			d, err := waitActive(ctx, m, ip, n, written, 30*time.Second)
			if err != nil {
				return err
			}
			cp.AxonChangeIdle = append(cp.AxonChangeIdle, d.Seconds()*1e3)
			own, err := r.agentChangeMs(ctx, r.nodes[0], written) // m is node1's map
			if err != nil {
				return err
			}
			cp.AgentChangeIdle = append(cp.AgentChangeIdle, own)
		}
	}
	cp.AxonChangeIdlePSI[1] = bench.ReadPressure().Avg10
	resume()
	r.progress("  axon alone: p50 %.1f ms, p99 %.1f ms (n=%d); kube-proxies resumed", bench.Percentile(cp.AxonChangeIdle, 50),
		bench.Percentile(cp.AxonChangeIdle, 99), len(cp.AxonChangeIdle))
	r.waitKubeProxiesIdle(ctx)
	return nil
}

// agentChangeMs is how long after written the agent of node finished its
// last map write of a Service change, by its own clock
// (axon_services_last_write_timestamp_seconds, lab.AgentMetricsAddr); call
// it once the map shows the change.
func (r *svcRun) agentChangeMs(ctx context.Context, node labpkg.Node, written time.Time) (float64, error) {
	body, err := kubeproxy.HTTPGetOK(ctx, "/run/netns/"+node.Netns, labpkg.AgentMetricsAddr, "/metrics")
	if err != nil {
		return math.NaN(), fmt.Errorf("agent of %s metrics: %w", node.Name, err)
	}
	ts, err := AgentLastWrite(bytes.NewReader(body))
	if err != nil {
		return math.NaN(), fmt.Errorf("agent of %s metrics: %w", node.Name, err)
	}
	if ts.Before(written) {
		return math.NaN(), fmt.Errorf("agent of %s: the map shows the change but its last write is from %s, before the change (%s)",
			node.Name, ts.Format(time.RFC3339Nano), written.Format(time.RFC3339Nano))
	}
	return ts.Sub(written).Seconds() * 1e3, nil
}

// AgentLastWrite reads axon_services_last_write_timestamp_seconds from an
// agent's Prometheus text exposition.
func AgentLastWrite(r io.Reader) (time.Time, error) {
	fams, err := bench.MetricFamilies(r)
	if err != nil {
		return time.Time{}, err
	}
	f := fams["axon_services_last_write_timestamp_seconds"]
	if f == nil || len(f.GetMetric()) != 1 {
		return time.Time{}, errors.New("no axon_services_last_write_timestamp_seconds (agent older than the benchmark?)")
	}
	m := f.GetMetric()[0]
	v := bench.MetricValue(m)
	if v <= 0 {
		return time.Time{}, errors.New("axon_services_last_write_timestamp_seconds is 0: the agent wrote no Service change yet")
	}
	sec, frac := math.Modf(v)
	return time.Unix(int64(sec), int64(frac*1e9)), nil
}

// msSince is the time since t in milliseconds.
func msSince(t time.Time) float64 { return time.Since(t).Seconds() * 1e3 }

func last(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	return xs[len(xs)-1]
}

// waitActive polls the pinned map (every 500 µs) until addr:80 has want
// active backends; it returns the time since written.
func waitActive(ctx context.Context, m *LBSvcMap, addr netip.Addr, want int, written time.Time, timeout time.Duration) (time.Duration, error) {
	deadline := written.Add(timeout)
	for {
		act, ok, err := m.Active(addr, scale.ServicePort)
		if err != nil {
			return 0, err
		}
		if ok && act == want {
			return time.Since(written), nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return 0, fmt.Errorf("%s:%d did not reach %d active backends in the BPF map within %s (has %d)", addr, scale.ServicePort, want, timeout, act)
		}
		time.Sleep(500 * time.Microsecond)
	}
}

// agentTook matches the agent's "services synced ... writer=true ... took=1.2s"
// log line (with writer=false the agent only built its table).
var agentTook = regexp.MustCompile(`msg="services synced".*\bwriter=true\b.*\btook=(\S+)`)

// agentFullSync restarts node2's agent with its socket-LB maps unpinned, so
// the new agent starts from empty maps and writes everything: process start
// → every Service in the new pinned map. The programs attached to node2's
// cgroup keep the old maps until the new agent swaps them in place.
func (r *svcRun) agentFullSync(ctx context.Context, level int, cp *ControlPlane) error {
	n := r.nodes[1]
	r.progress("control plane: axon agent full sync on %s (maps unpinned, agent restarted)", n.Name)
	for _, name := range LBMapNames {
		if err := os.Remove(filepath.Join(n.PinDir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("unpin %s: %w", name, err)
		}
	}
	want := []netip.Addr{r.target}
	for i := range level {
		if ip, ok := r.ips[i]; ok {
			want = append(want, ip)
		}
	}
	// the kube-proxies sit idle meanwhile (not in a sync of their own)
	r.waitKubeProxiesIdle(ctx)
	resume := r.pauseKubeProxies()
	defer resume()
	cp.AgentFullSyncIdle = len(r.kps) > 0
	t0 := time.Now()
	restarted := make(chan error, 1)
	go func() { restarted <- r.l.RestartAgent(ctx, n.Name) }()
	// Poll the pin path: the old map is unpinned, so whatever appears there
	// is the new agent's map; done when every ClusterIP has its endpoints.
	deadline := t0.Add(r.cfg.SyncTimeout)
	var done time.Time
	for done.IsZero() {
		if m, err := OpenLBSvcMap(n.PinDir); err == nil {
			missing := 0
			for k, ip := range want {
				wantN := r.cfg.Endpoints
				if k == 0 {
					wantN = 1 // the target Service: the server pod
				}
				if act, ok, err := m.Active(ip, scale.ServicePort); err != nil || !ok || act != wantN {
					missing++
					break
				}
			}
			if missing == 0 {
				done = time.Now()
				cp.AgentMapMasters, _ = m.Masters()
			}
			m.Close()
		}
		if done.IsZero() {
			if time.Now().After(deadline) || ctx.Err() != nil {
				<-restarted
				return fmt.Errorf("agent on %s: not every Service in the new BPF map within %s", n.Name, r.cfg.SyncTimeout)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	if err := <-restarted; err != nil {
		return fmt.Errorf("restart agent on %s: %w", n.Name, err)
	}
	cp.AgentFullSync = done.Sub(t0)
	if c, err := r.l.Agent(n.Name); err == nil {
		if rep, err := c.Services(ctx); err == nil {
			cp.AgentFrontends, cp.AgentBackends = rep.Frontends, rep.Backends
		}
	}
	st := r.l.State()
	if a := st.Nodes[1].Agent; a != nil {
		if hwm, rss, err := VmHWM(a.PID); err == nil {
			cp.AgentRSS = append(cp.AgentRSS, RSS{Who: "axon-agent " + n.Name + " after full sync", HWM: hwm, RSS: rss})
		}
		if d, ok := lastAgentTook(a.Log); ok {
			cp.AgentLoggedSync = d
		}
		if start, err := proc.StartTime(a.PID); err == nil && start.After(t0) {
			cp.AgentStartToSynced = done.Sub(start)
		}
	}
	r.progress("  axon agent: restart → %d Services in the new BPF map: %s (process start → map %s; agent's own table build + write %s), %d frontends in the map",
		len(want), cp.AgentFullSync.Round(time.Millisecond), cp.AgentStartToSynced.Round(time.Millisecond), cp.AgentLoggedSync.Round(time.Millisecond), cp.AgentMapMasters)
	return nil
}

func lastAgentTook(logPath string) (time.Duration, bool) {
	f, err := os.Open(logPath)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	var d time.Duration
	found := false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if m := agentTook.FindStringSubmatch(sc.Text()); m != nil {
			if v, err := time.ParseDuration(m[1]); err == nil {
				d, found = v, true
			}
		}
	}
	return d, found
}

// kubeProxyFullSync restarts kube-proxy (mode) and measures process start →
// first complete sync, with kube-proxy's own logged sync time and its RSS.
func (r *svcRun) kubeProxyFullSync(ctx context.Context, mode string, cp *ControlPlane) error {
	kp := r.kps[mode]
	r.progress("control plane: kube-proxy %s full sync on %s (restarted)", mode, kp.Spec.Node)
	if err := kp.Stop(); err != nil {
		return err
	}
	t0 := time.Now()
	nkp, err := StartKubeProxy(kp.Spec)
	if err != nil {
		r.kps[mode] = nil
		return err
	}
	r.kps[mode] = nkp
	fs := FullSync{Mode: mode}
	m, err := nkp.WaitSynced(ctx, t0, r.cfg.SyncTimeout, 50*time.Millisecond)
	if err != nil {
		fs.Err = err.Error()
	} else {
		fs.StartToSynced = time.Duration((m.LastSync - float64(t0.UnixNano())/1e9) * 1e9)
		if times, err := r.syncTimes(mode, t0); err == nil && len(times) > 0 {
			fs.Logged = times[0]
		}
		time.Sleep(time.Second) // let a follow-up sync happen before reading the peak RSS
		fs.HWM, fs.RSS, _ = VmHWM(nkp.Proc.PID)
	}
	cp.KubeProxyFullSync = append(cp.KubeProxyFullSync, fs)
	r.progress("  kube-proxy %s: start → synced %s (logged SyncProxyRules %s), VmHWM %.0f MiB %s", mode,
		fs.StartToSynced.Round(time.Millisecond), fs.Logged.Round(time.Millisecond), float64(fs.HWM)/(1<<20), fs.Err)
	return nil
}

// cleanup removes everything the run added, also after a failure: the
// kube-proxies and their rules, the server, the pods, the target Service and
// the cgroup first, the generated Services last (20 000 deletes take minutes
// on a busy apiserver; LeaveObjects skips them and the rules when the lab
// goes down next).
func (r *svcRun) cleanup() error {
	step := func(d time.Duration) (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), d)
	}
	var errs []error
	if r.server != nil {
		r.server.Stop()
	}
	for mode, kp := range r.kps {
		if kp == nil {
			continue
		}
		if err := kp.Stop(); err != nil {
			errs = append(errs, err)
		}
		if !r.cfg.Keep && !r.cfg.LeaveObjects { // lab down removes the node namespaces with their rules
			ctx, cancel := step(2 * time.Minute)
			if err := kp.Cleanup(ctx); err != nil {
				errs = append(errs, fmt.Errorf("kube-proxy %s rules: %w", mode, err))
			}
			cancel()
		}
	}
	if r.cfg.Keep {
		return errors.Join(errs...)
	}
	for name := range r.pods {
		ctx, cancel := step(time.Minute)
		if err := r.l.DeletePod(ctx, name); err != nil {
			errs = append(errs, fmt.Errorf("remove pod %s: %w", name, err))
		}
		cancel()
	}
	ctx, cancel := step(time.Minute)
	for _, del := range []func() error{
		func() error {
			return r.kube.CoreV1().Services(TargetNamespace).Delete(ctx, TargetName, metav1.DeleteOptions{})
		},
		func() error {
			return r.kube.DiscoveryV1().EndpointSlices(TargetNamespace).Delete(ctx, TargetName, metav1.DeleteOptions{})
		},
	} {
		if err := del(); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	cancel()
	if r.noLB != "" {
		if err := os.Remove(r.noLB); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", r.noLB, err))
		}
	}
	if r.cfg.LeaveObjects {
		r.progress("leaving the generated Services in namespace %s (--leave-objects): axon lab down removes them", svcScaleNamespace)
		return errors.Join(errs...)
	}
	r.progress("removing the generated Services and EndpointSlices")
	ctx, cancel = step(30 * time.Minute)
	defer cancel()
	if _, err := scale.Delete(ctx, r.kube, svcScaleNamespace, 16); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// ParseLevels parses a list of Service counts such as "10,1000,10k".
func ParseLevels(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		f = strings.ReplaceAll(f, "_", "")
		mult := 1
		if strings.HasSuffix(f, "k") {
			mult, f = 1000, strings.TrimSuffix(f, "k")
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("service count %q: want a positive number such as 10, 1000 or 10k", f)
		}
		out = append(out, n*mult)
	}
	if len(out) == 0 {
		return nil, errors.New("no service counts given: e.g. --services 10,1000,10000")
	}
	if !slices.IsSorted(out) {
		return nil, fmt.Errorf("service counts %v must be ascending (levels are cumulative)", out)
	}
	return out, nil
}
