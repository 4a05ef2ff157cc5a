package ethtool

import (
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"

	"github.com/axonhq/axon/internal/testutil"
)

// TestSetGet switches features of a veth in a private namespace and reads
// them back.
func TestSetGet(t *testing.T) {
	testutil.RequireRoot(t, "creates a network namespace")
	netns, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	defer testutils.UnmountNS(netns)
	defer netns.Close()
	err = netns.Do(func(ns.NetNS) error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "et0"}, PeerName: "et1"}); err != nil {
			return err
		}
		for _, c := range []struct {
			f  Feature
			on bool
		}{{GRO, true}, {GRO, false}, {TSO, false}, {TSO, true}, {TxChecksum, false}} {
			if err := Set("et0", c.f, c.on); err != nil {
				t.Errorf("Set %s %v: %v", c.f, c.on, err)
				continue
			}
			if got, err := Get("et0", c.f); err != nil || got != c.on {
				t.Errorf("after Set %s %v: Get = %v, %v", c.f, c.on, got, err)
			}
		}
		// TSO needs transmit checksums: with them off it cannot be on.
		if on, err := Get("et0", TSO); err != nil || on {
			t.Errorf("TSO with tx checksums off: %v, %v", on, err)
		}
		if err := Set("nosuchdev0", GRO, true); err == nil || !strings.Contains(err.Error(), "nosuchdev0") {
			t.Errorf("missing device: %v", err)
		}
		if _, err := Get("a-name-longer-than-ifnamsiz", GRO); err == nil {
			t.Error("a name longer than IFNAMSIZ: no error")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
