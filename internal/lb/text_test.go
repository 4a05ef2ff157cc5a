package lb

import (
	"errors"
	"net/netip"
	"slices"
	"testing"
	"time"
)

// TestRender: any input order gives the same text; the input is not modified.
func TestRender(t *testing.T) {
	be := func(s string, st BackendState, node, zone string) Backend {
		ap := netip.MustParseAddrPort(s)
		return Backend{Addr: ap.Addr(), Port: ap.Port(), State: st, NodeName: node, Zone: zone}
	}
	fs := []Frontend{
		{Key: FrontendKey{Addr: netip.MustParseAddr("fd00:10:96::a"), Port: 53, Proto: UDP}, Kind: KindClusterIP, Service: "kube-system/kube-dns", PortName: "dns",
			Backends: []Backend{be("[fd00:10:244:2::7]:53", Terminating, "node2", ""), be("[fd00:10:244:1::5]:53", Active, "node1", "a")}},
		{Key: FrontendKey{Addr: netip.IPv6Unspecified(), Port: 30080, Proto: TCP, Scope: ScopeNodePort}, Kind: KindNodePort, Service: "default/web", LocalOnly: true},
		{Key: FrontendKey{Addr: netip.MustParseAddr("10.96.0.10"), Port: 53, Proto: UDP}, Kind: KindClusterIP, Service: "kube-system/kube-dns", PortName: "dns",
			Affinity: 90 * time.Second, Backends: []Backend{be("10.244.2.7:53", Quarantined, "", ""), be("10.244.1.5:53", Active, "node1", "")}},
		{Key: FrontendKey{Addr: netip.IPv4Unspecified(), Port: 30080, Proto: Proto(99), Scope: Scope(7)}, Kind: "Weird", Service: "x/y",
			Backends: []Backend{be("10.244.1.5:80", BackendState(9), "n", "")}},
	}
	orig := slices.Clone(fs)
	got := Render(fs)
	golden(t, "render", got)
	slices.Reverse(fs)
	if Render(fs) != got {
		t.Error("input order changed the output")
	}
	slices.Reverse(fs)
	for i := range fs {
		if !Equal(fs[i], orig[i]) {
			t.Errorf("Render modified its input at %d", i)
		}
	}
	if Render(nil) != "" {
		t.Error("empty input should render nothing")
	}
}

func TestMemWriter(t *testing.T) {
	w := NewMemWriter(1)
	a := Frontend{Key: FrontendKey{Addr: netip.MustParseAddr("10.96.0.1"), Port: 80, Proto: TCP}}
	b := Frontend{Key: FrontendKey{Addr: netip.MustParseAddr("10.96.0.2"), Port: 80, Proto: TCP}}
	if err := w.UpsertFrontend(a); err != nil {
		t.Fatal(err)
	}
	if err := w.UpsertFrontend(b); !errors.Is(err, ErrMemFull) {
		t.Errorf("second frontend in a 1-entry writer: %v, want ErrMemFull", err)
	}
	if err := w.UpsertFrontend(a); err != nil { // replacing fits
		t.Errorf("replace: %v", err)
	}
	w.FailNext(1)
	if err := w.DeleteFrontend(a.Key); err == nil {
		t.Error("injected failure not returned")
	}
	ch := w.Changed()
	if err := w.DeleteFrontend(a.Key); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
	default:
		t.Error("Changed not closed by a write")
	}
	if fs, _ := w.Frontends(); len(fs) != 0 {
		t.Errorf("left %v", fs)
	}
	if ops, next := w.Ops(0); len(ops) != 3 || next != 3 || !ops[2].Delete {
		t.Errorf("ops %+v next %d", ops, next)
	}
}
