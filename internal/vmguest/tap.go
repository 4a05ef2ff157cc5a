package vmguest

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/netnsutil"
)

// OpenTap creates the tap device name in the netns at netnsPath, as virt-launcher does
// for a VM's NIC, and returns its fd for QEMU (IFF_VNET_HDR: QEMU negotiates checksum
// and segmentation offloads with the guest through it). The device lives as long as
// some process holds the fd: when the guest's QEMU exits and the caller closed its
// copy, the tap goes.
func OpenTap(netnsPath, name string) (*os.File, error) {
	var f *os.File
	err := netnsutil.DoAt(netnsPath, func() error {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open /dev/net/tun: %w", err)
		}
		ifr, err := unix.NewIfreq(name)
		if err != nil {
			unix.Close(fd)
			return fmt.Errorf("tap name %q: %w", name, err)
		}
		ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
		if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
			unix.Close(fd)
			return fmt.Errorf("create tap %s (TUNSETIFF): %w", name, err)
		}
		f = os.NewFile(uintptr(fd), "tap "+name)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("tap %s in %s: %w", name, netnsPath, err)
	}
	return f, nil
}
