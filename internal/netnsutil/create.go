package netnsutil

import (
	"errors"
	"fmt"
	"os"
	"runtime"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// CreateNamed creates the named network namespace Path(name) (like `ip netns
// add`), first making Dir a shared mount point (EnsureDir). It runs on a
// throw-away locked OS thread, so the caller's threads never change
// namespace: the thread is never unlocked and dies with its goroutine, so a
// failed restore cannot leak a thread in the wrong namespace.
func CreateNamed(name string) error {
	if err := EnsureDir(); err != nil {
		return err
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		h, err := netns.NewNamed(name)
		if err != nil {
			errc <- fmt.Errorf("create netns %s: %w", name, err)
			return
		}
		h.Close()
		errc <- nil
	}()
	return <-errc
}

// EnsureDir makes Dir (/run/netns) a shared mount point, as `ip netns add`
// does the first time it runs (iproute2 ip/ipnetns.c): a recursive bind
// mount of the directory onto itself, propagation shared. Every namespace
// file must be created after it: a bind made later covers the files mounted
// before it (the lab's, a test's), and they can then be neither unmounted
// nor removed (EBUSY) until the bind goes. Idempotent.
func EnsureDir() error {
	if err := os.MkdirAll(Dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", Dir, err)
	}
	for made := false; ; made = true {
		err := unix.Mount("", Dir, "none", unix.MS_SHARED|unix.MS_REC, "")
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.EINVAL) || made {
			return fmt.Errorf("make %s a shared mount: %w", Dir, err)
		}
		// EINVAL: not a mount point yet.
		if err := unix.Mount(Dir, Dir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind %s onto itself: %w", Dir, err)
		}
	}
}
