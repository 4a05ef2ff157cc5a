package datapath

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/vishvananda/netns"
)

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: loads BPF programs, creates network namespaces and bpffs pins")
	}
}

func randSuffix(t testing.TB) string {
	t.Helper()
	b := make([]byte, 3)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// newPinDir returns a fresh pin dir under /sys/fs/bpf, removed at cleanup.
func newPinDir(t testing.TB) string {
	t.Helper()
	if err := ensureBPFFS(); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(BPFFSRoot, "axt-dp-"+randSuffix(t))
	t.Cleanup(func() {
		if err := Uninstall(dir); err != nil {
			t.Errorf("cleanup: %v", err)
		}
		_ = os.RemoveAll(dir)
	})
	return dir
}

// newNetns creates a named netns axt-dp-<tag>-<rand> with lo up and IPv6 DAD
// off (deleted at cleanup) and returns its name. Pure netlink/netns syscalls
// and /proc/sys: the test binary also runs in VMs with a busybox userland (no
// ip, tc, nsenter, sysctl).
func newNetns(t testing.TB, tag string) string {
	t.Helper()
	name := "axt-dp-" + tag + "-" + randSuffix(t)
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("get current netns: %w", err)
			return
		}
		defer orig.Close()
		h, err := netns.NewNamed(name) // switches this thread into it
		if err != nil {
			if serr := netns.Set(orig); serr == nil {
				runtime.UnlockOSThread()
			}
			errc <- fmt.Errorf("create netns %s: %w", name, err)
			return
		}
		h.Close()
		if err := netns.Set(orig); err != nil {
			errc <- fmt.Errorf("return from netns %s: %w", name, err)
			return // thread stays locked and dies with the goroutine
		}
		runtime.UnlockOSThread()
		errc <- nil
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := netns.DeleteNamed(name); err != nil {
			t.Errorf("delete netns %s: %v", name, err)
		}
	})
	c := nsConf(t, name)
	c.up("lo")
	// devices created here from now on skip IPv6 DAD, link-local included:
	// until a device's link-local address leaves DAD (~2 s) the kernel sends
	// no neighbour solicitation from it, and a test's first IPv6 packet to
	// an unresolved neighbour waits for it (the CNI plugin and the lab do
	// the same for their devices)
	c.sysctl("net.ipv6.conf.default.accept_dad", "0")
	c.sysctl("net.ipv6.conf.all.accept_dad", "0")
	return name
}

// inNetns runs fn on a locked OS thread switched into netns ns.
func inNetns(t testing.TB, ns string, fn func()) {
	t.Helper()
	errc := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			runtime.UnlockOSThread()
			return
		}
		defer orig.Close()
		target, err := netns.GetFromName(ns)
		if err != nil {
			errc <- fmt.Errorf("open netns %s: %w", ns, err)
			runtime.UnlockOSThread()
			return
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			errc <- fmt.Errorf("enter netns %s: %w", ns, err)
			return // thread state unknown: keep it locked so it dies
		}
		var panicked any
		func() {
			defer func() { panicked = recover() }()
			fn()
		}()
		if err := netns.Set(orig); err != nil {
			errc <- fmt.Errorf("return from netns %s: %w", ns, err)
			return
		}
		runtime.UnlockOSThread()
		if panicked != nil {
			errc <- fmt.Errorf("panic in netns %s: %v", ns, panicked)
			return
		}
		errc <- nil
	}()
	<-done
	select {
	case err := <-errc:
		if err != nil {
			t.Fatal(err)
		}
	default: // fn called t.FailNow (runtime.Goexit): the test is marked failed
		t.FailNow()
	}
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func mustMAC(t testing.TB, s string) net.HardwareAddr {
	t.Helper()
	m, err := net.ParseMAC(s)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// ---- packet builders ----

func ethHdr(dst, src net.HardwareAddr, proto uint16) []byte {
	b := make([]byte, 14)
	copy(b[0:6], dst)
	copy(b[6:12], src)
	binary.BigEndian.PutUint16(b[12:], proto)
	return b
}

func csum16(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

// ipv4Packet builds eth + IPv4 (+ options) + UDP payload with a valid checksum.
func ipv4Packet(dstMAC, srcMAC net.HardwareAddr, src, dst netip.Addr, ttl uint8, options []byte) []byte {
	payload := udpPayload()
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
	binary.BigEndian.PutUint16(ip[10:], csum16(ip))
	out := append(ethHdr(dstMAC, srcMAC, 0x0800), ip...)
	return append(out, payload...)
}

func ipv6Packet(dstMAC, srcMAC net.HardwareAddr, src, dst netip.Addr, hop uint8) []byte {
	payload := udpPayload()
	ip := make([]byte, 40)
	ip[0] = 0x60
	binary.BigEndian.PutUint16(ip[4:], uint16(len(payload)))
	ip[6] = 17
	ip[7] = hop
	s6, d6 := src.As16(), dst.As16()
	copy(ip[8:], s6[:])
	copy(ip[24:], d6[:])
	out := append(ethHdr(dstMAC, srcMAC, 0x86dd), ip...)
	return append(out, payload...)
}

// udpPayload is a UDP header (checksum 0) + 18 bytes, so frames reach 64 bytes.
func udpPayload() []byte {
	b := make([]byte, 8+18)
	binary.BigEndian.PutUint16(b[0:], 40000)
	binary.BigEndian.PutUint16(b[2:], 5201)
	binary.BigEndian.PutUint16(b[4:], uint16(len(b)))
	copy(b[8:], "axon-test-payload!")
	return b
}

func arpPacket(srcMAC net.HardwareAddr) []byte {
	b := ethHdr(net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, srcMAC, 0x0806)
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

// forwarded returns what a forwarded frame must look like: new MACs, TTL or
// hop limit minus one and, for IPv4, a recomputed header checksum.
func forwarded(in []byte, dst, src net.HardwareAddr) []byte {
	out := append([]byte(nil), in...)
	copy(out[0:6], dst)
	copy(out[6:12], src)
	switch binary.BigEndian.Uint16(out[12:]) {
	case 0x0800:
		ihl := int(out[14]&0x0f) * 4
		out[14+8]--
		out[14+10], out[14+11] = 0, 0
		binary.BigEndian.PutUint16(out[14+10:], csum16(out[14:14+ihl]))
	case 0x86dd:
		out[14+7]--
	}
	return out
}

func ipv4HeaderValid(frame []byte) bool {
	ihl := int(frame[14]&0x0f) * 4
	return csum16(frame[14:14+ihl]) == 0
}
