package podpath

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/axonhq/axon/internal/datapath"
)

// Pure-logic tests: no root needed.

func TestConfigNormalise(t *testing.T) {
	cases := []struct {
		desc    string
		cfg     Config
		wantErr string
		attach  string
		routing string
	}{
		{desc: "defaults to auto", cfg: Config{PinDir: "/sys/fs/bpf/x"}, attach: datapath.ModeAuto, routing: datapath.ModeAuto},
		{desc: "explicit legacy", cfg: Config{PinDir: "/sys/fs/bpf/x", AttachMode: "legacy", HostRouting: "legacy"}, attach: datapath.ModeLegacy, routing: datapath.ModeLegacy},
		{desc: "missing pin dir", cfg: Config{}, wantErr: "PinDir is empty"},
		{desc: "bad attach mode", cfg: Config{PinDir: "/x", AttachMode: "tc"}, wantErr: `attach mode "tc"`},
		{desc: "bad host routing", cfg: Config{PinDir: "/x", HostRouting: "ebpf"}, wantErr: `host routing "ebpf"`},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			err := c.cfg.normalise()
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err = %v, want it to mention %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.cfg.AttachMode != c.attach || c.cfg.HostRouting != c.routing || c.cfg.Logger == nil {
				t.Fatalf("normalised to %+v", c.cfg)
			}
		})
	}
}

func TestDecide(t *testing.T) {
	yes := datapath.Capability{Available: true, Reason: "probed"}
	no := datapath.Capability{Reason: "missing"}
	all := datapath.Features{TCX: yes, RedirectPeer: yes, RedirectNeigh: yes, FibLookup: yes, Netkit: no, FibCache: yes}
	noCache := all
	noCache.FibCache = no
	old := datapath.Features{TCX: no, RedirectPeer: no, RedirectNeigh: no, FibLookup: yes, Netkit: no, FibCache: no}
	cases := []struct {
		desc            string
		feats           datapath.Features
		attach, routing string
		wantAttach      string
		wantRouting     string
		wantErr         bool
		noFibCache      bool
		wantCache       bool
	}{
		{"new kernel, auto", all, datapath.ModeAuto, datapath.ModeAuto, datapath.ModeTCX, datapath.RoutingBPF, false, false, true},
		{"new kernel, route cache off by configuration", all, datapath.ModeAuto, datapath.ModeAuto, datapath.ModeTCX, datapath.RoutingBPF, false, true, false},
		{"kernel without the route cache (6.1)", noCache, datapath.ModeAuto, datapath.ModeAuto, datapath.ModeTCX, datapath.RoutingBPF, false, false, false},
		{"new kernel, legacy attach requested", all, datapath.ModeLegacy, datapath.ModeAuto, datapath.ModeLegacy, datapath.RoutingBPF, false, false, true},
		{"new kernel, legacy routing requested", all, datapath.ModeAuto, datapath.ModeLegacy, datapath.ModeTCX, datapath.ModeLegacy, false, false, false},
		{"old kernel, auto falls back", old, datapath.ModeAuto, datapath.ModeAuto, datapath.ModeLegacy, datapath.ModeLegacy, false, false, false},
		{"old kernel, tcx required", old, datapath.ModeTCX, datapath.ModeAuto, "", "", true, false, false},
		{"old kernel, bpf routing required", old, datapath.ModeAuto, datapath.RoutingBPF, "", "", true, false, false},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			d := &Datapath{cfg: Config{AttachMode: c.attach, HostRouting: c.routing, NoFibCache: c.noFibCache}, feats: c.feats}
			err := d.decide()
			if c.wantErr {
				if err == nil {
					t.Fatalf("decide() accepted it: %+v", d.decisions)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d.attachMode != c.wantAttach || d.hostRouting != c.wantRouting {
				t.Fatalf("attach %s routing %s, want %s %s", d.attachMode, d.hostRouting, c.wantAttach, c.wantRouting)
			}
			if len(d.decisions) != 5 { // attach, host_routing, device, big_tcp, fib_cache
				t.Fatalf("decisions = %+v", d.decisions)
			}
			if d.fibCache != c.wantCache || (d.decisions[4].Value == "off") == c.wantCache {
				t.Errorf("route cache %v (decision %+v), want %v", d.fibCache, d.decisions[4], c.wantCache)
			}
			for _, dec := range d.decisions {
				if dec.Reason == "" {
					t.Errorf("decision %s has no reason", dec.Name)
				}
			}
		})
	}
}

// fakeMetrics is a pure-logic stand-in for the per-CPU metrics map.
type fakeMetrics map[uint32][]uint64

func (f fakeMetrics) Lookup(key, out any) error {
	v, ok := f[key.(uint32)]
	if !ok {
		return errors.New("no such key")
	}
	*out.(*[]uint64) = v
	return nil
}

func TestReadMetricsSumsCPUs(t *testing.T) {
	f := fakeMetrics{}
	for i := 0; i < len(directionNames)*len(reasonNames); i++ {
		f[uint32(i)] = []uint64{0, 0}
	}
	f[0] = []uint64{2, 3}                          // pod_egress/redirect_peer_local
	f[uint32(len(reasonNames)+6)] = []uint64{1, 1} // uplink_ingress/pass_malformed
	got, err := readMetrics(f)
	if err != nil {
		t.Fatal(err)
	}
	if got["pod_egress"]["redirect_peer_local"] != 5 || got["uplink_ingress"]["pass_malformed"] != 2 ||
		got["pod_egress"]["pass_malformed"] != 0 {
		t.Fatalf("readMetrics = %v", got)
	}
	perCPU, err := readMetricsPerCPU(f)
	if err != nil {
		t.Fatal(err)
	}
	if got := perCPU["pod_egress"]["redirect_peer_local"]; len(got) != 2 || got[0] != 2 || got[1] != 3 {
		t.Fatalf("readMetricsPerCPU pod_egress/redirect_peer_local = %v, want [2 3]", got)
	}
	if reasonNames[6] != "pass_malformed" || reasonNames[14] != "drop_malformed" || reasonNames[15] != "redirect_arp_reply" || len(reasonNames) != 16 {
		t.Fatalf("reason table out of sync with bpf/lib/common.h: %v", reasonNames)
	}
	delete(f, 3)
	if _, err := readMetrics(f); err == nil {
		t.Fatal("missing counter not reported")
	}
}

func TestListLinkPinsIgnoresForeignNames(t *testing.T) {
	dir := t.TempDir()
	if err := ensureDirs(dir, "tcx-pod-lxc1", "tc-uplink-eth0", "tcx-pod-a-b", "junk", "xdp-pod-x"); err != nil {
		t.Fatal(err)
	}
	pins, err := listLinkPins(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range pins {
		got = append(got, p.Kind+"|"+p.Role+"|"+p.Ifname)
	}
	want := "tc|uplink|eth0 tcx|pod|a-b tcx|pod|lxc1"
	if strings.Join(got, " ") != want {
		t.Fatalf("pins = %v, want %s", got, want)
	}
}

func ensureDirs(pinDir string, names ...string) error {
	for _, n := range names {
		if err := os.MkdirAll(filepath.Join(datapath.LinksDir(pinDir), n), 0o700); err != nil {
			return err
		}
	}
	return nil
}
