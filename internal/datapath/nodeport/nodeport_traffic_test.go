package nodeport

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/axonhq/axon/internal/lb"
	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/testutil"
)

// Real traffic through the attached LB: a client, the LB node and a backend
// on one bridge (namespaces axt-dp-np*-*), TCP connections to a NodePort
// (SNAT, tc and XDP generic) and to a LoadBalancer IP by DSR (IPIP,
// decapsulated by axon_lb_decap on the backend, replies straight to the
// client).

type npTrafficFix struct {
	wire, client, node, backend, pod string
	nodeLB, backendLB                *LB
}

func newNPTrafficFix(t *testing.T) *npTrafficFix { return newNPTrafficFixWith(t, nil) }

// newNPTrafficFixWith is newNPTrafficFix with the node LB's options
// changed by mod (nil: as the agent loads it).
func newNPTrafficFixWith(t *testing.T, mod func(*Options)) *npTrafficFix {
	dptest.RequireRoot(t)
	f := &npTrafficFix{}
	f.wire = dptest.NewNetns(t, "npw")
	wire := f.wire
	f.client, f.node, f.backend = dptest.NewNetns(t, "npc"), dptest.NewNetns(t, "npn"), dptest.NewNetns(t, "npb")
	w := dptest.NSConf(t, wire)
	w.NoBridgeNetfilter()
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}}
	if err := w.H.LinkAdd(br); err != nil {
		t.Fatal(err)
	}
	w.Up("br0")
	for _, e := range []struct{ ns, dev, peer, cidr, cidr6 string }{
		{f.node, "eth0", "n1", "198.18.0.11/24", "fd00:198:18::11/64"},
		{f.client, "c0", "c1", "198.18.0.250/24", "fd00:198:18::250/64"},
		{f.backend, "b0", "b1", "198.18.0.12/24", "fd00:198:18::12/64"},
	} {
		c := dptest.NSConf(t, e.ns)
		c.Veth(e.dev, "", e.peer, "", wire)
		c.Addr(e.dev, e.cidr)
		c.Addr(e.dev, e.cidr6)
		c.Up(e.dev)
		if err := w.H.LinkSetMaster(w.Link(e.peer), w.Link("br0").(*netlink.Bridge)); err != nil {
			t.Fatal(err)
		}
		w.Up(e.peer)
	}
	n := dptest.NSConf(t, f.node)
	n.Sysctl("net.ipv4.ip_forward", "1")
	n.Sysctl("net.ipv6.conf.all.forwarding", "1")
	dptest.NSConf(t, f.client).Route("192.0.2.0/24", "198.18.0.11", "c0")
	b := dptest.NSConf(t, f.backend)
	b.Addr("lo", "192.0.2.10/32") // the DSR service address, owned by the backend
	// a local pod behind the node (kernel-routed: no axon host routing here)
	f.pod = dptest.NewNetns(t, "npp")
	n.Veth("lxc0", "", "p0", "", f.pod)
	n.Addr("lxc0", "10.244.1.1/24")
	n.Addr("lxc0", "fd00:10:244:1::1/64")
	n.Up("lxc0")
	p := dptest.NSConf(t, f.pod)
	p.Addr("p0", "10.244.1.5/24")
	p.Addr("p0", "fd00:10:244:1::5/64")
	p.Up("p0")
	p.Route("default", "10.244.1.1", "p0")
	p.Route("default", "fd00:10:244:1::1", "p0")
	var err error
	dptest.InNetns(t, f.node, func() {
		// UplinkMTU as the agent sets it (the uplink's MTU): a full-size
		// segment that no longer fits once encapsulated gets "fragmentation
		// needed" and the client's PMTU shrinks; without it such a segment
		// is dropped at the veth, and a DSR bulk flow stalls on it
		o := Options{PinDir: newPinDir(t), NodeName: "node1",
			NodeAddrs: []netip.Addr{npNode, npNode6}, UplinkMTU: 1500, Logger: dptest.Logger(t)}
		if mod != nil {
			mod(&o)
		}
		f.nodeLB, err = Load(o)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.nodeLB.Close() })
	dptest.InNetns(t, f.backend, func() {
		f.backendLB, err = Load(Options{PinDir: newPinDir(t), Logger: dptest.Logger(t)})
		if err == nil {
			_, err = f.backendLB.AttachDecap("b0")
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.backendLB.Close() })
	// echo servers: the backend's :8080 (NodePort target) and 192.0.2.10:80
	// (DSR), the pod's :8080
	for _, srv := range []struct{ ns, addr string }{{f.backend, "0.0.0.0:8080"}, {f.backend, "192.0.2.10:80"}, {f.pod, "0.0.0.0:8080"}} {
		var ln net.Listener
		if err := netnsutil.Do(srv.ns, func() (e error) { ln, e = net.Listen("tcp4", srv.addr); return e }); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		testutil.ServeConns(ln, func(c net.Conn) {
			line, err := bufio.NewReader(c).ReadString('\n')
			if err != nil {
				return
			}
			fmt.Fprintf(c, "%s %s", c.RemoteAddr(), line)
		})
	}
	return f
}

// talk connects from the client to dst, sends a line and returns the echo
// ("<client address as the backend saw it> <line>").
func (f *npTrafficFix) talk(dst string) (string, error) {
	var out string
	err := netnsutil.Do(f.client, func() error {
		c, err := net.DialTimeout("tcp4", dst, 3*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := io.WriteString(c, "hello axon\n"); err != nil {
			return err
		}
		b, err := io.ReadAll(c)
		out = string(b)
		return err
	})
	return out, err
}

func TestNodePortTraffic(t *testing.T) {
	f := newNPTrafficFix(t)
	if err := f.nodeLB.UpsertFrontendWith(npNodePort(30080, lb.TCP, false, npBE("198.18.0.12:8080", "node2")), FrontendOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := f.nodeLB.UpsertFrontendWith(npVIP("192.0.2.10:80", lb.TCP, npBE("198.18.0.12:80", "node2")), FrontendOptions{Mode: ModeDSR}); err != nil {
		t.Fatal(err)
	}
	if err := f.nodeLB.UpsertFrontendWith(npNodePort(30081, lb.TCP, false, npBE("10.244.1.5:8080", "node1")), FrontendOptions{}); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		desc, dst, xdp string
		wantPeer       string // the client address the backend sees
		reason         string
	}{
		{"NodePort, SNAT, tc: the backend sees the node", "198.18.0.11:30080", XDPNone, "198.18.0.11", "snat_fwd"},
		{"LoadBalancer IP, DSR, tc: the backend sees the client, replies directly", "192.0.2.10:80", XDPNone, "198.18.0.250", "dsr_encap"},
		{"NodePort, local backend, tc: client address kept, reply fixed at uplink egress", "198.18.0.11:30081", XDPNone, "198.18.0.250", "dnat_local"},
		{"NodePort, local backend, XDP (generic)", "198.18.0.11:30081", XDPGeneric, "198.18.0.250", "dnat_local"},
		{"NodePort, SNAT, XDP (generic) with tc behind it", "198.18.0.11:30080", XDPGeneric, "198.18.0.11", "snat_fwd"},
		{"LoadBalancer IP, DSR, XDP (generic)", "192.0.2.10:80", XDPGeneric, "198.18.0.250", "dsr_encap"},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			var err error
			dptest.InNetns(t, f.node, func() { _, err = f.nodeLB.Attach("eth0", c.xdp) })
			if err != nil {
				t.Fatal(err)
			}
			before, _ := f.nodeLB.Metrics()
			for i := 0; i < 3; i++ {
				out, err := f.talk(c.dst)
				if err != nil {
					t.Fatalf("connection %d to %s: %v", i, c.dst, err)
				}
				host, _, _ := net.SplitHostPort(out[:max(0, len(out)-len(" hello axon\n"))])
				if host != c.wantPeer || out[len(out)-len("hello axon\n"):] != "hello axon\n" {
					t.Fatalf("echo %q: want the backend to see %s", out, c.wantPeer)
				}
			}
			after, _ := f.nodeLB.Metrics()
			var n uint64
			for _, h := range []string{"tc", "xdp"} {
				n += after[h][c.reason] - before[h][c.reason]
			}
			if n == 0 {
				t.Errorf("counter %s did not move: %v", c.reason, npMoved(before, after, "tc"))
			}
			if c.reason == "dnat_local" && after["egress"]["egress_rev"] == before["egress"]["egress_rev"] {
				t.Errorf("no reply was reverse-translated at egress: %v", npMoved(before, after, "egress"))
			}
			if c.xdp != XDPNone && after["xdp"]["ct_hit"] == before["xdp"]["ct_hit"] {
				t.Errorf("XDP handled no established packet: xdp %v", npMoved(before, after, "xdp"))
			}
		})
	}
	bm, _ := f.backendLB.Metrics()
	if bm["egress"]["dsr_decap"] == 0 {
		t.Errorf("the backend decapsulated nothing: %v", bm["egress"])
	}
	dptest.InNetns(t, f.node, func() {
		if err := f.nodeLB.Detach("eth0"); err != nil {
			t.Error(err)
		}
	})
}

// ipipLengths counts the IPIP packets received on a device by whether their
// outer tot_len is right: the packet's length (ok), 0 for a packet over
// 64 KiB (big, the BIG TCP form) or anything else (bad: a router, a kernel
// ipip device or a validating bridge would trim or drop the packet).
type ipipLengths struct {
	ok, big, bad int
	badLens      []string // "tot_len/length" of the first bad ones
}

// capture reads what arrives on dev in netns ns through an AF_PACKET
// socket (ETH_P_ALL: ahead of tc ingress, so before any translation or
// decapsulation; GSO packets whole) and hands each received frame and its
// full length to seen, on one goroutine, until stop is called.
func capture(t *testing.T, ns, dev string, seen func(frame []byte, n int)) (stop func()) {
	t.Helper()
	fd := -1
	dptest.InNetns(t, ns, func() {
		l, err := netlink.LinkByName(dev)
		if err != nil {
			t.Error(err)
			return
		}
		s, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(dptest.Htons(unix.ETH_P_ALL)))
		if err != nil {
			t.Errorf("packet socket: %v", err)
			return
		}
		if err := unix.Bind(s, &unix.SockaddrLinklayer{Protocol: dptest.Htons(unix.ETH_P_ALL), Ifindex: l.Attrs().Index}); err != nil {
			unix.Close(s)
			t.Errorf("bind packet socket to %s: %v", dev, err)
			return
		}
		fd = s
	})
	if fd < 0 {
		t.FailNow()
	}
	// room for a few hundred 192 KiB packets: a full socket drops what it
	// cannot queue (the counts are a sample then, not wrong)
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 64<<20); err != nil {
		t.Fatal(err)
	}
	tv := unix.NsecToTimeval(int64(100 * time.Millisecond))
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		t.Fatal(err)
	}
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 512<<10)
		for {
			select {
			case <-quit:
				return
			default:
			}
			n, from, err := unix.Recvfrom(fd, buf, unix.MSG_TRUNC)
			if err != nil {
				continue // timeout: look at quit again
			}
			if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
				continue
			}
			if n >= 14 && n <= len(buf) {
				seen(buf[:n], n)
			}
		}
	}()
	return func() {
		close(quit)
		<-done
		unix.Close(fd)
	}
}

// captureIPIP counts the IPIP packets arriving on dev by outer length.
func captureIPIP(t *testing.T, ns, dev string) (stop func() ipipLengths) {
	t.Helper()
	var res ipipLengths
	end := capture(t, ns, dev, func(b []byte, n int) {
		if n < 34 || binary.BigEndian.Uint16(b[12:]) != unix.ETH_P_IP || b[14+9] != 4 {
			return
		}
		tot, l3 := int(binary.BigEndian.Uint16(b[16:])), n-14
		switch {
		case tot == l3:
			res.ok++
		case tot == 0 && l3 > 0xffff:
			res.big++
		default:
			res.bad++
			if len(res.badLens) < 5 {
				res.badLens = append(res.badLens, fmt.Sprintf("%d/%d", tot, l3))
			}
		}
	})
	return func() ipipLengths { end(); return res }
}

// captureJumbo6 counts the IPv6 packets over 64 KiB arriving on dev with a
// hop-by-hop header first (IPv6 BIG TCP's jumbo header).
func captureJumbo6(t *testing.T, ns, dev string) (stop func() int) {
	t.Helper()
	var jumbo int
	end := capture(t, ns, dev, func(b []byte, n int) {
		if n > 14+0xffff && binary.BigEndian.Uint16(b[12:]) == unix.ETH_P_IPV6 && b[14+6] == 0 {
			jumbo++
		}
	})
	return func() int { end(); return jumbo }
}

// TestNodePortTrafficBigTCP: a client with BIG TCP (192 KiB GSO) sends bulk
// data to a LoadBalancer IP by DSR and to a NodePort by SNAT, IPv4 and
// IPv6. Its packets over 64 KiB (IPv4: tot_len 0; IPv6: a hop-by-hop jumbo
// header before TCP) are translated like any other, and every DSR outer
// header carries a length a router accepts: the packet's, or 0 over 64 KiB
// as BIG TCP writes it (not 0 + 20, which a validating hop trims the packet
// to). A transfer in which TCP sent no big packet measures nothing; up to
// three are made (in the TCG VM, one lost ~20 big packets at the wire's
// bridge port and shrank its window for the rest of the transfer). In the
// VM each transfer also logs the kernel's own drop records (dptest.TraceDrops:
// where and why), so that loss can be placed when it comes back.
func TestNodePortTrafficBigTCP(t *testing.T) {
	dptest.RequireRoot(t)
	if c := datapath.Probe().BigTCP; !c.Available {
		t.Skipf("no BIG TCP on this kernel: %s", c.Reason)
	}
	f := newNPTrafficFix(t)
	v4 := true
	for _, d := range []struct{ ns, dev string }{
		{f.client, "c0"}, {f.node, "eth0"}, {f.backend, "b0"},
		{f.wire, "br0"}, {f.wire, "c1"}, {f.wire, "n1"}, {f.wire, "b1"},
	} {
		v4 = dptest.SetBigTCP(t, d.ns, d.dev) && v4
	}
	if err := f.nodeLB.UpsertFrontendWith(npVIP("192.0.2.10:5201", lb.TCP, npBE("198.18.0.12:5201", "node2")), FrontendOptions{Mode: ModeDSR}); err != nil {
		t.Fatal(err)
	}
	for _, fe := range []lb.Frontend{
		npNodePort(30082, lb.TCP, false, npBE("198.18.0.12:5202", "node2")),
		npNodePort(30083, lb.TCP, true, npBE("[fd00:198:18::12]:5203", "node2")),
	} {
		if err := f.nodeLB.UpsertFrontendWith(fe, FrontendOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var err error
	dptest.InNetns(t, f.node, func() { _, err = f.nodeLB.Attach("eth0", XDPNone) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dptest.InNetns(t, f.node, func() { _ = f.nodeLB.Detach("eth0") }) })
	ap := netip.MustParseAddrPort
	const n = 32 << 20
	for _, c := range []struct {
		desc, reason string
		listen, dial netip.AddrPort
	}{
		{"LoadBalancer IP, DSR", "dsr_encap", ap("192.0.2.10:5201"), ap("192.0.2.10:5201")},
		{"NodePort, SNAT", "snat_fwd", ap("198.18.0.12:5202"), ap("198.18.0.11:30082")},
		// IPv6 BIG TCP packets carry a hop-by-hop jumbo header before TCP
		{"NodePort IPv6, SNAT", "snat_fwd", ap("[fd00:198:18::12]:5203"), ap("[fd00:198:18::11]:30083")},
	} {
		t.Run(c.desc, func(t *testing.T) {
			if c.dial.Addr().Is4() && !v4 {
				t.Skip("no IPv4 BIG TCP here (gso_ipv4_max_size, kernel >= 6.3)")
			}
			// one bulk transfer: every check but whether TCP sent big
			// packets at all, which it reports (why not: see dptest.TCPBulkVia)
			transfer := func() (why string) {
				before, _ := f.nodeLB.Metrics()
				p0, b0 := dptest.LinkRx(t, f.node, "eth0")
				stop := captureIPIP(t, f.backend, "b0")
				stop6 := captureJumbo6(t, f.node, "eth0")
				nss := []string{f.client, f.wire, f.node, f.backend}
				var st0 []map[string]uint64
				for _, ns := range nss {
					st0 = append(st0, dptest.NetStats(t, ns))
				}
				proto := uint16(unix.ETH_P_IP)
				if c.dial.Addr().Is6() {
					proto = unix.ETH_P_IPV6
				}
				stopTrace := dptest.TraceDrops(t, proto)
				bulkErr := dptest.TCPBulkVia(t, f.client, f.backend, c.listen, c.dial, n)
				drops := stopTrace()
				ipip, jumbo := stop(), stop6()
				if drops != "" {
					t.Logf("kernel drops: %s", drops)
				}
				for i, ns := range nss {
					if d := dptest.LossDelta(st0[i], dptest.NetStats(t, ns)); d != "" {
						t.Logf("%s: %s", ns, d)
					}
				}
				p1, b1 := dptest.LinkRx(t, f.node, "eth0")
				after, _ := f.nodeLB.Metrics()
				// eth0 also receives the backend's ACKs in SNAT; in DSR they go
				// straight to the client and the client's data alone counts
				pkts, avg := p1-p0, (b1-b0)/max(p1-p0, 1)
				moved := npMoved(before, after, "tc")
				t.Logf("eth0: %d packets, %d bytes on average, %d IPv6 with a jumbo header; tc %v; IPIP at the backend %+v", pkts, avg, jumbo, moved, ipip)
				if bulkErr != nil {
					t.Fatal(bulkErr)
				}
				if moved[c.reason] == 0 {
					t.Errorf("%s did not move: %v", c.reason, moved)
				}
				if ipip.bad != 0 {
					t.Errorf("%d IPIP packets with a wrong outer length (tot_len/length: %v)", ipip.bad, ipip.badLens)
				}
				switch {
				case c.dial.Addr().Is6() && jumbo == 0:
					return "no IPv6 packet with a jumbo header reached the LB"
				case c.reason == "dsr_encap" && ipip.big == 0:
					return "no IPIP packet over 64 KiB reached the backend"
				}
				return ""
			}
			// TCP alone decides its packet sizes: where one transfer sent
			// no big packet, try again (each transfer is checked in full)
			dptest.UntilMeasured(t, transfer)
		})
	}
}
