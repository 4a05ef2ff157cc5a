package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/axonhq/axon/internal/kubemetrics"
)

// healthServer starts the --health-addr listener:
//
//   - GET /livez (liveness): 200 while the agent's reconcile loop runs and
//     what it loaded is still pinned, 503 with the reason otherwise. It stays
//     200 while the kube-apiserver is unreachable: a restart would not bring
//     the apiserver back, and the agent keeps forwarding and collecting
//     conntrack and NAT entries meanwhile (only it removes them).
//   - GET /readyz (readiness): 200 when the agent serves the node from
//     current information: datapath loaded, podCIDR known, caches and the
//     Service watch synced, the north-south LB (when on and loadable)
//     attached and holding the Service table, and the apiserver reachable
//     now; 503 with the reasons otherwise.
//   - GET /healthz: the first readiness of earlier releases (datapath loaded,
//     podCIDR known, caches synced once; stays 200 through a later apiserver
//     outage), kept for probes and scripts that use it; the local API's
//     /healthz is the same.
//   - GET /metrics (Prometheus, datapath counters and client-go's REST
//     client and workqueue metrics included).
func (a *Agent) healthServer(reg *prometheus.Registry) (*http.Server, error) {
	mux := http.NewServeMux()
	probe := func(check func() error) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			if err := check(); err != nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				io.WriteString(w, err.Error()+"\n")
				return
			}
			io.WriteString(w, "ok\n")
		}
	}
	mux.HandleFunc("GET /healthz", probe(func() error { return a.Healthy(context.Background()) }))
	mux.HandleFunc("GET /livez", probe(a.Live))
	mux.HandleFunc("GET /readyz", probe(a.Ready))
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	ln, err := net.Listen("tcp", a.cfg.HealthAddr)
	if err != nil {
		return nil, fmt.Errorf("listen on --health-addr %s: %w (pick another port, or empty to disable)", a.cfg.HealthAddr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && err != http.ErrServerClosed {
			a.log.Error("health server stopped", "addr", a.cfg.HealthAddr, "error", err)
		}
	}()
	a.log.Info("health and metrics listening", "addr", ln.Addr().String())
	return srv, nil
}

// metricsRegistry holds every metric /metrics serves (on --health-addr and
// on --kube-proxy-metrics-addr).
func (a *Agent) metricsRegistry() (*prometheus.Registry, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), &agentCollector{a: a},
		nodePortCollector{n: a.nport}, servicesCollector{a: a}, sockmapCollector{s: a.sm}, dropCollector{a: a})
	// client-go's REST client and workqueue metrics (rest_client_*, workqueue_*).
	if err := kubemetrics.Register(reg); err != nil {
		return nil, fmt.Errorf("register client-go metrics: %w", err)
	}
	return reg, nil
}

// livenessStale is how long the reconcile loop may go without finishing a
// pass before /livez fails: three periodic passes and a slow one's margin.
func (a *Agent) livenessStale() time.Duration {
	return 3*a.cfg.ReconcileInterval + 30*time.Second
}

// Live reports whether the agent works, whatever the kube-apiserver does:
// nil while the reconcile loop finishes passes (failed ones count: they
// retry) and, once the pod datapath is loaded, its maps are still pinned
// under --bpf-root. An error means a restart helps.
func (a *Agent) Live() error {
	var why []string
	last := a.st.lastReconcile()
	if last.IsZero() {
		last = a.started
	}
	if stale := a.livenessStale(); !last.IsZero() && time.Since(last) > stale {
		why = append(why, fmt.Sprintf("the reconcile loop has not finished a pass for %s (limit %s): it is stuck; a restart adopts the pinned datapath",
			time.Since(last).Round(time.Second), stale))
	}
	if !a.cfg.bypassOnly() {
		if _, loaded := a.pods.state(); loaded {
			pin := filepath.Join(a.cfg.BPFRoot, "axon_ep_v4")
			if _, err := os.Stat(pin); err != nil {
				why = append(why, fmt.Sprintf("the datapath's pinned maps are gone (%v): bpffs unmounted or the pins removed; a restart pins them again", err))
			}
		}
	}
	if len(why) > 0 {
		return errors.New(strings.Join(why, "; "))
	}
	return nil
}

// Ready reports whether the agent serves this node from current
// information: Healthy (datapath loaded, podCIDR known, caches synced),
// the Service watch synced, and the kube-apiserver reachable right now.
func (a *Agent) Ready() error {
	var why []string
	if r := a.notReady(); r != "" {
		why = append(why, r)
	}
	if k := a.st.kubeClient(); k != nil {
		if r := k.unreachable(); r != "" && !strings.Contains(strings.Join(why, "; "), r) {
			why = append(why, r)
		}
	}
	if a.svc != nil && !a.svc.initialSynced() {
		why = append(why, "the Service watch has not synced yet")
	} else if r := a.nport.notServing(); r != "" {
		why = append(why, r)
	}
	if len(why) > 0 {
		return errors.New(strings.Join(why, "; "))
	}
	return nil
}

var (
	descReady     = prometheus.NewDesc("axon_agent_ready", "1 when the agent is ready (datapath loaded, podCIDR known, caches synced).", nil, nil)
	descConnected = prometheus.NewDesc("axon_agent_apiserver_connected", "1 when the kube-apiserver answers.", nil, nil)
	descEndpoints = prometheus.NewDesc("axon_agent_endpoints", "Endpoints in the registry.", nil, nil)
	descRoutes    = prometheus.NewDesc("axon_agent_routes", "podCIDR routes to other nodes.", nil, nil)
	descReconcile = prometheus.NewDesc("axon_agent_reconciles_total", "Reconcile passes by result.", []string{"result"}, nil)
	descDatapath  = prometheus.NewDesc("axon_datapath_packets_total", "Packets counted by the BPF datapath, by program direction and reason (summed over CPUs).", []string{"direction", "reason"}, nil)
	descRefused   = prometheus.NewDesc("axon_api_refused_total",
		"Local API calls refused, by reason: address_not_allocated, device_not_pod, device_in_use (endpoint PUTs that fail the ownership checks), gc_empty_list (a GC without keep-list or \"all\"), caller (a caller that may not change state).", []string{"reason"}, nil)
	descDPErr = prometheus.NewDesc("axon_datapath_metrics_read_errors", "1 when the datapath metrics map could not be read on this scrape.", nil, nil)
)

var metricName = regexp.MustCompile(`[^a-zA-Z0-9_]`)

type agentCollector struct{ a *Agent }

func (c *agentCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descReady, descConnected, descEndpoints, descRoutes, descReconcile, descDatapath, descDPErr, descRefused} {
		ch <- d
	}
}

func (c *agentCollector) Collect(ch chan<- prometheus.Metric) {
	st, _ := c.a.Status(context.Background())
	ch <- prometheus.MustNewConstMetric(descReady, prometheus.GaugeValue, b2f(st.Ready))
	ch <- prometheus.MustNewConstMetric(descConnected, prometheus.GaugeValue, b2f(st.APIServer.Connected))
	ch <- prometheus.MustNewConstMetric(descEndpoints, prometheus.GaugeValue, float64(st.Endpoints))
	ch <- prometheus.MustNewConstMetric(descRoutes, prometheus.GaugeValue, float64(st.Routes))
	for res, n := range c.a.st.reconcileCounts() {
		ch <- prometheus.MustNewConstMetric(descReconcile, prometheus.CounterValue, float64(n), res)
	}
	refused := c.a.pods.refused.counts()
	for _, r := range []string{refusedAddress, refusedDevice, refusedInUse, refusedGCEmpty, refusedCaller} {
		ch <- prometheus.MustNewConstMetric(descRefused, prometheus.CounterValue, float64(refused[r]), r)
	}
	dp := c.a.pods.snapshot()
	if dp == nil {
		return
	}
	byDir := map[string]map[string]uint64{}
	var err error
	if d, ok := dp.(interface {
		MetricsByDirection() (map[string]map[string]uint64, error)
	}); ok {
		byDir, err = d.MetricsByDirection()
	} else {
		byDir["all"], err = dp.Metrics()
	}
	ch <- prometheus.MustNewConstMetric(descDPErr, prometheus.GaugeValue, b2f(err != nil))
	for dir, m := range byDir {
		for name, v := range m {
			ch <- prometheus.MustNewConstMetric(descDatapath, prometheus.CounterValue, float64(v),
				metricName.ReplaceAllString(dir, "_"), metricName.ReplaceAllString(name, "_"))
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
