package vmbypass

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/axonhq/axon/internal/ethtool"
	"github.com/axonhq/axon/internal/testutil"
)

// The guest of the TCP tests: a netns "guest" whose device g0 (the guest's
// virtio NIC, guestMAC, 10.0.2.2) is a veth to g1 in a netns "wire"; a relay
// copies frames between g1 (an AF_PACKET socket with PACKET_VNET_HDR) and the
// tap (IFF_VNET_HDR, checksum and TSO offloads on), virtio-net headers
// included, as QEMU's tap backend does: the guest's CHECKSUM_PARTIAL and
// TSO segments reach the tap as such. Behind the node (10.0.2.1, forwarding)
// a netns "remote" (10.0.3.2) hangs on r1/r2 with tx checksum offload off on
// both ends: every checksum crossing r1/r2 is computed in software on send
// and verified on receive, so a bad one shows in Tcp InCsumErrors.

type guestNet struct {
	*vmPod
	guest, wire, remote string
	relay               *relay
}

var remote4 = netip.MustParseAddr("10.0.3.2")

func newGuestNet(t *testing.T, mode string) *guestNet {
	t.Helper()
	g := &guestNet{vmPod: newVMPod(t, mode, true)}
	g.guest, g.wire, g.remote = dptest.NewNetns(t, "vmguest"), dptest.NewNetns(t, "vmwire"), dptest.NewNetns(t, "vmremote")
	gc := dptest.NSConf(t, g.guest)
	gc.Veth("g0", guestMAC.String(), "g1", "", g.wire)
	gc.Up("g0")
	gc.Addr("g0", "10.0.2.2/24")
	gc.Route("0.0.0.0/0", "10.0.2.1", "g0")
	wc := dptest.NSConf(t, g.wire)
	wc.Sysctl("net.ipv6.conf.all.disable_ipv6", "1")
	wc.Up("g1")
	nc := dptest.NSConf(t, g.node)
	nc.Addr(nodeDev, "10.0.2.1/24")
	nc.Veth("r1", "", "r2", "", g.remote)
	nc.Up("r1")
	nc.Addr("r1", "10.0.3.1/24")
	nc.Sysctl("net.ipv4.ip_forward", "1")
	rc := dptest.NSConf(t, g.remote)
	rc.Up("r2")
	rc.Addr("r2", "10.0.3.2/24")
	rc.Route("0.0.0.0/0", "10.0.3.1", "r2")
	for ns, dev := range map[string]string{g.node: "r1", g.remote: "r2"} {
		dptest.InNetns(t, ns, func() {
			if err := ethtool.Set(dev, ethtool.TxChecksum, false); err != nil {
				t.Fatal(err)
			}
		})
	}
	g.relay = startRelay(t, g.wire, "g1", g.tap)
	return g
}

// relay copies frames with their virtio-net header between a tap and a
// packet socket, counting the guest's frames that carried a partial
// checksum or were TSO segments.
type relay struct {
	partial, gso atomic.Uint64
	stop         atomic.Bool
	wg           sync.WaitGroup
}

const vnetHdrLen = 10 // struct virtio_net_hdr

func startRelay(t *testing.T, ns, dev string, tap *os.File) *relay {
	t.Helper()
	r := &relay{}
	var fd int
	dptest.InNetns(t, ns, func() {
		l := dptest.NSConf(t, ns).Link(dev)
		var err error
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(dptest.Htons(unix.ETH_P_ALL)))
		if err != nil {
			t.Fatal(err)
		}
		if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_VNET_HDR, 1); err != nil {
			t.Fatalf("PACKET_VNET_HDR: %v", err)
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: dptest.Htons(unix.ETH_P_ALL), Ifindex: l.Attrs().Index}); err != nil {
			t.Fatal(err)
		}
		tv := unix.NsecToTimeval((50 * time.Millisecond).Nanoseconds())
		_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	})
	r.wg.Add(2)
	go func() { // guest -> tap
		defer r.wg.Done()
		buf := make([]byte, 1<<17)
		for !r.stop.Load() {
			n, from, err := unix.Recvfrom(fd, buf, 0)
			if err != nil {
				continue
			}
			if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
				continue
			}
			if n > vnetHdrLen {
				if buf[0]&unix.VIRTIO_NET_HDR_F_NEEDS_CSUM != 0 {
					r.partial.Add(1)
				}
				if buf[1] != unix.VIRTIO_NET_HDR_GSO_NONE {
					r.gso.Add(1)
				}
			}
			_, _ = tap.Write(buf[:n])
		}
	}()
	go func() { // tap -> guest
		defer r.wg.Done()
		buf := make([]byte, 1<<17)
		for !r.stop.Load() {
			_ = tap.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
			n, err := tap.Read(buf)
			if errors.Is(err, os.ErrDeadlineExceeded) {
				continue
			}
			if err != nil {
				return
			}
			_, _ = unix.Write(fd, buf[:n])
		}
	}()
	t.Cleanup(func() {
		r.stop.Store(true)
		r.wg.Wait()
		unix.Close(fd)
	})
	return r
}

// badSYN is a TCP SYN from src to dst:port with a wrong checksum.
func badSYN(src, dst netip.Addr, port uint16) []byte {
	p := tcpSYN(src, dst, 41000, port)
	off := 20 + 16
	binary.BigEndian.PutUint16(p[off:], binary.BigEndian.Uint16(p[off:])^0x5555)
	return p
}

// TestTCPThroughBypass: TCP both ways between the guest and a host behind
// the node, with the bridge's ports isolated (only the bypass carries), the
// guest's checksum and TSO offloads crossing the tap as with QEMU, and
// every checksum verified in software at both ends: none is wrong. A SYN
// with a bad checksum sent each way first shows that the ends do count
// them (InCsumErrors moves by one).
func TestTCPThroughBypass(t *testing.T) {
	g := newGuestNet(t, "")
	g.isolate(true)
	g.attach()
	csumErrs := func(ns string) uint64 { return dptest.SNMPCounter(t, ns, "Tcp", "InCsumErrors") }

	// the ends verify: a bad checksum each way is counted
	r0, g0 := csumErrs(g.remote), csumErrs(g.guest)
	var hdr [vnetHdrLen]byte
	if _, err := g.tap.Write(append(hdr[:], eth(nodeMAC, guestMAC, unix.ETH_P_IP, badSYN(guest4, remote4, 9))...)); err != nil {
		t.Fatal(err)
	}
	dptest.SendRaw(t, g.node, nodeDev, [][]byte{eth(guestMAC, nodeMAC, unix.ETH_P_IP, badSYN(remote4, guest4, 9))})
	deadline := time.Now().Add(testutil.Stretch(t, 5*time.Second))
	for (csumErrs(g.remote) == r0 || csumErrs(g.guest) == g0) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if csumErrs(g.remote) != r0+1 || csumErrs(g.guest) != g0+1 {
		t.Fatalf("a SYN with a bad checksum through the bypass: InCsumErrors remote %d -> %d, guest %d -> %d, want +1 each: the ends do not verify, the test would prove nothing",
			r0, csumErrs(g.remote), g0, csumErrs(g.guest))
	}

	before := g.stats()
	r0, g0 = csumErrs(g.remote), csumErrs(g.guest)
	const n = 8 << 20
	if err := dptest.TCPBulkVia(t, g.guest, g.remote, netip.AddrPortFrom(remote4, 5201), netip.AddrPortFrom(remote4, 5201), n); err != nil {
		t.Fatalf("guest -> remote: %v", err)
	}
	if err := dptest.TCPBulkVia(t, g.remote, g.guest, netip.AddrPortFrom(guest4, 5202), netip.AddrPortFrom(guest4, 5202), n); err != nil {
		t.Fatalf("remote -> guest: %v", err)
	}
	after := g.stats()
	if e := csumErrs(g.remote) - r0; e != 0 {
		t.Errorf("remote: %d TCP checksum errors", e)
	}
	if e := csumErrs(g.guest) - g0; e != 0 {
		t.Errorf("guest: %d TCP checksum errors", e)
	}
	up := after.Counters["tap_bytes"] - before.Counters["tap_bytes"]
	down := after.Counters["pod_bytes"] - before.Counters["pod_bytes"]
	if up < n || down < n {
		t.Errorf("bypass carried %d bytes up, %d down, want at least %d each", up, down, n)
	}
	if g.relay.partial.Load() == 0 || g.relay.gso.Load() == 0 {
		t.Errorf("the guest sent %d frames with a partial checksum, %d TSO segments: the offload path was not exercised", g.relay.partial.Load(), g.relay.gso.Load())
	}
	t.Logf("bypass: %d frames / %d bytes up, %d frames / %d bytes down; guest frames with partial checksum %d, TSO %d",
		after.Counters["tap_frames"]-before.Counters["tap_frames"], up, after.Counters["pod_frames"]-before.Counters["pod_frames"], down,
		g.relay.partial.Load(), g.relay.gso.Load())
}
