package netnsutil

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Namespace is one network namespace found by Scan.
type Namespace struct {
	Path   string       // where it was found: a bind mount or /proc/<pid>/ns/net
	Cookie uint64       // its netns cookie (see Cookie)
	Addrs  []netip.Addr // its local addresses, every interface, sorted
}

// Scan finds the network namespaces of the node without help from the CNI
// plugin that created them: those of the processes under procDir (normally
// /proc: /proc/<pid>/ns/net) and those bind-mounted in dirs (normally
// /run/netns), each listed once (the same namespace seen through several
// paths has one cookie), with the addresses configured in it. A namespace
// that goes away during the scan is skipped; errors of the others are
// joined, with what was found so far.
func Scan(procDir string, dirs []string) ([]Namespace, error) {
	var paths []string
	if procDir != "" {
		ents, err := os.ReadDir(procDir)
		if err != nil {
			return nil, fmt.Errorf("list processes in %s: %w", procDir, err)
		}
		for _, e := range ents {
			if _, err := strconv.Atoi(e.Name()); err == nil {
				paths = append(paths, filepath.Join(procDir, e.Name(), "ns", "net"))
			}
		}
	}
	for _, d := range dirs {
		ents, err := os.ReadDir(d)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("list network namespaces in %s: %w", d, err)
		}
		for _, e := range ents {
			paths = append(paths, filepath.Join(d, e.Name()))
		}
	}
	// the nsfs inode names a live namespace: enter each one once
	type ino struct{ dev, ino uint64 }
	seen := map[ino]bool{}
	byCookie := map[uint64]bool{}
	var out []Namespace
	var errs []error
	for _, p := range paths {
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			continue // the process exited, or not a namespace file
		}
		k := ino{uint64(st.Dev), st.Ino}
		if seen[k] {
			continue
		}
		seen[k] = true
		n, err := inspect(p)
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ESRCH) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if byCookie[n.Cookie] {
			continue
		}
		byCookie[n.Cookie] = true
		out = append(out, n)
	}
	return out, errors.Join(errs...)
}

// inspect reads the cookie and the addresses of the namespace at path.
func inspect(path string) (Namespace, error) {
	n := Namespace{Path: path}
	err := DoAt(path, func() error {
		c, err := ownCookie()
		if err != nil {
			return err
		}
		n.Cookie = c
		h, err := netlink.NewHandle(unix.NETLINK_ROUTE) // made on this thread: in the namespace
		if err != nil {
			return fmt.Errorf("netlink: %w", err)
		}
		defer h.Close()
		addrs, err := h.AddrList(nil, netlink.FAMILY_ALL)
		if err != nil {
			return fmt.Errorf("list addresses: %w", err)
		}
		for _, a := range addrs {
			if ip, ok := netip.AddrFromSlice(a.IP); ok {
				n.Addrs = append(n.Addrs, ip.Unmap())
			}
		}
		return nil
	})
	if err != nil {
		if _, serr := os.Stat(path); errors.Is(serr, os.ErrNotExist) {
			return n, fmt.Errorf("%w: %w", os.ErrNotExist, err)
		}
		return n, fmt.Errorf("network namespace %s: %w", path, err)
	}
	slices.SortFunc(n.Addrs, netip.Addr.Compare)
	n.Addrs = slices.Compact(n.Addrs)
	return n, nil
}
