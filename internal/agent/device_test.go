package agent

import (
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/datapath/podpath"
	"github.com/axonhq/axon/internal/testutil"
)

// TestDeviceModeValidate: an unknown --device-mode is a start-up error that
// lists the valid ones; a forced netkit mode on a kernel without netkit makes
// the agent refuse to start with the probe's reason (the 6.18 host), and is
// accepted where netkit exists (the 6.12 VM).
func TestDeviceModeValidate(t *testing.T) {
	base := Defaults()
	base.NodeName = "n1"
	base.SocketLB = false
	for _, mode := range []string{"veth", "auto"} {
		c := base
		c.DeviceMode = mode
		if err := c.Validate(); err != nil {
			t.Errorf("--device-mode=%s: %v", mode, err)
		}
	}
	c := base
	c.DeviceMode = "netkitt"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), `--device-mode "netkitt" is invalid: use one of veth|netkit|netkit-l2|auto`) {
		t.Errorf("unknown mode: %v", err)
	}
	testutil.RequireRoot(t, "the netkit probe")
	have := datapath.ProbeNetkit().Available
	for _, mode := range []string{"netkit", "netkit-l2"} {
		c := base
		c.DeviceMode = mode
		err := c.Validate()
		switch {
		case have && err != nil:
			t.Errorf("--device-mode=%s on a kernel with netkit: %v", mode, err)
		case !have && (err == nil || !strings.Contains(err.Error(), "cannot create netkit devices") || !strings.Contains(err.Error(), "CONFIG_NETKIT")):
			t.Errorf("--device-mode=%s on a kernel without netkit: %v, want a refusal with the reason", mode, err)
		}
		if err != nil {
			t.Logf("%s: %v", mode, err)
		}
	}
}

// TestBigTCPOnByDefault (BIG TCP is "on by default where supported"): the
// agent's defaults enable BIG TCP for both families, and the datapath the
// agent loads with them on a node whose uplink takes more than 64 KiB
// (a veth: tso_max_size 524280) decides 192 KiB for IPv6, and for IPv4 where
// the kernel has gso_ipv4_max_size (6.3+) — the `big_tcp` line of `axon status`.
func TestBigTCPOnByDefault(t *testing.T) {
	cfg := Defaults()
	if !cfg.EnableIPv4BigTCP || !cfg.EnableIPv6BigTCP {
		t.Fatalf("Defaults(): --enable-ipv4-big-tcp=%v --enable-ipv6-big-tcp=%v, want both on", cfg.EnableIPv4BigTCP, cfg.EnableIPv6BigTCP)
	}
	testutil.RequireRoot(t, "loads the datapath in a scratch netns")
	n := newScratchNode(t)
	cfg.BPFRoot = filepath.Join(datapath.BPFFSRoot, "axt-agent-bigtcp-"+testutil.RandSuffix(t))
	var dec api.Decision
	var v4 bool
	err := ns.WithNetNSPath(n.path, func(ns.NetNS) error {
		lim, err := podpath.ReadUplinkLimits("eth0")
		if err != nil {
			return err
		}
		v4 = lim.GSOIPv4MaxSize > 0
		dp, err := loadDatapath(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))("eth0")
		if err != nil {
			return err
		}
		d := dp.(dpAdapter)
		t.Cleanup(func() {
			d.Close()
			_ = ns.WithNetNSPath(n.path, func(ns.NetNS) error { return podpath.Uninstall(cfg.BPFRoot) })
		})
		for _, x := range d.Decisions() {
			if x.Name == "big_tcp" {
				dec = x
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := "ipv6 196608"
	if v4 {
		want = "ipv4+ipv6 196608"
	}
	if dec.Value != want {
		t.Errorf("big_tcp decision with the default flags = %q (%s), want %q", dec.Value, dec.Reason, want)
	}
	t.Logf("big_tcp %s: %s", dec.Value, dec.Reason)
}
