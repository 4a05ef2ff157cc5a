package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"golang.org/x/sys/unix"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/ipam"
)

// Version is reported in Status; set by the main package at link time.
var Version = "dev"

// errWaitUplink: the uplink can only be found from the Node's InternalIP.
var errWaitUplink = errors.New("no default route in this netns and the Node's InternalIP is not known yet (waiting for kube-apiserver): pass --uplink to start without it")

// Agent is the state of a running axon-agent. It implements api.Handler.
type Agent struct {
	cfg  Config
	log  *slog.Logger
	nl   *netlink.Handle
	rt   *routeTable
	reg  *registry
	ipam *ipam.Allocator
	kube *kube        // nil until the kube client is built
	svc  *serviceSync // issue 4: Service watch; set in run before the API serves
	load func(uplink string) (dataplane, error)

	sock *socketLB // socket load balancer (socklb.go, optout.go)

	nport *nodePort // north-south LB (nodeport*.go)

	bw *bandwidth // Bandwidth Manager (bandwidth.go)

	trigger chan struct{} // coalesced "reconcile now"

	// dpMu serialises every write to the dataplane, routes and IPAM pools:
	// API handlers and the reconcile loop.
	dpMu sync.Mutex
	dp   dataplane // nil until loaded
	// dpView publishes dp for lock-free read-only use (status).
	dpView atomic.Pointer[dataplane]
	// attached: pod devices this process attached (name → ifindex); the
	// reconcile re-attaches only new or re-created devices.
	attached map[string]int

	// stMu guards the status fields below.
	stMu        sync.Mutex
	uplink      string // in use; "" until resolved
	savedUplink string // from node.json, used only while kube-apiserver is not synced
	dpErr       string // why the datapath is not loaded
	podCIDRs    []netip.Prefix
	cidrErr     string // why podCIDRs are unknown
	routes      int
	routeErr    string
	warnings    []string          // problems with other Nodes (skipped routes)
	sysWarn     []string          // host problems found at start
	reconciles  map[string]uint64 // result → count
}

// nodeState is what the agent remembers across restarts (state-dir/node.json)
// so that a restart without kube-apiserver still knows its pools and uplink.
type nodeState struct {
	PodCIDRs []netip.Prefix `json:"podCIDRs"`
	Uplink   string         `json:"uplink"`
}

// Run starts the agent and blocks until ctx is done. On return pinned BPF
// maps and links stay in place: forwarding continues while the agent is down.
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	a, err := newAgent(cfg, log, loadDatapath(cfg, log))
	if err != nil {
		return err
	}
	defer a.close()
	return a.run(ctx)
}

func newAgent(cfg Config, log *slog.Logger, load func(string) (dataplane, error)) (*Agent, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid configuration: %w", err)
	}
	if log == nil {
		log = slog.Default()
	}
	a := &Agent{cfg: cfg, log: log, load: load, trigger: make(chan struct{}, 1), attached: map[string]int{}, reconciles: map[string]uint64{}}
	warns, err := ensureForwarding()
	if err != nil {
		return nil, err
	}
	for _, w := range warns {
		log.Warn(w)
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("create --state-dir %s: %w", cfg.StateDir, err)
	}
	if a.nl, err = netlink.NewHandle(unix.NETLINK_ROUTE); err != nil { // route only: xfrm/netfilter sockets fail on kernels without those modules
		return nil, fmt.Errorf("open netlink: %w", err)
	}
	a.rt = &routeTable{h: a.nl, log: log}
	if a.reg, err = openRegistry(cfg.StateDir, log); err != nil {
		a.nl.Close()
		return nil, err
	}
	if a.ipam, err = ipam.New(filepath.Join(cfg.StateDir, "ipam"), log); err != nil {
		a.nl.Close()
		return nil, fmt.Errorf("open ipam: %w", err)
	}
	a.sock = newSocketLB(cfg, log, a.nl, a.reg, a.kubeClient, a.kick)
	a.nport = &nodePort{cfg: cfg, log: log, nl: a.nl, kube: a.kubeClient}
	a.bw = newBandwidth(cfg, log, a.reg, a.kubeClient)
	if st, err := a.readNodeState(); err != nil {
		log.Warn("ignoring saved node state", "error", err)
	} else {
		if len(st.PodCIDRs) > 0 {
			if err := a.ipam.SetPools(st.PodCIDRs); err == nil {
				a.podCIDRs = st.PodCIDRs
			}
		}
		a.savedUplink = st.Uplink
	}
	if cfg.Uplink != "" {
		a.uplink = cfg.Uplink
	}
	return a, nil
}

func (a *Agent) close() {
	a.dpMu.Lock()
	if a.dp != nil {
		if err := a.dp.Close(); err != nil {
			a.log.Warn("close datapath", "error", err)
		}
		a.dp = nil
		a.dpView.Store(nil)
	}
	a.dpMu.Unlock()
	a.sock.close()
	a.nport.close()
	a.ipam.Close()
	a.nl.Close()
}

func (a *Agent) run(ctx context.Context) error {
	started := time.Now()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()

	// A bad --kubeconfig is a start-up error; an unreachable server is not.
	rc, err := restConfig(a.cfg.Kubeconfig)
	if err != nil {
		return err
	}
	// issue 4: watch Services and EndpointSlices into the lb table (watch
	// only until SetLBWriter attaches the datapath's writer).
	if a.svc, err = newServiceSync(rc, a.cfg.NodeName, a.log.With("component", "services")); err != nil {
		return err
	}
	a.svc.onSynced = a.kick // the north-south LB waits for it (servicesFirst)
	a.sock.svc = a.svc
	a.nport.svc, a.nport.started = a.svc, started
	errc := make(chan error, 2)
	ln, err := api.Listen(a.cfg.Socket)
	if err != nil {
		return err
	}
	ln.Close() // only to fail fast on a socket in use; Serve listens again
	wg.Go(func() {
		if err := api.Serve(ctx, a.cfg.Socket, a, a.log); err != nil {
			errc <- err
		}
	})
	if a.cfg.HealthAddr != "" {
		srv, err := a.healthServer()
		if err != nil {
			cancel()
			return err
		}
		wg.Go(func() {
			<-ctx.Done()
			sctx, c := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Second)
			defer c()
			srv.Shutdown(sctx)
		})
	}

	k, err := newKube(rc, a.cfg.NodeName, a.log, a.kick)
	if err != nil {
		cancel()
		return err
	}
	if err := a.svc.watchHostPorts(k); err != nil { // issue 7: Pod hostPorts (hostport.go)
		cancel()
		return err
	}
	a.stMu.Lock()
	a.kube = k
	a.stMu.Unlock()
	wg.Go(func() { k.run(ctx, a.kick) })
	wg.Go(func() { a.svc.run(ctx) })   // issue 4
	wg.Go(func() { a.nport.run(ctx) }) // health checks, conntrack GC
	wg.Go(func() { a.bw.loop(ctx) })   // keeps fq on the uplink

	a.log.Info("axon-agent started", "node", a.cfg.NodeName, "version", Version, "socket", a.cfg.Socket,
		"state", a.cfg.StateDir, "bpf", a.cfg.BPFRoot, "kube-apiserver", rc.Host)
	a.reconcileLoop(ctx, errc)
	cancel()
	select {
	case err := <-errc:
		return err
	default:
	}
	a.log.Info("axon-agent stopping; BPF programs stay attached and keep forwarding")
	return nil
}

// kick asks for a reconcile soon; calls coalesce.
func (a *Agent) kick() {
	select {
	case a.trigger <- struct{}{}:
	default:
	}
}

func (a *Agent) reconcileLoop(ctx context.Context, errc chan error) {
	tick := time.NewTicker(a.cfg.ReconcileInterval)
	defer tick.Stop()
	retry := time.NewTimer(0) // first pass right away
	var lastErr string
	var lastLog time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case err := <-errc:
			errc <- err
			return
		case <-tick.C:
		case <-retry.C:
		case <-a.trigger:
			// let a burst of informer events settle
			select {
			case <-time.After(50 * time.Millisecond):
			case <-ctx.Done():
				return
			}
			select {
			case <-a.trigger:
			default:
			}
		}
		err := a.reconcile()
		if err != nil {
			retry.Reset(5 * time.Second)
		}
		lastErr, lastLog = a.logReconcile(err, lastErr, lastLog)
	}
}

// logReconcile logs a failed pass once per distinct error and then at most
// once a minute (retries run every 5 s), and the recovery.
func (a *Agent) logReconcile(err error, lastErr string, lastLog time.Time) (string, time.Time) {
	switch {
	case err == nil && lastErr != "":
		a.log.Info("reconcile succeeded again")
		return "", time.Time{}
	case err == nil:
		return "", lastLog
	case err.Error() == lastErr && time.Since(lastLog) < time.Minute:
		a.log.Debug("reconcile incomplete; retrying in 5s", "error", err)
		return lastErr, lastLog
	case errors.Is(err, errWaitUplink):
		a.log.Info("datapath waits for the uplink; retrying in 5s", "reason", err.Error())
	default:
		a.log.Warn("reconcile incomplete; retrying in 5s", "error", err)
	}
	return err.Error(), time.Now()
}

// reconcile brings datapath, pools and routes to the desired state. It is
// idempotent and never removes state that is still desired.
func (a *Agent) reconcile() error {
	a.dpMu.Lock()
	defer a.dpMu.Unlock()
	var errs []error
	if k := a.kubeClient(); k != nil && k.isSynced() {
		if err := a.reconcileNodes(k); err != nil {
			errs = append(errs, err)
		}
	}
	if err := a.ensureDatapath(); err != nil {
		errs = append(errs, err)
	} else {
		if err := a.reconcileEndpoints(); err != nil {
			errs = append(errs, err)
		}
		a.sock.ensure() // never fails the pass, see status
		a.stMu.Lock()
		uplink := a.uplink
		a.stMu.Unlock()
		// these never fail the pass: see status
		a.nport.ensure(uplink, a.sock.writer(), a.podsRoutedByBPF())
		a.bw.reconcile(uplink)
	}
	a.stMu.Lock()
	if len(errs) == 0 {
		a.reconciles["ok"]++
	} else {
		a.reconciles["error"]++
	}
	a.stMu.Unlock()
	return errors.Join(errs...)
}

func (a *Agent) kubeClient() *kube {
	a.stMu.Lock()
	defer a.stMu.Unlock()
	return a.kube
}

// ensureDatapath loads the BPF datapath once the uplink is known. Called
// with dpMu held.
func (a *Agent) ensureDatapath() error {
	if a.dp != nil {
		return nil
	}
	uplink, err := a.resolveUplink()
	if err == nil {
		var dp dataplane
		if dp, err = a.load(uplink); err == nil {
			a.dp = dp
			a.dpView.Store(&dp)
			a.stMu.Lock()
			a.dpErr = ""
			a.stMu.Unlock()
			a.saveNodeState()
			for _, d := range dp.Decisions() {
				a.log.Info("datapath decision", "name", d.Name, "value", d.Value, "reason", d.Reason)
			}
			return nil
		}
		err = fmt.Errorf("load datapath on uplink %s: %w", uplink, err)
	}
	a.stMu.Lock()
	a.dpErr = err.Error()
	a.stMu.Unlock()
	return err
}

// resolveUplink picks the uplink once: --uplink; else the device of the
// default route; else the device holding the Node's InternalIP; else, while
// kube-apiserver is not synced, the uplink saved by the previous run.
func (a *Agent) resolveUplink() (string, error) {
	a.stMu.Lock()
	up, saved := a.uplink, a.savedUplink
	a.stMu.Unlock()
	if up != "" {
		if _, ok := lookupLink(a.nl, up); !ok {
			return "", fmt.Errorf("uplink device %q not found in this network namespace: check --uplink", up)
		}
		return up, nil
	}
	up, how, err := a.detectUplink(saved)
	if err != nil {
		return "", err
	}
	a.stMu.Lock()
	a.uplink = up
	a.stMu.Unlock()
	a.log.Info("uplink detected", "device", up, "from", how)
	return up, nil
}

func (a *Agent) detectUplink(saved string) (dev, how string, err error) {
	if dev, err = defaultRouteDevice(a.nl); err != nil || dev != "" {
		return dev, "default route", err
	}
	k := a.kubeClient()
	if k == nil || !k.isSynced() {
		if _, ok := lookupLink(a.nl, saved); saved != "" && ok {
			return saved, "state of the previous run (kube-apiserver not synced yet)", nil
		}
		return "", "", errWaitUplink
	}
	n, err := k.nodes.Get(a.cfg.NodeName)
	if err != nil {
		return "", "", fmt.Errorf("no default route, and own Node %s: %w: pass --uplink", a.cfg.NodeName, err)
	}
	if dev, err = deviceWithAddr(a.nl, InternalIPs(n.Status)); err != nil {
		return "", "", err
	}
	if dev == "" {
		return "", "", fmt.Errorf("no default route and no device holds Node %s's InternalIP %v: pass --uplink", a.cfg.NodeName, InternalIPs(n.Status))
	}
	return dev, "Node InternalIP", nil
}

// reconcileNodes updates pools from the own Node and routes to the others.
// Called with dpMu held, only once the Node cache is synced (an empty cache
// must never delete routes).
func (a *Agent) reconcileNodes(k *kube) error {
	list, err := k.nodes.List(labels.Everything())
	if err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	var nodes []NodeInfo
	var problems []string
	var own *NodeInfo
	for _, n := range list {
		ni, err := nodeInfo(n)
		if err != nil {
			problems = append(problems, err.Error())
		}
		nodes = append(nodes, ni)
		if n.Name == a.cfg.NodeName {
			own = &ni
		}
	}
	var errs []error
	switch {
	case own == nil:
		a.setCIDRs(nil, fmt.Sprintf("node %s not found in kube-apiserver: check --node-name, or create the Node", a.cfg.NodeName))
	case len(own.PodCIDRs) == 0:
		a.setCIDRs(nil, noPodCIDRMessage(a.cfg.NodeName))
	default:
		if err := a.ipam.SetPools(own.PodCIDRs); err != nil {
			msg := fmt.Sprintf("node %s podCIDRs %v unusable: %v", a.cfg.NodeName, own.PodCIDRs, err)
			a.setCIDRs(nil, msg)
			errs = append(errs, errors.New(msg))
		} else if a.setCIDRs(own.PodCIDRs, "") {
			a.log.Info("podCIDRs set", "node", a.cfg.NodeName, "podCIDRs", own.PodCIDRs)
			a.saveNodeState()
		}
	}

	a.nport.setClusterPrefixes(nodes) // north-south LB: in-cluster clients get SNAT, not DSR

	a.stMu.Lock()
	up := a.uplink
	a.stMu.Unlock()
	if up == "" {
		if up, err = a.resolveUplink(); err != nil {
			return errors.Join(append(errs, err)...)
		}
	}
	li, ok := lookupLink(a.nl, up)
	if !ok {
		return errors.Join(append(errs, fmt.Errorf("uplink %s not found: routes not programmed", up))...)
	}
	var ownCIDRs []netip.Prefix
	if own != nil {
		ownCIDRs = own.PodCIDRs
	}
	desired, rproblems := DesiredRoutes(a.cfg.NodeName, ownCIDRs, nodes, li.Index)
	problems = append(problems, rproblems...)
	current, err := a.rt.Current()
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	plan := DiffRoutes(desired, current)
	rerr := a.rt.Apply(plan)
	if rerr != nil {
		errs = append(errs, rerr)
	}
	a.stMu.Lock()
	if !slices.Equal(problems, a.warnings) {
		for _, p := range problems {
			a.log.Warn(p)
		}
	}
	a.warnings = problems
	a.routes = len(desired)
	a.routeErr = ""
	if rerr != nil {
		a.routeErr = rerr.Error()
	}
	a.stMu.Unlock()
	return errors.Join(errs...)
}

// setCIDRs records the pools or why they are unknown; true when they changed.
// A Node that loses its podCIDRs keeps the old pools in IPAM (existing pods
// keep their addresses) but the agent reports not ready.
func (a *Agent) setCIDRs(cidrs []netip.Prefix, why string) bool {
	a.stMu.Lock()
	defer a.stMu.Unlock()
	changed := !slices.Equal(cidrs, a.podCIDRs) || why != a.cidrErr
	if why != "" && why != a.cidrErr {
		a.log.Warn(why)
	}
	if cidrs != nil || why != "" {
		a.podCIDRs = cidrs
	}
	a.cidrErr = why
	return changed
}

// reconcileEndpoints makes the endpoint map match the registry. Called with
// dpMu held and the datapath loaded.
func (a *Agent) reconcileEndpoints() error {
	eps := a.reg.List()
	var errs []error
	lookup := func(name string) (linkInfo, bool) { return lookupLink(a.nl, name) }
	for _, ep := range eps {
		li, ok := lookup(ep.HostIfName)
		if !ok || a.attached[ep.HostIfName] == li.Index {
			continue
		}
		if err := a.dp.AttachPod(ep.HostIfName); err != nil {
			errs = append(errs, fmt.Errorf("attach %s (%s/%s): %w", ep.HostIfName, ep.ContainerID, ep.IfName, err))
			continue
		}
		a.attached[ep.HostIfName] = li.Index
	}
	desired := DesiredEntries(eps, lookup)
	current, err := a.dp.Endpoints()
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("read endpoint map: %w", err))...)
	}
	upsert, del := DiffEndpoints(desired, current)
	for _, e := range upsert {
		if err := a.dp.UpsertEndpoint(e); err != nil {
			errs = append(errs, fmt.Errorf("write endpoint %s: %w", e.IP, err))
			continue
		}
		a.log.Info("endpoint map entry written", "ip", e.IP, "ifindex", e.IfIndex)
	}
	for _, ip := range del {
		if err := a.dp.DeleteEndpoint(ip); err != nil {
			errs = append(errs, fmt.Errorf("delete endpoint %s: %w", ip, err))
			continue
		}
		a.log.Info("stale endpoint map entry deleted", "ip", ip)
	}
	return errors.Join(errs...)
}

func (a *Agent) statePath() string { return filepath.Join(a.cfg.StateDir, "node.json") }

func (a *Agent) readNodeState() (nodeState, error) {
	var st nodeState
	b, err := os.ReadFile(a.statePath())
	if errors.Is(err, fs.ErrNotExist) {
		return st, nil
	}
	if err != nil {
		return st, fmt.Errorf("read %s: %w", a.statePath(), err)
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("parse %s: %w", a.statePath(), err)
	}
	return st, nil
}

func (a *Agent) saveNodeState() {
	a.stMu.Lock()
	st := nodeState{PodCIDRs: a.podCIDRs, Uplink: a.uplink}
	a.stMu.Unlock()
	b, _ := json.MarshalIndent(st, "", "  ")
	if err := writeFileAtomic(a.statePath(), b); err != nil {
		a.log.Warn("save node state", "error", err)
	}
}

// podsRoutedByBPF reports whether the pod datapath is loaded with BPF host
// routing (axon_uplink_ingress on the uplink, its maps pinned under
// BPFRoot): the north-south LB then delivers pod-bound TCP and UDP itself
// (datapath.NodePortOptions.DeliverPods). Before the datapath is loaded it
// is false, and the uplink program delivers everything.
func (a *Agent) podsRoutedByBPF() bool {
	v := a.dpView.Load()
	return v != nil && (*v).HostRouting() == datapath.RoutingBPF
}
