package bench

import (
	"math"
	"slices"

	"github.com/axonhq/axon/internal/stats"
)

// Stats summarises the samples of one metric on one path.
type Stats struct {
	N      int
	Min    float64
	Median float64
	Max    float64
}

// Summarize returns min/median/max of the finite values in xs. The median of an
// even count is the mean of the two middle values (stats.Median). With no finite value, N is 0
// and the other fields are NaN.
func Summarize(xs []float64) Stats {
	vals := finite(xs)
	if len(vals) == 0 {
		nan := math.NaN()
		return Stats{Min: nan, Median: nan, Max: nan}
	}
	return Stats{N: len(vals), Min: slices.Min(vals), Median: stats.Median(vals), Max: slices.Max(vals)}
}

// Percentile is the p-th percentile (0 ≤ p ≤ 100; stats.Quantile, linear
// between order statistics) of the finite values of xs, NaN when none is
// finite.
func Percentile(xs []float64, p float64) float64 { return stats.Quantile(finite(xs), p/100) }

// finite is xs without NaN and ±Inf (a sample that failed or overflowed).
func finite(xs []float64) []float64 {
	vals := make([]float64, 0, len(xs))
	for _, x := range xs {
		if !math.IsNaN(x) && !math.IsInf(x, 0) {
			vals = append(vals, x)
		}
	}
	return vals
}

// Ratio returns value/ref, or NaN when either is missing or ref is zero.
func Ratio(value, ref float64) float64 {
	if math.IsNaN(value) || math.IsNaN(ref) || ref == 0 {
		return math.NaN()
	}
	return value / ref
}
