package datapath

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// BPFFSRoot is where bpffs is mounted when it is missing.
const BPFFSRoot = "/sys/fs/bpf"

// IsBPFFS reports whether path lies on a bpf filesystem.
func IsBPFFS(path string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false, fmt.Errorf("statfs %s: %w", path, err)
	}
	return uint32(st.Type) == unix.BPF_FS_MAGIC, nil
}

// EnsureBPFFS mounts bpffs at BPFFSRoot when it is not mounted there yet.
func EnsureBPFFS() error {
	if err := os.MkdirAll(BPFFSRoot, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", BPFFSRoot, err)
	}
	ok, err := IsBPFFS(BPFFSRoot)
	if err != nil {
		return err
	}
	if ok {
		return nil
	}
	if err := unix.Mount("bpf", BPFFSRoot, "bpf", 0, "mode=0700"); err != nil && !errors.Is(err, unix.EBUSY) {
		return fmt.Errorf("mount bpffs at %s (needs root / CAP_SYS_ADMIN in the initial mount namespace): %w", BPFFSRoot, err)
	}
	return nil
}

// EnsurePinDir creates dir (and dir/links) and checks that it is on bpffs.
func EnsurePinDir(dir string) error {
	if err := EnsureBPFFS(); err != nil {
		return err
	}
	if err := os.MkdirAll(LinksDir(dir), 0o700); err != nil {
		return fmt.Errorf("create pin dir %s: %w", dir, err)
	}
	ok, err := IsBPFFS(dir)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("pin dir %s is not on a bpf filesystem: choose a directory under %s", dir, BPFFSRoot)
	}
	return nil
}
