package podpath_test

import (
	"testing"

	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/axonhq/axon/internal/datapath/podpath"
)

// The shared test helpers (package dptest) under the names the external
// tests use, as helpers_test.go does for the internal ones.

type skbFields = dptest.SKBFields

const (
	tcActShot     = dptest.TCActShot
	tcActRedirect = dptest.TCActRedirect
)

var (
	requireRoot = dptest.RequireRoot
	testLogger  = dptest.Logger
	ipv4Packet  = dptest.IPv4Packet
	ipv6Packet  = dptest.IPv6Packet
	runEDT      = dptest.RunEDT
	runEDTCtx   = dptest.RunEDTCtx
	monoNow     = dptest.MonoNow
	bigTCP4     = dptest.BigTCP4
	linkMAC     = dptest.LinkMAC
	udpEcho     = dptest.UDPEcho
	sendRaw     = dptest.SendRaw
	inNetns     = dptest.InNetns
)

// newPinDir returns a fresh pin dir under /sys/fs/bpf, removed at cleanup.
func newPinDir(t testing.TB) string {
	t.Helper()
	return dptest.NewPinDir(t, datapath.BPFFSRoot, datapath.EnsureBPFFS, podpath.Uninstall)
}
