package datapath

import (
	"errors"
	"fmt"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// The one way axon attaches a program to a cgroup (the socket LB's hooks,
// the same-node bypass's sock_ops): a bpf_link pinned at
// <pinDir>/links/cgroup-<hook>, adopted (updated in place) by a restarted
// agent while it is on the same cgroup, so the programs never leave the
// cgroup while the agent restarts.

// CgroupID checks that path is a cgroup v2 directory and returns its id.
func CgroupID(path string) (uint64, error) {
	if path == "" {
		return 0, errors.New("cgroup path is empty: pass a cgroup v2 directory (the cgroup2 mount or a subtree of it, see /proc/mounts)")
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(path, &fs); err != nil {
		return 0, fmt.Errorf("cgroup %s: %w", path, err)
	}
	if fs.Type != unix.CGROUP2_SUPER_MAGIC {
		return 0, fmt.Errorf("cgroup %s is not on a cgroup v2 filesystem: pass a directory under the cgroup2 mount (see /proc/mounts)", path)
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("cgroup %s: %w", path, err)
	}
	return st.Ino, nil // a cgroup2 directory's inode number is the cgroup id
}

// AttachCgroupLink updates the link pinned at pin when it is attached to
// cgroup cgID, otherwise (missing, or left on another cgroup) attaches a new
// link and pins it.
func AttachCgroupLink(pin, cgroupPath string, cgID uint64, attach ebpf.AttachType, prog *ebpf.Program) error {
	if prog == nil {
		return errors.New("program not loaded")
	}
	old, err := link.LoadPinnedLink(pin, nil)
	switch {
	case err == nil:
		defer old.Close()
		info, ierr := old.Info()
		if ierr == nil && info.Cgroup() != nil && info.Cgroup().CgroupId == cgID {
			if err := old.Update(prog); err != nil {
				return fmt.Errorf("update pinned cgroup link %s: %w", pin, err)
			}
			return nil
		}
		// attached elsewhere (the cgroup root changed) or defunct: replace it
		_ = old.Detach()
		if err := old.Unpin(); err != nil {
			return fmt.Errorf("unpin stale cgroup link %s: %w", pin, err)
		}
	case !errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("load pinned cgroup link %s: %w", pin, err)
	}
	l, err := link.AttachCgroup(link.CgroupOptions{Path: cgroupPath, Attach: attach, Program: prog})
	if err != nil {
		return fmt.Errorf("attach to cgroup %s: %w", cgroupPath, err)
	}
	defer l.Close()
	if err := l.Pin(pin); err != nil {
		_ = l.Close()
		return fmt.Errorf("pin cgroup link at %s (kernel without bpf_link for cgroups?): %w", pin, err)
	}
	return nil
}
