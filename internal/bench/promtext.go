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

// MetricFamilies parses a Prometheus text exposition.
func MetricFamilies(r io.Reader) (map[string]*dto.MetricFamily, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parse metrics: %w", err)
	}
	return fams, nil
}

// MetricValue is a gauge's, counter's or untyped sample's value, whichever
// the exposition declared.
func MetricValue(m *dto.Metric) float64 {
	return m.GetGauge().GetValue() + m.GetCounter().GetValue() + m.GetUntyped().GetValue()
}

// HasLabel reports whether m has the label name="value".
func HasLabel(m *dto.Metric, name, value string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue() == value
		}
	}
	return false
}
