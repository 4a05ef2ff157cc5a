package uninstall

import (
	"log/slog"
	"os"
	"path/filepath"
	"slices"
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

// TestPodNetns: the pod netns uninstall looks into for the VM-pod bridge
// bypass's legacy filters come from the agent's endpoint files, each once.
func TestPodNetns(t *testing.T) {
	dir := t.TempDir()
	eps := filepath.Join(dir, "endpoints")
	if err := os.MkdirAll(eps, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{
		"a_eth0.json": `{"containerID":"a","ifName":"eth0","netns":"/run/netns/pod-a"}`,
		"a_net1.json": `{"containerID":"a","ifName":"net1","netns":"/run/netns/pod-a"}`,
		"b_eth0.json": `{"containerID":"b","ifName":"eth0","netns":"/proc/42/ns/net"}`,
		"broken.json": `{`,
		".tmp123":     `{"netns":"/run/netns/tmp"}`,
	} {
		if err := os.WriteFile(filepath.Join(eps, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	got := Options{StateDir: dir}.podNetns()
	slices.Sort(got)
	if want := []string{"/proc/42/ns/net", "/run/netns/pod-a"}; !slices.Equal(got, want) {
		t.Errorf("podNetns = %v, want %v", got, want)
	}
}
