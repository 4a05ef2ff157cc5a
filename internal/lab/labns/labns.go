// Package labns names the lab's network namespaces (/run/netns/<name>, as
// `ip netns` does) and runs code inside one.
package labns

import (
	"path/filepath"

	"github.com/containernetworking/plugins/pkg/ns"
)

// Dir holds the named network namespaces.
const Dir = "/run/netns"

// Path is the file of the named network namespace.
func Path(name string) string { return filepath.Join(Dir, name) }

// Do runs fn inside the named network namespace: see DoAt.
func Do(name string, fn func() error) error { return DoAt(Path(name), fn) }

// DoAt runs fn inside the network namespace at nsPath, on a goroutine of its
// own whose OS thread is locked and switched into that namespace for the
// call (ns.WithNetNSPath); the caller's threads never change namespace.
// Sockets that fn creates keep the namespace after it returns; goroutines
// that fn starts do NOT run in it, and neither does anything after fn. If
// switching back fails, the thread stays locked and ends with the goroutine.
func DoAt(nsPath string, fn func() error) error {
	return ns.WithNetNSPath(nsPath, func(ns.NetNS) error { return fn() })
}
