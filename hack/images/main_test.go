package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/axonhq/axon/deploy/image"
)

func TestTarballName(t *testing.T) {
	for ref, want := range map[string]string{
		image.PauseRef:   "pause-3.10.2.tar",
		image.AgnhostRef: "agnhost-2.63.0.tar",
	} {
		if got := TarballName(ref); got != want {
			t.Errorf("TarballName(%s) = %s, want %s", ref, got, want)
		}
	}
}

// TestCheckRefs: the references in deploy/image/e2e.go match the e2e image manifest of the
// pinned k8s.io/kubernetes, and a manifest that moves an image (here: another pause tag) is
// refused with both names in the message.
func TestCheckRefs(t *testing.T) {
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "k8s.io/kubernetes")
	cmd.Dir = filepath.Join("..", "k8s")
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")
	out, err := cmd.Output()
	dir := strings.TrimSpace(string(out))
	if err != nil || dir == "" {
		t.Skipf("k8s.io/kubernetes not in the module cache (make deps downloads it): %v", err)
	}
	manifest := filepath.Join(dir, "test", "utils", "image", "manifest.go")
	if _, err := os.Stat(manifest); err != nil {
		t.Skipf("module not downloaded: %v", err)
	}
	if err := checkRefs(manifest); err != nil {
		t.Fatalf("the pinned module: %v", err)
	}
	b, err := os.ReadFile(manifest)
	if err != nil {
		t.Fatal(err)
	}
	_, tag, _ := strings.Cut(image.PauseRef, ":")
	moved := strings.Replace(string(b), `"pause", "`+tag+`"`, `"pause", "9.9"`, 1)
	if moved == string(b) {
		t.Fatalf("%s has no pause entry with tag %s", manifest, tag)
	}
	alt := filepath.Join(t.TempDir(), "manifest.go")
	if err := os.WriteFile(alt, []byte(moved), 0o644); err != nil {
		t.Fatal(err)
	}
	err = checkRefs(alt)
	if err == nil || !strings.Contains(err.Error(), "registry.k8s.io/pause:9.9") || !strings.Contains(err.Error(), image.PauseRef) {
		t.Fatalf("checkRefs with pause moved to 9.9: %v, want an error naming both references", err)
	}
	t.Logf("refused as expected: %v", err)
}
