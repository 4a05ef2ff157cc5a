package kubenode

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/axonhq/axon/internal/proc"
)

// runtimeCgroup, below the cgroup root, holds the holder, containerd (and its shims) and
// kubelet; kubelet's pods go to <root>/kubepods. No process sits in the root itself (cgroup2's
// no-internal-processes rule for the controllers enabled below it).
const runtimeCgroup = "runtime"

// cgroups is one cgroup path in every mounted hierarchy: each cgroup v1 mount and the cgroup2
// mount (/sys/fs/cgroup on unified hosts, /sys/fs/cgroup/unified on hybrid ones).
type cgroups struct {
	root string   // e.g. /axon-kubenode-node1
	mnts []string // hierarchy mount points
	isV2 map[string]bool
}

// findCgroups lists the hierarchies from /proc/self/mountinfo. kubelet with the cgroupfs driver
// on a v1 or hybrid host wants its cgroupRoot in every v1 hierarchy ("cgroup [...] has some
// missing paths"), so all of them are used.
func findCgroups(root string) (cgroups, error) {
	cg := cgroups{root: root, isV2: map[string]bool{}}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return cg, fmt.Errorf("read mountinfo: %w", err)
	}
	defer f.Close()
	seen := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, x := range fields {
			if x == "-" {
				sep = i
				break
			}
		}
		if sep < 0 || sep+1 >= len(fields) || len(fields) < 5 {
			continue
		}
		typ, mnt := fields[sep+1], fields[4]
		if (typ != "cgroup" && typ != "cgroup2") || seen[mnt] {
			continue
		}
		seen[mnt] = true
		cg.mnts = append(cg.mnts, mnt)
		cg.isV2[mnt] = typ == "cgroup2"
	}
	if err := sc.Err(); err != nil {
		return cg, fmt.Errorf("read mountinfo: %w", err)
	}
	if len(cg.mnts) == 0 {
		return cg, errors.New("no cgroup filesystem mounted: kubelet needs cgroup2 (or the v1 hierarchies) under /sys/fs/cgroup")
	}
	sort.Strings(cg.mnts)
	return cg, nil
}

// createCgroups creates root and root/runtime in every hierarchy. cpuset children start with
// empty cpus and mems (no task may join), so they get their parent's; on cgroup2 the root
// delegates every controller it has to its children.
func createCgroups(root string) (cgroups, error) {
	cg, err := findCgroups(root)
	if err != nil {
		return cg, err
	}
	for _, mnt := range cg.mnts {
		for _, d := range []string{filepath.Join(mnt, root), filepath.Join(mnt, root, runtimeCgroup)} {
			if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
				return cg, fmt.Errorf("create cgroup %s: %w (is %s writable? kubelet needs its cgroupRoot in every hierarchy)", d, err, mnt)
			}
			if strings.HasSuffix(mnt, "/cpuset") || strings.Contains(filepath.Base(mnt), "cpuset") {
				for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
					b, err := os.ReadFile(filepath.Join(filepath.Dir(d), f))
					if err == nil {
						err = os.WriteFile(filepath.Join(d, f), b, 0o644)
					}
					if err != nil {
						return cg, fmt.Errorf("cgroup %s: copy %s from its parent: %w", d, f, err)
					}
				}
			}
			if cg.isV2[mnt] && d == filepath.Join(mnt, root) {
				if err := delegateControllers(d); err != nil {
					return cg, err
				}
			}
		}
	}
	return cg, nil
}

func delegateControllers(dir string) error {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	if err != nil {
		return fmt.Errorf("cgroup %s: %w", dir, err)
	}
	for _, c := range strings.Fields(string(b)) {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte("+"+c), 0o644); err != nil {
			return fmt.Errorf("cgroup %s: enable controller %s for kubelet's pods: %w", dir, c, err)
		}
	}
	return nil
}

// v2Mount is the cgroup2 hierarchy's mount point, if the host has one.
func (cg cgroups) v2Mount() (string, bool) {
	for _, mnt := range cg.mnts {
		if cg.isV2[mnt] {
			return mnt, true
		}
	}
	return "", false
}

// join moves pid into root/sub in every hierarchy.
func (cg cgroups) join(sub string, pid int) error {
	for _, mnt := range cg.mnts {
		f := filepath.Join(mnt, cg.root, sub, "cgroup.procs")
		if err := os.WriteFile(f, []byte(strconv.Itoa(pid)), 0o644); err != nil {
			return fmt.Errorf("move pid %d into %s: %w", pid, f, err)
		}
	}
	return nil
}

// pids lists every process in root's subtree in any hierarchy.
func (cg cgroups) pids() (map[int]bool, error) {
	out := map[int]bool{}
	for _, mnt := range cg.mnts {
		top := filepath.Join(mnt, cg.root)
		err := filepath.WalkDir(top, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil
				}
				return err
			}
			if !d.IsDir() {
				return nil
			}
			b, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil
				}
				return err
			}
			for _, l := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(l); err == nil {
					out[pid] = true
				}
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("list processes in cgroup %s: %w", top, err)
		}
	}
	return out, nil
}

// CgroupPIDs lists every process in the node's cgroups, sorted: the node's own processes, the
// shims and the pods' containers.
func (n *Node) CgroupPIDs() ([]int, error) {
	cg, err := findCgroups(n.cfg.CgroupRoot)
	if err != nil {
		return nil, err
	}
	m, err := cg.pids()
	if err != nil {
		return nil, err
	}
	var out []int
	for p := range m {
		out = append(out, p)
	}
	sort.Ints(out)
	return out, nil
}

// killAll SIGKILLs every process in the subtree until none is left, then waits until each has
// exited (a process leaves cgroup.procs as it dies, before its namespaces and mounts are gone).
// Every process there is the node's: the subtree is created for it and named after it.
func (cg cgroups) killAll(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	seen := map[int]bool{}
	for {
		pids, err := cg.pids()
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes %v still in cgroup %s after SIGKILL for %v", keys(pids), cg.root, timeout)
		}
		for pid := range pids {
			seen[pid] = true
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for pid := range seen {
		for !proc.Exited(pid) {
			if time.Now().After(deadline) {
				return fmt.Errorf("pid %d left cgroup %s but has not exited after %v", pid, cg.root, timeout)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return nil
}

// remove removes the subtree bottom-up in every hierarchy.
func (cg cgroups) remove() error {
	var errs []error
	for _, mnt := range cg.mnts {
		top := filepath.Join(mnt, cg.root)
		var dirs []string
		_ = filepath.WalkDir(top, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			if err := removeCgroupDir(dirs[i]); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// removeCgroupDir retries briefly: a cgroup whose last task just died can stay busy (EBUSY)
// until the kernel has finished with it.
func removeCgroupDir(d string) error {
	var err error
	for i := 0; i < 50; i++ {
		err = syscall.Rmdir(d)
		if err == nil || errors.Is(err, syscall.ENOENT) {
			return nil
		}
		if !errors.Is(err, syscall.EBUSY) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("remove cgroup %s: %w", d, err)
}

func keys(m map[int]bool) []int {
	var out []int
	for k := range m {
		out = append(out, k)
	}
	sort.Ints(out)
	return out
}
