package podpath

import (
	"bytes"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/datapath/dptest"
)

var podGateway = netip.MustParseAddr("169.254.1.1")

// TestGatewayARP: a pod's ARP request for its gateway is answered by
// axon_pod_egress with the host-side device's MAC, so what keeps its own
// ARP cache behind the pod's interface (a VM guest on the pod's bridge, a
// pod whose PERMANENT entry is gone) resolves it and reaches the network.
// Only that request is answered: one for another address passes to the
// stack as before, and one claiming a neighbour's sender address is dropped
// as a spoof, unanswered. Without a gateway configured nothing is answered.
func TestGatewayARP(t *testing.T) {
	dptest.RequireRoot(t)
	for _, tc := range []struct {
		name   string
		cfg    Config
		answer bool
	}{
		{"answered", Config{GatewayV4: podGateway}, true},
		{"no gateway configured", Config{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node, _ := newTrafficNode(t)
			a := addPod(t, node, "lxcA", "10.244.1.2", "fd00:10:244:1::2")
			b := addPod(t, node, "lxcB", "10.244.1.3", "fd00:10:244:1::3")
			d := loadWithPodsConfig(t, node, tc.cfg, a, b)
			replies := guardL2(t, a.ns, "eth0", unix.ETH_P_ARP)
			count := func() map[string]uint64 {
				m, err := d.MetricsByDirection()
				if err != nil {
					t.Fatal(err)
				}
				return m["pod_egress"]
			}

			// raw requests from A: for another pod's address, claiming B's
			// sender address, then A's own request for the gateway
			m0 := count()
			dptest.SendRaw(t, a.ns, "eth0", [][]byte{
				arpFrame(bcastMAC, a.mac, 1, a.mac, a.ip4, make(net.HardwareAddr, 6), b.ip4),
				arpFrame(bcastMAC, a.mac, 1, a.mac, b.ip4, make(net.HardwareAddr, 6), podGateway),
				arpFrame(bcastMAC, a.mac, 1, a.mac, a.ip4, make(net.HardwareAddr, 6), podGateway),
			})
			want := arpFrame(a.mac, a.hmac, 2, a.hmac, podGateway, a.mac, a.ip4)
			isReply := func(p []byte) bool { return len(p) >= len(want) && bytes.Equal(p[:len(want)], want) }
			deadline := time.Now().Add(2 * time.Second)
			for tc.answer && !replies.has(isReply) && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			time.Sleep(200 * time.Millisecond) // no second answer comes
			m1 := count()
			got := map[string]uint64{}
			for _, k := range []string{"redirect_arp_reply", "pass_arp_non_ip", "drop_spoof_arp"} {
				got[k] = m1[k] - m0[k]
			}
			wantCount := map[string]uint64{"redirect_arp_reply": 1, "pass_arp_non_ip": 1, "drop_spoof_arp": 1}
			if !tc.answer {
				wantCount = map[string]uint64{"redirect_arp_reply": 0, "pass_arp_non_ip": 2, "drop_spoof_arp": 1}
			}
			for k, w := range wantCount {
				if got[k] != w {
					t.Errorf("pod_egress %s moved by %d, want %d (all: %v)", k, got[k], w, got)
				}
			}
			if replies.has(isReply) != tc.answer {
				t.Errorf("A received the gateway's reply (gateway at %s, to %s/%s): %v, want %v", a.hmac, a.mac, a.ip4, !tc.answer, tc.answer)
			}

			// the kernel's own resolution: A's PERMANENT entry removed, A's
			// stack asks for 169.254.1.1 before its first datagram to B
			pc := dptest.NSConf(t, a.ns)
			if err := pc.H.NeighDel(&netlink.Neigh{LinkIndex: pc.Index("eth0"), IP: net.IP(podGateway.AsSlice())}); err != nil {
				t.Fatalf("delete A's neighbour entry for the gateway: %v", err)
			}
			sent := 3
			if !tc.answer {
				sent = 1 // each lost echo waits 2 s
			}
			n := dptest.UDPEcho(t, a.ns, b.ns, b.ip4, sent)
			lladdr := gatewayNeigh(t, pc)
			switch {
			case tc.answer && (n != sent || !bytes.Equal(lladdr, a.hmac)):
				t.Errorf("with the gateway answered: %d of %d echoes, A's neighbour entry %s, want all and %s", n, sent, lladdr, a.hmac)
			case !tc.answer && (n != 0 || lladdr != nil):
				t.Errorf("without an answer: %d of %d echoes, A's neighbour entry %s, want 0 and none", n, sent, lladdr)
			}
			t.Logf("echoes %d, A's entry for %s: %s; counters %v", n, podGateway, lladdr, got)
		})
	}
}

// gatewayNeigh is the MAC of pc's neighbour entry for the gateway, nil
// when it has none with an address (INCOMPLETE, FAILED or missing).
func gatewayNeigh(t *testing.T, pc *dptest.NSCfg) net.HardwareAddr {
	t.Helper()
	ns, err := pc.H.NeighList(pc.Index("eth0"), unix.AF_INET)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range ns {
		if n.IP.Equal(net.IP(podGateway.AsSlice())) && n.State&(netlink.NUD_INCOMPLETE|netlink.NUD_FAILED) == 0 && len(n.HardwareAddr) == 6 {
			return n.HardwareAddr
		}
	}
	return nil
}
