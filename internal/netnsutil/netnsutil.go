// Package netnsutil runs code inside a named network namespace, one created
// by `ip netns add` or netns.NewNamed and bind-mounted under /run/netns.
package netnsutil

import (
	"fmt"
	"path/filepath"

	"github.com/containernetworking/plugins/pkg/ns"
)

// Dir holds the bind mounts of named network namespaces.
const Dir = "/run/netns"

// Path is the bind mount of the named network namespace.
func Path(name string) string { return filepath.Join(Dir, name) }

// Do runs fn in the named network namespace and returns its error.
//
// fn runs on a new goroutine locked to its OS thread, switched into the
// namespace and back afterwards (ns.NetNS.Do); a thread that cannot switch
// back stays locked and ends with its goroutine, so no other goroutine ever
// runs in the namespace by accident. What fn does on that thread happens in
// the namespace: sockets, netlink handles and BPF links it creates stay
// there, and /proc/sys/net and /proc/thread-self/net show the namespace's.
// Goroutines that fn starts do not run on that thread: they are in the
// process's own namespace. fn must not call runtime.UnlockOSThread.
func Do(name string, fn func() error) error { return do(name, Path(name), fn) }

// DoAt is Do for the network namespace bind-mounted or found at path (a
// /run/netns file, or /proc/<pid>/ns/net), for callers that are handed a
// path rather than a name.
func DoAt(path string, fn func() error) error { return do(path, path, fn) }

// do runs fn in the network namespace at path; label names it in errors.
func do(label, path string, fn func() error) error {
	n, err := ns.GetNS(path)
	if err != nil {
		return fmt.Errorf("netns %s: %w", label, err)
	}
	defer n.Close()
	return n.Do(func(ns.NetNS) error { return fn() })
}
