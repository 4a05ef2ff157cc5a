package sockmap

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/testutil"
)

// sidecarNet is three pod network namespaces: A (10.78.0.1) and B
// (10.78.0.2) joined by a veth pair, and D (10.78.0.3 on its loopback
// device), all admitted, loopback connections of each admitted too.
type sidecarNet struct {
	a, b, d          string
	ca, cb, cd       uint64
	podA, podB, podD netip.Addr
	a6, b6           netip.Addr // A's and B's IPv6 pod addresses
}

func newSidecarNet(t *testing.T, b *Bypass) sidecarNet {
	t.Helper()
	n := sidecarNet{
		a: dptest.NewNetns(t, "sca"), b: dptest.NewNetns(t, "scb"), d: dptest.NewNetns(t, "scd"),
		podA: netip.MustParseAddr("10.78.0.1"), podB: netip.MustParseAddr("10.78.0.2"), podD: netip.MustParseAddr("10.78.0.3"),
		a6: netip.MustParseAddr("fd00:78::1"), b6: netip.MustParseAddr("fd00:78::2"),
	}
	ca := dptest.NSConf(t, n.a)
	ca.Veth("a0", "", "b0", "", n.b)
	cb := dptest.NSConf(t, n.b)
	ca.Up("a0")
	cb.Up("b0")
	ca.Addr("a0", "10.78.0.1/24")
	cb.Addr("b0", "10.78.0.2/24")
	ca.Addr("a0", "fd00:78::1/64")
	cb.Addr("b0", "fd00:78::2/64")
	waitRoutable(t, n.a, n.b6)
	waitRoutable(t, n.b, n.a6)
	dptest.NSConf(t, n.d).Addr("lo", "10.78.0.3/32")
	for _, x := range []struct {
		ns string
		c  *uint64
		ip netip.Addr
	}{{n.a, &n.ca, n.podA}, {n.b, &n.cb, n.podB}, {n.d, &n.cd, n.podD}, {n.a, &n.ca, n.a6}, {n.b, &n.cb, n.b6}} {
		c, err := netnsutil.Cookie(netnsutil.Path(x.ns))
		if err != nil {
			t.Fatal(err)
		}
		*x.c = c
		if err := b.SetPod(x.ip, c); err != nil {
			t.Fatal(err)
		}
		if err := b.SetNetns(c); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

// nsRun runs a command in netns ns (ip netns exec) and fails the test with
// its output when it fails.
func nsRun(t *testing.T, ns string, args ...string) {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"netns", "exec", ns}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("in netns %s: %s: %v\n%s", ns, strings.Join(args, " "), err, out)
	}
}

// requireIptables skips when iptables or ip6tables (the nat table's
// REDIRECT) is not installed.
func requireIptables(t *testing.T) {
	t.Helper()
	for _, cmd := range []string{"iptables", "ip6tables"} {
		if _, err := exec.LookPath(cmd); err != nil {
			t.Skipf("%s is not installed (the sidecar tests redirect with netfilter; apt-get install iptables): %v", cmd, err)
		}
	}
}

// aliasKey is one alias key of axon_sock_alias or axon_sockmap_alias_poison,
// decoded (bpf/lib/sockmap.h: local = the client's address, lport its port,
// netns its netns, rport = AXON_SM_ALIAS_PORT | role, remote[0..1] the
// server's netns).
type aliasKey struct {
	Client      netip.AddrPort
	ClientNetns uint64
	Role        string
	ServerNetns uint64
}

func (k aliasKey) String() string {
	return fmt.Sprintf("%s(netns %d) %s@netns %d", k.Client, k.ClientNetns, k.Role, k.ServerNetns)
}

func decodeAlias(t *testing.T, k sockOpsSockmapKey) aliasKey {
	t.Helper()
	if k.Rport>>16 != 1 || k.Remote[2] != 0 || k.Remote[3] != 0 {
		t.Fatalf("not an alias key: %+v", k)
	}
	role := map[uint32]string{1: "client", 2: "server"}[k.Rport&0xffff]
	if role == "" {
		t.Fatalf("alias key with role %d: %+v", k.Rport&0xffff, k)
	}
	return aliasKey{
		Client: netip.AddrPortFrom(addrOf(k.Local), uint16(k.Lport)), ClientNetns: k.Netns, Role: role,
		ServerNetns: uint64(k.Remote[0]) | uint64(k.Remote[1])<<32,
	}
}

// aliasKeys lists the keys of m (axon_sock_alias or the poison map) that
// name client endpoint client (every key when client is invalid), sorted.
func aliasKeys(t *testing.T, m *ebpf.Map, client netip.AddrPort) []aliasKey {
	t.Helper()
	var (
		out  []aliasKey
		k    sockOpsSockmapKey
		next sockOpsSockmapKey
		cur  any
	)
	for steps := 0; ; steps++ {
		err := m.NextKey(cur, &next)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			break
		}
		if err != nil || steps > 100000 {
			t.Fatalf("walk %s: %v (%d steps)", m, err, steps)
		}
		if a := decodeAlias(t, next); !client.IsValid() || a.Client == client {
			out = append(out, a)
		}
		k = next
		cur = &k
	}
	slices.SortFunc(out, func(x, y aliasKey) int { return strings.Compare(x.String(), y.String()) })
	return out
}

func sortedAliases(ks ...aliasKey) []aliasKey {
	slices.SortFunc(ks, func(x, y aliasKey) int { return strings.Compare(x.String(), y.String()) })
	return ks
}

// connByEnds returns the connection list's entry of the socket with local
// end local and remote end remote (any remote when invalid).
func connByEnds(t *testing.T, b *Bypass, local, remote netip.AddrPort) (Conn, bool) {
	t.Helper()
	all, err := b.Conns()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range all {
		if c.Local == local && (!remote.IsValid() || c.Remote == remote) {
			return c, true
		}
	}
	return Conn{}, false
}

// A connection that a netfilter REDIRECT rewrote pairs through the alias
// keys: inbound (PREROUTING in the server's pod, to the incoming interface's
// address) and outbound (OUTPUT in the client's pod, to a local proxy on
// 127.0.0.1). Each socket's alias keys are the ones the header of
// bpf/lib/sockmap.h names, every byte is redirected, and the keys leave the
// map with the sockets.
func TestSidecarRedirectPairs(t *testing.T) {
	requireIptables(t)
	b, _, _, cgFD := loadTest(t, Config{})
	n := newSidecarNet(t, b)
	p := startSockProc(t, cgFD)
	for _, ipt := range []string{"iptables", "ip6tables"} {
		nsRun(t, n.b, ipt, "-w", "-t", "nat", "-A", "PREROUTING", "-p", "tcp", "--dport", "8080", "-j", "REDIRECT", "--to-ports", "15006")
		nsRun(t, n.a, ipt, "-w", "-t", "nat", "-A", "OUTPUT", "-p", "tcp", "--dport", "9090", "-j", "REDIRECT", "--to-ports", "15001")
	}

	for _, tc := range []struct {
		name           string
		net            string
		lns, laddr     string // the proxy's listener
		dial, local    string // the address the application dials from A, and binds
		serverNetns    uint64
		serverAdmitted string
	}{
		{name: "inbound: PREROUTING REDIRECT to podB:15006", net: "tcp4", lns: n.b, laddr: "10.78.0.2:15006",
			dial: "10.78.0.2:8080", local: "10.78.0.1:0", serverNetns: n.cb, serverAdmitted: "admit_pod"},
		{name: "outbound: OUTPUT REDIRECT to 127.0.0.1:15001", net: "tcp4", lns: n.a, laddr: "127.0.0.1:15001",
			dial: "10.78.0.2:9090", local: "10.78.0.1:0", serverNetns: n.ca, serverAdmitted: "admit_intrapod"},
		{name: "inbound v6: PREROUTING REDIRECT to [podB]:15006", net: "tcp6", lns: n.b, laddr: "[fd00:78::2]:15006",
			dial: "[fd00:78::2]:8080", local: "[fd00:78::1]:0", serverNetns: n.cb, serverAdmitted: "admit_pod"},
		{name: "outbound v6: OUTPUT REDIRECT to [::1]:15001", net: "tcp6", lns: n.a, laddr: "[::1]:15001",
			dial: "[fd00:78::2]:9090", local: "[fd00:78::1]:0", serverNetns: n.ca, serverAdmitted: "admit_intrapod"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := metrics(t, b)
			ln := p.do(hreq{Op: "listen", Netns: tc.lns, Net: tc.net, Addr: tc.laddr})
			cl := p.do(hreq{Op: "dial", Netns: n.a, Net: tc.net, Addr: tc.dial, Local: tc.local})
			sv := p.do(hreq{Op: "accept", ID: ln.ID})
			p.do(hreq{Op: "closeln", ID: ln.ID})
			client := mustAP(t, cl.Local)
			if got := mustAP(t, sv.Remote); got != client {
				t.Fatalf("the proxy accepted %s, want the client %s: the REDIRECT did not happen as the row says", got, client)
			}
			if got, want := mustAP(t, cl.Remote), netip.MustParseAddrPort(tc.dial); got != want {
				t.Fatalf("client's remote %s, want %s", got, want)
			}
			// every socket's alias keys
			want := sortedAliases(
				aliasKey{Client: client, ClientNetns: n.ca, Role: "client", ServerNetns: n.ca},
				aliasKey{Client: client, ClientNetns: n.ca, Role: "client", ServerNetns: n.cb},
				aliasKey{Client: client, ClientNetns: n.ca, Role: "server", ServerNetns: tc.serverNetns},
			)
			if got := aliasKeys(t, b.ops.AxonSockAlias, client); !slices.Equal(got, want) {
				t.Fatalf("alias keys of %s: %v, want %v", client, got, want)
			}
			var sent [2]uint64
			for i := range 4 {
				sent[0] += p.send(cl.ID, sv.ID, randBytes(t, 1+i*20000))
				sent[1] += p.send(sv.ID, cl.ID, randBytes(t, 7+i*10000))
			}
			d := metricsDelta(t, b, before)
			if d["alias_paired"] != 2 || d["redirect_bytes"] != sent[0]+sent[1] || d["pass_bytes"] != 0 ||
				d["admit_pod"]+d["admit_intrapod"] != 2 || d[tc.serverAdmitted] < 1 || d["alias_collision"] != 0 {
				t.Fatalf("counters moved by %v; want alias_paired 2, redirect_bytes %d, nothing passed, %s for the proxy's socket",
					d, sent[0]+sent[1], tc.serverAdmitted)
			}
			for i, local := range []netip.AddrPort{client, mustAP(t, sv.Local)} {
				c, ok := connByEnds(t, b, local, netip.AddrPort{})
				if !ok || c.Mode != "bypass" || !c.Alias || c.RedirectedBytes != sent[i] || c.PassedBytes != 0 {
					t.Errorf("socket %s: %+v (in map %v); want mode bypass paired by alias, %d bytes redirected", local, c, ok, sent[i])
				}
			}
			p.do(hreq{Op: "close", ID: cl.ID})
			p.do(hreq{Op: "close", ID: sv.ID})
			if got := aliasKeys(t, b.ops.AxonSockAlias, client); len(got) != 0 {
				t.Fatalf("closed sockets' alias keys still in %s: %v", MapSockAlias, got)
			}
		})
	}
}

// A third pod cannot take a connection by claiming its client endpoint: D
// configures A's address in its own netns and accepts a connection "from"
// A's endpoint there, so its accepted socket is admitted (its local address
// is D's own, its remote an admitted pod's) and claims the server alias of
// A's endpoint. A then opens a connection from that very endpoint whose peer
// is not in the map (the server is not under the cgroup), so A's first
// write tries the alias keys: D's claim names server netns D, which A never
// looks up (its own netns, or B's: the owner of the address it dialled).
// A's bytes reach B only, D's reach D's own client only, both through TCP.
func TestSidecarAliasHostileThirdPod(t *testing.T) {
	b, _, _, cgFD := loadTest(t, Config{})
	n := newSidecarNet(t, b)
	p := startSockProc(t, cgFD)
	dptest.NSConf(t, n.d).Addr("lo", "10.78.0.1/32") // D's impostor copy of A's address
	const clientPort = 41234
	client := netip.AddrPortFrom(n.podA, clientPort)

	// D's forged connection: accepted by D's pod address, from A's endpoint
	before := metrics(t, b)
	dc := p.connect(n.d, "tcp4", "10.78.0.3:0", "", n.d, "tcp4", client.String())
	if dc.clientAddr != client {
		t.Fatalf("D's forged client is %s, want %s", dc.clientAddr, client)
	}
	d := metricsDelta(t, b, before)
	if d["admit_pod"] != 1 || d["skip_netns_mismatch"] != 1 {
		t.Fatalf("D's forged pair: counters %v; want its server admitted (admit_pod 1) and its client refused (skip_netns_mismatch 1)", d)
	}
	claim := aliasKey{Client: client, ClientNetns: n.ca, Role: "server", ServerNetns: n.cd}
	if got := aliasKeys(t, b.ops.AxonSockAlias, client); !slices.Equal(got, []aliasKey{claim}) {
		t.Fatalf("alias keys of %s: %v; want D's claim %v (the case this test is about)", client, got, []aliasKey{claim})
	}

	// A's connection to B from the same endpoint; B's end is outside the
	// cgroup: A's exact peer key misses
	var lnB net.Listener
	if err := netnsutil.Do(n.b, func() (err error) {
		lnB, err = net.Listen("tcp4", "10.78.0.2:0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer lnB.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := lnB.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	ac := p.do(hreq{Op: "dial", Netns: n.a, Net: "tcp4", Addr: lnB.Addr().String(), Local: client.String()})
	var bc net.Conn
	select {
	case bc = <-accepted:
	case <-time.After(testutil.Stretch(t, 5*time.Second)):
		t.Fatal("B did not accept A's connection")
	}
	if bc == nil {
		t.Fatal("B's accept failed")
	}
	defer bc.Close()
	before = metrics(t, b)
	msgA := randBytes(t, 5000)
	if w := p.do(hreq{Op: "write", ID: ac.ID, Data: msgA}); w.N != len(msgA) {
		t.Fatalf("A wrote %d bytes", w.N)
	}
	if got := readFull(t, bc, len(msgA)); string(got) != string(msgA) {
		t.Fatalf("B read %d bytes that differ from the %d A wrote", len(got), len(msgA))
	}
	// D's server writes to "A": D's own client gets it (TCP), A nothing
	msgD := []byte("D speaking")
	p.send(dc.server, dc.client, msgD)
	msgB := []byte("B speaking")
	if _, err := bc.Write(msgB); err != nil {
		t.Fatal(err)
	}
	if r := p.do(hreq{Op: "read", ID: ac.ID, N: len(msgB)}); string(r.Data) != string(msgB) {
		t.Fatalf("A read %q, want only B's %q", r.Data, msgB)
	}
	d = metricsDelta(t, b, before)
	if d["alias_paired"] != 0 || d["redirect_bytes"] != 0 || d["pass_no_peer"] != 2 ||
		d["pass_bytes"] != uint64(len(msgA)+len(msgD)) {
		t.Fatalf("counters moved by %v; want no alias pairing, nothing redirected, A's and D's first writes through TCP (pass_no_peer 2, pass_bytes %d)",
			d, len(msgA)+len(msgD))
	}
	for _, local := range []netip.AddrPort{client, dc.serverAddr} {
		if c, ok := connByEnds(t, b, local, netip.AddrPort{}); !ok || c.Mode != "stack" || c.RedirectedBytes != 0 {
			t.Errorf("socket %s: %+v (in map %v); want mode stack, nothing redirected", local, c, ok)
		}
	}
}

// Two sockets on one client endpoint (SO_REUSEADDR, two destinations) claim
// the same alias keys: every contested key is poisoned and removed, so the
// connection that needs an alias (REDIRECTed in B) is never paired, and
// takes the stack, while the other pairs by its exact key. The sockets stay
// in axon_sock_hash, and every byte arrives.
func TestSidecarAliasCollision(t *testing.T) {
	requireIptables(t)
	b, _, _, cgFD := loadTest(t, Config{})
	n := newSidecarNet(t, b)
	p := startSockProc(t, cgFD)
	nsRun(t, n.b, "iptables", "-w", "-t", "nat", "-A", "PREROUTING", "-p", "tcp", "--dport", "8080", "-j", "REDIRECT", "--to-ports", "15006")
	const clientPort = 41235
	client := netip.AddrPortFrom(n.podA, clientPort)
	before := metrics(t, b)

	lnR := p.do(hreq{Op: "listen", Netns: n.b, Net: "tcp4", Addr: "10.78.0.2:15006"})
	lnX := p.do(hreq{Op: "listen", Netns: n.b, Net: "tcp4", Addr: "10.78.0.2:8081"})
	c1 := p.do(hreq{Op: "dial", Netns: n.a, Net: "tcp4", Addr: "10.78.0.2:8080", Local: client.String(), Reuse: true})
	s1 := p.do(hreq{Op: "accept", ID: lnR.ID})
	c2 := p.do(hreq{Op: "dial", Netns: n.a, Net: "tcp4", Addr: "10.78.0.2:8081", Local: client.String(), Reuse: true})
	s2 := p.do(hreq{Op: "accept", ID: lnX.ID})
	if c1.Local != c2.Local || mustAP(t, c1.Local) != client {
		t.Fatalf("both connections must share the client endpoint %s: %s, %s", client, c1.Local, c2.Local)
	}
	d := metricsDelta(t, b, before)
	if d["admit_pod"] != 4 || d["alias_collision"] != 3 {
		t.Fatalf("counters moved by %v; want 4 sockets admitted and 3 collisions (the client keys for server netns A and B, the server key in B)", d)
	}
	if got := aliasKeys(t, b.ops.AxonSockAlias, client); len(got) != 0 {
		t.Fatalf("contested alias keys still in %s: %v", MapSockAlias, got)
	}
	wantPoison := sortedAliases(
		aliasKey{Client: client, ClientNetns: n.ca, Role: "client", ServerNetns: n.ca},
		aliasKey{Client: client, ClientNetns: n.ca, Role: "client", ServerNetns: n.cb},
		aliasKey{Client: client, ClientNetns: n.ca, Role: "server", ServerNetns: n.cb},
	)
	if got := aliasKeys(t, b.ops.AxonSockmapAliasPoison, client); !slices.Equal(got, wantPoison) {
		t.Fatalf("poisoned keys %v, want %v", got, wantPoison)
	}

	before = metrics(t, b)
	var viaStack, viaBypass uint64
	viaStack += p.send(c1.ID, s1.ID, randBytes(t, 3000))
	viaStack += p.send(s1.ID, c1.ID, randBytes(t, 4000))
	viaBypass += p.send(c2.ID, s2.ID, randBytes(t, 5000))
	viaBypass += p.send(s2.ID, c2.ID, randBytes(t, 6000))
	d = metricsDelta(t, b, before)
	// the REDIRECTed pair's first writes: the client's lookup of the server
	// key in B and the server's of the client key for B find them poisoned
	// (the client's lookup of a server in A finds nothing: no proxy there)
	if d["alias_paired"] != 0 || d["alias_poisoned"] != 2 || d["pass_bytes"] != viaStack || d["redirect_bytes"] != viaBypass {
		t.Fatalf("counters moved by %v; want alias_poisoned 2, alias_paired 0, pass_bytes %d (the REDIRECTed pair), redirect_bytes %d (the exact pair)",
			d, viaStack, viaBypass)
	}
	for _, x := range []struct {
		s    hresp
		mode string
	}{{c1, "stack"}, {s1, "stack"}, {c2, "bypass"}, {s2, "bypass"}} {
		if c, ok := connByEnds(t, b, mustAP(t, x.s.Local), mustAP(t, x.s.Remote)); !ok || c.Mode != x.mode {
			t.Errorf("socket %s -> %s: %+v (in map %v); want mode %s", x.s.Local, x.s.Remote, c, ok, x.mode)
		}
	}
}
