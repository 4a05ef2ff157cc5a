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
var sockmapCounterHelp = map[string]string{
	"admit_pod":           "Pod-to-pod sockets that entered the bypass (sock_ops, both ends counted).",
	"admit_loopback":      "Loopback sockets inside an admitted pod that entered the bypass.",
	"skip_not_pod":        "Established sockets left on the TCP/IP stack: an end is not an admitted pod's address (opted out, bandwidth limit, host, other node).",
	"skip_netns_mismatch": "Sockets left on the stack: the local address is a pod's but the socket is in another netns.",
	"skip_not_enabled":    "Loopback sockets left on the stack: their netns is not an admitted pod's.",
	"insert_failed":       "Admitted sockets that could not enter the SOCKHASH (full: raise its size); they use the stack.",
	"redirect_msgs":       "Writes moved straight into the peer socket (sk_msg).",
	"redirect_bytes":      "Bytes of the writes moved straight into the peer socket.",
	"pass_no_peer":        "Writes of bypassed sockets whose peer was not in the map: sent through TCP, and the socket stays on TCP.",
	"pass_sticky":         "Writes of sockets in stack mode, sent through TCP (a socket that used TCP never switches back: ordering).",
	"pass_bytes":          "Bytes of writes of sockets in the map that went through TCP.",
	"switch_stack":        "Bypassed sockets switched to the TCP/IP stack by the small-write rule (a stream of small writes its peer does not keep up with is faster on TCP).",
	"splice_refused":      "splice(2) calls refused with EINVAL on a bypassed socket (the application falls back to read/write; splice would lose bytes).",
	"backpressure":        "Bypassed sockets moved to the TCP/IP stack because their peer's unread bytes exceeded its receive buffer (TCP flow control takes over).",
	"admit_intrapod":      "Sockets inside an admitted pod with one end loopback and the other the pod's own address (a sidecar's) that entered the bypass.",
	"alias_paired":        "Sockets whose peer was found by the client endpoint of their connection (a sidecar's netfilter REDIRECT) instead of the reversed tuple.",
	"alias_collision":     "Client endpoints claimed by two sockets at once (port reuse): poisoned, never paired through, the sockets use the stack unless their exact peer is found.",
	"alias_poisoned":      "Alias inserts or redirects refused because the client endpoint was poisoned by a collision.",
	"left":                "Sockets that left the bypass's map once they and their peer used the TCP/IP stack and their queue was empty: plain TCP from then on.",
}

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
