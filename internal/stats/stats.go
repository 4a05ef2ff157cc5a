// Package stats summarizes samples of measurements: medians and quantiles
// for benchmarks and the tests that assert on measured rates and latencies.
// No function modifies its input, and an empty sample gives NaN.
package stats

import (
	"math"
	"slices"
)

// Median is the middle value of xs, the mean of the two middle values when
// len(xs) is even: Quantile(xs, 0.5).
func Median(xs []float64) float64 { return Quantile(xs, 0.5) }

// Quantile is the q-quantile (q in 0..1, clamped) of xs, interpolated
// linearly between the two nearest ranks: the h = q·(n−1)-th value (0-based)
// of the sorted sample, h's fraction of the way to the next one. This is
// Hyndman and Fan's type 7, the default of R, NumPy and spreadsheets.
func Quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	h := min(max(q, 0), 1) * float64(len(s)-1)
	lo := int(math.Floor(h))
	hi := min(lo+1, len(s)-1)
	return s[lo] + (s[hi]-s[lo])*(h-float64(lo))
}

// NearestRank is the q-quantile (q in 0..1, clamped) of xs by the
// nearest-rank method: the smallest value with at least a fraction q of the
// sample at or below it, the ⌈q·n⌉-th smallest (the smallest for q = 0).
// Unlike Quantile it is always one of the measured values, the usual
// reading of "p99 latency" (Hyndman and Fan's type 1).
func NearestRank(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(math.Ceil(min(max(q, 0), 1)*float64(len(s)))) - 1
	return s[max(i, 0)]
}

// MedianCI is the distribution-free 95 % confidence interval of the median
// of xs: the k-th smallest and k-th largest value, k = ⌊(n − 1.96·√n) / 2⌋
// (the sign test's order statistics; no assumption about the values'
// distribution). NaN below 8 values (k < 1).
func MedianCI(xs []float64) (lo, hi float64) {
	n := len(xs)
	k := int(math.Floor((float64(n) - 1.96*math.Sqrt(float64(n))) / 2))
	if n < 6 || k < 1 {
		return math.NaN(), math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[k-1], s[n-k]
}
