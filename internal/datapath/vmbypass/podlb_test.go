package vmbypass

import (
	"net/netip"
	"testing"

	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/axonhq/axon/internal/datapath/podlb"
	"github.com/axonhq/axon/internal/datapath/socklb"
	"github.com/axonhq/axon/internal/lb"
	"github.com/axonhq/axon/internal/testutil"
)

// TestGuestReachesClusterIP: the guest of a VM pod reaches a ClusterIP whose
// backend is the host behind the node, through the pod's own per-packet LB
// (its packets translated at the pod interface's egress, the replies at the
// tap's egress), over the in-pod bridge and then over the VM bypass with the
// bridge's ports isolated: TCP both times with the guest's partial checksums
// and TSO segments crossing the tap as with QEMU, every checksum verified in
// software at the guest and the remote end (none wrong), and the pod LB's
// counters moved by new flows and replies, the bypass's by the bytes.
func TestGuestReachesClusterIP(t *testing.T) {
	g := newGuestNet(t, "")
	cg, _ := testutil.NewCgroup(t, "axt-vmb-podlb-")
	sock, err := socklb.Load(g.pinDir, cg, dptest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sock.Close()
		if err := podlb.Uninstall(g.pinDir, []string{g.podPath}); err != nil {
			t.Errorf("pod LB uninstall: %v", err)
		}
		if err := socklb.Uninstall(g.pinDir, cg); err != nil {
			t.Errorf("socket LB uninstall: %v", err)
		}
	})
	fe := netip.MustParseAddrPort("10.96.8.1:80")
	be := netip.AddrPortFrom(remote4, 5203)
	if err := sock.UpsertFrontend(lb.Frontend{Key: lb.FrontendKey{Addr: fe.Addr(), Port: fe.Port(), Proto: lb.TCP, Scope: lb.ScopeCluster},
		Backends: []lb.Backend{{Addr: be.Addr(), Port: be.Port(), State: lb.Active}}}); err != nil {
		t.Fatal(err)
	}
	plb, err := podlb.New(podlb.Config{PinDir: g.pinDir, Logger: dptest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := plb.Attach(g.id, g.podPath, podlb.Target{Ifname: "eth0", Tap: tapName}); err != nil {
		t.Fatal(err)
	}
	csumErrs := func(ns string) uint64 { return dptest.SNMPCounter(t, ns, "Tcp", "InCsumErrors") }
	const n = 4 << 20
	for _, path := range []string{"bridge", "bypass"} {
		t.Run(path, func(t *testing.T) {
			if path == "bypass" {
				g.isolate(true)
				g.attach()
			}
			before, err := plb.Counters(g.id)
			if err != nil {
				t.Fatal(err)
			}
			var vmb Stats
			if path == "bypass" {
				vmb = g.stats()
			}
			r0, g0 := csumErrs(g.remote), csumErrs(g.guest)
			if err := dptest.TCPBulkVia(t, g.guest, g.remote, be, fe, n); err != nil {
				t.Fatalf("guest -> %s (backend %s): %v", fe, be, err)
			}
			after, err := plb.Counters(g.id)
			if err != nil {
				t.Fatal(err)
			}
			if after["new"] != before["new"]+1 || after["reply"] <= before["reply"] || after["hit"] <= before["hit"] {
				t.Errorf("pod LB counters %v -> %v: want one new flow, its later segments and replies translated", before, after)
			}
			if e := csumErrs(g.remote) - r0; e != 0 {
				t.Errorf("remote: %d TCP checksum errors", e)
			}
			if e := csumErrs(g.guest) - g0; e != 0 {
				t.Errorf("guest: %d TCP checksum errors", e)
			}
			if path == "bypass" {
				if up := g.stats().Counters["tap_bytes"] - vmb.Counters["tap_bytes"]; up < n {
					t.Errorf("bypass carried %d bytes up, want at least %d", up, n)
				}
			}
			t.Logf("%s: pod LB %v -> %v; guest frames with partial checksum %d, TSO %d", path, before, after, g.relay.partial.Load(), g.relay.gso.Load())
		})
	}
}
