package lab

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/netnsutil"
)

// createNetns creates the named network namespace /run/netns/<name> (like
// `ip netns add`; netnsutil.CreateNamed).
func createNetns(name string) error { return netnsutil.CreateNamed(name) }

// deleteNetns unmounts and removes /run/netns/<name>; missing is fine.
func deleteNetns(name string) error {
	p := netnsutil.Path(name)
	if _, err := os.Lstat(p); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
		return fmt.Errorf("unmount netns %s: %w", name, err)
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove netns %s: %w", name, err)
	}
	return nil
}

// labNetns lists the existing namespaces whose name starts with axonlab-.
func labNetns() ([]string, error) {
	ents, err := os.ReadDir(netnsutil.Dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", netnsutil.Dir, err)
	}
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), NetnsPrefix) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// pidsInNetns returns the processes whose network namespace is the named one.
func pidsInNetns(name string) ([]int, error) {
	var want syscall.Stat_t
	if err := syscall.Stat(netnsutil.Path(name), &want); err != nil {
		if errors.Is(err, syscall.ENOENT) {
			return nil, nil
		}
		return nil, fmt.Errorf("stat netns %s: %w", name, err)
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("list /proc: %w", err)
	}
	self := os.Getpid()
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		var st syscall.Stat_t
		if err := syscall.Stat("/proc/"+e.Name()+"/ns/net", &st); err != nil {
			continue
		}
		if st.Ino == want.Ino && st.Dev == want.Dev {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// netlinkAt opens a netlink handle bound to the named namespace.
func netlinkAt(name string) (*netlink.Handle, netns.NsHandle, error) {
	h, err := netns.GetFromPath(netnsutil.Path(name))
	if err != nil {
		return nil, 0, fmt.Errorf("open netns %s: %w", name, err)
	}
	nl, err := netlink.NewHandleAt(h, unix.NETLINK_ROUTE) // route only: xfrm/netfilter sockets fail on kernels without those modules
	if err != nil {
		h.Close()
		return nil, 0, fmt.Errorf("netlink in netns %s: %w", name, err)
	}
	return nl, h, nil
}

// writeSysctls writes /proc/sys/<key> = value inside the named namespace.
func writeSysctls(nsName string, kv [][2]string) error {
	return netnsutil.Do(nsName, func() error {
		for _, e := range kv {
			p := "/proc/sys/" + strings.ReplaceAll(e[0], ".", "/")
			if err := os.WriteFile(p, []byte(e[1]), 0o644); err != nil {
				return fmt.Errorf("sysctl %s=%s in %s: %w", e[0], e[1], nsName, err)
			}
		}
		return nil
	})
}

// ReadSNMP returns the value of a counter of /proc/net/snmp (e.g. "Ip",
// "ForwDatagrams") as seen inside the named network namespace.
func ReadSNMP(nsName, group, field string) (uint64, error) {
	return netnsutil.ReadNetCounter(netnsutil.Path(nsName), "snmp", group, field)
}
