package datapath

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/axonhq/axon/internal/lb"
)

// Real traffic through the attached LB: a client, the LB node and a backend
// on one bridge (namespaces axt-dp-np*-*), TCP connections to a NodePort
// (SNAT, tc and XDP generic) and to a LoadBalancer IP by DSR (IPIP,
// decapsulated by axon_lb_decap on the backend, replies straight to the
// client).

type npTrafficFix struct {
	client, node, backend, pod string
	nodeLB, backendLB          *NodePortLB
}

func newNPTrafficFix(t *testing.T) *npTrafficFix {
	requireRoot(t)
	f := &npTrafficFix{}
	wire := newNetns(t, "npw")
	f.client, f.node, f.backend = newNetns(t, "npc"), newNetns(t, "npn"), newNetns(t, "npb")
	w := nsConf(t, wire)
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}}
	if err := w.h.LinkAdd(br); err != nil {
		t.Fatal(err)
	}
	w.up("br0")
	for _, e := range []struct{ ns, dev, peer, cidr string }{
		{f.node, "eth0", "n1", "198.18.0.11/24"},
		{f.client, "c0", "c1", "198.18.0.250/24"},
		{f.backend, "b0", "b1", "198.18.0.12/24"},
	} {
		c := nsConf(t, e.ns)
		c.veth(e.dev, "", e.peer, "", wire)
		c.addr(e.dev, e.cidr)
		c.up(e.dev)
		if err := w.h.LinkSetMaster(w.link(e.peer), w.link("br0").(*netlink.Bridge)); err != nil {
			t.Fatal(err)
		}
		w.up(e.peer)
	}
	n := nsConf(t, f.node)
	n.sysctl("net.ipv4.ip_forward", "1")
	nsConf(t, f.client).route("192.0.2.0/24", "198.18.0.11", "c0")
	b := nsConf(t, f.backend)
	b.addr("lo", "192.0.2.10/32") // the DSR service address, owned by the backend
	// a local pod behind the node (kernel-routed: no axon host routing here)
	f.pod = newNetns(t, "npp")
	n.veth("lxc0", "", "p0", "", f.pod)
	n.addr("lxc0", "10.244.1.1/24")
	n.up("lxc0")
	p := nsConf(t, f.pod)
	p.addr("p0", "10.244.1.5/24")
	p.up("p0")
	p.route("default", "10.244.1.1", "p0")
	var err error
	inNetns(t, f.node, func() {
		f.nodeLB, err = LoadNodePortLB(NodePortOptions{PinDir: newPinDir(t), NodeName: "node1",
			NodeAddrs: []netip.Addr{npNode}, Logger: testLogger(t)})
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.nodeLB.Close() })
	inNetns(t, f.backend, func() {
		f.backendLB, err = LoadNodePortLB(NodePortOptions{PinDir: newPinDir(t), Logger: testLogger(t)})
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
		if err := npInNetns(srv.ns, func() (e error) { ln, e = net.Listen("tcp4", srv.addr); return e }); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					r := bufio.NewReader(c)
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					fmt.Fprintf(c, "%s %s", c.RemoteAddr(), line)
				}()
			}
		}()
	}
	return f
}

// talk connects from the client to dst, sends a line and returns the echo
// ("<client address as the backend saw it> <line>").
func (f *npTrafficFix) talk(dst string) (string, error) {
	var out string
	err := npInNetns(f.client, func() error {
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
	if err := f.nodeLB.UpsertFrontendWith(npVIP("192.0.2.10:80", lb.TCP, npBE("198.18.0.12:80", "node2")), FrontendOptions{Mode: NPModeDSR}); err != nil {
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
			inNetns(t, f.node, func() { _, err = f.nodeLB.Attach("eth0", c.xdp) })
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
	inNetns(t, f.node, func() {
		if err := f.nodeLB.Detach("eth0"); err != nil {
			t.Error(err)
		}
	})
}
