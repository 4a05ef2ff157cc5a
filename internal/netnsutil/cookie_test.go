package netnsutil_test

import (
	"errors"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/testutil"
)

// Cookie is the SO_NETNS_COOKIE of a socket made in the namespace: stable
// for one namespace, distinct between two, and a missing namespace is
// os.ErrNotExist.
func TestCookie(t *testing.T) {
	testutil.RequireRoot(t, "creates a network namespace")
	own, err := netnsutil.Cookie("")
	if err != nil {
		t.Fatal(err)
	}
	ns := testutil.NewNetns(t, "axt-cookie-")
	c1, err := netnsutil.Cookie(netnsutil.Path(ns))
	if err != nil {
		t.Fatal(err)
	}
	c2, err := netnsutil.Cookie(netnsutil.Path(ns))
	if err != nil {
		t.Fatal(err)
	}
	if c1 == 0 || c1 != c2 || c1 == own {
		t.Fatalf("cookies: own %d, the new netns %d then %d: want one non-zero value for the new netns, not the own one", own, c1, c2)
	}
	// the same value a socket made there reports
	var fromSocket uint64
	testutil.InNetns(t, ns, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		fromSocket, err = unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
		return err
	})
	if fromSocket != c1 {
		t.Fatalf("a TCP socket in the netns reports %d, Cookie %d", fromSocket, c1)
	}
	if _, err := netnsutil.Cookie(netnsutil.Path("axt-cookie-does-not-exist")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing netns: %v, want os.ErrNotExist", err)
	}
}
