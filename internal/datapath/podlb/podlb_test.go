package podlb

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/axonhq/axon/internal/datapath/drops"
	"github.com/axonhq/axon/internal/datapath/podpath"
	"github.com/axonhq/axon/internal/datapath/socklb"
	"github.com/axonhq/axon/internal/lb"
	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/testutil"
)

// env is a node netns routing between a client pod and two backend pods
// (veth pairs, each pod's eth0 with its default route to the node), the
// socket LB loaded on a test cgroup of its own (the pods' processes are not in
// it: they stand for opted-out pods) as the writer of the service maps, and
// the pod LB ready to attach in the client.
type env struct {
	pin          string
	sock         *socklb.LB
	lb           *LB
	client, node string
	backends     []string // netns of backend 0 and 1
}

// Addresses: client 198.18.97.2 / fd00:97::2, backend i 198.18.9(8+i).2 /
// fd00:9(8+i)::2, the node .1 / ::1 on each link.
func newEnv(t *testing.T) *env {
	t.Helper()
	dptest.RequireRoot(t)
	e := &env{pin: dptest.NewPinDir(t, datapath.BPFFSRoot, datapath.EnsureBPFFS, func(dir string) error {
		return errors.Join(Uninstall(dir, nil), podpath.Uninstall(dir))
	})}
	cg, _ := testutil.NewCgroup(t, "axt-podlb-")
	s, err := socklb.Load(e.pin, cg, dptest.Logger(t))
	if err != nil {
		t.Fatalf("socket LB: %v", err)
	}
	t.Cleanup(func() {
		s.Close()
		if err := socklb.Uninstall(e.pin, cg); err != nil {
			t.Errorf("socket LB uninstall: %v", err)
		}
	})
	e.sock = s
	e.node = dptest.NewNetns(t, "plbnode")
	e.client = dptest.NewNetns(t, "plbcli")
	e.backends = []string{dptest.NewNetns(t, "plbbe0"), dptest.NewNetns(t, "plbbe1")}
	node := dptest.NSConf(t, e.node)
	node.Sysctl("net.ipv4.ip_forward", "1")
	node.Sysctl("net.ipv6.conf.all.forwarding", "1")
	link := func(ns, hostIf string, net4, net6 string) {
		node.Veth(hostIf, "", "eth0", "", ns)
		node.Up(hostIf)
		node.Addr(hostIf, net4+".1/24")
		node.Addr(hostIf, net6+"::1/64")
		pod := dptest.NSConf(t, ns)
		pod.Up("eth0")
		pod.Addr("eth0", net4+".2/24")
		pod.Addr("eth0", net6+"::2/64")
		pod.Route("default", net4+".1", "eth0")
		pod.Route("default", net6+"::1", "eth0")
	}
	link(e.client, "vcli", "198.18.97", "fd00:97")
	link(e.backends[0], "vbe0", "198.18.98", "fd00:98")
	link(e.backends[1], "vbe1", "198.18.99", "fd00:99")
	for i, ns := range e.backends {
		v4 := fmt.Sprintf("198.18.%d.2", 98+i)
		v6 := fmt.Sprintf("fd00:%d::2", 98+i)
		serve(t, ns, v4+":8080", "["+v6+"]:8080", v4+":5353", "["+v6+"]:5353")
	}
	l, err := New(Config{PinDir: e.pin, Logger: dptest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	e.lb = l
	return e
}

// serve answers every TCP connection and UDP datagram at addrs in netns ns
// with "<its own address>" (closed at cleanup).
func serve(t *testing.T, ns string, addrs ...string) {
	t.Helper()
	dptest.InNetns(t, ns, func() {
		for _, a := range addrs {
			if strings.HasSuffix(a, ":8080") {
				ln, err := net.Listen("tcp", a)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { ln.Close() })
				testutil.ServeConns(ln, func(c net.Conn) {
					defer c.Close()
					c.Write([]byte(c.LocalAddr().String()))
				})
				continue
			}
			pc, err := net.ListenPacket("udp", a)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { pc.Close() })
			go func() {
				buf := make([]byte, 1500)
				for {
					_, from, err := pc.ReadFrom(buf)
					if err != nil {
						return
					}
					pc.WriteTo([]byte(pc.LocalAddr().String()), from)
				}
			}()
		}
	})
}

func (e *env) upsert(t *testing.T, f lb.Frontend) {
	t.Helper()
	if err := e.sock.UpsertFrontend(f); err != nil {
		t.Fatal(err)
	}
}

func frontend(s string, proto lb.Proto, affinity time.Duration, bes ...string) lb.Frontend {
	a := netip.MustParseAddrPort(s)
	f := lb.Frontend{Key: lb.FrontendKey{Addr: a.Addr(), Port: a.Port(), Proto: proto, Scope: lb.ScopeCluster}, Affinity: affinity}
	for _, b := range bes {
		ba := netip.MustParseAddrPort(b)
		f.Backends = append(f.Backends, lb.Backend{Addr: ba.Addr(), Port: ba.Port(), State: lb.Active})
	}
	return f
}

// exchange is one request from the client netns: a TCP connection to addr
// (its reply and the peer the socket saw), or a UDP datagram from an
// unconnected socket (its reply and the source it came from).
type exchange struct {
	reply, peer string
	err         error
}

func tcpTo(t *testing.T, ns, addr string) exchange {
	t.Helper()
	var x exchange
	dptest.InNetns(t, ns, func() {
		d := net.Dialer{Timeout: 2 * time.Second}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			x.err = err
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(testutil.Stretch(t, 3*time.Second)))
		buf := make([]byte, 100)
		n, err := c.Read(buf)
		x = exchange{reply: string(buf[:n]), peer: c.RemoteAddr().String(), err: err}
	})
	return x
}

func udpTo(t *testing.T, ns, addr string) exchange {
	t.Helper()
	var x exchange
	dptest.InNetns(t, ns, func() {
		pc, err := net.ListenPacket("udp", ":0")
		if err != nil {
			t.Fatal(err)
		}
		defer pc.Close()
		to, err := net.ResolveUDPAddr("udp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pc.WriteTo([]byte("hi"), to); err != nil {
			x.err = err
			return
		}
		pc.SetReadDeadline(time.Now().Add(testutil.Stretch(t, 2*time.Second)))
		buf := make([]byte, 100)
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			x.err = err
			return
		}
		x = exchange{reply: string(buf[:n]), peer: from.String()}
	})
	return x
}

func (e *env) counters(t *testing.T, id string) map[string]uint64 {
	t.Helper()
	c, err := e.lb.Counters(id)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestPodLBTraffic: real TCP connections and UDP datagrams from a pod whose
// sockets no socket LB translates reach a ClusterIP's backends in other pods
// through the node, over IPv4 and IPv6, and see the ClusterIP as their peer;
// without the pod LB the same requests find nothing (the node has no route
// to the ClusterIP) and after Detach again nothing, pins gone.
func TestPodLBTraffic(t *testing.T) {
	e := newEnv(t)
	e.upsert(t, frontend("10.96.7.1:80", lb.TCP, 0, "198.18.98.2:8080"))
	e.upsert(t, frontend("10.96.7.1:53", lb.UDP, 0, "198.18.99.2:5353"))
	e.upsert(t, frontend("[fd00:96::71]:80", lb.TCP, 0, "[fd00:99::2]:8080"))
	e.upsert(t, frontend("[fd00:96::71]:53", lb.UDP, 0, "[fd00:98::2]:5353"))
	cases := []struct {
		name, addr, backend string
		tcp                 bool
	}{
		{"tcp4", "10.96.7.1:80", "198.18.98.2:8080", true},
		{"udp4", "10.96.7.1:53", "198.18.99.2:5353", false},
		{"tcp6", "[fd00:96::71]:80", "[fd00:99::2]:8080", true},
		{"udp6", "[fd00:96::71]:53", "[fd00:98::2]:5353", false},
	}
	do := func(tcp bool, addr string) exchange {
		if tcp {
			return tcpTo(t, e.client, addr)
		}
		return udpTo(t, e.client, addr)
	}
	// Without the pod LB the requests leave the pod for the ClusterIP and
	// the node has no route for them (its InNoRoutes counters say so).
	noRoutes := func() (uint64, uint64) {
		return dptest.SNMPCounter(t, e.node, "IpExt", "InNoRoutes"), dptest.SNMPCounter(t, e.node, "", "Ip6InNoRoutes")
	}
	v4, v6 := noRoutes()
	for _, c := range cases {
		if x := do(c.tcp, c.addr); x.err == nil {
			t.Fatalf("%s without the pod LB: %+v, want an error (nothing serves the ClusterIP on the node)", c.name, x)
		}
	}
	if v4b, v6b := noRoutes(); v4b < v4+2 || v6b < v6+2 {
		t.Errorf("node InNoRoutes v4 %d -> %d, v6 %d -> %d: want the untranslated requests (2 per family) counted", v4, v4b, v6, v6b)
	}
	const id = "pod-a"
	if err := e.lb.Attach(id, netnsutil.Path(e.client), Target{}); err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			x := do(c.tcp, c.addr)
			if x.err != nil || x.reply != c.backend || x.peer != c.addr {
				t.Fatalf("%s: %+v, want reply %s from peer %s", c.addr, x, c.backend, c.addr)
			}
		})
	}
	got := e.counters(t, id)
	if got["new"] < 4 || got["reply"] < 4 || got["hit"] < 2 {
		t.Errorf("counters %v: want new >= 4 (one flow each), reply >= 4, hit >= 2 (the TCP flows' later segments)", got)
	}
	// Idempotent: attached again, in place, counters kept.
	if err := e.lb.Attach(id, netnsutil.Path(e.client), Target{Ifname: "eth0"}); err != nil {
		t.Fatal(err)
	}
	if again := e.counters(t, id); again["new"] < got["new"] {
		t.Errorf("counters after a second Attach %v, had %v: want them kept", again, got)
	}
	if x := tcpTo(t, e.client, "10.96.7.1:80"); x.err != nil || x.peer != "10.96.7.1:80" {
		t.Errorf("after a second Attach: %+v", x)
	}
	ids, err := Attached(e.pin)
	if err != nil || len(ids) != 1 || ids[0] != id {
		t.Errorf("Attached = %v, %v; want [%s]", ids, err, id)
	}
	if err := e.lb.Detach(id, netnsutil.Path(e.client)); err != nil {
		t.Fatal(err)
	}
	v4, _ = noRoutes()
	if x := tcpTo(t, e.client, "10.96.7.1:80"); x.err == nil {
		t.Errorf("after Detach: %+v, want an error", x)
	}
	if v4b, _ := noRoutes(); v4b <= v4 {
		t.Errorf("after Detach: node InNoRoutes %d -> %d, want the untranslated SYN counted", v4, v4b)
	}
	if _, err := os.Stat(PodPinDir(e.pin, id)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pin dir after Detach: %v, want it gone", err)
	}
}

// TestPodLBBackends: a frontend without a backend drops the SYN (the
// no_backend counter and the shared drop counter move; the connect times
// out); a removed backend's UDP flow chooses again at its next datagram
// (reselect); session affinity keeps a pod on one backend.
func TestPodLBBackends(t *testing.T) {
	e := newEnv(t)
	const id = "pod-b"
	e.upsert(t, frontend("10.96.7.2:80", lb.TCP, 0))
	e.upsert(t, frontend("10.96.7.2:53", lb.UDP, 0, "198.18.98.2:5353", "198.18.99.2:5353"))
	e.upsert(t, frontend("10.96.7.3:80", lb.TCP, time.Hour, "198.18.98.2:8080", "198.18.99.2:8080"))
	e.upsert(t, frontend("10.96.7.4:80", lb.TCP, 0, "198.18.98.2:8080", "198.18.99.2:8080"))
	if err := e.lb.Attach(id, netnsutil.Path(e.client), Target{}); err != nil {
		t.Fatal(err)
	}

	t.Run("no backend", func(t *testing.T) {
		dm, err := drops.Open(e.pin)
		if err != nil {
			t.Fatal(err)
		}
		defer dm.Close()
		dropped := func() uint64 {
			cs, err := dm.ReadCounts()
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range cs {
				if c.Reason == "drop_no_backend" && c.Direction == "egress" {
					return c.Packets
				}
			}
			t.Fatal("no drop_no_backend/egress counter")
			return 0
		}
		before, dBefore := e.counters(t, id)["no_backend"], dropped()
		x := tcpTo(t, e.client, "10.96.7.2:80")
		after, dAfter := e.counters(t, id)["no_backend"], dropped()
		if dAfter <= dBefore {
			t.Errorf("shared drop counter no_backend/egress %d -> %d: want the SYNs counted", dBefore, dAfter)
		}
		var ne net.Error
		if x.err == nil || !errors.As(x.err, &ne) || !ne.Timeout() {
			t.Errorf("connect to a frontend without backends: %+v, want a timeout (SYNs dropped)", x)
		}
		if after <= before {
			t.Errorf("no_backend %d -> %d: want it to count the dropped SYNs", before, after)
		}
	})

	t.Run("reselect", func(t *testing.T) {
		// One unconnected socket, one tuple: find its backend, remove it,
		// and the same tuple's next datagram goes to the other.
		dptest.InNetns(t, e.client, func() {
			ask0 := udpClient(t, "198.18.97.2:0", "10.96.7.2:53")
			ask := func() string {
				got, err := ask0()
				if err != nil {
					t.Fatalf("udp reply: %v", err)
				}
				return got
			}
			first := ask()
			if again := ask(); again != first {
				t.Errorf("same tuple, second datagram answered by %s, first by %s: want one backend per flow", again, first)
			}
			other := "198.18.99.2:5353"
			if first == other {
				other = "198.18.98.2:5353"
			}
			before := e.counters(t, id)["reselect"]
			e.upsert(t, frontend("10.96.7.2:53", lb.UDP, 0, other))
			if got := ask(); got != other {
				t.Errorf("after removing %s: answered by %s, want %s", first, got, other)
			}
			if after := e.counters(t, id)["reselect"]; after != before+1 {
				t.Errorf("reselect %d -> %d: want one", before, after)
			}
		})
	})

	t.Run("reverse entry evicted", func(t *testing.T) {
		// An LRU may evict a flow's reverse entry while its forward one stays
		// (replies idle): the flow's next UDP datagram writes it again.
		dptest.InNetns(t, e.client, func() {
			ask := udpClient(t, "198.18.97.2:0", "10.96.7.2:53")
			if _, err := ask(); err != nil {
				t.Fatal(err)
			}
			ct, err := ebpf.LoadPinnedMap(filepath.Join(PodPinDir(e.pin, id), CTMapName), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer ct.Close()
			var k, v []byte
			var revs [][]byte
			for it := ct.Iterate(); it.Next(&k, &v); {
				if v[18] == 2 { // podlb_ct.flags PODLB_CT_REV
					revs = append(revs, slices.Clone(k))
				}
			}
			for _, rk := range revs {
				if err := ct.Delete(rk); err != nil {
					t.Fatal(err)
				}
			}
			before := e.counters(t, id)["rev_restored"]
			if got, err := ask(); err != nil {
				t.Errorf("after the reverse entries went (%d): %q, %v", len(revs), got, err)
			}
			if after := e.counters(t, id)["rev_restored"]; after != before+1 || len(revs) == 0 {
				t.Errorf("rev_restored %d -> %d after removing %d reverse entries: want one restored", before, after, len(revs))
			}
		})
	})

	t.Run("affinity", func(t *testing.T) {
		seen, seenNoAff := map[string]int{}, map[string]int{}
		for range 12 {
			x := tcpTo(t, e.client, "10.96.7.3:80")
			if x.err != nil {
				t.Fatal(x.err)
			}
			seen[x.reply]++
			y := tcpTo(t, e.client, "10.96.7.4:80")
			if y.err != nil {
				t.Fatal(y.err)
			}
			seenNoAff[y.reply]++
		}
		if len(seen) != 1 {
			t.Errorf("with ClientIP affinity: backends %v, want one", seen)
		}
		// the control: without affinity 12 connections spread (both backends
		// with probability 1 - 2^-11)
		if len(seenNoAff) != 2 {
			t.Errorf("without affinity: backends %v, want both", seenNoAff)
		}
	})
}

// TestPodLBRefusesWithoutSocketLB: the pod LB serves the socket LB's maps;
// without them Attach says so and attaches nothing.
func TestPodLBRefusesWithoutSocketLB(t *testing.T) {
	dptest.RequireRoot(t)
	pin := dptest.NewPinDir(t, datapath.BPFFSRoot, datapath.EnsureBPFFS, func(dir string) error { return Uninstall(dir, nil) })
	if err := datapath.EnsurePinDir(pin); err != nil {
		t.Fatal(err)
	}
	ns := dptest.NewNetns(t, "plbnone")
	l, err := New(Config{PinDir: pin, Logger: dptest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	err = l.Attach("pod-c", netnsutil.Path(ns), Target{Ifname: "lo"})
	if err == nil || !strings.Contains(err.Error(), "socket LB") {
		t.Fatalf("Attach without the socket LB's maps: %v, want an error naming the socket LB", err)
	}
	if _, err := os.Stat(filepath.Join(pin, "podlb")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pin dir %s/podlb: %v, want nothing created", pin, err)
	}
}

// udpClient opens an unconnected UDP socket at local (in the caller's netns,
// closed at cleanup) and returns a function that sends service a datagram
// and returns the reply, an error unless the reply comes from service.
func udpClient(t *testing.T, local, service string) func() (string, error) {
	t.Helper()
	pc, err := net.ListenPacket("udp", local)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	to := net.UDPAddrFromAddrPort(netip.MustParseAddrPort(service))
	return func() (string, error) {
		if _, err := pc.WriteTo([]byte("hi"), to); err != nil {
			return "", err
		}
		pc.SetReadDeadline(time.Now().Add(testutil.Stretch(t, 2*time.Second)))
		buf := make([]byte, 100)
		n, from, err := pc.ReadFrom(buf)
		if err == nil && from.String() != to.String() {
			err = fmt.Errorf("reply from %s, want %s", from, to)
		}
		return string(buf[:n]), err
	}
}
