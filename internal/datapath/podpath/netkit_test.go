package podpath

import (
	"strings"
	"testing"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/testutil"
)

func TestDeviceDecision(t *testing.T) {
	yes := datapath.Capability{Available: true, Reason: "netkit: device created (probed)"}
	no := datapath.Capability{Reason: "netkit: creating a netkit device failed (CONFIG_NETKIT unset?): operation not supported"}
	tests := []struct {
		mode     string
		nk       datapath.Capability
		wantType string
		wantMode string
		wantErr  string // substring; "" = no error
		reason   string // substring of the reason
	}{
		{"veth", yes, api.DeviceVeth, "", "", "netkit is available"},
		{"veth", no, api.DeviceVeth, "", "", "configured veth"},
		{"", no, api.DeviceVeth, "", "", "configured veth"},
		{"auto", yes, api.DeviceNetkit, "l3", "", "configured auto: netkit: device created"},
		{"auto", no, api.DeviceVeth, "", "", "configured auto, veth because netkit: creating a netkit device failed"},
		{"netkit", yes, api.DeviceNetkit, "l3", "", "configured netkit"},
		{"netkit-l2", yes, api.DeviceNetkit, "l2", "", "configured netkit-l2"},
		{"netkit", no, "", "", "--device-mode=netkit but this kernel cannot create netkit devices", ""},
		{"netkit-l2", no, "", "", "use --device-mode=auto (falls back to veth) or veth", ""},
		{"bogus", yes, "", "", `device mode "bogus" is invalid`, ""},
	}
	for _, tc := range tests {
		typ, mode, reason, err := DeviceDecision(tc.mode, tc.nk)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%s (netkit %v): error %v, want %q", tc.mode, tc.nk.Available, err, tc.wantErr)
			}
			continue
		}
		if err != nil || typ != tc.wantType || mode != tc.wantMode || !strings.Contains(reason, tc.reason) {
			t.Errorf("%s (netkit %v): %q %q %q %v", tc.mode, tc.nk.Available, typ, mode, reason, err)
		}
	}
}

// TestDeviceModeAutoHere: auto resolves against this kernel's probe: veth on
// the 6.18 host (no CONFIG_NETKIT, the reason says so), netkit in the 6.12 VM.
func TestDeviceModeAutoHere(t *testing.T) {
	testutil.RequireRoot(t, "the probe creates a netkit pair in a scratch netns")
	c := datapath.ProbeNetkit()
	typ, _, reason, err := DeviceDecision(DeviceModeAuto, c)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("auto → %s: %s", typ, reason)
	if c.Available != (typ == api.DeviceNetkit) || !strings.Contains(reason, "netkit") {
		t.Errorf("auto → %s (%s) with probe %+v", typ, reason, c)
	}
}

func TestDecideBigTCP(t *testing.T) {
	ok := datapath.Capability{Available: true, Reason: "big_tcp: gso_max_size > 64k accepted (probed)"}
	veth := UplinkLimits{TSOMaxSize: 524280, GSOMaxSize: 65536, GSOIPv4MaxSize: 65536}
	tests := []struct {
		name   string
		v4, v6 bool
		probe  datapath.Capability
		lim    UplinkLimits
		want   string // Value()
		reason string
		dev    api.DeviceConfig
	}{
		{"both on, veth uplink", true, true, ok, veth, "ipv4+ipv6 196608", "tso_max_size 524280",
			api.DeviceConfig{GSOMaxSize: 196608, GROMaxSize: 196608, GSOIPv4MaxSize: 196608, GROIPv4MaxSize: 196608}},
		{"uplink takes less", true, true, ok, UplinkLimits{TSOMaxSize: 131072, GSOIPv4MaxSize: 65536}, "ipv4+ipv6 131072", "",
			api.DeviceConfig{GSOMaxSize: 131072, GROMaxSize: 131072, GSOIPv4MaxSize: 131072, GROIPv4MaxSize: 131072}},
		{"virtio uplink (64k)", true, true, ok, UplinkLimits{TSOMaxSize: 65536, GSOIPv4MaxSize: 65536}, "off", "tso_max_size 65536", api.DeviceConfig{}},
		{"ipv6 only", false, true, ok, veth, "ipv6 196608", "ipv4 off by --enable-ipv4-big-tcp=false",
			api.DeviceConfig{GSOMaxSize: 196608, GROMaxSize: 196608}},
		{"ipv4 only", true, false, ok, veth, "ipv4 196608", "ipv6 off",
			api.DeviceConfig{GSOMaxSize: 65536, GROMaxSize: 65536, GSOIPv4MaxSize: 196608, GROIPv4MaxSize: 196608}},
		{"kernel < 6.3: no ipv4", true, true, ok, UplinkLimits{TSOMaxSize: 524280, GSOMaxSize: 65536}, "ipv6 196608", "needs 6.3+",
			api.DeviceConfig{GSOMaxSize: 196608, GROMaxSize: 196608}},
		{"both off", false, false, ok, veth, "off", "--enable-ipv4-big-tcp=false", api.DeviceConfig{}},
		{"probe failed", true, true, datapath.Capability{Reason: "big_tcp: setting gso_max_size > 64k failed"}, veth, "off", "setting gso_max_size", api.DeviceConfig{}},
	}
	for _, tc := range tests {
		b := DecideBigTCP(tc.v4, tc.v6, tc.probe, "eth0", tc.lim)
		var dev api.DeviceConfig
		b.apply(&dev)
		if b.Value() != tc.want || !strings.Contains(b.Reason, tc.reason) || dev != tc.dev {
			t.Errorf("%s: %q (%s) sizes %+v", tc.name, b.Value(), b.Reason, dev)
		}
	}
}
