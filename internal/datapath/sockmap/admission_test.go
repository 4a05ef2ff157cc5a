package sockmap

import (
	"maps"
	"net/netip"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/testutil"
)

// podNet is two pod network namespaces A and B joined by a veth pair, and a
// third, C, that owns a pod address configured nowhere but in B (B is an
// impostor of C's pod there).
type podNet struct {
	a, b, c                  string // netns names
	ca, cb, cc               uint64 // their cookies
	podA, podB, victim       netip.Addr
	notPod, disabled, a6, b6 netip.Addr
}

// newPodNet builds the namespaces: A has 10.77.0.1 and fd00:77::1, B has
// 10.77.0.2 and fd00:77::2 (pods), 10.77.0.3 (C's pod address, the
// impostor's), 10.77.0.4 (not a pod) and 10.77.0.5 (a pod that is then
// disabled).
func newPodNet(t *testing.T) podNet {
	t.Helper()
	n := podNet{
		a: dptest.NewNetns(t, "sma"), b: dptest.NewNetns(t, "smb"), c: dptest.NewNetns(t, "smc"),
		podA: netip.MustParseAddr("10.77.0.1"), podB: netip.MustParseAddr("10.77.0.2"),
		victim: netip.MustParseAddr("10.77.0.3"), notPod: netip.MustParseAddr("10.77.0.4"),
		disabled: netip.MustParseAddr("10.77.0.5"),
		a6:       netip.MustParseAddr("fd00:77::1"), b6: netip.MustParseAddr("fd00:77::2"),
	}
	ca := dptest.NSConf(t, n.a)
	ca.Veth("a0", "", "b0", "", n.b)
	cb := dptest.NSConf(t, n.b)
	ca.Up("a0")
	cb.Up("b0")
	ca.Addr("a0", "10.77.0.1/24")
	ca.Addr("a0", "fd00:77::1/64")
	for _, cidr := range []string{"10.77.0.2/24", "10.77.0.3/24", "10.77.0.4/24", "10.77.0.5/24", "fd00:77::2/64"} {
		cb.Addr("b0", cidr)
	}
	waitRoutable(t, n.a, n.b6)
	waitRoutable(t, n.b, n.a6)
	for _, x := range []struct {
		ns string
		c  *uint64
	}{{n.a, &n.ca}, {n.b, &n.cb}, {n.c, &n.cc}} {
		c, err := netnsutil.Cookie(netnsutil.Path(x.ns))
		if err != nil {
			t.Fatal(err)
		}
		*x.c = c
	}
	return n
}

// waitRoutable waits until netns ns has a usable route to dst (an IPv6
// address gets its routes when its DAD work item runs, even with nodad).
func waitRoutable(t *testing.T, ns string, dst netip.Addr) {
	t.Helper()
	h := dptest.NSConf(t, ns).H
	deadline := time.Now().Add(testutil.Stretch(t, 10*time.Second))
	for {
		rs, err := h.RouteGet(dst.AsSlice())
		if err == nil && len(rs) == 1 && rs[0].Type == unix.RTN_UNICAST {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no route to %s: %+v, %v", ns, dst, rs, err)
		}
		time.Sleep(time.Millisecond)
	}
}

// register admits the pods of n: A's and B's addresses with their netns, the
// victim's address with C's, and A's loopback.
func (n podNet) register(t *testing.T, b *Bypass) {
	t.Helper()
	for ip, ns := range map[netip.Addr]uint64{n.podA: n.ca, n.a6: n.ca, n.podB: n.cb, n.b6: n.cb, n.victim: n.cc, n.disabled: n.cb} {
		if err := b.SetPod(ip, ns); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.SetNetns(n.ca); err != nil {
		t.Fatal(err)
	}
}

// connsOf returns the map's entries of connection c (matched by address and
// port, either end).
func connsOf(t *testing.T, b *Bypass, c conn) []Conn {
	t.Helper()
	all, err := b.Conns()
	if err != nil {
		t.Fatal(err)
	}
	var out []Conn
	for _, x := range all {
		if (x.Local == c.clientAddr && x.Remote == c.serverAddr) || (x.Local == c.serverAddr && x.Remote == c.clientAddr) {
			out = append(out, x)
		}
	}
	return out
}

// keys keeps only the key fields of cs (what the map's key says), sorted.
func keys(cs []Conn) []Conn {
	out := make([]Conn, len(cs))
	for i, c := range cs {
		out[i] = Conn{Local: c.Local, Remote: c.Remote, Netns: c.Netns}
	}
	return sortConns(out)
}

func sortConns(cs []Conn) []Conn {
	slices.SortFunc(cs, func(a, b Conn) int {
		if c := a.Local.Compare(b.Local); c != 0 {
			return c
		}
		return a.Remote.Compare(b.Remote)
	})
	return cs
}

// The admission rule, one row per case, on real sockets in real network
// namespaces: who enters the map (Conns), which counters move (exactly),
// and that the data arrives byte for byte, through the bypass or the stack.
func TestAdmission(t *testing.T) {
	b, _, _, cgFD := loadTest(t, Config{})
	n := newPodNet(t)
	n.register(t, b)
	p := startSockProc(t, cgFD)
	ap := func(ip netip.Addr) string { return netip.AddrPortFrom(ip, 0).String() }
	// enableB admits B's loopback and intra-pod connections for one row
	enableB := func(t *testing.T) {
		if err := b.SetNetns(n.cb); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := b.DeleteNetns(n.cb); err != nil {
				t.Error(err)
			}
		})
	}

	for _, tc := range []struct {
		name             string
		setup            func(t *testing.T)
		lns, lnet, laddr string
		dhost            string // "" = the listener's address
		dns, dnet, local string
		wantFamily       [2]int // client, server socket family
		inMap            string // "both", "server", "none"
		keyNetns         uint64
		admission        map[string]uint64 // exact deltas of the admission counters
	}{
		{name: "pod-pod v4", lns: n.a, lnet: "tcp4", laddr: ap(n.podA), dns: n.b, dnet: "tcp4", local: ap(n.podB),
			wantFamily: [2]int{unix.AF_INET, unix.AF_INET}, inMap: "both", admission: map[string]uint64{"admit_pod": 2}},
		{name: "pod-pod v6", lns: n.a, lnet: "tcp6", laddr: ap(n.a6), dns: n.b, dnet: "tcp6", local: ap(n.b6),
			wantFamily: [2]int{unix.AF_INET6, unix.AF_INET6}, inMap: "both", admission: map[string]uint64{"admit_pod": 2}},
		{name: "pod-pod v4-mapped: AF_INET6 listener, AF_INET client", lns: n.a, lnet: "tcp", laddr: "[::]:0", dhost: n.podA.String(),
			dns: n.b, dnet: "tcp4", local: ap(n.podB),
			wantFamily: [2]int{unix.AF_INET, unix.AF_INET6}, inMap: "both", admission: map[string]uint64{"admit_pod": 2}},
		{name: "loopback v4 in an enabled netns", lns: n.a, lnet: "tcp4", laddr: "127.0.0.1:0", dns: n.a, dnet: "tcp4",
			wantFamily: [2]int{unix.AF_INET, unix.AF_INET}, inMap: "both", keyNetns: n.ca, admission: map[string]uint64{"admit_loopback": 2}},
		{name: "loopback v6 in an enabled netns", lns: n.a, lnet: "tcp6", laddr: "[::1]:0", dns: n.a, dnet: "tcp6",
			wantFamily: [2]int{unix.AF_INET6, unix.AF_INET6}, inMap: "both", keyNetns: n.ca, admission: map[string]uint64{"admit_loopback": 2}},
		{name: "loopback v4-mapped in an enabled netns", lns: n.a, lnet: "tcp", laddr: "[::]:0", dhost: "127.0.0.1", dns: n.a, dnet: "tcp4",
			wantFamily: [2]int{unix.AF_INET, unix.AF_INET6}, inMap: "both", keyNetns: n.ca, admission: map[string]uint64{"admit_loopback": 2}},
		{name: "loopback in a netns that is not enabled", lns: n.b, lnet: "tcp4", laddr: "127.0.0.1:0", dns: n.b, dnet: "tcp4",
			wantFamily: [2]int{unix.AF_INET, unix.AF_INET}, inMap: "none", admission: map[string]uint64{"skip_not_enabled": 2}},
		{name: "intra-pod: 127.0.0.6 to the pod's own address", lns: n.a, lnet: "tcp4", laddr: ap(n.podA), dns: n.a, dnet: "tcp4", local: "127.0.0.6:0",
			wantFamily: [2]int{unix.AF_INET, unix.AF_INET}, inMap: "both", keyNetns: n.ca, admission: map[string]uint64{"admit_intrapod": 2}},
		{name: "intra-pod v6: ::1 to the pod's own address", lns: n.a, lnet: "tcp6", laddr: ap(n.a6), dns: n.a, dnet: "tcp6", local: "[::1]:0",
			wantFamily: [2]int{unix.AF_INET6, unix.AF_INET6}, inMap: "both", keyNetns: n.ca, admission: map[string]uint64{"admit_intrapod": 2}},
		{name: "intra-pod in a netns that is not enabled", lns: n.b, lnet: "tcp4", laddr: ap(n.podB), dns: n.b, dnet: "tcp4", local: "127.0.0.6:0",
			wantFamily: [2]int{unix.AF_INET, unix.AF_INET}, inMap: "none", admission: map[string]uint64{"skip_not_enabled": 2}},
		{name: "hostile intra-pod: loopback to another pod's address configured here", setup: enableB,
			// B holds C's address: 127.0.0.6 <-> C's address is not B's own pair
			lns: n.b, lnet: "tcp4", laddr: ap(n.victim), dns: n.b, dnet: "tcp4", local: "127.0.0.6:0",
			wantFamily: [2]int{unix.AF_INET, unix.AF_INET}, inMap: "none", admission: map[string]uint64{"skip_netns_mismatch": 2}},
		{name: "intra-pod: loopback to an address that is no pod's", setup: enableB,
			lns: n.b, lnet: "tcp4", laddr: ap(n.notPod), dns: n.b, dnet: "tcp4", local: "127.0.0.6:0",
			wantFamily: [2]int{unix.AF_INET, unix.AF_INET}, inMap: "none", admission: map[string]uint64{"skip_not_pod": 2}},
		{name: "impostor: B configured C's pod address", lns: n.a, lnet: "tcp4", laddr: ap(n.podA), dns: n.b, dnet: "tcp4", local: ap(n.victim),
			// A's socket qualifies (its peer's address is a pod's), B's never enters
			wantFamily: [2]int{unix.AF_INET, unix.AF_INET}, inMap: "server", admission: map[string]uint64{"admit_pod": 1, "skip_netns_mismatch": 1}},
		{name: "remote is not a pod", lns: n.a, lnet: "tcp4", laddr: ap(n.podA), dns: n.b, dnet: "tcp4", local: ap(n.notPod),
			wantFamily: [2]int{unix.AF_INET, unix.AF_INET}, inMap: "none", admission: map[string]uint64{"skip_not_pod": 2}},
		{name: "disabled pod", setup: func(t *testing.T) {
			if err := b.DeletePod(n.disabled); err != nil {
				t.Fatal(err)
			}
		}, lns: n.a, lnet: "tcp4", laddr: ap(n.podA), dns: n.b, dnet: "tcp4", local: ap(n.disabled),
			wantFamily: [2]int{unix.AF_INET, unix.AF_INET}, inMap: "none", admission: map[string]uint64{"skip_not_pod": 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.setup != nil {
				tc.setup(t)
			}
			before := metrics(t, b)
			c := p.connect(tc.lns, tc.lnet, tc.laddr, tc.dhost, tc.dns, tc.dnet, tc.local)
			if got := [2]int{c.clientFamily, c.serverFamily}; got != tc.wantFamily {
				t.Fatalf("socket families (client, server) %v, want %v: the row does not test what it says", got, tc.wantFamily)
			}
			var want []Conn
			cl := Conn{Local: c.clientAddr, Remote: c.serverAddr, Netns: tc.keyNetns}
			sv := Conn{Local: c.serverAddr, Remote: c.clientAddr, Netns: tc.keyNetns}
			switch tc.inMap {
			case "both":
				want = []Conn{cl, sv}
			case "server":
				want = []Conn{sv}
			}
			if got := connsOf(t, b, c); !slices.Equal(keys(got), sortConns(want)) {
				t.Errorf("map holds %v, want %v", got, want)
			}
			up := p.send(c.client, c.server, randBytes(t, 1), randBytes(t, 1000), randBytes(t, 30000))
			down := p.send(c.server, c.client, randBytes(t, 7), randBytes(t, 20000))
			d := metricsDelta(t, b, before)
			adm := map[string]uint64{}
			for _, k := range []string{"admit_pod", "admit_loopback", "admit_intrapod", "skip_not_pod", "skip_netns_mismatch", "skip_not_enabled", "insert_failed"} {
				if d[k] != 0 {
					adm[k] = d[k]
				}
			}
			if !maps.Equal(adm, tc.admission) {
				t.Errorf("admission counters moved by %v, want %v", adm, tc.admission)
			}
			switch tc.inMap {
			case "both": // every byte through the bypass, none through the stack
				if d["redirect_bytes"] != up+down || d["pass_bytes"] != 0 || d["redirect_msgs"] < 5 {
					t.Errorf("bypassed pair: redirect_bytes +%d (want %d), redirect_msgs +%d (want >= 5), pass_bytes +%d (want 0)",
						d["redirect_bytes"], up+down, d["redirect_msgs"], d["pass_bytes"])
				}
			case "server": // the server's first write finds no peer: it and the rest go through TCP
				if d["redirect_bytes"] != 0 || d["pass_no_peer"] != 1 || d["pass_bytes"] != down || d["pass_sticky"] < 1 {
					t.Errorf("one end in the map: redirect_bytes +%d (want 0), pass_no_peer +%d (want 1), pass_sticky +%d (want >= 1), pass_bytes +%d (want %d)",
						d["redirect_bytes"], d["pass_no_peer"], d["pass_sticky"], d["pass_bytes"], down)
				}
			}
			// the connection list: each socket's own counters and mode
			for _, x := range connsOf(t, b, c) {
				sent, isClient := down, x.Local == c.clientAddr
				if isClient {
					sent = up
				}
				want := Conn{Mode: "bypass", RedirectedBytes: sent}
				if tc.inMap == "server" {
					want = Conn{Mode: "stack", PassedBytes: sent}
				}
				if x.Cookie == 0 || x.Mode != want.Mode || x.RedirectedBytes != want.RedirectedBytes || x.PassedBytes != want.PassedBytes {
					t.Errorf("connection list entry %+v: want cookie != 0, mode %s, redirected %d, passed %d bytes",
						x, want.Mode, want.RedirectedBytes, want.PassedBytes)
				}
			}
			switch tc.inMap {
			case "both", "server":
			default: // sk_msg never ran
				if d["redirect_bytes"] != 0 || d["pass_bytes"] != 0 || d["redirect_msgs"] != 0 {
					t.Errorf("not admitted, yet sk_msg counted: %v", d)
				}
			}
			p.do(hreq{Op: "close", ID: c.client})
			p.do(hreq{Op: "close", ID: c.server})
			if got := connsOf(t, b, c); len(got) != 0 {
				t.Errorf("closed sockets still in the map: %v", got)
			}
		})
	}
}
