package main

import (
	"strings"
	"testing"
	"time"
)

func TestDiffAndRender(t *testing.T) {
	before := map[string]usage{
		"axon_pod_egress": {Runs: 100, Time: 40 * time.Microsecond, Progs: 2},
		"axon_idle":       {Runs: 7, Time: time.Microsecond, Progs: 1},
	}
	after := map[string]usage{
		"axon_pod_egress":     {Runs: 1100, Time: 440 * time.Microsecond, Progs: 2},
		"axon_idle":           {Runs: 7, Time: time.Microsecond, Progs: 1},
		"axon_uplink_ingress": {Runs: 500, Time: 75 * time.Microsecond, Progs: 2}, // loaded meanwhile
	}
	d := diff(before, after)
	cases := []struct {
		name string
		want usage
		ok   bool
	}{
		{"axon_pod_egress", usage{Runs: 1000, Time: 400 * time.Microsecond, Progs: 2}, true},
		{"axon_uplink_ingress", usage{Runs: 500, Time: 75 * time.Microsecond, Progs: 2}, true},
		{"axon_idle", usage{}, false}, // did not run
	}
	for _, c := range cases {
		got, ok := d[c.name]
		if ok != c.ok || got != c.want {
			t.Errorf("%s: %+v (present %v), want %+v (present %v)", c.name, got, ok, c.want, c.ok)
		}
	}
	out := render(d, 500)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 {
		t.Fatalf("want a header and 2 rows:\n%s", out)
	}
	// busiest first; 400 ns per run, 2 runs and 800 ns per unit of 500
	for i, want := range [][]string{
		{"axon_pod_egress", "1000", "400", "2.00", "800"},
		{"axon_uplink_ingress", "500", "150", "1.00", "150"},
	} {
		if f := strings.Fields(lines[i+1]); strings.Join(f, " ") != strings.Join(want, " ") {
			t.Errorf("row %d = %q, want %q", i, f, want)
		}
	}
	if f := strings.Fields(strings.Split(render(d, 0), "\n")[1]); len(f) != 3 {
		t.Errorf("without -per a row has 3 fields, got %q", f)
	}
}
