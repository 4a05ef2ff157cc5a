package podpath

import (
	"errors"
	"os"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/datapath/dptest"
)

// attachNetns makes a node netns with an uplink eth0 and two pod devices.
func attachNetns(t *testing.T) string {
	t.Helper()
	ns := dptest.NewNetns(t, "att")
	c := dptest.NSConf(t, ns)
	c.Veth("eth0", "", "wire", "", "")
	c.Veth("lxc1", "", "p1", "", "")
	c.Veth("lxc2", "", "p2", "", "")
	c.Up("eth0", "wire", "lxc1", "p1", "lxc2", "p2")
	return ns
}

func ifindex(t *testing.T, name string) int {
	t.Helper()
	l, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return l.Attrs().Index
}

// tcxProgs returns the program IDs attached with tcx ingress on dev; none
// when the kernel has no tcx (the query itself would fail there).
func tcxProgs(t *testing.T, f datapath.Features, dev string) []link.AttachedProgram {
	t.Helper()
	if !f.TCX.Available {
		return nil
	}
	res, err := link.QueryPrograms(link.QueryOptions{Target: ifindex(t, dev), Attach: ebpf.AttachTCXIngress})
	if err != nil {
		t.Fatalf("query tcx on %s: %v", dev, err)
	}
	return res.Programs
}

// axonFilters returns axon's cls_bpf filters on dev's ingress hook.
func axonFilters(t *testing.T, dev string) []*netlink.BpfFilter {
	t.Helper()
	l, err := netlink.LinkByName(dev)
	if err != nil {
		t.Fatal(err)
	}
	fs, err := netlink.FilterList(l, netlink.HANDLE_MIN_INGRESS)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("list filters on %s: %v", dev, err)
	}
	var out []*netlink.BpfFilter
	for _, f := range fs {
		if bf, ok := f.(*netlink.BpfFilter); ok && bf.Handle == podHook(rolePod, datapath.ModeLegacy).Handle {
			out = append(out, bf)
		}
	}
	return out
}

func pinnedLinkInfo(t *testing.T, path string) *link.Info {
	t.Helper()
	l, err := link.LoadPinnedLink(path, nil)
	if err != nil {
		t.Fatalf("load pinned link %s: %v", path, err)
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		t.Fatal(err)
	}
	return info
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func decision(d *Datapath, name string) string {
	for _, dec := range d.Decisions() {
		if dec.Name == name {
			return dec.Value
		}
	}
	return ""
}

func TestAttachTCXAdoptAndUninstall(t *testing.T) {
	dptest.RequireRoot(t)
	feats := datapath.Probe()
	if !feats.TCX.Available {
		t.Skip(feats.TCX.Reason)
	}
	ns := attachNetns(t)
	pin := newPinDir(t)
	cfg := Config{PinDir: pin, Uplink: "eth0", Logger: dptest.Logger(t)}
	podPin := datapath.PinPath(pin, datapath.PinTCX, rolePod, "lxc1")
	upPin := datapath.PinPath(pin, datapath.PinTCX, roleUplink, "eth0")

	dptest.InNetns(t, ns, func() {
		d, err := Load(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if got := decision(d, "attach"); got != datapath.ModeTCX {
			t.Fatalf("attach decision = %q, want tcx (%v)", got, d.Decisions())
		}
		if got := decision(d, "host_routing"); got != datapath.RoutingBPF {
			t.Fatalf("host_routing decision = %q (%v)", got, d.Decisions())
		}
		if len(d.Features()) < 8 {
			t.Errorf("Features() = %v", d.Features())
		}
		for i := 0; i < 2; i++ { // idempotent
			if err := d.AttachPod("lxc1"); err != nil {
				t.Fatalf("AttachPod #%d: %v", i+1, err)
			}
		}
		if n := len(tcxProgs(t, feats, "lxc1")); n != 1 {
			t.Fatalf("%d tcx programs on lxc1 after two AttachPod, want 1", n)
		}
		if n := len(tcxProgs(t, feats, "eth0")); n != 1 {
			t.Fatalf("%d tcx programs on eth0, want 1", n)
		}
		podInfo, upInfo := pinnedLinkInfo(t, podPin), pinnedLinkInfo(t, upPin)
		if err := d.Close(); err != nil {
			t.Fatal(err)
		}
		// Closed: links and pins stay, programs keep running.
		if n := len(tcxProgs(t, feats, "lxc1")); n != 1 {
			t.Fatalf("after Close: %d tcx programs on lxc1, want 1", n)
		}

		d2, err := Load(cfg)
		if err != nil {
			t.Fatalf("second Load: %v", err)
		}
		defer d2.Close()
		podInfo2, upInfo2 := pinnedLinkInfo(t, podPin), pinnedLinkInfo(t, upPin)
		for _, c := range []struct {
			desc      string
			old, new_ *link.Info
		}{{"pod", podInfo, podInfo2}, {"uplink", upInfo, upInfo2}} {
			if c.old.ID != c.new_.ID {
				t.Errorf("%s link id changed %d -> %d: detached instead of adopted", c.desc, c.old.ID, c.new_.ID)
			}
			if c.old.Program == c.new_.Program {
				t.Errorf("%s link still runs program %d: not swapped", c.desc, c.old.Program)
			}
		}
		if progs := tcxProgs(t, feats, "lxc1"); len(progs) != 1 || progs[0].ID != podInfo2.Program {
			t.Errorf("lxc1 tcx programs = %+v, want only %d", progs, podInfo2.Program)
		}

		// GC: lxc2 is not kept, lxc1's device disappears.
		if err := d2.AttachPod("lxc2"); err != nil {
			t.Fatal(err)
		}
		if err := netlink.LinkDel(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "lxc1"}}); err != nil {
			t.Fatal(err)
		}
		if err := d2.GCPodLinks(map[string]bool{"lxc1": true}); err != nil {
			t.Fatalf("GCPodLinks: %v", err)
		}
		if exists(podPin) || exists(datapath.PinPath(pin, datapath.PinTCX, rolePod, "lxc2")) {
			t.Errorf("GC left pins: lxc1 %v lxc2 %v", exists(podPin), exists(datapath.PinPath(pin, datapath.PinTCX, rolePod, "lxc2")))
		}
		if n := len(tcxProgs(t, feats, "lxc2")); n != 0 {
			t.Errorf("GC left %d programs on lxc2", n)
		}

		// Detach is idempotent, also for a device that is gone.
		if err := d2.AttachPod("lxc2"); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 2; i++ {
			if err := d2.DetachPod("lxc2"); err != nil {
				t.Fatalf("DetachPod #%d: %v", i+1, err)
			}
			if err := d2.DetachPod("lxc1"); err != nil {
				t.Fatalf("DetachPod of a deleted device: %v", err)
			}
		}
		if n := len(tcxProgs(t, feats, "lxc2")); n != 0 || exists(datapath.PinPath(pin, datapath.PinTCX, rolePod, "lxc2")) {
			t.Errorf("after DetachPod: %d programs, pin %v", n, exists(datapath.PinPath(pin, datapath.PinTCX, rolePod, "lxc2")))
		}
		if err := d2.AttachPod("nosuchdev"); err == nil {
			t.Error("AttachPod of a missing device succeeded")
		}
		if err := d2.AttachPod("bad/name"); err == nil {
			t.Error("AttachPod accepted an invalid name")
		}

		if err := d2.AttachPod("lxc2"); err != nil {
			t.Fatal(err)
		}
		if err := Uninstall(pin); err != nil {
			t.Fatalf("Uninstall: %v", err)
		}
		if n := len(tcxProgs(t, feats, "eth0")) + len(tcxProgs(t, feats, "lxc2")); n != 0 {
			t.Errorf("after Uninstall: %d programs still attached", n)
		}
		if exists(pin) {
			t.Errorf("after Uninstall: %s still exists", pin)
		}
		if err := Uninstall(pin); err != nil {
			t.Errorf("second Uninstall: %v", err)
		}
	})
}

func TestAttachLegacyAndModeSwitch(t *testing.T) {
	dptest.RequireRoot(t)
	feats := datapath.Probe()
	ns := attachNetns(t)
	pin := newPinDir(t)
	cfg := Config{PinDir: pin, Uplink: "eth0", AttachMode: datapath.ModeLegacy, Logger: dptest.Logger(t)}

	dptest.InNetns(t, ns, func() {
		d, err := Load(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if got := decision(d, "attach"); got != datapath.ModeLegacy {
			t.Fatalf("attach decision = %q, want legacy", got)
		}
		for i := 0; i < 2; i++ {
			if err := d.AttachPod("lxc1"); err != nil {
				t.Fatalf("AttachPod #%d: %v", i+1, err)
			}
		}
		fs := axonFilters(t, "lxc1")
		if len(fs) != 1 || !fs[0].DirectAction {
			t.Fatalf("lxc1 filters = %+v, want one direct-action cls_bpf", fs)
		}
		if n := len(axonFilters(t, "eth0")); n != 1 {
			t.Fatalf("%d axon filters on eth0, want 1", n)
		}
		if n := len(tcxProgs(t, feats, "lxc1")); n != 0 {
			t.Fatalf("legacy mode attached %d tcx programs", n)
		}
		oldProg := fs[0].Id
		d.Close()

		d2, err := Load(cfg) // adopts: filter replaced in place
		if err != nil {
			t.Fatal(err)
		}
		fs = axonFilters(t, "lxc1")
		if len(fs) != 1 || fs[0].Id == oldProg {
			t.Fatalf("after reload: filters %+v (old prog %d): want one with a new program", fs, oldProg)
		}
		if err := d2.DetachPod("lxc1"); err != nil {
			t.Fatal(err)
		}
		if n := len(axonFilters(t, "lxc1")); n != 0 {
			t.Fatalf("after DetachPod: %d filters", n)
		}
		if err := d2.AttachPod("lxc1"); err != nil {
			t.Fatal(err)
		}
		d2.Close()

		// Auto: with tcx the legacy filters go and tcx links replace them;
		// without tcx (kernel < 6.6) auto stays on the legacy filters.
		cfg.AttachMode = datapath.ModeAuto
		d3, err := Load(cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer d3.Close()
		wantFilters, wantTCX, wantMode := 0, 1, datapath.ModeTCX
		if !feats.TCX.Available {
			wantFilters, wantTCX, wantMode = 1, 0, datapath.ModeLegacy
		}
		if got := decision(d3, "attach"); got != wantMode {
			t.Errorf("auto attach decision = %q, want %q (tcx probe: %s)", got, wantMode, feats.TCX.Reason)
		}
		for _, dev := range []string{"lxc1", "eth0"} {
			if n, m := len(axonFilters(t, dev)), len(tcxProgs(t, feats, dev)); n != wantFilters || m != wantTCX {
				t.Errorf("%s after auto reload: %d filters, %d tcx programs; want %d, %d", dev, n, m, wantFilters, wantTCX)
			}
		}

		// Host routing legacy: nothing attached at all.
		d3.Close()
		cfg.HostRouting = datapath.ModeLegacy
		d4, err := Load(cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer d4.Close()
		if err := d4.AttachPod("lxc2"); err != nil {
			t.Fatal(err)
		}
		for _, dev := range []string{"lxc1", "lxc2", "eth0"} {
			if n, m := len(axonFilters(t, dev)), len(tcxProgs(t, feats, dev)); n+m != 0 {
				t.Errorf("%s with host routing legacy: %d filters, %d tcx programs", dev, n, m)
			}
		}
		if got := decision(d4, "host_routing"); got != datapath.ModeLegacy {
			t.Errorf("host_routing = %q", got)
		}

		// Legacy filters are removed by Uninstall too.
		cfg.HostRouting, cfg.AttachMode = datapath.ModeAuto, datapath.ModeLegacy
		d5, err := Load(cfg)
		if err != nil {
			t.Fatal(err)
		}
		d5.Close()
		if err := Uninstall(pin); err != nil {
			t.Fatal(err)
		}
		if n := len(axonFilters(t, "eth0")); n != 0 || exists(pin) {
			t.Errorf("after Uninstall: %d filters on eth0, pin dir exists %v", n, exists(pin))
		}
	})
}

func TestLoadBadConfig(t *testing.T) {
	dptest.RequireRoot(t)
	ns := attachNetns(t)
	pin := newPinDir(t)
	cases := []struct {
		desc string
		cfg  Config
	}{
		{"empty pin dir", Config{Uplink: "eth0"}},
		{"unknown attach mode", Config{PinDir: pin, Uplink: "eth0", AttachMode: "xdp"}},
		{"unknown host routing", Config{PinDir: pin, Uplink: "eth0", HostRouting: "maybe"}},
		{"pin dir outside bpffs", Config{PinDir: t.TempDir(), Uplink: "eth0"}},
		{"missing uplink device", Config{PinDir: pin, Uplink: "nosuch0"}},
		{"no uplink with bpf host routing", Config{PinDir: pin}},
	}
	dptest.InNetns(t, ns, func() {
		for _, c := range cases {
			if d, err := Load(c.cfg); err == nil {
				d.Close()
				t.Errorf("%s: Load succeeded", c.desc)
			} else {
				t.Logf("%s: %v", c.desc, err)
			}
		}
	})
}
