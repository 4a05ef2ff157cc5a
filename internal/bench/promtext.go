package bench

import (
	"fmt"
	"io"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The benchmark reads two Prometheus text expositions: kube-proxy's
// (ParseKubeProxyMetrics) and the axon agent's (AgentLastWrite).

// metricFamilies parses a Prometheus text exposition.
func metricFamilies(r io.Reader) (map[string]*dto.MetricFamily, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parse metrics: %w", err)
	}
	return fams, nil
}

// metricValue is a gauge's, counter's or untyped sample's value, whichever
// the exposition declared.
func metricValue(m *dto.Metric) float64 {
	return m.GetGauge().GetValue() + m.GetCounter().GetValue() + m.GetUntyped().GetValue()
}

// hasLabel reports whether m has the label name="value".
func hasLabel(m *dto.Metric, name, value string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue() == value
		}
	}
	return false
}
