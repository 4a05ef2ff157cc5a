package bypass

// The sidecar chain (`axon lab bench sockmap --chain`): each bench pod gets
// an HAProxy sidecar wired the way a service mesh wires its proxy, so a
// request takes three TCP connections on the node:
//
//	client pod                                  server pod
//	app ──(1)──▶ proxy :15001 ──(2)──▶ proxy :15006 ──(3)──▶ app
//	   nat OUTPUT REDIRECT        nat PREROUTING REDIRECT    127.0.0.1
//
// hop 1: loopback inside the client pod after REDIRECT (the app's socket
// still names the server pod's address); hop 2: pod to pod, the server
// pod's end on the REDIRECT port; hop 3: loopback inside the server pod.
// The client proxy finds where the app wanted to go by SO_ORIGINAL_DST
// (HAProxy's `server 0.0.0.0:0`); the server proxy forwards to the same
// port on 127.0.0.1 (`server 127.0.0.1:0`). The proxies run under their own
// uid and gid (ProxyUID), and the client pod's OUTPUT rule lets the proxy's
// own connections through by `-m owner`, as Istio does with uid 1337.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/bench"
	"github.com/axonhq/axon/internal/lab"
	"github.com/axonhq/axon/internal/netnsutil"
)

// The sidecars' ports and identity.
const (
	// OutboundPort is the client proxy's port: the client pod's outgoing TCP
	// is redirected to 127.0.0.1:OutboundPort (Istio's 15001).
	OutboundPort = 15001
	// InboundPort is the server proxy's port: TCP arriving at the server pod
	// is redirected to it (Istio's 15006).
	InboundPort = 15006
	// ProxyUID is the uid and gid the proxies run under: the client pod's
	// OUTPUT rule exempts this owner, so the proxy's own connections are not
	// redirected back to itself.
	ProxyUID = 1337
)

// Hop names of the chain, in order.
const (
	HopAppProxy   = "1 app → client proxy"
	HopProxyProxy = "2 client proxy → server proxy"
	HopProxyApp   = "3 server proxy → app"
)

// Hops are the chain's hops in order.
var Hops = []string{HopAppProxy, HopProxyProxy, HopProxyApp}

// Chain defaults: latency at DefaultChainSizes, throughput at
// DefaultChainBWSizes.
var (
	DefaultChainSizes   = []int{1, 64, 1024, 16384}
	DefaultChainBWSizes = []int{64, 16384}
)

// haproxyConfig is the sidecar's configuration: TCP mode, one thread, no
// splice (where the kernel has no splice guard, splice(2) from a bypassed
// socket loses the redirected bytes; HAProxy splices only when told to, and
// nosplice makes sure), dropping root to ProxyUID after binding. The client
// proxy (outbound) listens on 127.0.0.1:OutboundPort and connects to the
// original destination; the server proxy (inbound) listens on
// InboundPort and connects to the original port on 127.0.0.1.
func haproxyConfig(outbound bool) string {
	bind, server := fmt.Sprintf("0.0.0.0:%d", InboundPort), "127.0.0.1:0"
	name := "inbound"
	if outbound {
		bind, server, name = fmt.Sprintf("127.0.0.1:%d", OutboundPort), "0.0.0.0:0", "outbound"
	}
	return fmt.Sprintf(`# axon lab bench sockmap --chain: the %[1]s sidecar
global
    nbthread 1
    nosplice
    uid %[4]d
    gid %[4]d
defaults
    mode tcp
    timeout connect 5s
    timeout client 10m
    timeout server 10m
frontend %[1]s
    bind %[2]s
    default_backend %[1]s_dst
backend %[1]s_dst
    # port 0: the port the client connected to (SO_ORIGINAL_DST after REDIRECT)
    server dst %[3]s
`, name, bind, server, ProxyUID)
}

// iptablesRules are the nat rules of a sidecar's pod, as iptables
// arguments (each run as `iptables -w -t nat ARGS...` in the pod's netns).
func iptablesRules(outbound bool) [][]string {
	if outbound {
		return [][]string{
			{"-A", "OUTPUT", "-p", "tcp", "-m", "owner", "--uid-owner", strconv.Itoa(ProxyUID), "-j", "RETURN"},
			{"-A", "OUTPUT", "-p", "tcp", "-d", "127.0.0.0/8", "-j", "RETURN"},
			{"-A", "OUTPUT", "-p", "tcp", "-j", "REDIRECT", "--to-ports", strconv.Itoa(OutboundPort)},
		}
	}
	return [][]string{
		{"-A", "PREROUTING", "-p", "tcp", "-j", "REDIRECT", "--to-ports", strconv.Itoa(InboundPort)},
	}
}

// ChainInfo is how the chain was set up, for the report.
type ChainInfo struct {
	Proxy        string   `json:"proxy"` // haproxy -v's first line
	ClientRules  []string `json:"clientRules"`
	ServerRules  []string `json:"serverRules"`
	ClientConfig string   `json:"clientConfig"`
	ServerConfig string   `json:"serverConfig"`
	ClientCmd    string   `json:"clientProxyCommand"`
	ServerCmd    string   `json:"serverProxyCommand"`
	// OrigDst is the check before the measurements: a connection from the
	// client pod to each of two server pod ports, through both proxies,
	// reached the listener of that port.
	OrigDst []OrigDstCheck `json:"origDst"`
}

// OrigDstCheck is one connection of the original-destination check.
type OrigDstCheck struct {
	Dial  netip.AddrPort `json:"dial"`  // what the client pod connected to
	Reply string         `json:"reply"` // what came back ("" on error)
	// Peer is the connection's remote end as the server's listener saw it:
	// on 127.0.0.1 when it came through the server proxy.
	Peer netip.AddrPort `json:"peer"`
	Err  string         `json:"error,omitempty"`
}

// OK reports whether the reply names the port dialled and came through the
// server proxy (a loopback peer).
func (c OrigDstCheck) OK() bool {
	return c.Err == "" && c.Reply == origDstReply(c.Dial.Port()) && c.Peer.Addr().IsLoopback()
}

// origDstReply is what the check's listener on port answers.
func origDstReply(port uint16) string { return "port " + strconv.Itoa(int(port)) }

// origDstPorts are the two server ports of the original-destination check.
var origDstPorts = []uint16{19801, 19802}

// chain is the running sidecars of a benchmark.
type chain struct {
	dir     string
	proxies []*bench.Server
	// undo deletes the nat rules added so far (argv each), so that pods kept
	// after the run (--keep-pods) are not left redirecting to no proxy
	undo   [][]string
	info   ChainInfo
	client chainPod
	server chainPod
}

// chainPod is a bench pod with its netns cookie (loopback keys carry it).
type chainPod struct {
	lab.Pod
	cookie uint64
}

// startChain sets up both sidecars: nat rules in the two pods' netns and an
// HAProxy in each pod's cgroup and netns, the client proxy pinned to
// clientCPU and the server proxy to serverCPU (each with its pod's app).
// Configuration files go to a temp dir. On error what was started is
// stopped; the rules go with the pods.
func startChain(ctx context.Context, tools map[string]string, client, server lab.Pod, clientCPU, serverCPU int) (*chain, error) {
	haproxy := tools["haproxy"]
	dir, err := os.MkdirTemp("", "axon-bench-chain-")
	if err != nil {
		return nil, fmt.Errorf("temp dir for the sidecars' configuration: %w", err)
	}
	c := &chain{dir: dir}
	c.info.Proxy = firstLineOf(runQuiet(ctx, haproxy, "-v"))
	for _, side := range []struct {
		pod      lab.Pod
		outbound bool
		cpu      int
		into     *chainPod
	}{{client, true, clientCPU, &c.client}, {server, false, serverCPU, &c.server}} {
		cookie, err := netnsutil.Cookie(netnsutil.Path(side.pod.Netns))
		if err != nil {
			c.stop()
			return nil, fmt.Errorf("netns cookie of pod %s: %w", side.pod.Name, err)
		}
		*side.into = chainPod{side.pod, cookie}
		var rules []string
		for _, r := range iptablesRules(side.outbound) {
			argv := append([]string{tools["nsenter"], "--net=" + netnsutil.Path(side.pod.Netns), tools["iptables"], "-w", "-t", "nat"}, r...)
			if out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput(); err != nil {
				c.stop()
				return nil, fmt.Errorf("nat rule in pod %s (%s): %w: %s (the kernel needs nf_nat, xt_REDIRECT and xt_owner)",
					side.pod.Name, bench.ShellQuote(argv), err, strings.TrimSpace(string(out)))
			}
			rules = append(rules, "iptables -t nat "+strings.Join(r, " "))
			del := slices.Clone(argv)
			del[slices.Index(del, "-A")] = "-D"
			c.undo = append(c.undo, del)
		}
		cfg := haproxyConfig(side.outbound)
		name := "inbound.cfg"
		if side.outbound {
			name = "outbound.cfg"
		}
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
			c.stop()
			return nil, fmt.Errorf("write %s: %w", path, err)
		}
		argv := []string{tools["nsenter"], "--net=" + netnsutil.Path(side.pod.Netns), tools["taskset"], "-c", strconv.Itoa(side.cpu),
			haproxy, "-db", "-f", path}
		listen, port := netip.MustParseAddr("0.0.0.0"), InboundPort
		if side.outbound {
			listen, port = netip.MustParseAddr("127.0.0.1"), OutboundPort
		}
		srv, err := bench.StartServer(context.WithoutCancel(ctx), side.pod.Cgroup, argv, listen, port, 10*time.Second)
		if err != nil {
			c.stop()
			return nil, fmt.Errorf("sidecar of pod %s: %w", side.pod.Name, err)
		}
		c.proxies = append(c.proxies, srv)
		if side.outbound {
			c.info.ClientRules, c.info.ClientConfig, c.info.ClientCmd = rules, cfg, bench.ShellQuote(argv)
		} else {
			c.info.ServerRules, c.info.ServerConfig, c.info.ServerCmd = rules, cfg, bench.ShellQuote(argv)
		}
	}
	return c, nil
}

// stop ends the proxies by PID, deletes the nat rules (the pods may be
// kept) and removes the configuration. It returns what it could not undo.
func (c *chain) stop() error {
	for _, p := range c.proxies {
		p.Stop()
	}
	c.proxies = nil
	var errs []error
	for _, argv := range c.undo {
		if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w: %s", bench.ShellQuote(argv), err, strings.TrimSpace(string(out))))
		}
	}
	c.undo = nil
	return errors.Join(append(errs, os.RemoveAll(c.dir))...)
}

// alive reports a proxy that exited.
func (c *chain) alive() error {
	for i, p := range c.proxies {
		if p.Exited() {
			return fmt.Errorf("the %s sidecar (PID %d) exited", [2]string{"client", "server"}[i], p.PID())
		}
	}
	return nil
}

// checkOrigDst connects from the client pod to two ports of the server pod,
// through both proxies, and records what each port's listener answered and
// from where it saw the connection. The listeners and the dialling sockets
// are the bench's own (not in a pod's cgroup, so the bypass never sees
// them): the check is about the proxies and the nat rules.
func (c *chain) checkOrigDst(ctx context.Context) ([]OrigDstCheck, error) {
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	peers := make([]chan netip.AddrPort, len(origDstPorts))
	for i, port := range origDstPorts {
		var ln net.Listener
		err := netnsutil.Do(c.server.Netns, func() (err error) {
			ln, err = net.Listen("tcp4", fmt.Sprintf("0.0.0.0:%d", port))
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("original-destination check: listen on port %d in pod %s: %w", port, c.server.Name, err)
		}
		lns = append(lns, ln)
		peers[i] = make(chan netip.AddrPort, 1)
		go func() {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			defer conn.Close()
			peers[i] <- conn.RemoteAddr().(*net.TCPAddr).AddrPort()
			_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
			_, _ = io.WriteString(conn, origDstReply(port)+"\n")
			_, _ = io.Copy(io.Discard, conn) // until the client closes
		}()
	}
	var out []OrigDstCheck
	for i, port := range origDstPorts {
		chk := OrigDstCheck{Dial: netip.AddrPortFrom(c.server.IP, port)}
		var conn net.Conn
		err := netnsutil.Do(c.client.Netns, func() (err error) {
			d := net.Dialer{Timeout: 5 * time.Second}
			conn, err = d.DialContext(ctx, "tcp4", chk.Dial.String())
			return err
		})
		if err == nil {
			_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
			var line string
			line, err = bufio.NewReader(conn).ReadString('\n')
			chk.Reply = strings.TrimSpace(line)
			conn.Close()
		}
		if err != nil {
			chk.Err = err.Error()
		}
		select {
		case chk.Peer = <-peers[i]:
		case <-time.After(time.Second):
		}
		out = append(out, chk)
	}
	var errs []error
	for _, chk := range out {
		if !chk.OK() {
			errs = append(errs, fmt.Errorf("%s: reply %q from %s, want %q from 127.0.0.1 (through the server proxy): %s",
				chk.Dial, chk.Reply, chk.Peer, origDstReply(chk.Dial.Port()), chk.Err))
		}
	}
	if len(errs) > 0 {
		return out, fmt.Errorf("original-destination check through the sidecars failed: %w", errors.Join(errs...))
	}
	return out, nil
}

// HopSocket is one established TCP socket of the bench pods during a chain
// measurement, with the hop it belongs to and what the SOCKHASH says of it.
type HopSocket struct {
	Hop    string         `json:"hop"`
	Pod    string         `json:"pod"`
	Proxy  bool           `json:"proxy"` // the sidecar's socket (uid ProxyUID), else the app's
	Local  netip.AddrPort `json:"local"`
	Remote netip.AddrPort `json:"remote"`
	// InMap: the socket is in the SOCKHASH; Mode and the byte counters are
	// its (see api.SockmapConn).
	InMap bool   `json:"inMap"`
	Mode  string `json:"mode,omitempty"`
	// Alias: it found its peer by its connection's client endpoint (the
	// pairing across a REDIRECT), not by the reversed tuple.
	Alias           bool   `json:"alias,omitempty"`
	RedirectedBytes uint64 `json:"redirectedBytes,omitempty"`
	PassedBytes     uint64 `json:"passedBytes,omitempty"`
}

// tcpEstablished is TCP_ESTABLISHED in sock_diag's state field.
const tcpEstablished = 1

// diagSocket is a TCP socket as sock_diag shows it.
type diagSocket struct {
	local, remote netip.AddrPort
	uid           uint32
}

// hopOf names the hop of an established socket of the client pod
// (client) or the server pod, from its owner and local port.
func hopOf(client bool, s diagSocket) string {
	proxy := s.uid == ProxyUID
	switch {
	case client && !proxy:
		return HopAppProxy // the app's connection, redirected to the client proxy
	case client && s.local.Port() == OutboundPort:
		return HopAppProxy // the client proxy's accepted end
	case client:
		return HopProxyProxy // the client proxy's connection to the original destination
	case proxy && s.local.Port() == InboundPort:
		return HopProxyProxy // the server proxy's accepted end
	case proxy:
		return HopProxyApp // the server proxy's connection to the app
	default:
		return HopProxyApp // the app's accepted end
	}
}

// classify joins the pods' sockets with the SOCKHASH's entries: a socket is
// in the map when an entry has its tuple (pod to pod: netns 0; loopback:
// the pod's netns cookie).
func classify(client, server chainPod, clientSocks, serverSocks []diagSocket, conns []api.SockmapConn) []HopSocket {
	type key struct {
		local, remote netip.AddrPort
		netns         uint64
	}
	inMap := map[key]api.SockmapConn{}
	for _, c := range conns {
		inMap[key{unmapAP(c.Local), unmapAP(c.Remote), c.Netns}] = c
	}
	var out []HopSocket
	for _, side := range []struct {
		pod   chainPod
		socks []diagSocket
	}{{client, clientSocks}, {server, serverSocks}} {
		for _, s := range side.socks {
			h := HopSocket{Hop: hopOf(side.pod.Name == client.Name, s), Pod: side.pod.Name, Proxy: s.uid == ProxyUID,
				Local: s.local, Remote: s.remote}
			c, ok := inMap[key{s.local, s.remote, 0}]
			if !ok {
				c, ok = inMap[key{s.local, s.remote, side.pod.cookie}]
			}
			if ok {
				h.InMap, h.Mode, h.Alias, h.RedirectedBytes, h.PassedBytes = true, c.Mode, c.Alias, c.RedirectedBytes, c.PassedBytes
			}
			out = append(out, h)
		}
	}
	return out
}

func unmapAP(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// podSockets lists the established TCP sockets of a pod's netns (both
// families) with their owners, by sock_diag.
func podSockets(netns string) ([]diagSocket, error) {
	var out []diagSocket
	err := netnsutil.Do(netns, func() error {
		h, err := netlink.NewHandle(unix.NETLINK_INET_DIAG)
		if err != nil {
			return fmt.Errorf("sock_diag handle: %w", err)
		}
		defer h.Close()
		for _, fam := range []uint8{unix.AF_INET, unix.AF_INET6} {
			socks, err := h.SocketDiagTCP(fam)
			if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
				return fmt.Errorf("sock_diag dump: %w", err)
			}
			for _, s := range socks {
				if s.State != tcpEstablished {
					continue
				}
				l, _ := netip.AddrFromSlice(s.ID.Source)
				r, _ := netip.AddrFromSlice(s.ID.Destination)
				out = append(out, diagSocket{netip.AddrPortFrom(l.Unmap(), s.ID.SourcePort),
					netip.AddrPortFrom(r.Unmap(), s.ID.DestinationPort), s.UID})
			}
		}
		return nil
	})
	return out, err
}

// quiesce waits (up to wait) until the pods hold no established TCP
// socket: the previous measurement's connections, which the proxies close
// after the app, are gone and cannot write into the next one's counters.
func (c *chain) quiesce(ctx context.Context, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		cs, err := podSockets(c.client.Netns)
		if err != nil {
			return err
		}
		ss, err := podSockets(c.server.Netns)
		if err != nil {
			return err
		}
		if len(cs)+len(ss) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d sockets of the previous measurement still open after %s", len(cs)+len(ss), wait)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// snapshot lists the chain's sockets now, with what the SOCKHASH holds.
func (c *chain) snapshot(ctx context.Context, sw switcher) ([]HopSocket, error) {
	cs, err := podSockets(c.client.Netns)
	if err != nil {
		return nil, fmt.Errorf("sockets of pod %s: %w", c.client.Name, err)
	}
	ss, err := podSockets(c.server.Netns)
	if err != nil {
		return nil, fmt.Errorf("sockets of pod %s: %w", c.server.Name, err)
	}
	conns, err := sw.conns(ctx)
	if err != nil {
		return nil, err
	}
	return classify(c.client, c.server, cs, ss, conns), nil
}

// runQuiet runs argv and returns its combined output ("" on error).
func runQuiet(ctx context.Context, argv ...string) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		return ""
	}
	return string(out)
}

func firstLineOf(s string) string {
	head, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(head)
}
