package agent

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/axonhq/axon/internal/lb"
)

// TestTeeWriter: ClusterIPs go to the socket LB only, external frontends to
// both; the read-back makes the Service watch's resync repair either writer.
func TestTeeWriter(t *testing.T) {
	be := []lb.Backend{{Addr: netip.MustParseAddr("10.244.1.5"), Port: 8080}}
	cip := lb.Frontend{Key: lb.FrontendKey{Addr: netip.MustParseAddr("10.96.0.10"), Port: 80, Proto: lb.TCP}, Kind: lb.KindClusterIP, Backends: be}
	ext := lb.Frontend{Key: lb.FrontendKey{Addr: netip.MustParseAddr("203.0.113.10"), Port: 80, Proto: lb.TCP}, Kind: lb.KindLoadBalancer, Backends: be}
	np := lb.Frontend{Key: lb.FrontendKey{Addr: netip.IPv4Unspecified(), Port: 30080, Proto: lb.TCP, Scope: lb.ScopeNodePort}, Kind: lb.KindNodePort, Backends: be}
	keys := func(fs []lb.Frontend) []string {
		var out []string
		for _, f := range fs {
			out = append(out, f.Key.String())
		}
		return out
	}
	sock, ns := lb.NewMemWriter(0), lb.NewMemWriter(0)
	tee := newTeeWriter(sock, ns)

	// A new tee reports the external frontends the secondary lacks as
	// missing, and — read-backs carry no kind — every frontend it has not
	// written yet (the first resync rewrites them through the tee).
	if err := sock.UpsertFrontend(cip); err != nil {
		t.Fatal(err)
	}
	if err := sock.UpsertFrontend(ext); err != nil {
		t.Fatal(err)
	}
	got, err := tee.Frontends()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 0 {
		t.Errorf("cold read-back = %v, want nothing (all rewritten)", keys(got))
	}
	for _, f := range []lb.Frontend{cip, ext, np} {
		if err := tee.UpsertFrontend(f); err != nil {
			t.Fatal(err)
		}
	}
	s, _ := sock.Frontends()
	n, _ := ns.Frontends()
	if len(s) != 3 || len(n) != 2 {
		t.Fatalf("socket LB has %v, north-south has %v", keys(s), keys(n))
	}
	if got, _ := tee.Frontends(); len(got) != 3 {
		t.Errorf("warm read-back = %v, want all 3", keys(got))
	}

	// The secondary loses one (e.g. a failed write): reported missing.
	if err := ns.DeleteFrontend(ext.Key); err != nil {
		t.Fatal(err)
	}
	got, _ = tee.Frontends()
	if len(got) != 2 {
		t.Errorf("read-back after the secondary lost %s = %v", ext.Key, keys(got))
	}
	// The secondary differs: its version is reported (so it differs from the table).
	stale := ext
	stale.Backends = nil
	_ = tee.UpsertFrontend(ext)
	_ = ns.UpsertFrontend(stale)
	got, _ = tee.Frontends()
	for _, f := range got {
		if f.Key == ext.Key && lb.SameDatapath(f, ext) {
			t.Errorf("a stale secondary entry is hidden by the primary's")
		}
	}
	// Only the secondary holds a frontend: reported, so the resync deletes it.
	orphan := np
	orphan.Key.Port = 30099
	_ = ns.UpsertFrontend(orphan)
	got, _ = tee.Frontends()
	found := false
	for _, f := range got {
		found = found || f.Key == orphan.Key
	}
	if !found {
		t.Error("a frontend only the secondary holds is not reported")
	}
	if err := tee.DeleteFrontend(orphan.Key); err != nil {
		t.Fatal(err)
	}
	// A new tee told what the table wants (the Service watch's resync):
	// a ClusterIP the socket LB already holds is reported as programmed
	// (no rewrite of every ClusterIP when the north-south LB appears), an
	// external frontend the secondary lacks still as missing.
	sock2, ns2 := lb.NewMemWriter(0), lb.NewMemWriter(0)
	for _, f := range []lb.Frontend{cip, ext} {
		if err := sock2.UpsertFrontend(f); err != nil {
			t.Fatal(err)
		}
	}
	table := map[lb.FrontendKey]lb.Kind{cip.Key: cip.Kind, ext.Key: ext.Kind}
	got, err = newTeeWriter(sock2, ns2).FrontendsFor(func(k lb.FrontendKey) (lb.Kind, bool) {
		kind, ok := table[k]
		return kind, ok
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Key != cip.Key {
		t.Errorf("cold read-back with the table's kinds = %v, want only the ClusterIP %s", keys(got), cip.Key)
	}
	// No socket LB: the tee is the secondary alone.
	solo := newTeeWriter(nil, ns)
	if err := solo.UpsertFrontend(cip); err != nil {
		t.Fatal(err)
	}
	n, _ = ns.Frontends()
	for _, f := range n {
		if f.Key == cip.Key {
			t.Error("a ClusterIP reached the north-south LB")
		}
	}
}

func TestMaglevIndexes(t *testing.T) {
	bs := []lb.Backend{
		{Addr: netip.MustParseAddr("10.0.0.1"), Port: 80, State: lb.Active},
		{Addr: netip.MustParseAddr("10.0.0.2"), Port: 80, State: lb.Terminating},
		{Addr: netip.MustParseAddr("10.0.0.3"), Port: 80, State: lb.Active},
	}
	tab, err := maglevIndexes(bs, 251, "")
	if err != nil || len(tab) != 251 {
		t.Fatalf("table %d slots, err %v", len(tab), err)
	}
	for _, i := range tab {
		if i == 1 {
			t.Fatal("a terminating backend got a slot while active ones exist")
		}
	}
	bs[0].State, bs[2].State = lb.Quarantined, lb.Quarantined
	tab, _ = maglevIndexes(bs, 251, "")
	for _, i := range tab {
		if i != 1 {
			t.Fatal("with no active backend, the terminating one should hold every slot")
		}
	}
	bs[1].State = lb.Quarantined
	if tab, err := maglevIndexes(bs, 251, ""); tab != nil || err != nil {
		t.Errorf("no eligible backend: got %d slots, %v", len(tab), err)
	}
}

func TestNodePortConfigValidate(t *testing.T) {
	good := DefaultNodePortConfig()
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	bad := good
	bad.Acceleration, bad.Mode, bad.MaglevSize, bad.CTMax, bad.CTUDPTimeout = "fast", "nat", 1000, 5, 0
	err := bad.Validate()
	for _, want := range []string{"--lb-acceleration", "--nodeport-mode", "--maglev-table-size", "--ct-max", "--ct-udp-timeout"} {
		if err == nil || !contains(err.Error(), want) {
			t.Errorf("error %v lacks %s", err, want)
		}
	}
	bad.Enabled = false
	if err := bad.Validate(); err != nil {
		t.Errorf("--nodeport=false still validates the other flags: %v", err)
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }
