package quantile

import (
	"math"
	"testing"
)

func TestQuantile(t *testing.T) {
	for _, tc := range []struct {
		xs      []float64
		q, want float64
	}{
		{[]float64{3, 1, 2}, 0.5, 2},
		{[]float64{4, 1, 3, 2}, 0.5, 2.5},
		{[]float64{1, 2, 3, 4, 5}, 0.25, 2},
		{[]float64{1, 2}, 0.75, 1.75},
		{[]float64{7}, 0.25, 7},
	} {
		if got := Of(append([]float64(nil), tc.xs...), tc.q); got != tc.want {
			t.Errorf("Of(%v, %v) = %v, want %v", tc.xs, tc.q, got, tc.want)
		}
	}
	if !math.IsNaN(Of(nil, 0.5)) {
		t.Error("quantile of nothing is not NaN")
	}
}

func TestMedianCI(t *testing.T) {
	xs := make([]float64, 230)
	for i := range xs {
		xs[len(xs)-1-i] = float64(i + 1) // 230, 229, …, 1: not sorted by MedianCI
	}
	// n = 230: k = ⌊(230 − 1.96·√230) / 2⌋ = 100, so the 100th and 131st values
	if lo, hi := MedianCI(xs); lo != 100 || hi != 131 {
		t.Errorf("medianCI of 1..230 = %v..%v, want 100..131", lo, hi)
	}
	if lo, hi := MedianCI([]float64{1, 2, 3, 4, 5, 6, 7}); !math.IsNaN(lo) || !math.IsNaN(hi) {
		t.Errorf("7 values: %v..%v, want NaN (too few for an interval)", lo, hi)
	}
	// the smallest count with an interval: k = ⌊(8 − 1.96·√8) / 2⌋ = 1
	if lo, hi := MedianCI([]float64{8, 7, 6, 5, 4, 3, 2, 1}); lo != 1 || hi != 8 {
		t.Errorf("8 values: %v..%v, want 1..8", lo, hi)
	}
}

// TestOf: the ends, interpolation at an exact rank, and that the input is left alone.
func TestOf(t *testing.T) {
	for _, tc := range []struct {
		xs      []float64
		q, want float64
	}{
		{[]float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 0.9, 9.1},
		{[]float64{4, 1, 3, 2}, 1, 4},
		{[]float64{4, 1, 3, 2}, 0, 1},
	} {
		in := append([]float64(nil), tc.xs...)
		if got := Of(in, tc.q); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("Of(%v, %v) = %v, want %v", tc.xs, tc.q, got, tc.want)
		}
		for i := range in {
			if in[i] != tc.xs[i] {
				t.Fatalf("Of sorted its input: %v", in)
			}
		}
	}
	if !math.IsNaN(Of(nil, 0.5)) || !math.IsNaN(Median(nil)) {
		t.Error("the quantile of nothing is not NaN")
	}
	if got := Median([]float64{4, 1, 3, 2}); got != 2.5 {
		t.Errorf("Median = %v, want 2.5", got)
	}
}

func TestPercentile(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	for _, tc := range []struct {
		xs      []float64
		p, want float64
	}{
		{[]float64{5}, 99, 5},
		{[]float64{4, 1, 3, 2}, 50, 2.5},
		{[]float64{4, 1, 3, 2}, 99, 3.97},
		{[]float64{nan, 4, inf, 1, 3, 2}, 50, 2.5},
	} {
		if got := Percentile(tc.xs, tc.p); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("Percentile(%v, %v) = %v, want %v", tc.xs, tc.p, got, tc.want)
		}
	}
	if !math.IsNaN(Percentile([]float64{nan}, 50)) {
		t.Error("the percentile of no finite value is not NaN")
	}
}
