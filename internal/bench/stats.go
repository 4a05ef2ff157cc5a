package bench

import (
	"math"
	"slices"

	"github.com/axonhq/axon/internal/bench/quantile"
)

// Stats summarises the samples of one metric on one path.
type Stats struct {
	N      int
	Min    float64
	Median float64
	Max    float64
}

// Summarize returns min/median/max of the finite values in xs. The median of an
// even count is the mean of the two middle values (quantile.Median). With no finite value, N is 0
// and the other fields are NaN.
func Summarize(xs []float64) Stats {
	vals := make([]float64, 0, len(xs))
	for _, x := range xs {
		if !math.IsNaN(x) && !math.IsInf(x, 0) {
			vals = append(vals, x)
		}
	}
	if len(vals) == 0 {
		nan := math.NaN()
		return Stats{Min: nan, Median: nan, Max: nan}
	}
	return Stats{N: len(vals), Min: slices.Min(vals), Median: quantile.Median(vals), Max: slices.Max(vals)}
}

// Ratio returns value/ref, or NaN when either is missing or ref is zero.
func Ratio(value, ref float64) float64 {
	if math.IsNaN(value) || math.IsNaN(ref) || ref == 0 {
		return math.NaN()
	}
	return value / ref
}
