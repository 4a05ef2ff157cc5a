package datapath

import (
	"testing"

	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/vishvananda/netlink"
)

// Probe tests for the kernel matrix: they do what the later netkit and
// EDT/bandwidth features will need, and run only where Probe says the kernel
// has the facility (Debian 6.12 in the VM); elsewhere they skip with the
// probe's reason.

// TestNetkitPairProbe creates an L3 netkit pair (primary forwards, peer
// blackholes by default, as a pod device would), reads both ends back and
// deletes the pair.
func TestNetkitPairProbe(t *testing.T) {
	dptest.RequireRoot(t)
	feats := Probe()
	if !feats.Netkit.Available {
		t.Skip(feats.Netkit.Reason)
	}
	c := dptest.NSConf(t, dptest.NewNetns(t, "nk"))
	nk := &netlink.Netkit{
		LinkAttrs:  netlink.LinkAttrs{Name: "nk0"},
		Mode:       netlink.NETKIT_MODE_L3,
		Policy:     netlink.NETKIT_POLICY_FORWARD,
		PeerPolicy: netlink.NETKIT_POLICY_BLACKHOLE,
	}
	nk.SetPeerAttrs(&netlink.LinkAttrs{Name: "nk1"})
	if err := c.H.LinkAdd(nk); err != nil {
		t.Fatalf("create netkit pair although the probe said %q: %v", feats.Netkit.Reason, err)
	}
	cases := []struct {
		name            string
		primary         bool
		policy, peerPol netlink.NetkitPolicy
	}{
		{"nk0", true, netlink.NETKIT_POLICY_FORWARD, netlink.NETKIT_POLICY_BLACKHOLE},
		{"nk1", false, netlink.NETKIT_POLICY_BLACKHOLE, netlink.NETKIT_POLICY_FORWARD},
	}
	for _, tc := range cases {
		l := c.Link(tc.name)
		got, ok := l.(*netlink.Netkit)
		if !ok {
			t.Fatalf("%s reads back as %T (type %q), want netkit", tc.name, l, l.Type())
		}
		if got.Mode != netlink.NETKIT_MODE_L3 {
			t.Errorf("%s mode = %d, want L3 (%d)", tc.name, got.Mode, netlink.NETKIT_MODE_L3)
		}
		if got.IsPrimary() != tc.primary {
			t.Errorf("%s primary = %v, want %v", tc.name, got.IsPrimary(), tc.primary)
		}
		// the policy of each end is reported from that end's point of view
		if got.Policy != tc.policy || got.PeerPolicy != tc.peerPol {
			t.Errorf("%s policy %d / peer policy %d, want %d / %d", tc.name, got.Policy, got.PeerPolicy, tc.policy, tc.peerPol)
		}
		t.Logf("%s: type %s mode %d primary %v policy %d peer policy %d", tc.name, got.Type(), got.Mode, got.IsPrimary(), got.Policy, got.PeerPolicy)
	}
	if err := c.H.LinkDel(c.Link("nk0")); err != nil {
		t.Fatalf("delete netkit pair: %v", err)
	}
	for _, name := range []string{"nk0", "nk1"} {
		if _, err := c.H.LinkByName(name); err == nil {
			t.Errorf("%s still exists after deleting the pair", name)
		}
	}
}

// TestFQQdiscProbe adds an fq qdisc (the EDT scheduler) as root qdisc of a
// veth, reads its options back and deletes it.
func TestFQQdiscProbe(t *testing.T) {
	dptest.RequireRoot(t)
	feats := Probe()
	if !feats.SchFQ.Available {
		t.Skip(feats.SchFQ.Reason)
	}
	c := dptest.NSConf(t, dptest.NewNetns(t, "fq"))
	c.Veth("veth0", "", "veth1", "", "")
	c.Up("veth0", "veth1")
	dev := c.Link("veth0")
	q := netlink.NewFq(netlink.QdiscAttrs{LinkIndex: dev.Attrs().Index, Parent: netlink.HANDLE_ROOT, Handle: netlink.MakeHandle(0xa1, 0)})
	q.FlowPacketLimit = 123
	q.Horizon = 2_000_000 // µs: EDT stamps further out are dropped
	if err := c.H.QdiscAdd(q); err != nil {
		t.Fatalf("add fq qdisc although the probe said %q: %v", feats.SchFQ.Reason, err)
	}
	find := func() *netlink.Fq {
		qs, err := c.H.QdiscList(dev)
		if err != nil {
			t.Fatalf("list qdiscs of veth0: %v", err)
		}
		for _, q := range qs {
			if fq, ok := q.(*netlink.Fq); ok && fq.Handle == netlink.MakeHandle(0xa1, 0) {
				return fq
			}
		}
		return nil
	}
	got := find()
	if got == nil {
		t.Fatal("fq qdisc 0xa1: not listed after adding it")
	}
	if got.Parent != netlink.HANDLE_ROOT || got.FlowPacketLimit != 123 || got.Pacing != 1 || got.Horizon != 2_000_000 {
		t.Errorf("fq reads back as parent %x %s", got.Parent, got)
	}
	t.Logf("fq qdisc: %s", got)
	if err := c.H.QdiscDel(got); err != nil {
		t.Fatalf("delete fq qdisc: %v", err)
	}
	if find() != nil {
		t.Error("fq qdisc still listed after deleting it")
	}
	if err := c.H.QdiscDel(got); err == nil {
		t.Error("deleting the fq qdisc twice succeeded")
	}
}
