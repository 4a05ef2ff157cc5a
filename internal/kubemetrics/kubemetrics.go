// Package kubemetrics exports client-go's own instrumentation as Prometheus
// metrics: the REST client's request latency, results, retries and
// client-side rate-limiter wait (k8s.io/client-go/tools/metrics), and every
// named workqueue's depth, adds, queue and work time, retries and stuck work
// (k8s.io/client-go/util/workqueue). Names and labels are the ones
// Kubernetes components export (rest_client_*, workqueue_*), so existing
// dashboards apply.
//
// client-go takes these hooks once per process (tools/metrics.Register and
// workqueue.SetProvider are sync.Once), so the collectors behind them are
// the only process-wide state here: Install sets the hooks on first use,
// Register adds the same collectors to a registry (the agent's /metrics
// registry, built in internal/agent's healthServer).
package kubemetrics

import (
	"context"
	"net/url"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/tools/metrics"
	"k8s.io/client-go/util/workqueue"
)

// set is every collector behind the hooks.
type set struct {
	requestLatency     *prometheus.HistogramVec
	rateLimiterLatency *prometheus.HistogramVec
	requestResult      *prometheus.CounterVec
	requestRetry       *prometheus.CounterVec

	depth          *prometheus.GaugeVec
	adds           *prometheus.CounterVec
	queueLatency   *prometheus.HistogramVec
	workDuration   *prometheus.HistogramVec
	unfinished     *prometheus.GaugeVec
	longestRunning *prometheus.GaugeVec
	retries        *prometheus.CounterVec
}

var (
	once      sync.Once
	installed *set
)

// Install sets client-go's metric hooks (once per process; later calls do
// nothing). Call it before the first workqueue is created: a queue takes
// the provider when it is made.
func Install() {
	once.Do(func() {
		s := newSet()
		metrics.Register(metrics.RegisterOpts{
			RequestLatency:     latency{s.requestLatency},
			RateLimiterLatency: latency{s.rateLimiterLatency},
			RequestResult:      result{s.requestResult},
			RequestRetry:       retry{s.requestRetry},
		})
		workqueue.SetProvider(queueProvider{s})
		installed = s
	})
}

// Register installs the hooks if needed and adds their collectors to reg.
func Register(reg prometheus.Registerer) error {
	Install()
	s := installed
	for _, c := range []prometheus.Collector{s.requestLatency, s.rateLimiterLatency, s.requestResult, s.requestRetry,
		s.depth, s.adds, s.queueLatency, s.workDuration, s.unfinished, s.longestRunning, s.retries} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

func newSet() *set {
	latencyBuckets := []float64{0.005, 0.025, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60}
	queueBuckets := prometheus.ExponentialBuckets(10e-9, 10, 12) // 10 ns .. 1000 s, as Kubernetes' workqueue metrics
	return &set{
		requestLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "rest_client_request_duration_seconds", Help: "kube-apiserver request latency by verb and host (client-go).", Buckets: latencyBuckets,
		}, []string{"verb", "host"}),
		rateLimiterLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "rest_client_rate_limiter_duration_seconds", Help: "Time requests waited for client-go's client-side rate limiter, by verb and host.", Buckets: latencyBuckets,
		}, []string{"verb", "host"}),
		requestResult: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rest_client_requests_total", Help: "kube-apiserver requests by HTTP status code, method and host (client-go).",
		}, []string{"code", "method", "host"}),
		requestRetry: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rest_client_request_retries_total", Help: "kube-apiserver request retries by status code, method and host (client-go).",
		}, []string{"code", "method", "host"}),
		depth: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "workqueue_depth", Help: "Items waiting in the workqueue.",
		}, []string{"name"}),
		adds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "workqueue_adds_total", Help: "Items added to the workqueue.",
		}, []string{"name"}),
		queueLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "workqueue_queue_duration_seconds", Help: "Time an item waits in the workqueue before it is worked on.", Buckets: queueBuckets,
		}, []string{"name"}),
		workDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "workqueue_work_duration_seconds", Help: "Time working on one item of the workqueue.", Buckets: queueBuckets,
		}, []string{"name"}),
		unfinished: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "workqueue_unfinished_work_seconds", Help: "Seconds of work in progress not yet finished (large values: stuck workers).",
		}, []string{"name"}),
		longestRunning: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "workqueue_longest_running_processor_seconds", Help: "How long the longest-running worker of the workqueue has run.",
		}, []string{"name"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "workqueue_retries_total", Help: "Items re-added to the workqueue after a failure (rate-limited retries).",
		}, []string{"name"}),
	}
}

type latency struct{ h *prometheus.HistogramVec }

func (l latency) Observe(_ context.Context, verb string, u url.URL, d time.Duration) {
	l.h.WithLabelValues(verb, u.Host).Observe(d.Seconds())
}

type result struct{ c *prometheus.CounterVec }

func (r result) Increment(_ context.Context, code, method, host string) {
	r.c.WithLabelValues(code, method, host).Inc()
}

type retry struct{ c *prometheus.CounterVec }

func (r retry) IncrementRetry(_ context.Context, code, method, host string) {
	r.c.WithLabelValues(code, method, host).Inc()
}

// queueProvider gives each named workqueue its children of the vectors.
type queueProvider struct{ s *set }

func (p queueProvider) NewDepthMetric(name string) workqueue.GaugeMetric {
	return p.s.depth.WithLabelValues(name)
}
func (p queueProvider) NewAddsMetric(name string) workqueue.CounterMetric {
	return p.s.adds.WithLabelValues(name)
}
func (p queueProvider) NewLatencyMetric(name string) workqueue.HistogramMetric {
	return p.s.queueLatency.WithLabelValues(name)
}
func (p queueProvider) NewWorkDurationMetric(name string) workqueue.HistogramMetric {
	return p.s.workDuration.WithLabelValues(name)
}
func (p queueProvider) NewUnfinishedWorkSecondsMetric(name string) workqueue.SettableGaugeMetric {
	return p.s.unfinished.WithLabelValues(name)
}
func (p queueProvider) NewLongestRunningProcessorSecondsMetric(name string) workqueue.SettableGaugeMetric {
	return p.s.longestRunning.WithLabelValues(name)
}
func (p queueProvider) NewRetriesMetric(name string) workqueue.CounterMetric {
	return p.s.retries.WithLabelValues(name)
}
