// Package dptest holds what the tests of axon's datapath packages share on
// top of package testutil: the datapath's netns names (NewNetns, InNetns),
// netns configuration (NSConf), bpffs pin dirs, a test logger, packet
// builders, skb test runs and traffic helpers. It needs no userland tools:
// the VM kernel matrix runs the tests under busybox.
package dptest

import (
	"encoding/binary"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/axonhq/axon/internal/inetcsum"
	"github.com/axonhq/axon/internal/testutil"
)

// RequireRoot skips the test unless it runs as root (testutil.RequireRoot).
func RequireRoot(t testing.TB) {
	t.Helper()
	testutil.RequireRoot(t, "loads BPF programs, creates network namespaces and bpffs pins")
}

// NewPinDir returns a fresh pin dir under root, the bpffs mount (made sure
// of by ensure), which uninstall removes at cleanup.
func NewPinDir(t testing.TB, root string, ensure func() error, uninstall func(dir string) error) string {
	t.Helper()
	if err := ensure(); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "axt-dp-"+testutil.RandSuffix(t))
	t.Cleanup(func() {
		if err := uninstall(dir); err != nil {
			t.Errorf("cleanup: %v", err)
		}
		_ = os.RemoveAll(dir)
	})
	return dir
}

// NewNetns creates the netns axt-dp-<tag>-<rand> (testutil.NewNetns: lo up,
// IPv6 DAD off, deleted at cleanup) and returns its name.
func NewNetns(t testing.TB, tag string) string {
	t.Helper()
	return testutil.NewNetns(t, "axt-dp-"+tag+"-")
}

// InNetns runs fn in netns ns (testutil.InNetns, for the fn that report
// failures through t themselves): t.Fatal, t.FailNow and t.SkipNow in fn end
// the test, and a panic in fn fails it.
func InNetns(t testing.TB, ns string, fn func()) {
	t.Helper()
	testutil.InNetns(t, ns, func() error { fn(); return nil })
}

// Logger logs to t at debug level.
func Logger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(logWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type logWriter struct{ t testing.TB }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// MustMAC parses s or fails the test.
func MustMAC(t testing.TB, s string) net.HardwareAddr {
	t.Helper()
	m, err := net.ParseMAC(s)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// ---- packet builders ----

// EthHdr is an Ethernet header.
func EthHdr(dst, src net.HardwareAddr, proto uint16) []byte {
	b := make([]byte, 14)
	copy(b[0:6], dst)
	copy(b[6:12], src)
	binary.BigEndian.PutUint16(b[12:], proto)
	return b
}

// IPv4Packet builds eth + IPv4 (+ options) + UDP payload with a valid checksum.
func IPv4Packet(dstMAC, srcMAC net.HardwareAddr, src, dst netip.Addr, ttl uint8, options []byte) []byte {
	payload := UDPPayload()
	ihl := 5 + len(options)/4
	ip := make([]byte, ihl*4)
	ip[0] = 0x40 | byte(ihl)
	binary.BigEndian.PutUint16(ip[2:], uint16(len(ip)+len(payload)))
	binary.BigEndian.PutUint16(ip[4:], 0x1234)
	ip[8] = ttl
	ip[9] = 17
	s4, d4 := src.As4(), dst.As4()
	copy(ip[12:], s4[:])
	copy(ip[16:], d4[:])
	copy(ip[20:], options)
	binary.BigEndian.PutUint16(ip[10:], inetcsum.Checksum(ip, 0))
	out := append(EthHdr(dstMAC, srcMAC, 0x0800), ip...)
	return append(out, payload...)
}

// IPv6Packet builds eth + IPv6 + UDP payload.
func IPv6Packet(dstMAC, srcMAC net.HardwareAddr, src, dst netip.Addr, hop uint8) []byte {
	payload := UDPPayload()
	ip := make([]byte, 40)
	ip[0] = 0x60
	binary.BigEndian.PutUint16(ip[4:], uint16(len(payload)))
	ip[6] = 17
	ip[7] = hop
	s6, d6 := src.As16(), dst.As16()
	copy(ip[8:], s6[:])
	copy(ip[24:], d6[:])
	out := append(EthHdr(dstMAC, srcMAC, 0x86dd), ip...)
	return append(out, payload...)
}

// UDPPayload is a UDP header (checksum 0) + 18 bytes, so frames reach 64 bytes.
func UDPPayload() []byte {
	b := make([]byte, 8+18)
	binary.BigEndian.PutUint16(b[0:], 40000)
	binary.BigEndian.PutUint16(b[2:], 5201)
	binary.BigEndian.PutUint16(b[4:], uint16(len(b)))
	copy(b[8:], "axon-test-payload!")
	return b
}

// ARPPacket is an ARP request from srcMAC.
func ARPPacket(srcMAC net.HardwareAddr) []byte {
	b := EthHdr(net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, srcMAC, 0x0806)
	arp := make([]byte, 28)
	binary.BigEndian.PutUint16(arp[0:], 1)
	binary.BigEndian.PutUint16(arp[2:], 0x0800)
	arp[4], arp[5] = 6, 4
	binary.BigEndian.PutUint16(arp[6:], 1)
	copy(arp[8:], srcMAC)
	copy(arp[14:], []byte{10, 244, 1, 5})
	copy(arp[24:], []byte{169, 254, 1, 1})
	return append(b, arp...)
}

// Forwarded returns what a Forwarded frame must look like: new MACs, TTL or
// hop limit minus one and, for IPv4, a recomputed header checksum.
func Forwarded(in []byte, dst, src net.HardwareAddr) []byte {
	out := append([]byte(nil), in...)
	copy(out[0:6], dst)
	copy(out[6:12], src)
	switch binary.BigEndian.Uint16(out[12:]) {
	case 0x0800:
		ihl := int(out[14]&0x0f) * 4
		out[14+8]--
		out[14+10], out[14+11] = 0, 0
		binary.BigEndian.PutUint16(out[14+10:], inetcsum.Checksum(out[14:14+ihl], 0))
	case 0x86dd:
		out[14+7]--
	}
	return out
}

// IPv4HeaderValid checks the IPv4 header checksum of frame.
func IPv4HeaderValid(frame []byte) bool {
	ihl := int(frame[14]&0x0f) * 4
	return inetcsum.Checksum(frame[14:14+ihl], 0) == 0
}

// MapLen counts the entries of m by iterating.
func MapLen(t testing.TB, m *ebpf.Map) int {
	t.Helper()
	var n int
	var k, v []byte
	it := m.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// BigTCP4 turns an IPv4 frame into what IPv4 BIG TCP hands a device for a
// GSO packet over 64 KiB: TCP with tot_len 0 (the length is skb->len), and a
// valid header checksum.
func BigTCP4(frame []byte, proto byte) []byte {
	out := append([]byte(nil), frame...)
	ihl := int(out[14]&0x0f) * 4
	out[14+9] = proto
	out[14+2], out[14+3] = 0, 0
	out[14+10], out[14+11] = 0, 0
	binary.BigEndian.PutUint16(out[14+10:], inetcsum.Checksum(out[14:14+ihl], 0))
	return out
}
