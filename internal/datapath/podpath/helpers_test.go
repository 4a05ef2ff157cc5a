package podpath

import (
	"testing"

	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/datapath/dptest"
)

// newPinDir returns a fresh pin dir under /sys/fs/bpf, removed at cleanup.
func newPinDir(t testing.TB) string {
	t.Helper()
	return dptest.NewPinDir(t, datapath.BPFFSRoot, datapath.EnsureBPFFS, Uninstall)
}
