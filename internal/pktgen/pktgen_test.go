package pktgen

import (
	"encoding/binary"
	"encoding/hex"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/inetcsum"
	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/testutil"
)

func TestUDP4Frame(t *testing.T) {
	u := UDP4{
		SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, DstMAC: net.HardwareAddr{2, 0, 0, 0, 0, 2},
		Src: netip.MustParseAddrPort("198.18.0.250:40000"), Dst: netip.MustParseAddrPort("198.18.0.12:30092"),
	}
	f, err := u.Frame()
	if err != nil {
		t.Fatal(err)
	}
	if len(f) != FrameLen {
		t.Fatalf("frame is %d bytes, want %d", len(f), FrameLen)
	}
	if got := hex.EncodeToString(f[:14]); got != "020000000002"+"020000000001"+"0800" {
		t.Errorf("Ethernet header %s", got)
	}
	ip := f[14:34]
	if c := inetcsum.Checksum(ip, 0); c != 0 {
		t.Errorf("IPv4 header does not sum to 0xffff (checksum over it %#04x)", c)
	}
	if got := binary.BigEndian.Uint16(ip[2:]); got != FrameLen-14 {
		t.Errorf("IPv4 total length %d", got)
	}
	udp := f[34:]
	if sp, dp := binary.BigEndian.Uint16(udp[0:]), binary.BigEndian.Uint16(udp[2:]); sp != 40000 || dp != 30092 {
		t.Errorf("ports %d → %d", sp, dp)
	}
	if c := inetcsum.Checksum(udp, pseudoHeader([4]byte(ip[12:16]), [4]byte(ip[16:20]), len(udp))); c != 0 {
		t.Errorf("UDP checksum does not verify (%#04x)", c)
	}

	for name, bad := range map[string]UDP4{
		"short MAC": {SrcMAC: net.HardwareAddr{1}, DstMAC: u.DstMAC, Src: u.Src, Dst: u.Dst},
		"IPv6":      {SrcMAC: u.SrcMAC, DstMAC: u.DstMAC, Src: netip.MustParseAddrPort("[fd00::1]:1"), Dst: u.Dst},
	} {
		if _, err := bad.Frame(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// veth pair g0 ↔ g1 in a private namespace, IPv6 off so that nothing but
// the generator's frames crosses it.
func vethNetns(t *testing.T) string {
	t.Helper()
	testutil.RequireRoot(t, "network namespaces and XDP")
	name := testutil.NewNetns(t, "axt-pg-")
	run := func(argv ...string) {
		t.Helper()
		if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(argv, " "), err, out)
		}
	}
	run("ip", "netns", "exec", name, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1")
	run("ip", "-n", name, "link", "add", "g0", "type", "veth", "peer", "name", "g1")
	run("ip", "-n", name, "link", "set", "g0", "up")
	run("ip", "-n", name, "link", "set", "g1", "up")
	return name
}

func linkOf(t *testing.T, ns, dev string) netlink.Link {
	t.Helper()
	var l netlink.Link
	if err := netnsutil.Do(ns, func() (err error) { l, err = netlink.LinkByName(dev); return err }); err != nil {
		t.Fatalf("%s in %s: %v", dev, ns, err)
	}
	return l
}

func frames(t *testing.T, ns string, port uint16, flows int) [][]byte {
	t.Helper()
	g0, g1 := linkOf(t, ns, "g0"), linkOf(t, ns, "g1")
	var fs [][]byte
	for i := range flows {
		f, err := UDP4{SrcMAC: g0.Attrs().HardwareAddr, DstMAC: g1.Attrs().HardwareAddr,
			Src: netip.AddrPortFrom(netip.MustParseAddr("10.99.0.1"), uint16(40000+i)),
			Dst: netip.AddrPortFrom(netip.MustParseAddr("10.99.0.2"), port)}.Frame()
		if err != nil {
			t.Fatal(err)
		}
		fs = append(fs, f)
	}
	return fs
}

// TestGeneratorToSink sends frames out of g0 into g1's ring, where the sink
// counts them: every frame g1 received is counted, no more, and frames to
// another port pass the sink uncounted. The sink's NAPI thread shows the
// receive work as CPU time.
func TestGeneratorToSink(t *testing.T) {
	ns := vethNetns(t)
	// A program already on g1, which the sink must give back on Close.
	pass, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.XDP, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2), asm.Return()}})
	if err != nil {
		t.Fatal(err)
	}
	defer pass.Close()
	passInfo, err := pass.Info()
	if err != nil {
		t.Fatal(err)
	}
	passID, _ := passInfo.ID()
	if err := netnsutil.Do(ns, func() error {
		return netlink.LinkSetXdpFdWithFlags(linkOf(t, ns, "g1"), pass.FD(), nl.XDP_FLAGS_DRV_MODE)
	}); err != nil {
		t.Fatal(err)
	}

	sink, err := AttachSink(ns, "g1", 7001)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			sink.Close()
		}
	}()
	threads, err := ThreadedNAPI(ns, "g1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ThreadedNAPI(ns, "g1"); err == nil {
		t.Error("a second ThreadedNAPI on the same device found new threads")
	}
	for _, pid := range threads {
		if err := Pin(pid, 0); err != nil {
			t.Fatal(err)
		}
	}
	gen, err := NewGenerator(ns, "g0")
	if err != nil {
		t.Fatal(err)
	}
	defer gen.Close()

	rxPackets := func() uint64 { return linkOf(t, ns, "g1").Attrs().Statistics.RxPackets }
	cpu := func() time.Duration {
		var sum time.Duration
		for _, pid := range threads {
			d, err := CPUTime(pid)
			if err != nil {
				t.Fatal(err)
			}
			sum += d
		}
		return sum
	}

	rx0, cpu0 := rxPackets(), cpu()
	res, err := gen.Run(t.Context(), frames(t, ns, 7001, 4), 400*time.Millisecond, 1)
	if err != nil {
		t.Fatal(err)
	}
	// the generator has sent; g1's NAPI thread may still be draining the
	// ring (on a busy machine for a while): wait until g1's received
	// frames stop growing and the sink's count agrees, or the deadline
	// says they never will
	deadline := time.Now().Add(testutil.Stretch(t, 5*time.Second))
	for last := ^uint64(0); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		c, err := sink.Count()
		if err != nil {
			t.Fatal(err)
		}
		r := rxPackets() - rx0
		if r == last && c == r && c > 0 {
			break
		}
		last = r
	}
	n, err := sink.Count()
	if err != nil {
		t.Fatal(err)
	}
	rx, used := rxPackets()-rx0, cpu()-cpu0
	t.Logf("offered %d frames in %v (%.2f Mpps), g1 received %d, sink counted %d, g1's NAPI thread ran %v (%.0f ns/frame)",
		res.Sent, res.Elapsed.Round(time.Millisecond), res.PPS()/1e6, rx, n, used, float64(used)/float64(max(n, 1)))
	if n == 0 || n != rx {
		t.Errorf("sink counted %d frames, g1 received %d: want every received frame counted, and some", n, rx)
	}
	if n > res.Sent {
		t.Errorf("sink counted %d frames, more than the %d offered", n, res.Sent)
	}
	if used <= 0 {
		t.Errorf("g1's NAPI thread used no CPU time (%v) while receiving %d frames", used, rx)
	}

	// Another port: received, passed, not counted.
	rx0 = rxPackets()
	if _, err := gen.Run(t.Context(), frames(t, ns, 9, 1), 100*time.Millisecond, -1); err != nil {
		t.Fatal(err)
	}
	// wait until g1 received them (the sink sees each frame as g1 receives
	// it, so its count is final then)
	for deadline := time.Now().Add(testutil.Stretch(t, 5*time.Second)); rxPackets() == rx0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if m, _ := sink.Count(); m != n {
		t.Errorf("frames to port 9 were counted: %d → %d", n, m)
	}
	if rxPackets() == rx0 {
		t.Error("no frame to port 9 reached g1")
	}

	closed = true
	if err := sink.Close(); err != nil {
		t.Fatal(err)
	}
	if x := linkOf(t, ns, "g1").Attrs().Xdp; x == nil || ebpf.ProgramID(x.ProgId) != passID {
		t.Errorf("after Close g1 runs XDP %+v, want the program it had before (%d)", x, passID)
	}
}

// TestGeneratorFlows: every frame sent is one of the templates, picked at
// random: with half of them to the sink's port, about half the frames are
// counted, and the rest pass.
func TestGeneratorFlows(t *testing.T) {
	ns := vethNetns(t)
	sink, err := AttachSink(ns, "g1", 7001)
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	gen, err := NewGenerator(ns, "g0")
	if err != nil {
		t.Fatal(err)
	}
	defer gen.Close()
	fs := append(frames(t, ns, 7001, 2), frames(t, ns, 7002, 2)...)
	rx0 := linkOf(t, ns, "g1").Attrs().Statistics.RxPackets
	if _, err := gen.Run(t.Context(), fs, 200*time.Millisecond, -1); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	rx := linkOf(t, ns, "g1").Attrs().Statistics.RxPackets - rx0
	n, err := sink.Count()
	if err != nil {
		t.Fatal(err)
	}
	share := float64(n) / float64(rx)
	t.Logf("g1 received %d frames, %d (%.3f) to the sink's port", rx, n, share)
	if rx < 10000 || share < 0.45 || share > 0.55 {
		t.Errorf("%d of %d frames went to port 7001: want about half of at least 10 000", n, rx)
	}
}

func TestGeneratorErrors(t *testing.T) {
	ns := vethNetns(t)
	if _, err := NewGenerator(ns, "nonexistent0"); err == nil {
		t.Error("NewGenerator on a missing device: no error")
	}
	gen, err := NewGenerator(ns, "g0")
	if err != nil {
		t.Fatal(err)
	}
	defer gen.Close()
	if _, err := gen.Run(t.Context(), nil, time.Millisecond, -1); err == nil {
		t.Error("Run without frames: no error")
	}
	if _, err := gen.Run(t.Context(), [][]byte{make([]byte, 20)}, time.Millisecond, -1); err == nil {
		t.Error("Run with a 20-byte frame: no error")
	}
	if _, err := gen.Run(t.Context(), frames(t, ns, 7001, 3), time.Millisecond, -1); err == nil {
		t.Error("Run with 3 frames (not a power of two): no error")
	}
	odd := frames(t, ns, 7001, 2)
	odd[1][FrameLen-1] ^= 0xff
	if _, err := gen.Run(t.Context(), odd, time.Millisecond, -1); err == nil || !strings.Contains(err.Error(), "after its headers") {
		t.Errorf("Run with frames whose payloads differ: %v", err)
	}
	// g1 has no NAPI ring (no XDP program, GRO off): veth refuses every
	// frame (ndo_xdp_xmit fails), as a NIC drops what its ring cannot take.
	rx0 := linkOf(t, ns, "g1").Attrs().Statistics.RxPackets
	res, err := gen.Run(t.Context(), frames(t, ns, 7001, 1), 50*time.Millisecond, -1)
	if err != nil || res.Sent == 0 {
		t.Fatalf("Run into a peer without NAPI: %+v, %v", res, err)
	}
	if rx := linkOf(t, ns, "g1").Attrs().Statistics.RxPackets - rx0; rx != 0 {
		t.Errorf("g1 without a NAPI ring received %d of %d frames", rx, res.Sent)
	}
	if _, err := ThreadedNAPI(ns, "g1"); err == nil {
		t.Error("ThreadedNAPI on a veth without NAPI: no error")
	}
}

func TestTCP4SYNFrame(t *testing.T) {
	s := TCP4SYN{
		SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, DstMAC: net.HardwareAddr{2, 0, 0, 0, 0, 2},
		Src: netip.MustParseAddrPort("203.0.113.7:40000"), Dst: netip.MustParseAddrPort("198.18.0.11:30090"),
	}
	f, err := s.Frame()
	if err != nil {
		t.Fatal(err)
	}
	if len(f) != FrameLen {
		t.Fatalf("frame is %d bytes, want %d", len(f), FrameLen)
	}
	ip := f[14:34]
	if c := inetcsum.Checksum(ip, 0); c != 0 || ip[9] != 6 || binary.BigEndian.Uint16(ip[2:]) != 40 {
		t.Errorf("IPv4 header %x: checksum over it %#04x, want 0; protocol 6, total length 40", ip, c)
	}
	tcp := f[34:54]
	if sp, dp := binary.BigEndian.Uint16(tcp[0:]), binary.BigEndian.Uint16(tcp[2:]); sp != 40000 || dp != 30090 || tcp[13] != 0x02 || tcp[12] != 0x50 {
		t.Errorf("TCP header %x: want 40000 -> 30090, SYN only, 20 bytes", tcp)
	}
	ps := uint32(0xcb00+0x7107) + uint32(0xc612+0x000b) + 6 + 20
	if c := inetcsum.Checksum(tcp, ps); c != 0 {
		t.Errorf("TCP checksum does not verify (%#04x)", c)
	}
	if _, err := (TCP4SYN{SrcMAC: s.SrcMAC, DstMAC: s.DstMAC, Src: netip.MustParseAddrPort("[fd00::1]:1"), Dst: s.Dst}).Frame(); err == nil {
		t.Error("IPv6 address: no error")
	}
}

// TestGeneratorRandomSourcePort: with RandomSourcePort the frames that
// arrive carry many different source ports (new flows), read from the
// receiving device by a packet socket.
func TestGeneratorRandomSourcePort(t *testing.T) {
	ns := vethNetns(t)
	sink, err := AttachSink(ns, "g1", 7001) // a NAPI ring for g1; TCP passes it
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	g0, g1 := linkOf(t, ns, "g0"), linkOf(t, ns, "g1")
	f, err := TCP4SYN{SrcMAC: g0.Attrs().HardwareAddr, DstMAC: g1.Attrs().HardwareAddr,
		Src: netip.MustParseAddrPort("10.99.0.1:40000"), Dst: netip.MustParseAddrPort("10.99.0.2:7001")}.Frame()
	if err != nil {
		t.Fatal(err)
	}
	fd := -1
	if err := netnsutil.Do(ns, func() error {
		s, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(htons(unix.ETH_P_IP)))
		if err != nil {
			return err
		}
		fd = s
		return unix.Bind(s, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_IP), Ifindex: g1.Attrs().Index})
	}); err != nil {
		t.Fatalf("packet socket on g1: %v", err)
	}
	defer unix.Close(fd)
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 32<<20); err != nil {
		t.Fatal(err)
	}
	tv := unix.NsecToTimeval(int64(200 * time.Millisecond))
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		t.Fatal(err)
	}
	gen, err := NewGenerator(ns, "g0", RandomSourcePort())
	if err != nil {
		t.Fatal(err)
	}
	defer gen.Close()
	if _, err := gen.Run(t.Context(), [][]byte{f}, 20*time.Millisecond, -1); err != nil {
		t.Fatal(err)
	}
	ports := map[uint16]int{}
	frames := 0
	buf := make([]byte, 2048)
	for frames < 2000 {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			break
		}
		if n < 54 || buf[23] != 6 || binary.BigEndian.Uint16(buf[36:]) != 7001 {
			continue
		}
		frames++
		ports[binary.BigEndian.Uint16(buf[34:])]++
	}
	t.Logf("%d SYN frames read, %d source ports", frames, len(ports))
	if frames < 500 || len(ports) < frames*9/10 {
		t.Errorf("%d frames with %d different source ports: want at least 500, nearly all different", frames, len(ports))
	}
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
