package sockmap

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/axonhq/axon/internal/testutil"
)

// haproxyPath is Debian's haproxy package's binary.
const haproxyPath = "/usr/sbin/haproxy"

// proxyUID is the uid and gid the sidecar proxies run as: the outbound
// REDIRECT rule skips their own connections by it (-m owner), as a mesh
// skips its proxy's.
const proxyUID = 65534

// startHAProxy writes cfg into a temporary directory and runs haproxy in
// netns ns, in the cgroup of directory fd cgFD (the bypass sees its
// sockets), until the test ends (killed by its PID). It returns once the
// proxy listens on port.
func startHAProxy(t *testing.T, ns string, cgFD int, name, cfg string, port uint16) {
	t.Helper()
	path := filepath.Join(t.TempDir(), name+".cfg")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", ns, haproxyPath, "-db", "-f", path)
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: cgFD}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("start haproxy %s: %v", name, err)
	}
	pid := cmd.Process.Pid
	t.Cleanup(func() {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		_ = cmd.Wait()
		cancel()
		if t.Failed() {
			t.Logf("haproxy %s (pid %d) output:\n%s", name, pid, out.String())
		}
	})
	// listening: a LISTEN socket (state 0A) on port in the netns
	want := fmt.Sprintf(":%04X ", port)
	deadline := time.Now().Add(testutil.Stretch(t, 10*time.Second))
	for {
		for _, l := range strings.Split(dptest.NSConf(t, ns).ProcNet("tcp"), "\n") {
			f := strings.Fields(l)
			if len(f) > 3 && strings.HasSuffix(f[1]+" ", want) && f[3] == "0A" {
				return
			}
		}
		if cmd.ProcessState != nil || time.Now().After(deadline) {
			t.Fatalf("haproxy %s does not listen on port %d:\n%s", name, port, out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// haproxyConfig is a TCP proxy listening on bind and forwarding to server,
// running as proxyUID.
func haproxyConfig(bind, server string) string {
	return fmt.Sprintf(`global
	uid %d
	gid %d
	nbthread 1
	maxconn 64
defaults
	mode tcp
	timeout connect 5s
	timeout client 60s
	timeout server 60s
frontend sidecar
	bind %s
	default_backend upstream
backend upstream
	server upstream %s
`, proxyUID, proxyUID, bind, server)
}

// The sidecar chain with a real proxy, as a mesh lays it out (Istio's
// ports): in pod A an OUTPUT REDIRECT sends the application's TCP to HAProxy
// on 127.0.0.1:15001 (the proxy's own connections, by its uid, excepted),
// which connects to the original destination (SO_ORIGINAL_DST: server
// 0.0.0.0:0); in pod B a PREROUTING REDIRECT sends what arrives to HAProxy
// on 15006, which forwards to the application on 127.0.0.1 and the original
// port. Two applications in B (8080, 8081) send different data, so each
// answer proves the proxies used the right original destination. 1 MiB
// each way, checked byte for byte, first with both pods out of the bypass
// (the stack: nothing enters the map), then admitted: every hop's two
// sockets are in the SOCKHASH and each redirected exactly what it sent.
func TestSidecarHAProxyChain(t *testing.T) {
	requireIptables(t)
	if _, err := os.Stat(haproxyPath); err != nil {
		t.Skipf("HAProxy is not installed (%v): apt-get install haproxy", err)
	}
	b, _, _, cgFD := loadTest(t, Config{})
	n := newSidecarNet(t, b)
	p := startSockProc(t, cgFD)
	nsRun(t, n.a, "iptables", "-w", "-t", "nat", "-A", "OUTPUT", "-p", "tcp", "-d", "10.78.0.0/24",
		"-m", "owner", "!", "--uid-owner", fmt.Sprint(proxyUID), "-j", "REDIRECT", "--to-ports", "15001")
	nsRun(t, n.b, "iptables", "-w", "-t", "nat", "-A", "PREROUTING", "-p", "tcp", "-i", "b0", "-j", "REDIRECT", "--to-ports", "15006")
	startHAProxy(t, n.a, cgFD, "outbound", haproxyConfig("127.0.0.1:15001", "0.0.0.0:0"), 15001)
	startHAProxy(t, n.b, cgFD, "inbound", haproxyConfig("10.78.0.2:15006", "127.0.0.1:0"), 15006)

	withdraw := func(t *testing.T) {
		for _, ip := range []netip.Addr{n.podA, n.podB} {
			if err := b.DeletePod(ip); err != nil {
				t.Fatal(err)
			}
		}
		for _, ns := range []uint64{n.ca, n.cb} {
			if err := b.DeleteNetns(ns); err != nil {
				t.Fatal(err)
			}
		}
	}
	admit := func(t *testing.T) {
		for ip, ns := range map[netip.Addr]uint64{n.podA: n.ca, n.podB: n.cb} {
			if err := b.SetPod(ip, ns); err != nil {
				t.Fatal(err)
			}
			if err := b.SetNetns(ns); err != nil {
				t.Fatal(err)
			}
		}
	}
	const chunk, total = 32 << 10, 1 << 20
	for _, mode := range []string{"stack", "bypass"} {
		t.Run(mode, func(t *testing.T) {
			if mode == "stack" {
				withdraw(t)
				t.Cleanup(func() { admit(t) })
			}
			for _, port := range []uint16{8080, 8081} {
				before := metrics(t, b)
				app := p.do(hreq{Op: "listen", Netns: n.b, Net: "tcp4", Addr: fmt.Sprintf("127.0.0.1:%d", port)})
				dst := netip.AddrPortFrom(n.podB, port)
				cl := p.do(hreq{Op: "dial", Netns: n.a, Net: "tcp4", Addr: dst.String()})
				sv := p.do(hreq{Op: "accept", ID: app.ID}) // only through both proxies, to the original port
				p.do(hreq{Op: "closeln", ID: app.ID})
				tag := []byte(fmt.Sprintf("app %d says ", port))
				var up, down uint64
				for range total / chunk {
					up += p.send(cl.ID, sv.ID, randBytes(t, chunk))
					down += p.send(sv.ID, cl.ID, append(tag, randBytes(t, chunk-len(tag))...))
				}
				d := metricsDelta(t, b, before)
				client := mustAP(t, cl.Local)
				if mode == "stack" {
					if got := connsOfHost(t, b, client, mustAP(t, sv.Remote)); len(got) != 0 || d["redirect_bytes"] != 0 || d["alias_paired"] != 0 {
						t.Fatalf("pods withdrawn, yet the map holds %v and the counters moved by %v", got, d)
					}
				} else {
					checkChain(t, b, n, client, mustAP(t, sv.Local), mustAP(t, sv.Remote), up, down, d)
				}
				p.do(hreq{Op: "close", ID: cl.ID})
				p.do(hreq{Op: "close", ID: sv.ID})
			}
		})
	}
}

// connsOfHost lists the map's sockets of the chain of the application
// client endpoint client (hop 1, both ends), and of the inbound proxy's
// connection to the application, whose client end is proxyEnd (hop 3).
func connsOfHost(t *testing.T, b *Bypass, client, proxyEnd netip.AddrPort) []Conn {
	t.Helper()
	all, err := b.Conns()
	if err != nil {
		t.Fatal(err)
	}
	var out []Conn
	for _, c := range all {
		if c.Local == client || c.Remote == client || c.Local == proxyEnd || c.Remote == proxyEnd {
			out = append(out, c)
		}
	}
	return out
}

// checkChain finds the six sockets of the three hops in the connection list
// and checks that each is bypassed and redirected exactly what it sent: up
// bytes from the application in A to the one in B, down bytes back.
func checkChain(t *testing.T, b *Bypass, n sidecarNet, client, appB, proxyB netip.AddrPort, up, down uint64, d map[string]uint64) {
	t.Helper()
	all, err := b.Conns()
	if err != nil {
		t.Fatal(err)
	}
	find := func(hop string, match func(c Conn) bool) Conn {
		t.Helper()
		var got []Conn
		for _, c := range all {
			if match(c) {
				got = append(got, c)
			}
		}
		if len(got) != 1 {
			t.Fatalf("%s: %d sockets in the map match (%v); want 1. The map: %v", hop, len(got), got, all)
		}
		return got[0]
	}
	dst := netip.AddrPortFrom(n.podB, appB.Port())
	lo := netip.MustParseAddr("127.0.0.1")
	appA := find("hop 1, the application in A", func(c Conn) bool { return c.Local == client && c.Remote == dst && c.Netns == 0 })
	outAcc := find("hop 1, the outbound proxy's accepted socket", func(c Conn) bool {
		return c.Local == netip.AddrPortFrom(lo, 15001) && c.Remote == client && c.Netns == n.ca
	})
	outConn := find("hop 2, the outbound proxy's connection", func(c Conn) bool {
		return c.Local.Addr() == n.podA && c.Local != client && c.Remote == dst && c.Netns == 0
	})
	inAcc := find("hop 2, the inbound proxy's accepted socket", func(c Conn) bool {
		return c.Local == netip.AddrPortFrom(n.podB, 15006) && c.Remote == outConn.Local && c.Netns == 0
	})
	inConn := find("hop 3, the inbound proxy's connection", func(c Conn) bool { return c.Local == proxyB && c.Remote == appB && c.Netns == n.cb })
	app := find("hop 3, the application in B", func(c Conn) bool { return c.Local == appB && c.Remote == proxyB && c.Netns == n.cb })
	for _, x := range []struct {
		hop   string
		c     Conn
		sent  uint64
		alias bool // hops 1 and 2 pair by alias key, hop 3 by the reversed tuple
	}{
		{"hop 1, application A", appA, up, true}, {"hop 1, outbound proxy (accepted)", outAcc, down, true},
		{"hop 2, outbound proxy (connected)", outConn, up, true}, {"hop 2, inbound proxy (accepted)", inAcc, down, true},
		{"hop 3, inbound proxy (connected)", inConn, up, false}, {"hop 3, application B", app, down, false},
	} {
		t.Logf("%-34s %s -> %s netns %d: %s alias=%v, %d bytes redirected", x.hop, x.c.Local, x.c.Remote, x.c.Netns, x.c.Mode, x.c.Alias, x.c.RedirectedBytes)
		if x.c.Mode != "bypass" || x.c.Alias != x.alias || x.c.RedirectedBytes != x.sent || x.c.PassedBytes != 0 {
			t.Errorf("%s %s -> %s: mode %q, alias %v, redirected %d, passed %d bytes; want bypass, alias %v, %d redirected, none passed",
				x.hop, x.c.Local, x.c.Remote, x.c.Mode, x.c.Alias, x.c.RedirectedBytes, x.c.PassedBytes, x.alias, x.sent)
		}
	}
	// hops 1 and 2 pair by alias (both ends), hop 3 by its exact keys
	if d["alias_paired"] != 4 || d["redirect_bytes"] != 3*(up+down) || d["pass_bytes"] != 0 ||
		d["admit_pod"] != 3 || d["admit_intrapod"] != 1 || d["admit_loopback"] != 2 {
		t.Errorf("counters moved by %v; want alias_paired 4, redirect_bytes %d (every byte on each of 3 hops), nothing passed, admit_pod 3, admit_intrapod 1, admit_loopback 2",
			d, 3*(up+down))
	}
}
