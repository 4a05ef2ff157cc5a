package netnsutil

import (
	"errors"
	"fmt"
	"os"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
)

// Cookie returns the netns cookie of the network namespace at path (a
// /run/netns bind mount or /proc/<pid>/ns/net; "" = the caller's own): the
// SO_NETNS_COOKIE of a socket made there, what bpf_get_netns_cookie gives a
// BPF program for sockets of that namespace. A namespace that is gone is an
// error that matches os.ErrNotExist. Needs kernel >= 5.14.
func Cookie(path string) (uint64, error) {
	var cookie uint64
	get := func() (err error) {
		cookie, err = ownCookie()
		return err
	}
	var err error
	if path == "" {
		err = get()
	} else {
		err = DoAt(path, get)
		if errors.As(err, new(ns.NSPathNotExistErr)) {
			err = fmt.Errorf("%w: %w", os.ErrNotExist, err)
		}
	}
	if err != nil {
		return 0, fmt.Errorf("netns cookie of %q: %w", path, err)
	}
	return cookie, nil
}

// ownCookie is the netns cookie of the calling thread's network namespace.
func ownCookie() (uint64, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		fd, err = unix.Socket(unix.AF_INET6, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	}
	if err != nil {
		return 0, fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	v, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
	if err != nil {
		return 0, fmt.Errorf("getsockopt SO_NETNS_COOKIE (kernel >= 5.14): %w", err)
	}
	return v, nil
}
