package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/ipam"
	"github.com/axonhq/axon/internal/kubemetrics"
)

// Version is reported in Status; set by the main package at link time.
var Version = "dev"

// Agent is a running axon-agent, the composition root of its features:
// it builds them, runs the reconcile loop that drives them, and dispatches
// the local API (api.Handler and the feature handlers) to them. Every
// feature owns its state and its lock (see the package comment for the
// lock order); the fields of Agent itself are set before run starts the
// goroutines and only read afterwards.
type Agent struct {
	cfg  Config
	log  *slog.Logger
	nl   *netlink.Handle
	reg  *registry
	ipam *ipam.Allocator

	st    *nodeStatus    // uplink, podCIDRs, kube client (status.go)
	rt    *routeTable    // routes to other nodes' pods (routes.go)
	pods  *podDatapath   // tc datapath and endpoint map (pods.go)
	svc   *serviceSync   // Service watch (services.go); set in run before the API serves
	sock  *socketLB      // socket load balancer (socklb.go, optout.go)
	nport *nodePort      // north-south LB (nodeport*.go)
	bw    *bandwidth     // Bandwidth Manager (bandwidth.go)
	sm    *sockBypass    // same-node TCP bypass (sockmap.go)
	vm    *vmBypass      // VM-pod bridge bypass (vmbypass.go)
	drops *dropMonitor   // drop counters and events (drops.go)
	kp    kubeProxyPorts // kube-proxy's healthz and metrics ports (kubeproxy.go)

	trigger chan struct{} // coalesced "reconcile now"
	started time.Time     // when run started (liveness before the first pass)
}

// Run starts the agent and blocks until ctx is done. On return pinned BPF
// maps and links stay in place: forwarding continues while the agent is down.
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	// client-go's metric hooks are per process and must be set before the
	// Service workqueue is made; /metrics exports them (healthServer).
	kubemetrics.Install()
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
	a := &Agent{cfg: cfg, log: log, st: &nodeStatus{}, trigger: make(chan struct{}, 1), drops: newDropMonitor(cfg.BPFRoot, log)}
	if !cfg.bypassOnly() { // bypass-only: the node's CNI owns forwarding
		warns, err := ensureForwarding()
		if err != nil {
			return nil, err
		}
		for _, w := range warns {
			log.Warn(w)
		}
	}
	var err error
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("create --state-dir %s: %w", cfg.StateDir, err)
	}
	if a.nl, err = netlink.NewHandle(unix.NETLINK_ROUTE); err != nil { // route only: xfrm/netfilter sockets fail on kernels without those modules
		return nil, fmt.Errorf("open netlink: %w", err)
	}
	if a.reg, err = openRegistry(cfg.StateDir, log); err != nil {
		a.nl.Close()
		return nil, err
	}
	if a.ipam, err = ipam.New(filepath.Join(cfg.StateDir, "ipam"), log); err != nil {
		a.nl.Close()
		return nil, fmt.Errorf("open ipam: %w", err)
	}
	a.rt = &routeTable{h: a.nl, log: log}
	a.pods = newPodDatapath(load, a.nl, a.reg, a.ipam, a.st.uplinkInUse, log)
	a.sock = newSocketLB(cfg, log, a.nl, a.reg, a.st.kubeClient, a.kick)
	a.nport = &nodePort{cfg: cfg, log: log, nl: a.nl, kube: a.st.kubeClient}
	a.bw = newBandwidth(cfg, log, a.reg, a.st.kubeClient)
	a.sm = newSockBypass(cfg, log, a.reg, a.st.kubeClient)
	a.vm = newVMBypass(cfg, log, a.reg, a.st.kubeClient)
	a.sock.vmTaps = a.vm.taps
	if st, err := a.readNodeState(); err != nil {
		log.Warn("ignoring saved node state", "error", err)
	} else {
		if len(st.PodCIDRs) > 0 {
			if err := a.ipam.SetPools(st.PodCIDRs); err == nil {
				a.st.podCIDRs = st.PodCIDRs
			}
		}
		a.st.savedUplink = st.Uplink
	}
	if cfg.Uplink != "" {
		a.st.uplink = cfg.Uplink
	}
	return a, nil
}

func (a *Agent) close() {
	a.drops.close()
	a.pods.close()
	a.sock.close()
	a.sm.close()
	a.vm.close()
	a.nport.close()
	a.ipam.Close()
	a.nl.Close()
}

func (a *Agent) run(ctx context.Context) error {
	started := time.Now()
	a.started = started
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()

	// A bad --kubeconfig or --k8s-api-server is a start-up error; an
	// unreachable server is not.
	rc, err := a.cfg.restConfig() // apiserver.go
	if err != nil {
		return err
	}
	// watch Services and EndpointSlices into the lb table (watch only until
	// the socket LB or the north-south LB attaches its writer)
	if a.svc, err = newServiceSync(rc, a.cfg.NodeName, a.log.With("component", "services")); err != nil {
		return err
	}
	a.svc.onSynced = a.kick // the north-south LB waits for it (servicesFirst)
	a.sock.svc = a.svc
	a.sm.svc = a.svc
	// Namespace annotations (the socket LB opt-out, the sockmap opt-out)
	// take effect at the next reconcile
	a.svc.setNamespaceHook(a.kick)
	a.nport.svc, a.nport.started = a.svc, started
	errc := make(chan error, 2)
	ln, err := api.Listen(a.cfg.Socket, a.cfg.apiAccess())
	if err != nil {
		return err
	}
	ln.Close() // only to fail fast on a socket in use; Serve listens again
	wg.Go(func() {
		if err := api.Serve(ctx, a.cfg.Socket, a, a.log, a.cfg.apiAccess()); err != nil {
			errc <- err
		}
	})
	reg, err := a.metricsRegistry()
	if err != nil {
		cancel()
		return err
	}
	if a.cfg.HealthAddr != "" {
		srv, err := a.healthServer(reg)
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
	a.serveKubeProxyPorts(ctx, &wg, reg) // kubeproxy.go; off unless configured

	k, err := newKube(rc, a.cfg.NodeName, a.log, a.kick)
	if err != nil {
		cancel()
		return err
	}
	k.probeEvery = a.cfg.APIServerProbeInterval
	if !a.cfg.bypassOnly() {
		if err := a.svc.watchHostPorts(k); err != nil { // Pod hostPorts (hostport.go)
			cancel()
			return err
		}
	}
	a.st.setKube(k)
	wg.Go(func() { k.run(ctx, a.kick) })
	wg.Go(func() { a.svc.run(ctx) }) // Namespaces (opt-outs) and Events; Services are only watched until a writer attaches
	if !a.cfg.bypassOnly() {
		wg.Go(func() { a.nport.run(ctx) }) // health checks, Events, conntrack GC
		wg.Go(func() { a.bw.loop(ctx) })   // keeps fq on the uplink
	}

	a.log.Info("axon-agent started", "mode", cmp.Or(a.cfg.Mode, ModeFull), "node", a.cfg.NodeName, "version", Version, "socket", a.cfg.Socket,
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
		err := a.reconcile(ctx)
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

// reconcile brings this node, the pod datapath and every feature to the
// desired state, one feature after the other (each takes its own lock). It
// is idempotent and never removes state that is still desired.
func (a *Agent) reconcile(ctx context.Context) error {
	if a.cfg.bypassOnly() {
		// another CNI networks the pods: no routes, no pod datapath, no
		// other feature; the bypass never fails the pass (see status)
		a.sm.ensure(ctx)
		a.st.countReconcile(nil)
		return nil
	}
	var errs []error
	if k := a.st.kubeClient(); k != nil && k.isSynced() {
		if err := a.reconcileNodes(k); err != nil {
			errs = append(errs, err)
		}
	}
	if err := a.ensureDatapath(); err != nil {
		errs = append(errs, err)
	} else {
		if err := a.pods.reconcileEndpoints(); err != nil {
			errs = append(errs, err)
		}
		// these never fail the pass: see status
		uplink := a.st.uplinkInUse()
		a.vm.reconcile() // before the socket LB: its pod LBs follow the VM bypasses' taps
		a.sock.ensure()
		a.nport.ensure(uplink, a.sock.writer(), a.pods.routedByBPF())
		a.bw.reconcile(uplink)
		a.sm.ensure(ctx)
	}
	if a.notReady() == "" {
		// ready to serve CNI ADD (a failed route to another node does not
		// change that): now the runtime may use axon (cniconf.go)
		if wrote, err := a.cfg.ensureCNIConf(); err != nil {
			errs = append(errs, err)
		} else if wrote {
			a.log.Info("CNI configuration written", "path", filepath.Join(a.cfg.CNIConfDir, CNIConfFile))
		}
	}
	err := errors.Join(errs...)
	a.st.countReconcile(err)
	return err
}

// ensureDatapath loads the pod datapath once the uplink is known.
func (a *Agent) ensureDatapath() error {
	loaded, err := a.pods.ensure(a.resolveUplink)
	if loaded {
		a.saveNodeState()
	}
	return err
}
