package podpath

import (
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/datapath/dptest"
)

// pinnedProgID returns the ID of the program pinned at path (legacy marker).
func pinnedProgID(t *testing.T, path string) int {
	t.Helper()
	p, err := ebpf.LoadPinnedProgram(path, nil)
	if err != nil {
		t.Fatalf("load pinned program %s: %v", path, err)
	}
	defer p.Close()
	info, err := p.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, ok := info.ID()
	if !ok {
		t.Fatalf("program id of %s not reported", path)
	}
	return int(id)
}

// TestAttachAutoFollowsProbe loads with AttachMode auto and asserts the path
// the tcx probe chose: tcx links on kernels >= 6.6, clsact + cls_bpf (found
// through netlink, adopted by filter replace, removed by Uninstall) before.
// The same test runs on the host and in the kernel-matrix VMs.
func TestAttachAutoFollowsProbe(t *testing.T) {
	dptest.RequireRoot(t)
	feats := datapath.Probe()
	t.Logf("tcx probe: available=%v, %s", feats.TCX.Available, feats.TCX.Reason)
	cases := []struct {
		desc string
		mode string
	}{
		{"auto follows the probe", datapath.ModeAuto},
		// proves the legacy assertions on kernels with tcx too
		{"legacy requested", datapath.ModeLegacy},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			ns := attachNetns(t)
			pin := newPinDir(t)
			cfg := Config{PinDir: pin, Uplink: "eth0", AttachMode: c.mode, Logger: dptest.Logger(t)}
			dptest.InNetns(t, ns, func() {
				d, err := Load(cfg)
				if err != nil {
					t.Fatal(err)
				}
				for i := 0; i < 2; i++ {
					if err := d.AttachPod("lxc1"); err != nil {
						t.Fatalf("AttachPod #%d: %v", i+1, err)
					}
				}
				if c.mode == datapath.ModeAuto && feats.TCX.Available {
					autoTCX(t, feats, d, cfg)
				} else {
					autoLegacy(t, feats, d, cfg)
				}
				if err := Uninstall(pin); err != nil {
					t.Fatalf("Uninstall: %v", err)
				}
				for _, dev := range []string{"lxc1", "eth0"} {
					if n, m := len(axonFilters(t, dev)), len(tcxProgs(t, feats, dev)); n+m != 0 {
						t.Errorf("%s after Uninstall: %d filters, %d tcx programs", dev, n, m)
					}
				}
				if exists(pin) {
					t.Errorf("after Uninstall: %s still exists", pin)
				}
			})
		})
	}
}

func autoTCX(t *testing.T, feats datapath.Features, d *Datapath, cfg Config) {
	t.Helper()
	if got := decision(d, "attach"); got != datapath.ModeTCX {
		t.Fatalf("attach decision = %q with tcx available, want tcx", got)
	}
	podPin := datapath.PinPath(cfg.PinDir, datapath.PinTCX, rolePod, "lxc1")
	before := pinnedLinkInfo(t, podPin)
	for _, dev := range []string{"lxc1", "eth0"} {
		if n, m := len(axonFilters(t, dev)), len(tcxProgs(t, feats, dev)); n != 0 || m != 1 {
			t.Errorf("%s: %d filters, %d tcx programs; want 0, 1", dev, n, m)
		}
	}
	d.Close()
	d2, err := Load(cfg)
	if err != nil {
		t.Fatalf("reload: %v", err)
	}
	defer d2.Close()
	after := pinnedLinkInfo(t, podPin)
	if after.ID != before.ID || after.Program == before.Program {
		t.Errorf("reload: link %d prog %d -> link %d prog %d; want the same link with a new program",
			before.ID, before.Program, after.ID, after.Program)
	}
}

func autoLegacy(t *testing.T, feats datapath.Features, d *Datapath, cfg Config) {
	t.Helper()
	if got := decision(d, "attach"); got != datapath.ModeLegacy {
		t.Fatalf("attach decision = %q without tcx, want legacy", got)
	}
	for _, dec := range d.Decisions() {
		if cfg.AttachMode == datapath.ModeAuto && dec.Name == "attach" && !strings.Contains(dec.Reason, "fallback") {
			t.Errorf("attach reason %q does not say it is a fallback", dec.Reason)
		}
	}
	ids := map[string]int{}
	for _, c := range []struct{ dev, role string }{{"lxc1", rolePod}, {"eth0", roleUplink}} {
		fs := axonFilters(t, c.dev)
		if len(fs) != 1 || !fs[0].DirectAction || fs[0].Priority != datapath.LegacyPrio {
			t.Fatalf("%s filters = %+v, want one direct-action cls_bpf at prio %d", c.dev, fs, datapath.LegacyPrio)
		}
		pinned := pinnedProgID(t, datapath.PinPath(cfg.PinDir, datapath.PinTC, c.role, c.dev))
		if fs[0].Id != pinned {
			t.Errorf("%s filter runs program %d, pinned marker is %d", c.dev, fs[0].Id, pinned)
		}
		if n := len(tcxProgs(t, feats, c.dev)); n != 0 {
			t.Errorf("%s: %d tcx programs in legacy mode", c.dev, n)
		}
		ids[c.dev] = fs[0].Id
	}
	d.Close()
	d2, err := Load(cfg) // adoption: the filter is replaced in place
	if err != nil {
		t.Fatalf("reload: %v", err)
	}
	defer d2.Close()
	for _, dev := range []string{"lxc1", "eth0"} {
		fs := axonFilters(t, dev)
		if len(fs) != 1 || fs[0].Id == ids[dev] {
			t.Errorf("%s after reload: filters %+v (old program %d), want one with a new program", dev, fs, ids[dev])
		}
	}
	if err := d2.DetachPod("lxc1"); err != nil {
		t.Fatal(err)
	}
	if n := len(axonFilters(t, "lxc1")); n != 0 || exists(datapath.PinPath(cfg.PinDir, datapath.PinTC, rolePod, "lxc1")) {
		t.Errorf("after DetachPod: %d filters on lxc1", n)
	}
	if err := d2.AttachPod("lxc1"); err != nil { // left for Uninstall
		t.Fatal(err)
	}
}
