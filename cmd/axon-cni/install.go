package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// installSelf copies the running executable to dir/axon-cni through a
// temporary file in dir and a rename, so a runtime calling the plugin
// meanwhile runs either the old or the new binary, never half of one.
func installSelf(dir string) (string, error) {
	st, err := os.Stat(dir)
	if err != nil {
		return "", fmt.Errorf("%w: mount the host's CNI binary folder (/opt/cni/bin) there", err)
	}
	if !st.IsDir() {
		return "", fmt.Errorf("%s is not a directory", dir)
	}
	src, err := os.Open("/proc/self/exe")
	if err != nil {
		return "", fmt.Errorf("open own executable: %w", err)
	}
	defer src.Close()
	dst := filepath.Join(dir, "axon-cni")
	tmp, err := os.CreateTemp(dir, ".axon-cni.tmp*")
	if err != nil {
		return "", fmt.Errorf("create a temporary file in %s: %w", dir, err)
	}
	defer os.Remove(tmp.Name()) // after the rename: nothing to remove
	if _, err := io.Copy(tmp, src); err != nil {
		tmp.Close()
		return "", fmt.Errorf("write %s: %w", tmp.Name(), err)
	}
	if err := tmp.Chmod(0o755); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return "", fmt.Errorf("sync %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return "", fmt.Errorf("rename into %s: %w", dst, err)
	}
	return dst, nil
}
