package bench

import (
	"fmt"
	"io"
	"math"

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

// HistogramQuantile estimates quantile q (0..1) of a Prometheus histogram
// the way PromQL's histogram_quantile does: find the bucket holding the
// q-th observation and interpolate linearly inside it (from 0 for the first
// bucket). NaN when the histogram is empty; the highest finite bound when
// the quantile falls into the +Inf bucket.
func HistogramQuantile(h *dto.Histogram, q float64) float64 {
	total := float64(h.GetSampleCount())
	if total == 0 || q < 0 || q > 1 {
		return math.NaN()
	}
	rank := q * total
	lower, below := 0.0, 0.0
	for _, b := range h.GetBucket() {
		upper, cum := b.GetUpperBound(), float64(b.GetCumulativeCount())
		if math.IsInf(upper, 1) {
			break
		}
		if cum >= rank {
			if cum == below {
				return upper
			}
			return lower + (upper-lower)*(rank-below)/(cum-below)
		}
		lower, below = upper, cum
	}
	return lower
}
