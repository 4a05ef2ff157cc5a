package agent

// Prometheus metrics of the same-node TCP bypass (registered by
// healthServer): whether it is on, the admitted pods, the sockets in the
// SOCKHASH and the BPF programs' counters, one counter per name of the C
// enum (sockmap.Bypass.Metrics).

import (
	"github.com/prometheus/client_golang/prometheus"
)

var (
	descSMEnabled  = prometheus.NewDesc("axon_sockmap_enabled", "1 when the same-node TCP bypass is loaded (--sockmap=enabled, kernel self-test passed).", nil, nil)
	descSMPods     = prometheus.NewDesc("axon_sockmap_pods_admitted", "Local pods admitted to the same-node TCP bypass (not opted out, no bandwidth limit).", nil, nil)
	descSMSockets  = prometheus.NewDesc("axon_sockmap_sockets", "Sockets in the bypass's SOCKHASH (two per bypassed connection).", nil, nil)
	descSMReadErrs = prometheus.NewDesc("axon_sockmap_metrics_read_errors", "1 when the bypass's counters or SOCKHASH could not be read on this scrape.", nil, nil)
)

// sockmapCounterHelp is the HELP of the BPF counters the agent knows; a
// counter the programs add later is exported with a generic HELP.
var sockmapCounterHelp = map[string]string{}

type sockmapCollector struct{ s *sockBypass }

// Describe sends nothing: the counter names come from the loaded programs
// (an unchecked collector).
func (c sockmapCollector) Describe(chan<- *prometheus.Desc) {}

func (c sockmapCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.s.status()
	ch <- prometheus.MustNewConstMetric(descSMEnabled, prometheus.GaugeValue, b2f(st.Enabled))
	if !st.Enabled {
		return
	}
	ch <- prometheus.MustNewConstMetric(descSMPods, prometheus.GaugeValue, float64(st.PodsAdmitted))
	bp, _, _, _, _, _ := c.s.state()
	if bp == nil {
		return
	}
	m, err := bp.Metrics()
	ch <- prometheus.MustNewConstMetric(descSMReadErrs, prometheus.GaugeValue, b2f(err != nil || st.Connections < 0))
	if st.Connections >= 0 {
		ch <- prometheus.MustNewConstMetric(descSMSockets, prometheus.GaugeValue, float64(st.Connections))
	}
	for name, v := range m {
		n := metricName.ReplaceAllString(name, "_")
		help, ok := sockmapCounterHelp[name]
		if !ok {
			help = "Counter " + name + " of the same-node TCP bypass's BPF programs, summed over CPUs (docs/sockmap.md)."
		}
		ch <- prometheus.MustNewConstMetric(prometheus.NewDesc("axon_sockmap_"+n+"_total", help, nil, nil), prometheus.CounterValue, float64(v))
	}
}
