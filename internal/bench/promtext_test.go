package bench

import (
	"math"
	"strings"
	"testing"
)

// TestHistogramQuantile: the PromQL estimate on a parsed exposition: linear
// inside the bucket that holds the rank, from 0 in the first, the highest
// finite bound in +Inf, NaN when empty.
func TestHistogramQuantile(t *testing.T) {
	const text = `# TYPE x histogram
x_bucket{l="a",le="0.1"} 10
x_bucket{l="a",le="0.5"} 90
x_bucket{l="a",le="1"} 99
x_bucket{l="a",le="+Inf"} 100
x_sum{l="a"} 30
x_count{l="a"} 100
x_bucket{l="b",le="0.1"} 0
x_bucket{l="b",le="+Inf"} 0
x_sum{l="b"} 0
x_count{l="b"} 0
`
	fams, err := MetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	ms := fams["x"].GetMetric()
	a, b := ms[0].GetHistogram(), ms[1].GetHistogram()
	for _, tc := range []struct {
		q, want float64
	}{
		{0.05, 0.05}, // 5 of the 10 in [0, 0.1]
		{0.5, 0.3},   // 50: 40 of the 80 in (0.1, 0.5]
		{0.9, 0.5},
		{0.99, 1},
		{0.999, 1}, // in +Inf: the highest finite bound
	} {
		if got := HistogramQuantile(a, tc.q); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("q%v = %v, want %v", tc.q, got, tc.want)
		}
	}
	if got := HistogramQuantile(b, 0.5); !math.IsNaN(got) {
		t.Errorf("empty histogram: %v, want NaN", got)
	}
}
