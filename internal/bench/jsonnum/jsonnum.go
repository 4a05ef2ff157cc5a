// Package jsonnum carries the benchmark reports' missing numbers (NaN:
// nothing measured) through JSON, which has no NaN, as null.
package jsonnum

import "math"

// From returns &v, or nil (JSON null) when v is NaN or infinite.
func From(v float64) *float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return nil
	}
	return &v
}

// FromAll is From of every value of xs.
func FromAll(xs []float64) []*float64 {
	out := make([]*float64, len(xs))
	for i, x := range xs {
		out[i] = From(x)
	}
	return out
}

// To returns *p, or NaN when p is nil (JSON null or a missing field).
func To(p *float64) float64 {
	if p == nil {
		return math.NaN()
	}
	return *p
}

// ToAll is To of every value of ps.
func ToAll(ps []*float64) []float64 {
	out := make([]float64, len(ps))
	for i, p := range ps {
		out[i] = To(p)
	}
	return out
}
