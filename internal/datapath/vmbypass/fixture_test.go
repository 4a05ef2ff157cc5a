package vmbypass

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/axonhq/axon/internal/inetcsum"
	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/testutil"
)

// The fixture: a VM pod as KubeVirt's bridge binding wires it, without a VM.
// In the pod netns a bridge k6t-eth0 (169.254.75.10/32, like KubeVirt's,
// for its DHCP server) enslaves eth0 and tap0; eth0's veth peer "node" is
// in the node netns. The test holds tap0's fd and plays the guest: a frame
// written to it is what the guest sends, a frame read from it what the guest
// receives.

const (
	bridgeName = "k6t-eth0"
	tapName    = "tap0"
	nodeDev    = "node"
)

var (
	guestMAC  = net.HardwareAddr{0x02, 0x00, 0x00, 0x00, 0x00, 0x02}
	nodeMAC   = net.HardwareAddr{0x02, 0x00, 0x00, 0x00, 0x00, 0x01}
	bridgeMAC = net.HardwareAddr{0x02, 0x00, 0x00, 0x00, 0x00, 0x0b}
	bcastMAC  = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
)

type vmPod struct {
	t          *testing.T
	pod, node  string // netns names
	podPath    string // the pod netns' path (what Detect and Attach take)
	tap        *os.File
	b          *Bypass
	id, pinDir string
}

// newVMPod builds the fixture; vnetHdr opens the tap with IFF_VNET_HDR and
// checksum/TSO offloads, as QEMU does (the relay of the TCP tests).
func newVMPod(t *testing.T, mode string, vnetHdr bool) *vmPod {
	t.Helper()
	dptest.RequireRoot(t)
	pinDir := dptest.NewPinDir(t, datapath.BPFFSRoot, datapath.EnsureBPFFS, func(dir string) error { return os.RemoveAll(dir) })
	v := &vmPod{t: t, pod: dptest.NewNetns(t, "vmpod"), node: dptest.NewNetns(t, "vmnode"), id: "pod-" + testutil.RandSuffix(t), pinDir: pinDir}
	v.podPath = netnsutil.Path(v.pod)
	pc := dptest.NSConf(t, v.pod)
	pc.Veth("eth0", "02:00:00:00:00:0e", nodeDev, nodeMAC.String(), v.node)
	if err := pc.H.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: bridgeName, HardwareAddr: bridgeMAC}}); err != nil {
		t.Fatalf("add bridge: %v", err)
	}
	v.tap = openTap(t, v.pod, tapName, vnetHdr)
	br := pc.Link(bridgeName)
	for _, port := range []string{"eth0", tapName} {
		if err := pc.H.LinkSetMaster(pc.Link(port), br); err != nil {
			t.Fatalf("enslave %s: %v", port, err)
		}
	}
	pc.Up("eth0", tapName, bridgeName)
	pc.Addr(bridgeName, "169.254.75.10/32")
	dptest.NSConf(t, v.node).Up(nodeDev)
	b, err := New(Config{PinDir: pinDir, AttachMode: mode, Logger: dptest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	v.b = b
	return v
}

// isolate sets the bridge ports isolated (on) or not: isolated ports forward
// nothing to each other, so whatever crosses comes through the bypass.
func (v *vmPod) isolate(on bool) {
	v.t.Helper()
	pc := dptest.NSConf(v.t, v.pod)
	for _, port := range []string{"eth0", tapName} {
		if err := pc.H.LinkSetIsolated(pc.Link(port), on); err != nil {
			v.t.Fatalf("set %s isolated %v: %v", port, on, err)
		}
	}
}

func (v *vmPod) attach() Layout {
	v.t.Helper()
	l, err := v.b.Attach(v.id, v.podPath, "")
	if err != nil {
		v.t.Fatal(err)
	}
	return l
}

func (v *vmPod) stats() Stats {
	v.t.Helper()
	st, err := v.b.Stats(v.id, v.podPath)
	if err != nil {
		v.t.Fatal(err)
	}
	return st
}

// openTap creates tap device name in netns ns by opening /dev/net/tun there;
// the device lives as long as the returned file.
func openTap(t *testing.T, ns, name string, vnetHdr bool) *os.File {
	t.Helper()
	var f *os.File
	dptest.InNetns(t, ns, func() {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatalf("open /dev/net/tun: %v", err)
		}
		ifr, err := unix.NewIfreq(name)
		if err != nil {
			t.Fatal(err)
		}
		flags := uint16(unix.IFF_TAP | unix.IFF_NO_PI)
		if vnetHdr {
			flags |= unix.IFF_VNET_HDR
		}
		ifr.SetUint16(flags)
		if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
			unix.Close(fd)
			t.Fatalf("TUNSETIFF %s: %v", name, err)
		}
		if vnetHdr {
			if err := unix.IoctlSetInt(fd, unix.TUNSETOFFLOAD, unix.TUN_F_CSUM|unix.TUN_F_TSO4|unix.TUN_F_TSO6); err != nil {
				unix.Close(fd)
				t.Fatalf("TUNSETOFFLOAD %s: %v", name, err)
			}
		}
		f = os.NewFile(uintptr(fd), "tap "+name)
	})
	t.Cleanup(func() { f.Close() })
	return f
}

// ---- raw frames ----

func eth(dst, src net.HardwareAddr, typ uint16, payload []byte) []byte {
	b := dptest.EthHdr(dst, src, typ)
	return append(b, payload...)
}

func arp(op uint16, sha net.HardwareAddr, spa netip.Addr, tha net.HardwareAddr, tpa netip.Addr) []byte {
	b := make([]byte, 28)
	binary.BigEndian.PutUint16(b[0:], 1)
	binary.BigEndian.PutUint16(b[2:], unix.ETH_P_IP)
	b[4], b[5] = 6, 4
	binary.BigEndian.PutUint16(b[6:], op)
	copy(b[8:], sha)
	copy(b[14:], spa.AsSlice())
	copy(b[18:], tha)
	copy(b[24:], tpa.AsSlice())
	return b
}

// l4sum is the Internet checksum of an L4 segment with its pseudo-header.
func l4sum(src, dst netip.Addr, proto byte, seg []byte) uint16 {
	var ph []byte
	ph = append(ph, src.AsSlice()...)
	ph = append(ph, dst.AsSlice()...)
	if src.Is4() {
		ph = append(ph, 0, proto, byte(len(seg)>>8), byte(len(seg)))
	} else {
		ph = binary.BigEndian.AppendUint32(ph, uint32(len(seg)))
		ph = append(ph, 0, 0, 0, proto)
	}
	return inetcsum.Checksum(append(ph, seg...), 0)
}

// ip builds an IPv4 or IPv6 packet around seg, whose checksum (at csumOff)
// it fills in.
func ip(src, dst netip.Addr, proto byte, seg []byte, csumOff int) []byte {
	binary.BigEndian.PutUint16(seg[csumOff:], 0)
	binary.BigEndian.PutUint16(seg[csumOff:], l4sum(src, dst, proto, seg))
	if src.Is4() {
		h := make([]byte, 20)
		h[0] = 0x45
		binary.BigEndian.PutUint16(h[2:], uint16(20+len(seg)))
		h[8], h[9] = 64, proto
		copy(h[12:], src.AsSlice())
		copy(h[16:], dst.AsSlice())
		binary.BigEndian.PutUint16(h[10:], inetcsum.Checksum(h, 0))
		return append(h, seg...)
	}
	h := make([]byte, 40)
	h[0] = 0x60
	binary.BigEndian.PutUint16(h[4:], uint16(len(seg)))
	h[6], h[7] = proto, 255
	copy(h[8:], src.AsSlice())
	copy(h[24:], dst.AsSlice())
	return append(h, seg...)
}

func udp(src, dst netip.Addr, sport, dport uint16, payload []byte) []byte {
	seg := make([]byte, 8, 8+len(payload))
	binary.BigEndian.PutUint16(seg[0:], sport)
	binary.BigEndian.PutUint16(seg[2:], dport)
	binary.BigEndian.PutUint16(seg[4:], uint16(8+len(payload)))
	return ip(src, dst, 17, append(seg, payload...), 6)
}

func tcpSYN(src, dst netip.Addr, sport, dport uint16) []byte {
	seg := make([]byte, 20)
	binary.BigEndian.PutUint16(seg[0:], sport)
	binary.BigEndian.PutUint16(seg[2:], dport)
	binary.BigEndian.PutUint32(seg[4:], 1000)
	seg[12], seg[13] = 5<<4, 0x02
	binary.BigEndian.PutUint16(seg[14:], 65535)
	return ip(src, dst, 6, seg, 16)
}

// nd is a Neighbor Solicitation (type 135) or Advertisement (136) for target
// with a link-layer address option.
func nd(typ byte, src, dst, target netip.Addr, lladdr net.HardwareAddr) []byte {
	seg := make([]byte, 24, 32)
	seg[0] = typ
	if typ == 136 {
		seg[4] = 0x60 // solicited, override
	}
	copy(seg[8:], target.AsSlice())
	opt := byte(1)
	if typ == 136 {
		opt = 2
	}
	seg = append(seg, opt, 1)
	seg = append(seg, lladdr...)
	return ip(src, dst, 58, seg, 2)
}

// dhcpDiscover is a BOOTP/DHCP DISCOVER of chaddr, broadcast from 0.0.0.0.
func dhcpDiscover(chaddr net.HardwareAddr) []byte {
	p := make([]byte, 240)
	p[0], p[1], p[2] = 1, 1, 6
	binary.BigEndian.PutUint32(p[4:], 0x1234abcd)
	binary.BigEndian.PutUint16(p[10:], 0x8000) // broadcast flag
	copy(p[28:], chaddr)
	binary.BigEndian.PutUint32(p[236:], 0x63825363) // magic cookie
	p = append(p, 53, 1, 1, 255)                    // DHCP message type DISCOVER, end
	return udp(netip.IPv4Unspecified(), netip.MustParseAddr("255.255.255.255"), 68, 67, p)
}

// ---- capture ----

// capture is an AF_PACKET socket on a device: it sees every frame the device
// receives (and sends: those are skipped).
type capture struct {
	t  *testing.T
	fd int
}

func newCapture(t *testing.T, ns, dev string) *capture {
	t.Helper()
	c := &capture{t: t}
	dptest.InNetns(t, ns, func() {
		l, err := netlink.LinkByName(dev)
		if err != nil {
			t.Fatal(err)
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(dptest.Htons(unix.ETH_P_ALL)))
		if err != nil {
			t.Fatalf("packet socket: %v", err)
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: dptest.Htons(unix.ETH_P_ALL), Ifindex: l.Attrs().Index}); err != nil {
			t.Fatalf("bind packet socket to %s: %v", dev, err)
		}
		c.fd = fd
	})
	t.Cleanup(func() { unix.Close(c.fd) })
	return c
}

// received returns the frames received until quiet for idle (at most max).
func (c *capture) received(idle, max time.Duration) [][]byte {
	var out [][]byte
	end := time.Now().Add(max)
	buf := make([]byte, 65536)
	for time.Now().Before(end) {
		tv := unix.NsecToTimeval(idle.Nanoseconds())
		_ = unix.SetsockoptTimeval(c.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
		n, from, err := unix.Recvfrom(c.fd, buf, 0)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			return out
		}
		if err != nil {
			c.t.Fatalf("capture: %v", err)
		}
		if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
			continue
		}
		out = append(out, bytes.Clone(buf[:n]))
	}
	return out
}

// tapFrames reads what the guest receives until quiet for idle.
func tapFrames(t *testing.T, tap *os.File, idle time.Duration) [][]byte {
	t.Helper()
	var out [][]byte
	buf := make([]byte, 65536)
	for {
		_ = tap.SetReadDeadline(time.Now().Add(idle))
		n, err := tap.Read(buf)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return out
		}
		if err != nil {
			t.Fatalf("read tap: %v", err)
		}
		out = append(out, bytes.Clone(buf[:n]))
	}
}

// missing lists the frames of want that are not in got.
func missing(want, got [][]byte) []int {
	var out []int
	for i, w := range want {
		found := false
		for _, g := range got {
			if bytes.Equal(w, g) {
				found = true
				break
			}
		}
		if !found {
			out = append(out, i)
		}
	}
	return out
}

// udpListener is a UDP socket on port in netns ns bound to device dev.
func udpListener(t *testing.T, ns, dev string, port int) int {
	t.Helper()
	var fd int
	dptest.InNetns(t, ns, func() {
		var err error
		fd, err = unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_BROADCAST, 1)
		if err := unix.BindToDevice(fd, dev); err != nil {
			t.Fatalf("bind to %s: %v", dev, err)
		}
		if err := unix.Bind(fd, &unix.SockaddrInet4{Port: port}); err != nil {
			t.Fatalf("bind :%d: %v", port, err)
		}
		tv := unix.NsecToTimeval(testutil.Stretch(t, 500*time.Millisecond).Nanoseconds())
		_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	})
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

// udpReceived counts the datagrams waiting on fd whose payload starts with prefix.
func udpReceived(fd int, prefix []byte) int {
	n := 0
	buf := make([]byte, 2048)
	for {
		k, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return n
		}
		if bytes.HasPrefix(buf[:k], prefix) {
			n++
		}
	}
}

// pinsUnder lists what is pinned under dir (recursively).
func pinsUnder(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	_ = filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() {
			out = append(out, p)
		}
		return nil
	})
	return out
}
