// Package testutil holds what the tests of several packages need: skipping
// without root, unique names, and network namespace fixtures. Everything here
// uses netlink and netns syscalls only (no ip, tc or nsenter), so tests that
// use it also run in VMs with a busybox userland.
package testutil

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/netnsutil"
)

// RequireRoot skips the test unless it runs as root; why says what needs
// root (e.g. "loads BPF programs, creates network namespaces").
func RequireRoot(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: " + why)
	}
}

// RandSuffix is 6 random hex digits: names of network namespaces, devices
// (IFNAMSIZ leaves 15 characters) and bpffs pins that tests running at the
// same time on one machine do not share.
func RandSuffix(t testing.TB) string {
	t.Helper()
	b := make([]byte, 3)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// NewNetns creates the named network namespace prefix+RandSuffix with lo up
// and IPv6 DAD off, deletes it at cleanup (unless the test did) and returns
// its name. DAD is off
// for devices created in it from now on, link-local addresses included:
// until an address leaves DAD (~2 s) the kernel sends no neighbour
// solicitation from it, and a test's first IPv6 packet to an unresolved
// neighbour waits for it.
func NewNetns(t testing.TB, prefix string) string {
	t.Helper()
	return newNetns(t, prefix, false)
}

// NewNetnsKernelDAD is NewNetns with IPv6 DAD left at the kernel's default,
// for tests that check that the code under test turns DAD off itself.
func NewNetnsKernelDAD(t testing.TB, prefix string) string {
	t.Helper()
	return newNetns(t, prefix, true)
}

func newNetns(t testing.TB, prefix string, keepDAD bool) string {
	t.Helper()
	name := prefix + RandSuffix(t)
	if err := netnsutil.CreateNamed(name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := os.Stat(netnsutil.Path(name)); errors.Is(err, fs.ErrNotExist) {
			return // the test deleted it
		}
		if err := netns.DeleteNamed(name); err != nil {
			t.Errorf("delete netns %s: %v", name, err)
		}
	})
	if err := setUp(name, keepDAD); err != nil {
		t.Fatal(err)
	}
	return name
}

// setUp sets lo up and, unless keepDAD, turns IPv6 DAD off in the named
// netns.
func setUp(name string, keepDAD bool) error {
	return netnsutil.Do(name, func() error {
		h, err := netlink.NewHandle(unix.NETLINK_ROUTE) // route only: xfrm and netfilter sockets fail on kernels without them
		if err != nil {
			return fmt.Errorf("netlink handle in netns %s: %w", name, err)
		}
		defer h.Close()
		lo, err := h.LinkByName("lo")
		if err == nil {
			err = h.LinkSetUp(lo)
		}
		if err != nil {
			return fmt.Errorf("set lo up in netns %s: %w", name, err)
		}
		if keepDAD {
			return nil
		}
		for _, key := range []string{"net.ipv6.conf.default.accept_dad", "net.ipv6.conf.all.accept_dad"} {
			if err := WriteSysctl(key, "0"); err != nil {
				return fmt.Errorf("netns %s: %w", name, err)
			}
		}
		return nil
	})
}

// WriteSysctl writes a sysctl (key as in sysctl(8): net.ipv4.ip_forward)
// through /proc/sys, in the network namespace of the calling thread for
// net.* keys: call it inside netnsutil.Do or InNetns.
func WriteSysctl(key, val string) error {
	path := filepath.Join("/proc/sys", strings.ReplaceAll(key, ".", "/"))
	if err := os.WriteFile(path, []byte(val), 0o644); err != nil {
		return fmt.Errorf("sysctl %s=%s: %w", key, val, err)
	}
	return nil
}

// InNetns runs fn in the named network namespace (netnsutil.Do) and fails
// the test with fn's error. fn may call t.Fatal, t.FailNow or t.SkipNow:
// InNetns then ends the test too. A panic in fn fails the test.
func InNetns(t testing.TB, name string, fn func() error) {
	t.Helper()
	returned := false
	err := netnsutil.Do(name, func() (err error) {
		defer func() {
			if p := recover(); p != nil {
				returned = true
				err = fmt.Errorf("panic in netns %s: %v", name, p)
			}
		}()
		err = fn()
		returned = true
		return err
	})
	switch {
	case err != nil:
		t.Fatal(err)
	case !returned: // fn ended its goroutine (runtime.Goexit): the test is failed or skipped
		if t.Skipped() {
			t.SkipNow()
		}
		t.FailNow()
	}
}

// EnvInt is the positive integer in the environment variable key, def when
// it is unset; anything else fails the test (benchmarks' knobs).
func EnvInt(t testing.TB, key string, def int) int {
	t.Helper()
	s := os.Getenv(key)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive integer", key, s)
	}
	return n
}

// EnvSizes is the comma-separated list of message sizes in bytes
// (1..65000) in the environment variable key, def when it is unset;
// anything else fails the test.
func EnvSizes(t testing.TB, key string, def []int) []int {
	t.Helper()
	s := os.Getenv(key)
	if s == "" {
		return def
	}
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 65000 {
			t.Fatalf("%s: %q is not a message size in bytes (1..65000)", key, f)
		}
		out = append(out, n)
	}
	return out
}
