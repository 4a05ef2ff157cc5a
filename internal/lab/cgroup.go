package lab

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// cgroup2Mount finds the cgroup v2 mount point from /proc/mounts
// (/sys/fs/cgroup on unified hosts, /sys/fs/cgroup/unified on hybrid ones).
func cgroup2Mount() (string, error) {
	f, err := os.Open("/proc/mounts")
	if err != nil {
		return "", fmt.Errorf("read /proc/mounts: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 3 && fields[2] == "cgroup2" {
			return fields[1], nil
		}
	}
	return "", errors.New("no cgroup2 filesystem mounted: mount one with `mount -t cgroup2 none /sys/fs/cgroup/unified`")
}

// removeCgroupTree kills every process left in the cgroup subtree root
// (they can only be lab processes) and removes the directories bottom-up.
func removeCgroupTree(root string) error {
	if root == "" {
		return nil
	}
	if _, err := os.Stat(root); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	// cgroup.kill (Linux >= 5.14) kills the whole subtree atomically.
	if err := os.WriteFile(filepath.Join(root, "cgroup.kill"), []byte("1"), 0o644); err != nil {
		// Older kernels: kill what cgroup.procs lists, per directory.
		_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				killPIDs(cgroupPIDs(p))
			}
			return nil
		})
	}
	var dirs []string
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
	var errs []error
	for _, d := range dirs {
		var err error
		for range 100 { // EBUSY while killed processes are still exiting
			if err = os.Remove(d); err == nil || errors.Is(err, os.ErrNotExist) {
				err = nil
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("remove cgroup %s (processes left: %v): %w", d, cgroupPIDs(d), err))
		}
	}
	return errors.Join(errs...)
}

func cgroupPIDs(dir string) []int {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		var pid int
		if _, err := fmt.Sscan(f, &pid); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}
