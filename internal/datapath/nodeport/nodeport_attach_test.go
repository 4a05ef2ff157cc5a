package nodeport

import (
	"os"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/datapath/dptest"
)

// TestNodePortAttach: the tc ingress program goes first in the uplink's
// chain (before axon's uplink program, here a stand-in attached earlier),
// egress and XDP attach and pin, a second Attach updates in place, Detach
// removes everything.
func TestNodePortAttach(t *testing.T) {
	f := newNPFix(t, nil)
	tcx := datapath.Probe().TCX.Available
	for _, mode := range []string{XDPGeneric, XDPNative} {
		t.Run("xdp="+mode, func(t *testing.T) {
			var a Attachment
			var err error
			dptest.InNetns(t, f.ns, func() {
				if tcx {
					// stand-in for axon_uplink_ingress, attached before the LB
					l, lerr := link.AttachTCX(link.TCXOptions{Interface: f.upIf, Program: f.n.tc.AxonLbEgress, Attach: ebpf.AttachTCXIngress})
					if lerr != nil {
						t.Errorf("stand-in: %v", lerr)
						return
					}
					defer l.Close()
				}
				if a, err = f.n.Attach("eth0", mode); err != nil {
					return
				}
				if _, err = f.n.Attach("eth0", mode); err != nil { // in place
					return
				}
				if tcx {
					res, qerr := link.QueryPrograms(link.QueryOptions{Target: f.upIf, Attach: ebpf.AttachTCXIngress})
					if qerr != nil {
						t.Errorf("query: %v", qerr)
						return
					}
					info, _ := f.n.tc.AxonLbIngress.Info()
					id, _ := info.ID()
					if len(res.Programs) != 2 || res.Programs[0].ID != id {
						t.Errorf("tcx ingress chain %+v: the LB (id %d) must run first", res.Programs, id)
					}
				}
				err = f.n.Detach("eth0")
			})
			if err != nil {
				t.Fatal(err)
			}
			if a.XDP != mode || a.Ingress == "" || a.Egress == "" {
				t.Errorf("attachment %+v", a)
			}
			if (a.Ingress == "tcx") != tcx {
				t.Errorf("ingress %s with tcx available=%v", a.Ingress, tcx)
			}
			pins, _ := listNPLinkPins(f.pin)
			if len(pins) != 0 {
				t.Errorf("pins left after Detach: %+v", pins)
			}
		})
	}
	// XDP removed when re-attached without it
	dptest.InNetns(t, f.ns, func() {
		if _, err := f.n.Attach("eth0", XDPGeneric); err != nil {
			t.Error(err)
			return
		}
		if _, err := f.n.Attach("eth0", XDPNone); err != nil {
			t.Error(err)
		}
	})
	if _, err := os.Stat(datapath.PinPath(f.pin, datapath.PinXDP, npRoleXDP, "eth0")); !os.IsNotExist(err) {
		t.Errorf("XDP pin still there after Attach without XDP: %v", err)
	}
	if _, err := f.n.Attach("bad/name", XDPNone); err == nil {
		t.Error("invalid interface name accepted")
	}
	if _, err := f.n.Attach("eth0", "turbo"); err == nil {
		t.Error("unknown XDP mode accepted")
	}
}

// TestNodePortLegacyOrder: in legacy tc (kernels without tcx) the LB's
// cls_bpf filter shares prio 1 with axon's uplink filter (handle 0xa10);
// cls_bpf runs the filters of one prio newest first, so the LB, attached
// after the datapath, runs first. Checked here with the filter dump order
// (= run order).
func TestNodePortLegacyOrder(t *testing.T) {
	f := newNPFix(t, nil)
	dptest.InNetns(t, f.ns, func() {
		dev, err := netlink.LinkByName("eth0")
		if err != nil {
			t.Error(err)
			return
		}
		// stand-in for axon's uplink filter
		if err := datapath.Attach(f.pin, dev, f.n.tc.AxonLbEgress, datapath.TCHook(datapath.RoleUplink, true)); err != nil {
			t.Error(err)
			return
		}
		if err := datapath.Attach(f.pin, dev, f.n.tc.AxonLbIngress, npHook(npRoleIn, true)); err != nil {
			t.Error(err)
			return
		}
		// the datapath re-attaching in place (agent restart) keeps the order
		if err := datapath.Attach(f.pin, dev, f.n.tc.AxonLbEgress, datapath.TCHook(datapath.RoleUplink, true)); err != nil {
			t.Error(err)
			return
		}
		fl, err := netlink.FilterList(dev, netlink.HANDLE_MIN_INGRESS)
		if err != nil {
			t.Error(err)
			return
		}
		var handles []uint32
		for _, x := range fl {
			handles = append(handles, x.Attrs().Handle)
		}
		lbHandle, upHandle := npHook(npRoleIn, true).Handle, datapath.TCHook(datapath.RoleUplink, true).Handle
		if len(handles) != 2 || handles[0] != lbHandle || handles[1] != upHandle {
			t.Errorf("ingress filters in run order: %#x, want the LB (%#x) before axon's (%#x)", handles, lbHandle, upHandle)
		}
		if err := f.n.Detach("eth0"); err != nil {
			t.Error(err)
		}
		_ = datapath.Detach(f.pin, "eth0", datapath.TCHook(datapath.RoleUplink, true))
	})
}
