package agent

// Prometheus metrics of the north-south LB (registered by
// healthServer): conntrack fullness, GC work and the LB's packet counters.

import (
	"github.com/prometheus/client_golang/prometheus"
)

var (
	descNPCTEntries  = prometheus.NewDesc("axon_nodeport_ct_entries", "North-south conntrack entries in use.", nil, nil)
	descNPCTUnrepl   = prometheus.NewDesc("axon_nodeport_ct_unreplied_entries", "North-south flows not answered yet (their own LRU table of --ct-unreplied-max entries: a SYN flood fills and evicts only it).", nil, nil)
	descNPCTMax      = prometheus.NewDesc("axon_nodeport_ct_max", "North-south conntrack table size (--ct-max).", nil, nil)
	descNPCTFull     = prometheus.NewDesc("axon_nodeport_ct_fullness_ratio", "Entries in use / table size; at 1 the least recently used flows are evicted.", nil, nil)
	descNPCTCreated  = prometheus.NewDesc("axon_nodeport_ct_created_total", "Flows created in the north-south conntrack table.", nil, nil)
	descNPCTInsFail  = prometheus.NewDesc("axon_nodeport_ct_insert_failed_total", "Conntrack inserts that failed (the packet was still translated).", nil, nil)
	descNPGCDeleted  = prometheus.NewDesc("axon_nodeport_ct_gc_deleted_total", "Conntrack entries removed by the agent's garbage collection (expired or backend gone).", nil, nil)
	descNPPackets    = prometheus.NewDesc("axon_nodeport_packets_total", "Packets seen by the north-south LB, by hook (tc, xdp, egress) and verdict.", []string{"hook", "reason"}, nil)
	descNPNATEntries = prometheus.NewDesc("axon_nodeport_nat_entries", "North-south reverse NAT entries in use, SNAT port reservations (held --nodeport-snat-timewait after a TCP flow closed) included.", nil, nil)
	descNPNATMax     = prometheus.NewDesc("axon_nodeport_nat_max", "North-south reverse NAT table size (--nat-max); it never evicts: when full, new SNAT flows and new flows to local backends are dropped (reasons snat_no_port, nat_full).", nil, nil)
	descNPSNATNoPort = prometheus.NewDesc("axon_nodeport_snat_no_port_total", "New SNAT flows dropped because no source port was free for their backend or the NAT table was full (the client retransmits its SYN): widen --nodeport-snat-ports or raise --nat-max.", nil, nil)
	descNPHC         = prometheus.NewDesc("axon_nodeport_health_checks", "healthCheckNodePort servers, by state (serving, failed).", []string{"state"}, nil)
)

type nodePortCollector struct{ n *nodePort }

func (c nodePortCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descNPCTEntries, descNPCTUnrepl, descNPCTMax, descNPCTFull, descNPCTCreated, descNPCTInsFail, descNPGCDeleted, descNPPackets, descNPHC, descNPNATEntries, descNPNATMax, descNPSNATNoPort} {
		ch <- d
	}
}

func (c nodePortCollector) Collect(ch chan<- prometheus.Metric) {
	n := c.n
	n.mu.Lock()
	np, hc, deleted := n.np, n.hc, n.gcDeleted
	n.mu.Unlock()
	if hc != nil {
		var ok, failed float64
		for _, s := range hc.Statuses() {
			if s.Error != "" {
				failed++
			} else {
				ok++
			}
		}
		ch <- prometheus.MustNewConstMetric(descNPHC, prometheus.GaugeValue, ok, "serving")
		ch <- prometheus.MustNewConstMetric(descNPHC, prometheus.GaugeValue, failed, "failed")
	}
	if np == nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(descNPGCDeleted, prometheus.CounterValue, float64(deleted))
	if st, err := np.CTStats(); err == nil {
		ch <- prometheus.MustNewConstMetric(descNPCTEntries, prometheus.GaugeValue, float64(st.Entries))
		ch <- prometheus.MustNewConstMetric(descNPCTUnrepl, prometheus.GaugeValue, float64(st.Unreplied))
		ch <- prometheus.MustNewConstMetric(descNPCTMax, prometheus.GaugeValue, float64(st.Max))
		if st.Max > 0 {
			ch <- prometheus.MustNewConstMetric(descNPCTFull, prometheus.GaugeValue, float64(st.Entries)/float64(st.Max))
		}
		ch <- prometheus.MustNewConstMetric(descNPCTCreated, prometheus.CounterValue, float64(st.Created))
		ch <- prometheus.MustNewConstMetric(descNPCTInsFail, prometheus.CounterValue, float64(st.InsertFailed))
		ch <- prometheus.MustNewConstMetric(descNPNATEntries, prometheus.GaugeValue, float64(st.NATEntries))
		ch <- prometheus.MustNewConstMetric(descNPNATMax, prometheus.GaugeValue, float64(st.NATMax))
		ch <- prometheus.MustNewConstMetric(descNPSNATNoPort, prometheus.CounterValue, float64(st.SNATNoPort))
	}
	if m, err := np.Metrics(); err == nil {
		for hook, row := range m {
			for reason, v := range row {
				ch <- prometheus.MustNewConstMetric(descNPPackets, prometheus.CounterValue, float64(v), hook, reason)
			}
		}
	}
}
