package socklb

import (
	"testing"

	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/axonhq/axon/internal/datapath/podpath"
	"github.com/axonhq/axon/internal/testutil"
)

// The shared test helpers (package dptest) under the names these tests use.
var (
	requireRoot     = dptest.RequireRoot
	randSuffix      = testutil.RandSuffix
	newNetns        = dptest.NewNetns
	inNetns         = dptest.InNetns
	testLogger      = dptest.Logger
	mustMAC         = dptest.MustMAC
	ipv4Packet      = dptest.IPv4Packet
	ipv6Packet      = dptest.IPv6Packet
	arpPacket       = dptest.ARPPacket
	forwarded       = dptest.Forwarded
	ipv4HeaderValid = dptest.IPv4HeaderValid
	nsConf          = dptest.NSConf
	ipNet           = dptest.IPNet
	ethHdr          = dptest.EthHdr
	udpPayload      = dptest.UDPPayload
	mapLen          = dptest.MapLen
)

type nsCfg = dptest.NSCfg

// newPinDir returns a fresh pin dir under /sys/fs/bpf, removed at cleanup.
func newPinDir(t testing.TB) string {
	t.Helper()
	return dptest.NewPinDir(t, datapath.BPFFSRoot, datapath.EnsureBPFFS, podpath.Uninstall)
}
