package vmbypass

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/axonhq/axon/internal/testutil"
)

var (
	guest4, node4 = netip.MustParseAddr("10.0.2.2"), netip.MustParseAddr("10.0.2.1")
	guest6, node6 = netip.MustParseAddr("fd00::2"), netip.MustParseAddr("fd00::1")
	bridge4       = netip.MustParseAddr("169.254.75.10")
	zeroMAC       = net.HardwareAddr{0, 0, 0, 0, 0, 0}
)

// solicited is the solicited-node multicast address of a and its MAC.
func solicited(a netip.Addr) (netip.Addr, net.HardwareAddr) {
	b := a.As16()
	s := netip.AddrFrom16([16]byte{0xff, 0x02, 11: 1, 12: 0xff, 13: b[13], 14: b[14], 15: b[15]})
	return s, net.HardwareAddr{0x33, 0x33, 0xff, b[13], b[14], b[15]}
}

// frameSet is one frame of every kind the bypass must carry, from src to
// dst (MACs and addresses), and how many of them are broadcast/multicast.
func frameSet(srcMAC, dstMAC net.HardwareAddr, src4, dst4, src6, dst6 netip.Addr, dhcp []byte) (frames [][]byte, group int) {
	sn, snMAC := solicited(dst6)
	frames = [][]byte{
		eth(bcastMAC, srcMAC, unix.ETH_P_ARP, arp(1, srcMAC, src4, zeroMAC, dst4)),          // ARP request
		eth(dstMAC, srcMAC, unix.ETH_P_ARP, arp(2, srcMAC, src4, dstMAC, dst4)),             // ARP reply
		eth(dstMAC, srcMAC, unix.ETH_P_IP, udp(src4, dst4, 40000, 7, []byte("udp4 frame"))), // IPv4 UDP
		eth(dstMAC, srcMAC, unix.ETH_P_IP, tcpSYN(src4, dst4, 40001, 80)),                   // IPv4 TCP
		eth(dstMAC, srcMAC, unix.ETH_P_IPV6, udp(src6, dst6, 40002, 7, []byte("udp6"))),     // IPv6 UDP
		eth(snMAC, srcMAC, unix.ETH_P_IPV6, nd(135, src6, sn, dst6, srcMAC)),                // ND: NS to the solicited-node group
		eth(dstMAC, srcMAC, unix.ETH_P_IPV6, nd(136, src6, dst6, src6, srcMAC)),             // ND: NA
		eth(bcastMAC, srcMAC, unix.ETH_P_IP, dhcp),                                          // DHCP broadcast
	}
	return frames, 3
}

func sumLen(frames [][]byte) (n uint64) {
	for _, f := range frames {
		n += uint64(len(f))
	}
	return n
}

// TestFramesCrossBothWays: with the bridge's ports isolated (the bridge
// forwards nothing between them: shown first, no frame crosses), every kind
// of frame crosses in both directions once the bypass is attached, byte for
// byte, and the counters moved by exactly those frames. The guest's
// broadcasts also reach the pod's own DHCP server socket on the bridge, and
// a frame to the bridge's MAC goes to the bridge, not to the node.
func TestFramesCrossBothWays(t *testing.T) {
	for _, mode := range []string{datapath.ModeTCX, datapath.ModeLegacy} {
		t.Run(mode, func(t *testing.T) {
			if mode == datapath.ModeTCX && !datapath.ProbeTCX().Available {
				t.Skip("no tcx on this kernel: the legacy subtest covers the attach")
			}
			v := newVMPod(t, mode, false)
			idle := testutil.Stretch(t, 200*time.Millisecond) // quiet this long: nothing more comes
			for _, ns := range []string{v.pod, v.node} {      // no kernel chatter: the counters must be exact
				dptest.NSConf(t, ns).Sysctl("net.ipv6.conf.all.disable_ipv6", "1")
			}
			v.isolate(true)
			capNode := newCapture(t, v.node, nodeDev)
			dhcpSrv := udpListener(t, v.pod, bridgeName, 67)

			up, upGroup := frameSet(guestMAC, nodeMAC, guest4, node4, guest6, node6, dhcpDiscover(guestMAC))
			down, _ := frameSet(nodeMAC, guestMAC, node4, guest4, node6, guest6,
				udp(node4, netip.MustParseAddr("255.255.255.255"), 67, 68, []byte("dhcp offer")))
			send := func() {
				for _, f := range up {
					if _, err := v.tap.Write(f); err != nil {
						t.Fatalf("write %d-byte frame to the tap: %v", len(f), err)
					}
				}
				dptest.SendRaw(t, v.node, nodeDev, down)
			}

			// without the bypass the isolated bridge carries nothing
			send()
			if got := missing(up, capNode.received(idle, 10*idle)); len(got) != len(up) {
				t.Fatalf("bridge ports isolated, no bypass: guest frames reached the node (missing only %v): the negative check is void", got)
			}
			if got := missing(down, tapFrames(t, v.tap, idle)); len(got) != len(down) {
				t.Fatalf("bridge ports isolated, no bypass: node frames reached the guest (missing only %v)", got)
			}
			if n := udpReceived(dhcpSrv, []byte{1, 1, 6}); n != 1 {
				t.Fatalf("without the bypass the bridge delivered %d DHCP DISCOVERs to its own socket, want 1", n)
			}

			l := v.attach()
			if l.Tap != tapName || l.Pod != "eth0" || l.Bridge != bridgeName {
				t.Errorf("layout %+v", l)
			}
			send()
			if m := missing(up, capNode.received(idle, 10*idle)); len(m) > 0 {
				t.Errorf("guest -> node: frames %v of %d did not cross", m, len(up))
			}
			if m := missing(down, tapFrames(t, v.tap, idle)); len(m) > 0 {
				t.Errorf("node -> guest: frames %v of %d did not cross", m, len(down))
			}
			if n := udpReceived(dhcpSrv, []byte{1, 1, 6}); n != 1 {
				t.Errorf("the pod's DHCP server socket on the bridge got %d DISCOVERs through the bypass, want 1", n)
			}

			// unicast to the bridge's own MAC stays in the pod
			toBridge := eth(bridgeMAC, guestMAC, unix.ETH_P_IP, udp(guest4, bridge4, 68, 67, []byte("to the bridge")))
			if _, err := v.tap.Write(toBridge); err != nil {
				t.Fatal(err)
			}
			if n := udpReceived(dhcpSrv, []byte("to the bridge")); n != 1 {
				t.Errorf("unicast to the bridge's MAC: its socket got %d datagrams, want 1", n)
			}
			if m := missing([][]byte{toBridge}, capNode.received(idle, 5*idle)); len(m) == 0 {
				t.Errorf("unicast to the bridge's MAC reached the node")
			}

			st := v.stats()
			want := map[string]uint64{
				"tap_frames": uint64(len(up)), "tap_bytes": sumLen(up),
				"pod_frames": uint64(len(down)), "pod_bytes": sumLen(down),
				"tap_bcast_copy": uint64(upGroup), "tap_to_bridge": 1, "redirect_fail": 0,
			}
			for k, w := range want {
				if st.Counters[k] != w {
					t.Errorf("counter %s = %d, want %d", k, st.Counters[k], w)
				}
			}
			if !st.TapAttached || !st.PodAttached || st.Problem != "" {
				t.Errorf("stats: %+v", st)
			}
			t.Logf("counters %v", st.Counters)

			if err := v.b.Detach(v.id, v.podPath); err != nil {
				t.Fatal(err)
			}
			if left := pinsUnder(t, PodPinDir(v.pinDir, v.id)); len(left) > 0 {
				t.Errorf("pins left after detach: %v", left)
			}
			// detached: the isolated bridge carries nothing again
			send()
			if got := missing(up, capNode.received(idle, 10*idle)); len(got) != len(up) {
				t.Errorf("after detach guest frames still crossed the isolated bridge (missing only %v)", got)
			}
		})
	}
}
