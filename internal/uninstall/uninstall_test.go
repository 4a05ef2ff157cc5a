package uninstall

import (
	"log/slog"
	"strings"
	"testing"
)

// Paths that would make uninstall remove the wrong thing are refused
// before anything is looked at.
func TestRunRefusesBadPaths(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    Options
		err  string
	}{
		{"bpf root /", Options{BPFRoot: "/", StateDir: "/var/lib/axon"}, "--bpf-root"},
		{"relative state dir", Options{BPFRoot: "/sys/fs/bpf/axon", StateDir: "var/lib/axon"}, "--state-dir"},
		{"state dir /", Options{BPFRoot: "/sys/fs/bpf/axon", StateDir: "/"}, "--state-dir"},
		{"bpf root not on bpffs", Options{BPFRoot: t.TempDir() + "/axon", StateDir: t.TempDir()}, "not on a bpf filesystem"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			items, err := Run(tc.o, slog.New(slog.DiscardHandler))
			if err == nil || !strings.Contains(err.Error(), tc.err) || len(items) != 0 {
				t.Fatalf("Run = %v, %v; want an error with %q and nothing found", items, err, tc.err)
			}
		})
	}
}
