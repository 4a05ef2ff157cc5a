package lab_test

// DSR end to end: a lab with `--nodeport-mode dsr`. The external
// check runs as in SNAT mode (its remote-backend NodePort rows then also
// require the client address at the backend), and a LoadBalancer Service
// whose only backends are on node2 is reached through node1 (NodePort,
// externalIP and LoadBalancer IP; TCP and UDP; IPv4 and IPv6) while raw
// sockets on the wire bridge's ports watch where packets go: the request
// reaches node2 encapsulated (IPIP / IPv6-in-IPv6), the backend sees the
// client's own address, and every reply enters the wire from node2's port
// with the frontend address as source — none passes back through node1.

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/axonhq/axon/internal/lab"
	"github.com/axonhq/axon/internal/lab/probe"
	"github.com/axonhq/axon/internal/netnsutil"
)

func TestLabNorthSouthDSR(t *testing.T) {
	waitLabSlot(t)
	need(t, "axon", "axon-agent", "axon-cni")
	l := up(t, "--nodes", "2", "--pods-per-node", "2", "--nodeport-mode", "dsr")
	for n, v := range nodePortLBStatus(t, l) {
		t.Logf("%s nodeport_lb: %s", n, v)
		if !strings.Contains(v, "--nodeport-mode=dsr") {
			t.Fatalf("agent of %s does not run in DSR mode: %s", n, v)
		}
	}
	out := externalCheck(t)
	if !strings.Contains(out, "DSR: client IP kept") {
		t.Errorf("the external check has no DSR client-IP rows")
	}

	ctx := t.Context()
	kube, err := l.Kube()
	if err != nil {
		t.Fatal(err)
	}
	node1, node2 := l.Nodes()[0], l.Nodes()[1]
	client := l.State().External.IPs
	var remote []lab.Pod
	for _, p := range l.Pods() {
		if p.Node == node2.Name {
			remote = append(remote, p)
		}
	}
	a := netip.MustParseAddr
	extIPs := []netip.Addr{a("198.18.0.111"), a("fd00:198:18::111")}
	lbIPs := []netip.Addr{a("198.18.0.211"), a("fd00:198:18::211")}
	bulkIPs := []netip.Addr{a("198.18.0.212"), a("fd00:198:18::212")}
	bigIPs := []netip.Addr{a("198.18.0.213"), a("fd00:198:18::213")}
	const nodePort = 30086
	// The external client reaches externalIPs and LoadBalancer IPs via node1
	// (the lab's announcer stand-in).
	for _, ip := range slices.Concat(extIPs, lbIPs, bulkIPs, bigIPs) {
		gw := node1.IP
		args := []string{"ip", "route", "replace", ip.String() + "/32", "via", gw.String()}
		if ip.Is6() {
			for _, x := range node1.IPs {
				if x.Is6() {
					gw = x
				}
			}
			args = []string{"ip", "-6", "route", "replace", ip.String() + "/128", "via", gw.String()}
		}
		if o, err := l.Command(ctx, lab.ExternalName, args...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, o)
		}
	}
	svc := newTestService("dsr-remote", corev1.ServiceTypeLoadBalancer, nodePort, corev1.ProtocolTCP, corev1.ProtocolUDP)
	for _, ip := range extIPs {
		svc.Spec.ExternalIPs = append(svc.Spec.ExternalIPs, ip.String())
	}
	created, err := kube.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ip := range lbIPs {
		created.Status.LoadBalancer.Ingress = append(created.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip.String()})
	}
	if created, err = kube.CoreV1().Services("default").UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	(&testService{svc: created, port: probe.PeerEchoPort, backends: remote}).apply(t, kube)
	waitFrontend(t, l, node1.Name, netip.AddrPortFrom(lbIPs[1], 80).String()+"/UDP")
	var names []string
	for _, p := range remote {
		names = append(names, p.Name)
	}
	stop, err := l.StartPeerEcho(ctx, names)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)

	// Watch the wire bridge's ports of both nodes while probing.
	capEntry := startWireCapture(t, "w-"+node1.Name)
	capBackend := startWireCapture(t, "w-"+node2.Name)

	type target struct {
		kind string
		fe   netip.AddrPort
	}
	var targets []target
	for _, ip := range node1.IPs {
		targets = append(targets, target{"NodePort via " + node1.Name, netip.AddrPortFrom(ip, nodePort)})
	}
	for _, ip := range extIPs {
		targets = append(targets, target{"externalIP via " + node1.Name, netip.AddrPortFrom(ip, 80)})
	}
	for _, ip := range lbIPs {
		targets = append(targets, target{"LoadBalancer IP via " + node1.Name, netip.AddrPortFrom(ip, 80)})
	}
	for _, tg := range targets {
		for _, proto := range []string{"tcp", "udp"} {
			spec := proto + "/" + tg.fe.String()
			r, ok := xprobeUntil(t, l, spec, 2*time.Second, 20*time.Second, func(r probe.ExternalResult) bool { return r.OK })
			if !ok {
				t.Errorf("%s %s: no answer: %+v", tg.kind, spec, r)
				continue
			}
			seen, err := netip.ParseAddrPort(r.Seen)
			want := client[0]
			for _, c := range client {
				if c.Is4() == tg.fe.Addr().Is4() {
					want = c
				}
			}
			if err != nil || seen.Addr() != want {
				t.Errorf("%s %s: the backend saw %q, want the client's own address %s (DSR keeps it)", tg.kind, spec, r.Seen, want)
			} else {
				t.Logf("%s %s: backend %s saw %s", tg.kind, spec, orDashT(r.Server), r.Seen)
			}
		}
	}
	time.Sleep(200 * time.Millisecond)
	entry, backend := capEntry.stop(), capBackend.stop()
	for _, tg := range targets {
		for _, proto := range []uint8{unix.IPPROTO_TCP, unix.IPPROTO_UDP} {
			k := replyKey{src: tg.fe, proto: proto}
			fromBackend, fromEntry := backend.replies[k], entry.replies[k]
			t.Logf("%s %s/%d: replies entering the wire from %s: %d, from %s: %d", tg.kind, tg.fe, proto, node2.Name, fromBackend, node1.Name, fromEntry)
			if fromBackend == 0 || fromEntry != 0 {
				t.Errorf("%s %s proto %d: replies from %s (backend node) %d, from %s (entry node) %d: with DSR every reply must leave the backend node directly",
					tg.kind, tg.fe, proto, node2.Name, fromBackend, node1.Name, fromEntry)
			}
		}
	}
	t.Logf("encapsulated packets node1 → %s: IPIP %d, IPv6-in-IPv6 %d", node2.Name, backend.encap4, backend.encap6)
	if backend.encap4 == 0 || backend.encap6 == 0 {
		t.Errorf("requests did not reach %s encapsulated (IPIP %d, IPv6-in-IPv6 %d)", node2.Name, backend.encap4, backend.encap6)
	}

	// Bulk TCP from the client through node1's LB and node2's decap into
	// the pod (GSO-sized packets encapsulated and decapsulated), and the
	// MSS the client got: the backend node clamps DSR SYN-ACKs so that a
	// segment plus the LB's outer header fits a 1500-byte wire. (The lab's
	// veth wire forwards GSO packets whole, so an unclamped MSS would not
	// stall here as it would on a real wire: the MSS itself is checked.)
	bulk := newTestService("dsr-bulk", corev1.ServiceTypeLoadBalancer, 30087, corev1.ProtocolTCP)
	if bulk, err = kube.CoreV1().Services("default").Create(ctx, bulk, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, ip := range bulkIPs {
		bulk.Status.LoadBalancer.Ingress = append(bulk.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip.String()})
	}
	if bulk, err = kube.CoreV1().Services("default").UpdateStatus(ctx, bulk, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	(&testService{svc: bulk, port: 5201, backends: remote[:1]}).apply(t, kube)
	for _, ip := range bulkIPs {
		waitFrontend(t, l, node1.Name, netip.AddrPortFrom(ip, 80).String()+"/TCP")
		waitFrontend(t, l, node2.Name, netip.AddrPortFrom(ip, 80).String()+"/TCP")
	}
	for _, ip := range bulkIPs {
		srv := iperfServer(t, ctx, l, remote[0].Name, 5201)
		bps, mss := externalIperf(t, l, ip.String(), 80)
		awaitIperfServer(t, srv) // the next address's server binds 5201 again
		t.Logf("bulk TCP client → %s:80 (DSR via %s to %s): %.0f Mbit/s, MSS %d", ip, node1.Name, remote[0].Name, bps/1e6, mss)
		max := 1500 - 60
		if ip.Is6() {
			max = 1500 - 100
		}
		if bps < 10e6 {
			t.Errorf("bulk TCP to %s through DSR: %.1f Mbit/s", ip, bps/1e6)
		}
		if mss <= 0 || mss > max {
			t.Errorf("client MSS toward %s is %d, want ≤ %d (clamped for the outer header)", ip, mss, max)
		}
	}

	// UDP datagrams that do not fit the outer header (bpf/lib/icmp_too_big.h):
	// the client's kernel fragments 4 000 bytes at the wire's 1 500; the
	// first fragment plus 20 / 40 bytes would not fit node1's uplink, so
	// node1 answers "fragmentation needed" / "packet too big", the client
	// caches the smaller path MTU and sends the next datagram in fragments
	// that fit; node2 takes each encapsulated fragment, and the pod's echo
	// comes back whole, straight from node2.
	for _, p := range remote {
		fragEchoServer(t, p.Netns, fragEchoPort)
	}
	big := newTestService("dsr-big", corev1.ServiceTypeLoadBalancer, 30088, corev1.ProtocolUDP)
	big.Spec.Ports[0].TargetPort = intstr.FromInt32(fragEchoPort)
	if big, err = kube.CoreV1().Services("default").Create(ctx, big, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, ip := range bigIPs {
		big.Status.LoadBalancer.Ingress = append(big.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip.String()})
	}
	if big, err = kube.CoreV1().Services("default").UpdateStatus(ctx, big, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	(&testService{svc: big, port: fragEchoPort, backends: remote}).apply(t, kube)
	for _, ip := range bigIPs {
		waitFrontend(t, l, node1.Name, netip.AddrPortFrom(ip, 80).String()+"/UDP")
		waitFrontend(t, l, node2.Name, netip.AddrPortFrom(ip, 80).String()+"/UDP")
	}
	before := npPinnedCounters(t, node1.PinDir)
	for _, ip := range bigIPs {
		dst := netip.AddrPortFrom(ip, 80)
		sends, err := fragExchange(l.External().Netns, dst, fragDatagram, 20*time.Second)
		if err != nil {
			t.Errorf("%d-byte datagram to %s through DSR: %v", fragDatagram, dst, err)
			continue
		}
		route, _ := l.Command(ctx, lab.ExternalName, "ip", "route", "get", ip.String()).CombinedOutput()
		t.Logf("%d-byte datagram to %s through DSR echoed whole after %d sends; client route: %s", fragDatagram, dst, sends, strings.Join(strings.Fields(string(route)), " "))
		want := "mtu 1480"
		if ip.Is6() {
			want = "mtu 1460"
		}
		if !strings.Contains(string(route), want) {
			t.Errorf("the client's route to %s has no cached %s: %s", ip, want, route)
		}
	}
	moved := npPinnedCounters(t, node1.PinDir)["tc"]["dsr_too_big"] - before["tc"]["dsr_too_big"]
	t.Logf("%s answered %d packets too big for DSR", node1.Name, moved)
	if moved == 0 {
		t.Errorf("%s's dsr_too_big did not move: the datagrams were not too big, or not answered", node1.Name)
	}
}

// externalIperf runs a 3 s iperf3 TCP stream from the external namespace
// to addr:port and returns the receiver's goodput and the client's MSS.
func externalIperf(t *testing.T, l *lab.Lab, addr string, port int) (bps float64, mss int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	out, err := l.Command(ctx, lab.ExternalName, "iperf3", "-c", addr, "-p", fmt.Sprint(port), "-t", "3", "-J").Output()
	var r struct {
		Start struct {
			TCPMSSDefault int `json:"tcp_mss_default"`
		} `json:"start"`
		End struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
		Error string `json:"error"`
	}
	if jerr := json.Unmarshal(out, &r); jerr != nil || r.Error != "" || err != nil {
		t.Fatalf("iperf3 from %s to %s:%d: %v %s\n%s", lab.ExternalName, addr, port, err, r.Error, out)
	}
	return r.End.SumReceived.BitsPerSecond, r.Start.TCPMSSDefault
}

func orDashT(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// replyKey is a packet's source address:port and L4 protocol.
type replyKey struct {
	src   netip.AddrPort
	proto uint8
}

// captureResult counts, on one bridge port: packets that entered the wire
// from the node (by source address:port and protocol) and encapsulated
// packets the wire delivered to the node.
type captureResult struct {
	replies        map[replyKey]int
	encap4, encap6 int
}

type wireCapture struct {
	done     chan captureResult
	quit     chan struct{}
	stopOnce sync.Once
}

// startWireCapture opens an AF_PACKET socket on port (a bridge port in the
// wire namespace) and counts until stop.
func startWireCapture(t *testing.T, port string) *wireCapture {
	t.Helper()
	all := htons(unix.ETH_P_ALL)
	var fd, ifindex int
	err := netnsutil.Do(lab.WireNetns, func() error {
		link, err := netlink.LinkByName(port)
		if err != nil {
			return fmt.Errorf("find %s in %s: %w", port, lab.WireNetns, err)
		}
		ifindex = link.Attrs().Index
		if fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(all)); err != nil {
			return fmt.Errorf("AF_PACKET socket in %s: %w", lab.WireNetns, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: all, Ifindex: ifindex}); err != nil {
		unix.Close(fd)
		t.Fatalf("bind to %s: %v", port, err)
	}
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 100000})
	c := &wireCapture{done: make(chan captureResult, 1), quit: make(chan struct{})}
	t.Cleanup(func() { c.stopOnce.Do(func() { close(c.quit) }) })
	go func() {
		defer unix.Close(fd)
		res := captureResult{replies: map[replyKey]int{}}
		buf := make([]byte, 65536)
		for {
			select {
			case <-c.quit:
				c.done <- res
				return
			default:
			}
			n, from, err := unix.Recvfrom(fd, buf, unix.MSG_TRUNC)
			if err != nil || n > len(buf) {
				continue
			}
			ll, ok := from.(*unix.SockaddrLinklayer)
			if !ok {
				continue
			}
			countFrame(&res, buf[:n], ll.Pkttype == unix.PACKET_OUTGOING)
		}
	}()
	return c
}

func (c *wireCapture) stop() captureResult {
	c.stopOnce.Do(func() { close(c.quit) })
	return <-c.done
}

// countFrame classifies one Ethernet frame seen on a bridge port: outgoing =
// the bridge sends it to the node; otherwise the node sent it.
func countFrame(res *captureResult, f []byte, toNode bool) {
	if len(f) < 14 {
		return
	}
	et := binary.BigEndian.Uint16(f[12:14])
	ip := f[14:]
	var src netip.Addr
	var proto uint8
	var l4 []byte
	switch et {
	case unix.ETH_P_IP:
		if len(ip) < 20 {
			return
		}
		ihl := int(ip[0]&0x0f) * 4
		if len(ip) < ihl+4 {
			return
		}
		src, proto, l4 = netip.AddrFrom4([4]byte(ip[12:16])), ip[9], ip[ihl:]
	case unix.ETH_P_IPV6:
		if len(ip) < 44 {
			return
		}
		src, proto, l4 = netip.AddrFrom16([16]byte(ip[8:24])), ip[6], ip[40:]
	default:
		return
	}
	if toNode {
		switch proto {
		case unix.IPPROTO_IPIP:
			res.encap4++
		case unix.IPPROTO_IPV6:
			res.encap6++
		}
		return
	}
	if proto == unix.IPPROTO_TCP || proto == unix.IPPROTO_UDP {
		res.replies[replyKey{src: netip.AddrPortFrom(src, binary.BigEndian.Uint16(l4[0:2])), proto: proto}]++
	}
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
