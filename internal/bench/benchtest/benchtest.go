// Package benchtest holds what the lab benchmarks' end-to-end tests share.
package benchtest

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/axonhq/axon/internal/lab"
	"github.com/axonhq/axon/internal/testutil"
)

// LabSetup checks what the lab benchmarks' end-to-end tests need
// (root, the cached kube-apiserver/etcd/kube-proxy/CNI plugin builds,
// kube-proxy's tools, the machine's lab slot free) and returns a directory
// with axon, axon-agent and axon-cni: AXON_TEST_BIN_DIR, or a fresh build.
func LabSetup(t *testing.T) string {
	t.Helper()
	testutil.RequireRoot(t, "network namespaces, bpffs, cgroups, kube-proxy")
	for _, d := range []string{"etcd", "kube-apiserver", "kubectl", "kube-proxy", "ptp", "host-local"} {
		if _, err := lab.DepPath(d); errors.Is(err, lab.ErrDepMissing) {
			t.Skipf("cached dependency missing (%v): run `make deps`", err)
		}
	}
	for _, tool := range []string{"nft", "iptables-restore", "nsenter", "taskset", "iperf3"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not installed (`make deps`): %v", tool, err)
		}
	}
	if _, err := os.Stat(filepath.Join(lab.DefaultStateDir, "lab.json")); err == nil {
		t.Skipf("a lab is already up in %s (not created by this test): run `axon lab down` to let the test run", lab.DefaultStateDir)
	}
	if ents, _ := filepath.Glob("/run/netns/" + lab.NetnsPrefix + "*"); len(ents) > 0 {
		t.Skipf("lab namespaces exist (%v): run `axon lab down` to let the test run", ents)
	}

	// AXON_TEST_BIN_DIR reuses built binaries (axon, axon-agent, axon-cni).
	bin := os.Getenv("AXON_TEST_BIN_DIR")
	if bin == "" {
		bin = t.TempDir()
		t0 := time.Now()
		build := exec.Command("go", "build", "-o", bin+"/", "./cmd/axon", "./cmd/axon-agent", "./cmd/axon-cni")
		build.Dir = moduleRoot(t)
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build ./cmd/...: %v\n%s", err, out)
		}
		t.Logf("built the binaries in %s", time.Since(t0).Round(time.Millisecond))
	}
	return bin
}

// moduleRoot is the directory of the go.mod above the test's working
// directory (the package directory under `go test`).
func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
		if filepath.Dir(d) == d {
			t.Fatalf("no go.mod above %s", dir)
		}
	}
}
