package stats

import (
	"math"
	"slices"
	"testing"
)

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		name string
		xs   []float64
		want float64
	}{
		{"empty", nil, math.NaN()},
		{"one", []float64{7}, 7},
		{"odd, unsorted", []float64{3, 1, 2}, 2},
		{"even: mean of the middle two", []float64{4, 1, 3, 2}, 2.5},
		{"duplicates", []float64{5, 5, 1, 5}, 5},
		{"negative", []float64{-1, -3, -2}, -2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Median(tc.xs); !same(got, tc.want) {
				t.Errorf("Median(%v) = %v, want %v", tc.xs, got, tc.want)
			}
		})
	}
}

func TestQuantile(t *testing.T) {
	ten := []float64{10, 9, 8, 7, 6, 5, 4, 3, 2, 1}
	for _, tc := range []struct {
		name string
		xs   []float64
		q    float64
		want float64
	}{
		{"empty", nil, 0.5, math.NaN()},
		{"one value, any q", []float64{7}, 0.99, 7},
		{"q 0 is the minimum", ten, 0, 1},
		{"q 1 is the maximum", ten, 1, 10},
		{"median of ten", ten, 0.5, 5.5},
		{"p25 of ten: h = 2.25", ten, 0.25, 3.25},
		{"p90 of ten: h = 8.1", ten, 0.9, 9.1},
		{"p99 of ten: h = 8.91", ten, 0.99, 9.91},
		{"p25 of 1..5 (R type 7: 2)", []float64{1, 2, 3, 4, 5}, 0.25, 2},
		{"p75 of 1,2,4,8 (R type 7: 5)", []float64{8, 4, 2, 1}, 0.75, 5},
		{"p75 of two", []float64{1, 2}, 0.75, 1.75},
		{"median of three", []float64{3, 1, 2}, 0.5, 2},
		{"q below 0 clamps", ten, -1, 1},
		{"q above 1 clamps", ten, 2, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Quantile(tc.xs, tc.q); !near(got, tc.want) {
				t.Errorf("Quantile(%v, %v) = %v, want %v", tc.xs, tc.q, got, tc.want)
			}
		})
	}
}

func TestNearestRank(t *testing.T) {
	hundred := make([]float64, 100)
	for i := range hundred {
		hundred[i] = float64(100 - i) // 100..1, unsorted
	}
	for _, tc := range []struct {
		name string
		xs   []float64
		q    float64
		want float64
	}{
		{"empty", nil, 0.5, math.NaN()},
		{"q 0 is the minimum", hundred, 0, 1},
		{"p50 of 1..100", hundred, 0.5, 50},
		{"p99 of 1..100", hundred, 0.99, 99},
		{"p100 is the maximum", hundred, 1, 100},
		{"p50 of four: the 2nd", []float64{40, 10, 30, 20}, 0.5, 20},
		{"p99 of four: the maximum", []float64{40, 10, 30, 20}, 0.99, 40},
		{"p50 of five: the 3rd", []float64{5, 4, 3, 2, 1}, 0.5, 3},
		{"q above 1 clamps", []float64{1, 2}, 1.5, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := NearestRank(tc.xs, tc.q); !same(got, tc.want) {
				t.Errorf("NearestRank(%v, %v) = %v, want %v", tc.xs, tc.q, got, tc.want)
			}
		})
	}
}

func TestMedianCI(t *testing.T) {
	desc := func(n int) []float64 { // n, n−1, …, 1: not sorted for MedianCI
		xs := make([]float64, n)
		for i := range xs {
			xs[n-1-i] = float64(i + 1)
		}
		return xs
	}
	for _, tc := range []struct {
		name   string
		xs     []float64
		lo, hi float64
	}{
		// n = 230: k = ⌊(230 − 1.96·√230) / 2⌋ = 100, so the 100th and 131st values
		{"1..230", desc(230), 100, 131},
		{"7 values: too few for an interval", desc(7), math.NaN(), math.NaN()},
		// the smallest count with an interval: k = ⌊(8 − 1.96·√8) / 2⌋ = 1
		{"8 values: the extremes", desc(8), 1, 8},
		{"empty", nil, math.NaN(), math.NaN()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if lo, hi := MedianCI(tc.xs); !same(lo, tc.lo) || !same(hi, tc.hi) {
				t.Errorf("MedianCI = %v..%v, want %v..%v", lo, hi, tc.lo, tc.hi)
			}
		})
	}
}

// TestInputUnchanged: callers keep their samples in the order measured.
func TestInputUnchanged(t *testing.T) {
	xs := []float64{3, 1, 2}
	orig := slices.Clone(xs)
	Median(xs)
	Quantile(xs, 0.9)
	NearestRank(xs, 0.9)
	if !slices.Equal(xs, orig) {
		t.Errorf("input changed to %v, want %v", xs, orig)
	}
	ci := []float64{8, 7, 6, 5, 4, 3, 2, 1} // enough values for MedianCI to sort a copy
	MedianCI(ci)
	if want := []float64{8, 7, 6, 5, 4, 3, 2, 1}; !slices.Equal(ci, want) {
		t.Errorf("MedianCI changed its input to %v", ci)
	}
}

func same(a, b float64) bool { return a == b || math.IsNaN(a) && math.IsNaN(b) }

func near(a, b float64) bool { return same(a, b) || math.Abs(a-b) < 1e-9 }
