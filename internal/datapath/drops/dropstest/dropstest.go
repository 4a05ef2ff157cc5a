// Package dropstest holds what the traffic tests of the datapath packages
// need to watch the shared drop counters and drop events: the pinned drop
// maps with a Hub on them, and one counter by reason and direction. It is a
// package of its own because dptest cannot import drops (the drops
// package's own tests import dptest).
package dropstest

import (
	"testing"

	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/axonhq/axon/internal/datapath/drops"
)

// Open opens the drop maps pinned under pinDir and starts a Hub on them
// that logs to the test; both are closed when the test ends.
func Open(t testing.TB, pinDir string) (*drops.Maps, *drops.Hub) {
	t.Helper()
	mp, err := drops.Open(pinDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(mp.Close)
	hub, err := drops.NewHub(mp, dptest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hub.Close)
	return mp, hub
}

// Counter reads the drop counter of reason (e.g. "drop_no_backend") and
// direction ("ingress" or "egress"); a missing counter fails the test.
func Counter(t testing.TB, mp *drops.Maps, reason, direction string) drops.Count {
	t.Helper()
	cs, err := mp.ReadCounts()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cs {
		if c.Reason == reason && c.Direction == direction {
			return c
		}
	}
	t.Fatalf("no %s/%s drop counter", reason, direction)
	return drops.Count{}
}
