package podpath

import (
	"net"
	"net/netip"
	"testing"

	"github.com/axonhq/axon/internal/datapath/dptest"
)

type pod struct {
	ns, hostIf string
	ip4, ip6   netip.Addr
	mac, hmac  net.HardwareAddr
}

// addPod wires a pod netns to the node netns the way axon-cni does.
func addPod(t *testing.T, node, hostIf, ip4, ip6 string) pod {
	t.Helper()
	p := pod{ns: dptest.NewNetns(t, "pod"), hostIf: hostIf, ip4: netip.MustParseAddr(ip4), ip6: netip.MustParseAddr(ip6)}
	nc := dptest.NSConf(t, node)
	nc.Veth(hostIf, "", "eth0", "", p.ns)
	wirePod(t, node, &p)
	return p
}

// wirePod brings up a pod's host side (created in node) and eth0 (in p.ns)
// and routes them as axon-cni does: the pod's addresses as host routes on
// the node, the pod's default routes via 169.254.1.1 / fe80::1 at the host
// side's MAC.
func wirePod(t *testing.T, node string, p *pod) {
	t.Helper()
	nc := dptest.NSConf(t, node)
	nc.Up(p.hostIf)
	p.hmac = dptest.LinkMAC(t, node, p.hostIf)
	p.mac = dptest.LinkMAC(t, p.ns, "eth0")
	pc := dptest.NSConf(t, p.ns)
	pc.Addr("eth0", p.ip4.String()+"/32")
	pc.Addr("eth0", p.ip6.String()+"/128")
	pc.Up("eth0")
	pc.Route("169.254.1.1/32", "", "eth0")
	pc.Route("default", "169.254.1.1", "eth0")
	pc.Neigh("eth0", "169.254.1.1", p.hmac.String())
	pc.Route("default", "fe80::1", "eth0")
	pc.Neigh("eth0", "fe80::1", p.hmac.String())
	nc.Route(p.ip4.String()+"/32", "", p.hostIf)
	nc.Route(p.ip6.String()+"/128", "", p.hostIf)
}

// newTrafficNode makes a node netns whose eth0 (198.18.0.11/24,
// fd00:198:18::11/64, forwarding on) is a veth to an external netns
// ("wire", .250) that routes the podCIDRs 10.244.1.0/24 and
// fd00:10:244:1::/64 to the node.
func newTrafficNode(t *testing.T) (node, ext string) {
	t.Helper()
	node, ext = dptest.NewNetns(t, "node"), dptest.NewNetns(t, "ext")
	nc := dptest.NSConf(t, node)
	nc.Veth("eth0", "", "wire", "", ext)
	nc.Addr("eth0", "198.18.0.11/24")
	nc.Addr("eth0", "fd00:198:18::11/64")
	nc.Up("eth0")
	nc.Sysctl("net.ipv4.ip_forward", "1")
	nc.Sysctl("net.ipv6.conf.all.forwarding", "1")
	ec := dptest.NSConf(t, ext)
	ec.Addr("wire", "198.18.0.250/24")
	ec.Addr("wire", "fd00:198:18::250/64")
	ec.Up("wire")
	ec.Route("10.244.1.0/24", "198.18.0.11", "")
	ec.Route("fd00:10:244:1::/64", "fd00:198:18::11", "")
	return node, ext
}

// loadWithPods loads the datapath in netns node (uplink eth0), attaches it
// to every pod's host-side device and programs the pods' endpoints.
func loadWithPods(t *testing.T, node string, pods ...pod) *Datapath {
	t.Helper()
	return loadWithPodsConfig(t, node, Config{}, pods...)
}

// loadWithPodsConfig is loadWithPods with cfg's options (its PinDir, Uplink
// and Logger are the test's).
func loadWithPodsConfig(t *testing.T, node string, cfg Config, pods ...pod) *Datapath {
	t.Helper()
	cfg.PinDir, cfg.Uplink, cfg.Logger = newPinDir(t), "eth0", dptest.Logger(t)
	var d *Datapath
	dptest.InNetns(t, node, func() {
		var err error
		d, err = Load(cfg)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pods {
			if err := d.AttachPod(p.hostIf); err != nil {
				t.Fatal(err)
			}
			idx := ifindex(t, p.hostIf)
			for _, ip := range []netip.Addr{p.ip4, p.ip6} {
				if err := d.UpsertEndpoint(Endpoint{IP: ip, IfIndex: idx, PodMAC: p.mac, HostMAC: p.hmac}); err != nil {
					t.Fatal(err)
				}
			}
		}
	})
	t.Cleanup(func() { d.Close() })
	return d
}

// TestTrafficRedirectPeer: real pings between two pods of one node, and
// from an external host on the wire to a pod, go through the BPF programs
// (redirect_peer / fib) without the node's IP forwarding.
func TestTrafficRedirectPeer(t *testing.T) {
	dptest.RequireRoot(t)
	node, ext := newTrafficNode(t)
	a := addPod(t, node, "lxcA", "10.244.1.2", "fd00:10:244:1::2")
	b := addPod(t, node, "lxcB", "10.244.1.3", "fd00:10:244:1::3")
	d := loadWithPods(t, node, a, b)

	before4 := dptest.SNMPCounter(t, node, "Ip", "ForwDatagrams")
	before6 := dptest.SNMPCounter(t, node, "", "Ip6OutForwDatagrams")
	m0, err := d.MetricsByDirection()
	if err != nil {
		t.Fatal(err)
	}
	const n = 5
	echoes := []struct {
		desc        string
		client, srv string
		addr        netip.Addr
	}{
		{"pod A -> pod B, IPv4", a.ns, b.ns, b.ip4},
		{"pod A -> pod B, IPv6", a.ns, b.ns, b.ip6},
		{"external -> pod A, IPv4 (uplink ingress, fib on the way back)", ext, a.ns, a.ip4},
	}
	for _, e := range echoes {
		if got := dptest.UDPEcho(t, e.client, e.srv, e.addr, n); got != n {
			t.Errorf("%s: %d of %d echoes came back", e.desc, got, n)
		}
	}
	after4 := dptest.SNMPCounter(t, node, "Ip", "ForwDatagrams")
	after6 := dptest.SNMPCounter(t, node, "", "Ip6OutForwDatagrams")
	if after4 != before4 || after6 != before6 {
		t.Errorf("node dptest.Forwarded packets itself: IpForwDatagrams +%d, Ip6OutForwDatagrams +%d (want 0)", after4-before4, after6-before6)
	}
	m1, err := d.MetricsByDirection()
	if err != nil {
		t.Fatal(err)
	}
	delta := func(dir, r string) uint64 { return m1[dir][r] - m0[dir][r] }
	// pod<->pod: 2n v4 + 2n v6 redirect_peer on pod egress; ext: n on uplink.
	if got := delta("pod_egress", "redirect_peer_local"); got < 4*n {
		t.Errorf("pod_egress redirect_peer_local +%d, want >= %d", got, 4*n)
	}
	if got := delta("uplink_ingress", "redirect_peer_local"); got < n {
		t.Errorf("uplink_ingress redirect_peer_local +%d, want >= %d", got, n)
	}
	if got := delta("pod_egress", "redirect_fib") + delta("pod_egress", "redirect_neigh"); got < n {
		t.Errorf("pod_egress fib redirects +%d, want >= %d (replies to external)", got, n)
	}
	t.Logf("IpForwDatagrams %d -> %d; metrics delta pod_egress %v", before4, after4, m1["pod_egress"])

	// Truncated frames on a real veth reach the program (PROG_TEST_RUN
	// refuses them) and are counted and dropped, never redirected.
	truncated := [][]byte{
		dptest.IPv4Packet(a.hmac, a.mac, a.ip4, b.ip4, 64, nil)[:14+10], // IPv4 header cut at 10 bytes
		dptest.IPv6Packet(a.hmac, a.mac, a.ip6, b.ip6, 64)[:14+30],      // IPv6 header cut at 30 bytes
		dptest.IPv4Packet(a.hmac, a.mac, a.ip4, b.ip4, 64, nil)[:14],    // ethertype IPv4, no header at all
	}
	m2, _ := d.MetricsByDirection()
	dptest.SendRaw(t, a.ns, "eth0", truncated)
	m3, err := d.MetricsByDirection()
	if err != nil {
		t.Fatal(err)
	}
	if got := m3["pod_egress"]["drop_malformed"] - m2["pod_egress"]["drop_malformed"]; got != uint64(len(truncated)) {
		t.Errorf("drop_malformed +%d after %d truncated frames", got, len(truncated))
	}
	if m3["pod_egress"]["redirect_peer_local"] != m2["pod_egress"]["redirect_peer_local"] {
		t.Errorf("a truncated frame was redirected")
	}

	// Control: without the programs the same ping is dptest.Forwarded by the
	// node's stack, so the counter above is really measuring something.
	dptest.InNetns(t, node, func() {
		for _, p := range []pod{a, b} {
			if err := d.DetachPod(p.hostIf); err != nil {
				t.Fatal(err)
			}
		}
	})
	if got := dptest.UDPEcho(t, a.ns, b.ns, b.ip4, 2); got != 2 {
		t.Errorf("stack path: %d of 2 echoes came back", got)
	}
	if got := dptest.SNMPCounter(t, node, "Ip", "ForwDatagrams") - after4; got < 4 {
		t.Errorf("stack path: IpForwDatagrams +%d, want >= 4 (measurement broken?)", got)
	}
}
