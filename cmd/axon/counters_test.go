package main

import "testing"

func TestFormatCounters(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   map[string]uint64
		want string
	}{
		{"none", nil, ""},
		{"one", map[string]uint64{"pass": 3}, "pass=3"},
		{"sorted by name", map[string]uint64{"tx": 2, "drop": 0, "pass": 10}, "drop=0 pass=10 tx=2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := formatCounters(tc.in); got != tc.want {
				t.Errorf("formatCounters(%v) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}
