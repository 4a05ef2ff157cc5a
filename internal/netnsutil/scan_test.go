package netnsutil_test

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/testutil"
)

// Scan lists each namespace once (here: seen through its /run/netns bind
// mount and through a second bind mount), with its cookie and addresses,
// and the namespace of this process through /proc.
func TestScan(t *testing.T) {
	testutil.RequireRoot(t, "creates a network namespace and bind mounts")
	name := testutil.NewNetns(t, "axt-scan-")
	path := netnsutil.Path(name)
	if err := netnsutil.DoAt(path, func() error {
		h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
		if err != nil {
			return err
		}
		defer h.Close()
		lo, err := h.LinkByName("lo")
		if err != nil {
			return err
		}
		return h.AddrAdd(lo, &netlink.Addr{IPNet: netlink.NewIPNet(netip.MustParseAddr("10.213.178.7").AsSlice())})
	}); err != nil {
		t.Fatal(err)
	}
	want, err := netnsutil.Cookie(path)
	if err != nil {
		t.Fatal(err)
	}
	own, err := netnsutil.Cookie("")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	second := filepath.Join(dir, "again")
	if err := os.WriteFile(second, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(path, second, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(second, unix.MNT_DETACH) })

	got, err := netnsutil.Scan("/proc", []string{netnsutil.Dir, dir})
	if err != nil {
		t.Logf("scan errors (other namespaces of the host): %v", err)
	}
	var ours, self []netnsutil.Namespace
	for _, n := range got {
		switch n.Cookie {
		case want:
			ours = append(ours, n)
		case own:
			self = append(self, n)
		}
	}
	if len(ours) != 1 {
		t.Fatalf("the test namespace listed %d times, want once: %+v", len(ours), ours)
	}
	if !slices.Contains(ours[0].Addrs, netip.MustParseAddr("10.213.178.7")) || !slices.Contains(ours[0].Addrs, netip.MustParseAddr("127.0.0.1")) {
		t.Errorf("addresses %v, want 10.213.178.7 and 127.0.0.1", ours[0].Addrs)
	}
	if len(self) != 1 {
		t.Errorf("this process's namespace listed %d times, want once (through /proc)", len(self))
	}
}
