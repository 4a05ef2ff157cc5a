package bench

import (
	"math"
	"testing"
)

// TestQperfMeasure: a parsed latency test is its latency and round trips, a
// bandwidth test its received rate and messages.
func TestQperfMeasure(t *testing.T) {
	res, err := ParseQperf([]byte("udp_lat:\n    latency  =  62000 ns\ntcp_bw:\n    bw  =  250000000 bytes/sec\n"))
	if err != nil || len(res) != 2 {
		t.Fatalf("parse: %v, %d results", err, len(res))
	}
	if v, ops := res[0].Measure(2, 64); v != 62000 || math.Abs(ops-2e9/62000) > 1e-6 {
		t.Errorf("udp_lat: %v, %v", v, ops)
	}
	if v, ops := res[1].Measure(2, 1000); v != 250000000 || ops != 500000 {
		t.Errorf("tcp_bw: %v, %v", v, ops)
	}
}
