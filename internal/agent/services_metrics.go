package agent

// Prometheus metrics of the Service watch (registered by
// healthServer), the counterparts of kube-proxy's sync metrics: when the
// socket LB maps were last written and how big the table is.

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

var (
	descSvcLastWrite = prometheus.NewDesc("axon_services_last_write_timestamp_seconds",
		"Unix time at which the last Service or EndpointSlice change was written to the socket LB maps (0: none yet).", nil, nil)
	descSvcWrites = prometheus.NewDesc("axon_services_writes_total",
		"Writes of changed Services to the socket LB maps (one per handled change that changed the maps; the full sync counts once).", nil, nil)
	descSvcFullSync = prometheus.NewDesc("axon_services_full_sync_seconds",
		"Duration of the first table build and write after the Service caches synced (0: not synced yet).", nil, nil)
	descSvcFrontends = prometheus.NewDesc("axon_services_frontends", "Frontends in the desired Service table.", nil, nil)
	descSvcBackends  = prometheus.NewDesc("axon_services_backends", "Backends over all frontends of the desired Service table.", nil, nil)
)

type servicesCollector struct{ a *Agent }

func (c servicesCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descSvcLastWrite, descSvcWrites, descSvcFullSync, descSvcFrontends, descSvcBackends} {
		ch <- d
	}
}

func (c servicesCollector) Collect(ch chan<- prometheus.Metric) {
	if c.a.svc == nil {
		return
	}
	st := c.a.svc.status()
	last := 0.0
	if !st.LastWrite.IsZero() {
		last = float64(st.LastWrite.UnixNano()) / 1e9
	}
	ch <- prometheus.MustNewConstMetric(descSvcLastWrite, prometheus.GaugeValue, last)
	ch <- prometheus.MustNewConstMetric(descSvcWrites, prometheus.CounterValue, float64(st.Writes))
	ch <- prometheus.MustNewConstMetric(descSvcFullSync, prometheus.GaugeValue, st.FullSync.Seconds())
	ch <- prometheus.MustNewConstMetric(descSvcFrontends, prometheus.GaugeValue, float64(st.Frontends))
	ch <- prometheus.MustNewConstMetric(descSvcBackends, prometheus.GaugeValue, float64(st.Backends))
}

// noteWrite records that a change reached the Writer (s.mu held).
func (s *serviceSync) noteWrite() {
	s.lastWrite = time.Now()
	s.writes++
}
