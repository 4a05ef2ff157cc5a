// Package quantile is the one definition of medians, quantiles and the
// median's confidence interval that every benchmark report uses.
//
// The convention is linear interpolation between order statistics (Hyndman
// and Fan's definition 7, R's default and numpy's "linear"): the q-quantile of
// n sorted values x[0..n-1] is x[⌊h⌋] + (h − ⌊h⌋)·(x[⌊h⌋+1] − x[⌊h⌋]) with
// h = q·(n − 1). The median of an even count is then the mean of the two
// middle values.
package quantile

import (
	"math"
	"slices"
)

// Of returns the q-quantile (0 ≤ q ≤ 1) of xs by linear interpolation
// between order statistics, NaN when xs is empty. xs is not modified; it
// must hold no NaN (filter them first).
func Of(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return sorted(s, q)
}

// sorted is Of for an already sorted, non-empty s.
func sorted(s []float64, q float64) float64 {
	h := q * float64(len(s)-1)
	lo := int(math.Floor(h))
	lo = max(0, min(lo, len(s)-1))
	hi := min(lo+1, len(s)-1)
	if f := h - float64(lo); f > 0 {
		return s[lo] + (s[hi]-s[lo])*f
	}
	return s[lo]
}

// Median is Of(xs, 0.5): the middle value, or the mean of the two middle
// values of an even count.
func Median(xs []float64) float64 { return Of(xs, 0.5) }

// Percentile is Of(xs, p/100) of the finite values of xs (NaN and ±Inf are
// left out), NaN when none is finite.
func Percentile(xs []float64, p float64) float64 {
	finite := make([]float64, 0, len(xs))
	for _, x := range xs {
		if !math.IsNaN(x) && !math.IsInf(x, 0) {
			finite = append(finite, x)
		}
	}
	return Of(finite, p/100)
}

// MedianCI is the distribution-free 95 % confidence interval of the median
// of xs: the k-th smallest and k-th largest value, k = ⌊(n − 1.96·√n) / 2⌋
// (the sign test's order statistics; no assumption about the values'
// distribution). NaN below 8 values (k < 1). xs is not modified.
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
