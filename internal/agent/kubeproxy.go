package agent

// kube-proxy's node-wide ports, served by the agent that replaces it, for
// the tools that probe them (--kube-proxy-healthz-addr,
// --kube-proxy-metrics-addr; both off unless set, the chart sets them):
//
//   - healthz (kube-proxy's --healthz-bind-address, 0.0.0.0:10256): GET
//     /healthz and /livez, kube-proxy's JSON (internal/healthcheck). Cloud
//     load balancers probe it to send externalTrafficPolicy: Cluster
//     traffic only to nodes whose Service proxy is current; 200 while the
//     Service sync is caught up (no change waiting and no datapath write
//     failing for 2 × --reconcile-interval, kube-proxy's 2 × its sync
//     period) and the Node is not being removed.
//   - metrics (kube-proxy's --metrics-bind-address, 127.0.0.1:10249): GET
//     /proxyMode answers "axon"; GET /metrics is the agent's own
//     /metrics (scrape configs written for kube-proxy keep working).
//
// A port in use (kube-proxy still runs on the node) is not fatal: the agent
// logs it, reports it in `axon status` and tries again every
// kubeProxyRetry until the port is free.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/healthcheck"
)

// DecisionKubeProxyPorts names kube-proxy's ports in `axon status`.
const DecisionKubeProxyPorts = "kube_proxy_ports"

// ProxyMode is what GET /proxyMode answers (kube-proxy: iptables, ipvs,
// nftables, kernelspace).
const ProxyMode = "axon"

// kubeProxyRetry is how long the agent waits before listening again on a
// kube-proxy port it could not open.
const kubeProxyRetry = 10 * time.Second

// validateKubeProxy checks --kube-proxy-healthz-addr and
// --kube-proxy-metrics-addr: host:port or empty.
func (c Config) validateKubeProxy() error {
	var errs []error
	for _, f := range []struct{ flag, val, example string }{
		{"--kube-proxy-healthz-addr", c.KubeProxyHealthzAddr, "0.0.0.0:10256"},
		{"--kube-proxy-metrics-addr", c.KubeProxyMetricsAddr, "127.0.0.1:10249"},
	} {
		if f.val == "" {
			continue
		}
		if _, port, err := net.SplitHostPort(f.val); err != nil || port == "" {
			errs = append(errs, fmt.Errorf("%s %q is invalid: use host:port such as %s, or empty to disable", f.flag, f.val, f.example))
		}
	}
	return errors.Join(errs...)
}

// kubeProxyPortsOff says why the agent does not serve kube-proxy's ports
// although they are set: it serves no Services here, so it must not answer
// for the node's Service proxy (kube-proxy, or another CNI's replacement,
// owns the ports). The chart sets them on every node; a node switched to
// bypass-only or without both LBs keeps working and says so.
func (c Config) kubeProxyPortsOff() string {
	switch {
	case c.KubeProxyHealthzAddr == "" && c.KubeProxyMetricsAddr == "":
		return ""
	case c.bypassOnly():
		return "--mode=" + ModeBypassOnly + " serves no Services (the node's own Service proxy owns these ports)"
	case !c.SocketLB && !c.NodePortLB.Enabled:
		return "--socket-lb=false and --nodeport=false: axon serves no Services here (the node's own Service proxy owns these ports)"
	}
	return ""
}

// kubeProxyPorts is the state of the two listeners, for `axon status`.
type kubeProxyPorts struct {
	retry time.Duration // between listen attempts; 0 = kubeProxyRetry (tests shorten it)
	mu    sync.Mutex
	errs  map[string]string // address → why it is not served ("" = serving)
}

func (p *kubeProxyPorts) every() time.Duration {
	if p.retry > 0 {
		return p.retry
	}
	return kubeProxyRetry
}

func (p *kubeProxyPorts) set(addr string, err error) (changed bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.errs == nil {
		p.errs = map[string]string{}
	}
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	old, seen := p.errs[addr]
	p.errs[addr] = msg
	return !seen || old != msg
}

func (p *kubeProxyPorts) get(addr string) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	msg, seen := p.errs[addr]
	return msg, seen
}

// serveKubeProxyPorts starts the configured listeners; they stop with ctx.
func (a *Agent) serveKubeProxyPorts(ctx context.Context, wg *sync.WaitGroup, reg *prometheus.Registry) {
	if off := a.cfg.kubeProxyPortsOff(); off != "" {
		a.log.Warn("kube-proxy's ports not served", "healthz", a.cfg.KubeProxyHealthzAddr, "metrics", a.cfg.KubeProxyMetricsAddr, "why", off)
		return
	}
	if a.cfg.KubeProxyHealthzAddr != "" {
		h := healthcheck.ProxyHandler(a.proxyState, a.proxyHealthTimeout())
		wg.Go(func() { a.serveRetrying(ctx, "kube-proxy healthz", a.cfg.KubeProxyHealthzAddr, h) })
	}
	if a.cfg.KubeProxyMetricsAddr != "" {
		mux := http.NewServeMux()
		mux.HandleFunc("GET /proxyMode", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			fmt.Fprint(w, ProxyMode) // no newline, as kube-proxy
		})
		mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		wg.Go(func() { a.serveRetrying(ctx, "kube-proxy metrics", a.cfg.KubeProxyMetricsAddr, mux) })
	}
}

// serveRetrying serves h on addr until ctx is done, listening again every
// kubeProxyRetry while the address cannot be opened.
func (a *Agent) serveRetrying(ctx context.Context, what, addr string, h http.Handler) {
	for {
		ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", addr)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			err = fmt.Errorf("listen: %w (kube-proxy still running on this node? remove it, or move the port)", err)
			if a.kp.set(addr, err) {
				a.log.Warn(what+" not served; retrying", "addr", addr, "every", a.kp.every(), "error", err)
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(a.kp.every()):
			}
			continue
		}
		a.kp.set(addr, nil)
		a.log.Info(what+" listening", "addr", ln.Addr().String())
		srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
		done := make(chan struct{})
		go func() {
			defer close(done)
			<-ctx.Done()
			sctx, c := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Second)
			defer c()
			srv.Shutdown(sctx)
		}()
		err = srv.Serve(ln)
		if errors.Is(err, http.ErrServerClosed) {
			<-done
			return
		}
		a.kp.set(addr, fmt.Errorf("serve: %w", err))
		a.log.Error(what+" stopped; listening again", "addr", addr, "error", err)
		srv.Close()
		select {
		case <-ctx.Done():
			<-done
			return
		case <-time.After(a.kp.every()):
		}
	}
}

// proxyHealthTimeout is how long the Service sync may be behind or a write
// fail before the healthz answers 503: kube-proxy's 2 × its sync period.
func (a *Agent) proxyHealthTimeout() time.Duration { return 2 * a.cfg.ReconcileInterval }

// proxyState is the Service sync's state for the healthz.
func (a *Agent) proxyState() healthcheck.ProxyState {
	if a.svc == nil {
		return healthcheck.ProxyState{NotServing: "the Service watch has not started"}
	}
	return a.svc.proxyState()
}

// syncHealth is the Service sync's health as the worker last left it. Its
// lock is a leaf and never held across a write: a write that hangs (with
// serviceSync.mu held) must make the healthz answer 503, not hang it.
type syncHealth struct {
	mu           sync.Mutex
	serving      bool
	notServing   string    // why not
	behindSince  time.Time // the worker took a change while caught up; zero = caught up
	failingSince time.Time // first failure of the oldest write still failing
	caughtUp     time.Time // last time the queue was empty with nothing failing
}

// took records that the worker took a change.
func (h *syncHealth) took() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.behindSince.IsZero() {
		h.behindSince = time.Now()
	}
}

// noteHealth records the sync's health after the worker handled a change
// (deferred by processNext after Done: a key re-added meanwhile is queued
// again and the sync is still behind) or the initial sync.
func (s *serviceSync) noteHealth() {
	s.mu.Lock()
	serving, why := false, ""
	switch {
	case !s.synced:
		why = "the Service watch has not synced"
	case s.w == nil:
		why = "no Service datapath attached yet (socket LB, north-south LB)"
	case s.comparedW != s.writerGen || s.comparedWriter != s.w:
		why = "the Service table is being written to the datapath"
	default:
		serving = true
	}
	var failing time.Time
	for _, we := range s.writeErrs {
		if failing.IsZero() || we.since.Before(failing) {
			failing = we.since
		}
	}
	s.mu.Unlock()
	idle := s.queue.Len() == 0
	h := &s.health
	h.mu.Lock()
	defer h.mu.Unlock()
	h.serving, h.notServing, h.failingSince = serving, why, failing
	if idle {
		h.behindSince = time.Time{}
		if failing.IsZero() && serving {
			h.caughtUp = time.Now()
		}
	}
}

func (s *serviceSync) proxyState() healthcheck.ProxyState {
	node, _ := s.nodes.Get(s.node)
	h := &s.health
	h.mu.Lock()
	defer h.mu.Unlock()
	return healthcheck.ProxyState{Serving: h.serving, NotServing: h.notServing, BehindSince: h.behindSince,
		FailingSince: h.failingSince, LastUpdated: h.caughtUp, Node: node}
}

// kubeProxyDecision is the `axon status` line of kube-proxy's ports.
func (a *Agent) kubeProxyDecision() api.Decision {
	d := api.Decision{Name: DecisionKubeProxyPorts, Value: "disabled", Reason: "--kube-proxy-healthz-addr and --kube-proxy-metrics-addr are empty"}
	if off := a.cfg.kubeProxyPortsOff(); off != "" {
		d.Reason = off
		return d
	}
	var parts []string
	serving := 0
	for _, p := range []struct{ name, addr string }{{"healthz", a.cfg.KubeProxyHealthzAddr}, {"metrics", a.cfg.KubeProxyMetricsAddr}} {
		if p.addr == "" {
			continue
		}
		msg, seen := a.kp.get(p.addr)
		switch {
		case !seen:
			parts = append(parts, fmt.Sprintf("%s %s: starting", p.name, p.addr))
		case msg != "":
			parts = append(parts, fmt.Sprintf("%s %s: %s; retrying every %s", p.name, p.addr, msg, a.kp.every()))
		default:
			serving++
			line := fmt.Sprintf("%s %s", p.name, p.addr)
			if p.name == "healthz" {
				st := a.proxyState()
				_, why := st.Health(time.Now(), a.proxyHealthTimeout())
				if ok, notEligible := healthcheck.NodeEligible(st.Node); why == "" && !ok {
					why = notEligible
				}
				if why == "" {
					line += " (200)"
				} else {
					line += " (503: " + why + ")"
				}
			}
			parts = append(parts, line)
		}
	}
	if len(parts) == 0 {
		return d
	}
	d.Value = "serving"
	if serving < len(parts) {
		d.Value = "not serving"
		if serving > 0 {
			d.Value = "partly serving"
		}
	}
	d.Reason = strings.Join(parts, ", ")
	return d
}
