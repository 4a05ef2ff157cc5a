// Package ethtool switches a network device's offload features on or off
// with the SIOCETHTOOL ioctl, as `ethtool -K dev <feature> on|off` does,
// without the ethtool binary (not installed everywhere; lab namespaces call
// it from Go). The legacy per-feature commands are used: every kernel since
// 2.6 maps them onto the device's feature bits.
//
// The ioctl acts on the network namespace of the calling OS thread: call it
// inside the device's namespace (e.g. ns.WithNetNSPath).
package ethtool

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Feature is one legacy ethtool "set" command (include/uapi/linux/ethtool.h).
type Feature uint32

const (
	// TxChecksum is ETHTOOL_STXCSUM ("tx-checksumming"). Off, an skb with
	// CHECKSUM_PARTIAL leaving the device has its checksum completed in
	// software; TSO, which depends on it, goes off too.
	TxChecksum Feature = 0x17
	// TSO is ETHTOOL_STSO ("tcp-segmentation-offload": every TSO variant).
	TSO Feature = 0x1f
	// GRO is ETHTOOL_SGRO ("generic-receive-offload"). On a veth, GRO on
	// also gives the device a NAPI receive ring (kernel ≥ 5.13).
	GRO Feature = 0x2c
)

func (f Feature) String() string {
	switch f {
	case TxChecksum:
		return "tx-checksumming"
	case TSO:
		return "tcp-segmentation-offload"
	case GRO:
		return "generic-receive-offload"
	}
	return fmt.Sprintf("ethtool command %#x", uint32(f))
}

// Set turns feature f of dev (in the calling thread's network namespace) on
// or off.
func Set(dev string, f Feature, on bool) error {
	var data uint32
	if on {
		data = 1
	}
	if _, err := call(dev, uint32(f), data); err != nil {
		return fmt.Errorf("ethtool %s %s %s: %w", dev, f, onOff(on), err)
	}
	return nil
}

// Get reports whether feature f of dev is on (the matching ETHTOOL_G*
// command is the set command minus one).
func Get(dev string, f Feature) (bool, error) {
	data, err := call(dev, uint32(f)-1, 0)
	if err != nil {
		return false, fmt.Errorf("ethtool %s get %s: %w", dev, f, err)
	}
	return data != 0, nil
}

// call runs one struct ethtool_value command on dev and returns its data.
func call(dev string, cmd, data uint32) (uint32, error) {
	if len(dev) >= unix.IFNAMSIZ {
		return 0, fmt.Errorf("device name %q too long", dev)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	val := struct{ cmd, data uint32 }{cmd: cmd, data: data}
	var ifr struct {
		name [unix.IFNAMSIZ]byte
		data uintptr
		_    [16]byte
	}
	copy(ifr.name[:], dev)
	ifr.data = uintptr(unsafe.Pointer(&val))
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr))); errno != 0 {
		return 0, errno
	}
	runtime.KeepAlive(&val)
	return val.data, nil
}

func onOff(on bool) string {
	if on {
		return "on"
	}
	return "off"
}
