package l4lb

// End-to-end test of the standalone load balancer in network namespaces:
//
//	client 10.200.0.1 ──┐
//	lb     10.200.0.2 ──┤ bridge in a "wire" netns (one L2 segment)
//	be1..3 10.200.0.1x ─┘
//
// The client routes the VIP 10.200.100.1 via the LB, which runs l4lb.Run
// (XDP native on its veth, or tc) with DSR: it encapsulates IPIP to a
// backend, the backend decapsulates and holds the VIP on lo, and replies
// straight to the client over the wire (never through the LB). This host's
// kernel has no ipip module (CONFIG_NET_IPIP unset), so backends decapsulate
// with a 10-instruction tc program (decapProg) instead of an ipip device;
// with an ipip kernel the fallback device tunl0 does the same.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/datapath/nodeport"
	"github.com/axonhq/axon/internal/ethtool"
	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/testutil"
)

const (
	e2eVIP  = "10.200.100.1"
	e2ePort = 80
)

// topo is the test's namespaces: their names by role.
type topo struct {
	ns map[string]string
}

func (tp *topo) newNS(t *testing.T, role string) string {
	t.Helper()
	tp.ns[role] = testutil.NewNetns(t, "axt-nsctl-"+role+"-")
	return tp.ns[role]
}

func handle(t *testing.T, ns string) *netlink.Handle {
	t.Helper()
	nsh := openNS(t, ns)
	defer nsh.Close()
	h, err := netlink.NewHandleAt(nsh, unix.NETLINK_ROUTE) // route only: xfrm/netfilter sockets fail on kernels without them
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

func openNS(t *testing.T, ns string) netns.NsHandle {
	t.Helper()
	h, err := netns.GetFromName(ns)
	if err != nil {
		t.Fatalf("open netns %s: %v", ns, err)
	}
	return h
}

func must(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// build creates the namespaces and links; returns the LB's uplink ifindex
// peer name in the wire ns (for the XDP_TX peer program).
func build(t *testing.T, backends int) *topo {
	t.Helper()
	tp := &topo{ns: map[string]string{}}
	wire := tp.newNS(t, "wire")
	hw := handle(t, wire)
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}}
	must(t, "add bridge", hw.LinkAdd(br))
	must(t, "bridge up", hw.LinkSetUp(br))
	roles := []string{"client", "lb"}
	for i := 1; i <= backends; i++ {
		roles = append(roles, fmt.Sprintf("be%d", i))
	}
	for i, role := range roles {
		ns := tp.newNS(t, role)
		h := handle(t, ns)
		lo, err := h.LinkByName("lo") // up: testutil.NewNetns
		must(t, "lo", err)
		peer := "w-" + role
		nsh := openNS(t, ns)
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: peer, MasterIndex: br.Index}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(nsh))}
		must(t, "add veth "+peer, hw.LinkAdd(veth))
		nsh.Close()
		wl, err := hw.LinkByName(peer)
		must(t, "wire end", err)
		must(t, "wire end master", hw.LinkSetMaster(wl, br))
		must(t, "wire end up", hw.LinkSetUp(wl))
		eth, err := h.LinkByName("eth0")
		must(t, "eth0", err)
		addr := netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(10, 200, 0, byte(i+1)), Mask: net.CIDRMask(24, 32)}}
		if role != "client" && role != "lb" {
			addr.IP = net.IPv4(10, 200, 0, byte(10+i-1))
		}
		must(t, "addr", h.AddrAdd(eth, &addr))
		addr6 := netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(fmt.Sprintf("fd00:200::%d", addr.IP.To4()[3])), Mask: net.CIDRMask(64, 128)}, Flags: unix.IFA_F_NODAD}
		must(t, "addr6", h.AddrAdd(eth, &addr6))
		must(t, "eth0 up", h.LinkSetUp(eth))
		// Full checksums on every packet the LB may see: a veth hands it
		// CHECKSUM_PARTIAL packets, and native XDP on veth loses that state
		// on XDP_TX; packets from a real NIC carry complete
		// checksums anyway.
		must(t, "tx checksum off", netnsutil.Do(ns, func() error { return ethtool.Set("eth0", ethtool.TxChecksum, false) }))
		switch {
		case role == "lb":
			must(t, "forwarding", netnsutil.Do(ns, func() error {
				if err := os.WriteFile("/proc/sys/net/ipv6/conf/all/forwarding", []byte("1"), 0o644); err != nil {
					return err
				}
				return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644)
			}))
		case role == "client":
			_, vipNet, _ := net.ParseCIDR("10.200.100.0/24")
			must(t, "route to VIPs", h.RouteAdd(&netlink.Route{Dst: vipNet, Gw: net.IPv4(10, 200, 0, 2), LinkIndex: eth.Attrs().Index}))
			_, vip6Net, _ := net.ParseCIDR("fd00:200:100::/64")
			must(t, "route to IPv6 VIPs", h.RouteAdd(&netlink.Route{Dst: vip6Net, Gw: net.ParseIP("fd00:200::2"), LinkIndex: eth.Attrs().Index}))
		case strings.HasPrefix(role, "be"):
			vip := netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(e2eVIP).To4(), Mask: net.CIDRMask(32, 32)}}
			must(t, "VIP on lo", h.AddrAdd(lo, &vip))
			must(t, "sysctls", netnsutil.Do(ns, func() error {
				for _, kv := range [][2]string{
					{"net/ipv4/conf/all/rp_filter", "0"}, {"net/ipv4/conf/eth0/rp_filter", "0"},
					{"net/ipv4/conf/all/arp_ignore", "1"}, {"net/ipv4/conf/eth0/arp_ignore", "1"},
				} {
					if err := os.WriteFile("/proc/sys/"+kv[0], []byte(kv[1]), 0o644); err != nil {
						return err
					}
				}
				return nil
			}))
		}
	}
	return tp
}

// decapProg strips an outer IPv4 header (protocol 4, IPIP) in front of the
// packet at tc ingress, so the kernel delivers the inner packet to the VIP.
func decapProg() (*ebpf.Program, error) {
	const (
		offData    = 76 // offsetof(struct __sk_buff, data)
		offDataEnd = 80
	)
	insns := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.LoadMem(asm.R2, asm.R6, offData, asm.Word),
		asm.LoadMem(asm.R3, asm.R6, offDataEnd, asm.Word),
		asm.Mov.Reg(asm.R4, asm.R2),
		asm.Add.Imm(asm.R4, 14+20),
		asm.JGT.Reg(asm.R4, asm.R3, "pass"),
		asm.LoadMem(asm.R5, asm.R2, 12, asm.Half),
		asm.JNE.Imm(asm.R5, 0x0008, "pass"), // ETH_P_IP in network order, read little-endian
		asm.LoadMem(asm.R5, asm.R2, 14+9, asm.Byte),
		asm.JNE.Imm(asm.R5, 4, "pass"), // IPPROTO_IPIP
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.Mov.Imm(asm.R2, -20),
		asm.Mov.Imm(asm.R3, 1), // BPF_ADJ_ROOM_MAC
		asm.Mov.Imm(asm.R4, 0),
		asm.FnSkbAdjustRoom.Call(),
		asm.Mov.Imm(asm.R0, 0).WithSymbol("pass"), // TC_ACT_OK / TCX_PASS
		asm.Return(),
	}
	return ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, Instructions: insns, License: "GPL"})
}

// xdpPassProg is the peer program native XDP_TX on veth needs.
func xdpPassProg() (*ebpf.Program, error) {
	return ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.XDP, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2), asm.Return()}})
}

// attachIn attaches prog in ns to dev (tcx ingress or XDP); detached at cleanup.
func attachIn(t *testing.T, ns string, dev string, prog *ebpf.Program) {
	t.Helper()
	var l link.Link
	err := netnsutil.Do(ns, func() error {
		ifc, err := net.InterfaceByName(dev)
		if err != nil {
			return err
		}
		if prog.Type() == ebpf.XDP {
			l, err = link.AttachXDP(link.XDPOptions{Program: prog, Interface: ifc.Index})
			return err
		}
		l, err = link.AttachTCX(link.TCXOptions{Program: prog, Attach: ebpf.AttachTCXIngress, Interface: ifc.Index})
		if errors.Is(err, ebpf.ErrNotSupported) { // no tcx (< 6.6): clsact + cls_bpf direct-action
			err = attachLegacyIngress(ifc.Index, prog)
		}
		return err
	})
	must(t, "attach "+dev, err)
	if l != nil {
		t.Cleanup(func() { l.Close() })
	}
}

// peers records the client addresses backends saw (DSR preserves them).
var peers sync.Map

// attachLegacyIngress is `tc qdisc add dev X clsact; tc filter add dev X
// ingress bpf da` in the current netns (the netns goes away with the test).
func attachLegacyIngress(ifindex int, prog *ebpf.Program) error {
	qd := &netlink.GenericQdisc{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: ifindex, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}, QdiscType: "clsact"}
	if err := netlink.QdiscReplace(qd); err != nil {
		return fmt.Errorf("add clsact: %w", err)
	}
	f := &netlink.BpfFilter{FilterAttrs: netlink.FilterAttrs{LinkIndex: ifindex, Parent: netlink.HANDLE_MIN_INGRESS, Handle: 1, Protocol: unix.ETH_P_ALL, Priority: 1},
		Fd: prog.FD(), Name: "axt-decap", DirectAction: true}
	return netlink.FilterReplace(f)
}

// serveBackend answers every line with "<name> <line>" on VIP:80 in ns.
func serveBackend(t *testing.T, ns string, name string) {
	t.Helper()
	serveOn(t, ns, name, fmt.Sprintf("%s:%d", e2eVIP, e2ePort))
}

// serveOn answers every line with "<name> <line>" on addr in ns.
func serveOn(t *testing.T, ns string, name, addr string) {
	t.Helper()
	var ln net.Listener
	must(t, "listen "+name, netnsutil.Do(ns, func() error {
		var err error
		ln, err = net.Listen("tcp", addr)
		return err
	}))
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			peers.Store(c.RemoteAddr().(*net.TCPAddr).IP.String(), true)
			go func() {
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					if _, err := fmt.Fprintf(c, "%s %s\n", name, sc.Text()); err != nil {
						return
					}
				}
			}()
		}
	}()
}

// conn is a client connection to the VIP made in the client netns.
type conn struct {
	c  net.Conn
	rd *bufio.Reader
}

func dialVIP(ns string) (*conn, error) {
	return dial(ns, fmt.Sprintf("%s:%d", e2eVIP, e2ePort))
}

func dial(ns string, addr string) (*conn, error) {
	var c net.Conn
	err := netnsutil.Do(ns, func() error {
		var err error
		c, err = net.DialTimeout("tcp", addr, 3*time.Second)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &conn{c: c, rd: bufio.NewReader(c)}, nil
}

// ask sends one line and returns the backend that answered.
func (c *conn) ask(msg string) (string, error) {
	_ = c.c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := fmt.Fprintln(c.c, msg); err != nil {
		return "", err
	}
	line, err := c.rd.ReadString('\n')
	if err != nil {
		return "", err
	}
	be, rest, _ := strings.Cut(strings.TrimSpace(line), " ")
	if rest != msg {
		return "", fmt.Errorf("reply %q does not echo %q", line, msg)
	}
	return be, nil
}

// e2eConfig is the test's config; dir holds the socket, its base name
// (axt-nsctl-...) names the pin dir.
func e2eConfig(dir, mode string, backends ...int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "interface: eth0\nxdpMode: %s\nbpfRoot: %s\nsocket: %s\nmaglev: {tableSize: 1021}\nconntrack: {max: 65536}\nvips:\n",
		mode, filepath.Join(datapath.BPFFSRoot, filepath.Base(dir)), filepath.Join(dir, "l4lb.sock"))
	fmt.Fprintf(&b, "- name: web\n  address: %s\n  port: %d\n  forwarding: dsr\n  backends:\n", e2eVIP, e2ePort)
	for _, i := range backends {
		fmt.Fprintf(&b, "  - address: 10.200.0.%d\n", 10+i)
	}
	return b.String()
}

// TestStandaloneDSR: client → VIP → backends with DSR (IPIP), reloads under
// a connection loop with zero failures, established connections keep their
// backend across reloads (a removed backend drains), and an invalid config
// is rejected while the old one keeps serving.
func TestStandaloneDSR(t *testing.T) {
	testutil.RequireRoot(t, "network namespaces, BPF programs, bpffs pins")
	for _, mode := range []string{"native", "disabled"} {
		t.Run("xdp="+mode, func(t *testing.T) { testStandaloneDSR(t, mode) })
	}
}

func testStandaloneDSR(t *testing.T, xdpMode string) {
	tp := build(t, 3)
	decap, err := decapProg()
	must(t, "load decap program", err)
	t.Cleanup(func() { decap.Close() })
	for i := 1; i <= 3; i++ {
		name := fmt.Sprintf("be%d", i)
		// The kernel's ipip fallback device decapsulates where the kernel has
		// ipip (CONFIG_NET_IPIP, module loaded); else the BPF decap program.
		h := handle(t, tp.ns[name])
		if tunl, err := h.LinkByName("tunl0"); err == nil {
			must(t, "tunl0 up", h.LinkSetUp(tunl))
			must(t, "tunl0 rp_filter", netnsutil.Do(tp.ns[name], func() error {
				return os.WriteFile("/proc/sys/net/ipv4/conf/tunl0/rp_filter", []byte("0"), 0o644)
			}))
			if i == 1 {
				t.Log("backends decapsulate with the kernel's ipip device tunl0")
			}
		} else {
			attachIn(t, tp.ns[name], "eth0", decap)
			if i == 1 {
				t.Log("no ipip in this kernel: backends decapsulate with a tc BPF program")
			}
		}
		serveBackend(t, tp.ns[name], name)
	}
	if xdpMode == "native" {
		pass, err := xdpPassProg()
		must(t, "load XDP pass program", err)
		t.Cleanup(func() { pass.Close() })
		attachIn(t, tp.ns["wire"], "w-lb", pass) // XDP_TX on a veth needs an XDP program on its peer
	}

	dir := filepath.Join(t.TempDir(), "axt-nsctl-"+testutil.RandSuffix(t))
	must(t, "config dir", os.Mkdir(dir, 0o755))
	cfgPath := filepath.Join(dir, "lb.yaml")
	writeConfig(t, cfgPath, e2eConfig(dir, xdpMode, 1, 2))
	cfg, _, err := ReadFile(cfgPath)
	must(t, "config", err)
	t.Cleanup(func() {
		if err := netnsutil.Do(tp.ns["lb"], func() error { return nodeport.Uninstall(cfg.BPFRoot) }); err != nil {
			t.Errorf("uninstall: %v", err)
		}
		_ = os.RemoveAll(cfg.BPFRoot)
	})

	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	ready := make(chan *Runner, 1)
	go func() {
		runErr <- netnsutil.Do(tp.ns["lb"], func() error {
			return Run(ctx, cfgPath, RunOptions{PollInterval: 200 * time.Millisecond, GCInterval: time.Second,
				Ready: func(r *Runner) { ready <- r }})
		})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-runErr:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(time.Minute):
			t.Error("Run did not return within a minute of its context's end")
		}
	})
	var r *Runner
	start := time.Now()
	select {
	case r = <-ready:
	case err := <-runErr:
		t.Fatalf("Run failed: %v", err)
	case <-time.After(2 * time.Minute): // loading and verifying the programs is slow on a loaded machine
		t.Fatal("Run did not get ready in 2 minutes")
	}
	t.Logf("load, attach and program took %s", time.Since(start).Round(time.Millisecond))
	t.Logf("attached: %s", r.Status().Attach)

	// 1. Basic: connections spread over be1 and be2; replies come straight from them.
	seen := map[string]int{}
	var long []*conn // kept open across the reloads
	for i := range 40 {
		c, err := dialVIP(tp.ns["client"])
		if err != nil {
			t.Fatalf("connection %d to the VIP: %v (status: %+v)", i, err, r.Status())
		}
		be, err := c.ask("hello")
		if err != nil {
			st := r.Status()
			t.Fatalf("connection %d: %v (packets %v, flows %d)", i, err, st.Packets, st.CTEntries)
		}
		seen[be]++
		if len(long) < 8 {
			long = append(long, c)
		} else {
			c.c.Close()
		}
	}
	t.Cleanup(func() {
		for _, c := range long {
			c.c.Close()
		}
	})
	if seen["be1"] == 0 || seen["be2"] == 0 || seen["be3"] != 0 {
		t.Fatalf("backends hit: %v, want be1 and be2 only", seen)
	}
	peers.Range(func(k, _ any) bool {
		if k.(string) != "10.200.0.1" {
			t.Errorf("a backend saw client address %s, want the client's 10.200.0.1 (DSR keeps it)", k)
		}
		return true
	})
	checkSocketAPI(t, cfg.Socket)
	longBE := make([]string, len(long))
	for i, c := range long {
		longBE[i], _ = c.ask("who")
	}
	t.Logf("40 connections: %v; long-lived on %v", seen, longBE)

	// 2. A connection loop runs while the config changes.
	var ok, failed atomic.Int64
	var failMu sync.Mutex
	var failures []string
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for n := 0; ; n++ {
			select {
			case <-stop:
				return
			default:
			}
			c, err := dialVIP(tp.ns["client"])
			if err == nil {
				_, err = c.ask(fmt.Sprintf("loop-%d", n))
				c.c.Close()
			}
			if err != nil {
				failed.Add(1)
				failMu.Lock()
				failures = append(failures, err.Error())
				failMu.Unlock()
				continue
			}
			ok.Add(1)
		}
	})
	reload := func(content string) error {
		writeConfig(t, cfgPath, content)
		_, err := r.Reload()
		if errors.Is(err, ErrUnchanged) {
			err = nil // the file poll applied it first
		}
		return err
	}
	time.Sleep(300 * time.Millisecond)
	// add be3
	must(t, "reload: add be3", reload(e2eConfig(dir, xdpMode, 1, 2, 3)))
	time.Sleep(500 * time.Millisecond)
	// remove be1: its established connections drain
	must(t, "reload: remove be1", reload(e2eConfig(dir, xdpMode, 2, 3)))
	time.Sleep(500 * time.Millisecond)
	// an invalid config is rejected, the running one stays
	err = reload(strings.Replace(e2eConfig(dir, xdpMode, 2, 3), "port: 80", "port: 0", 1))
	if err == nil || !strings.Contains(err.Error(), "vips[0].port") {
		t.Errorf("invalid config: err = %v, want a vips[0].port error", err)
	}
	if st := r.Status(); st.Rejected < 1 || st.LastError == "" { // the poll may have rejected it too
		t.Errorf("status after the rejected reload: rejected %d, lastError %q", st.Rejected, st.LastError)
	}
	time.Sleep(500 * time.Millisecond)
	close(stop)
	wg.Wait()
	t.Logf("connection loop during 2 reloads and 1 rejected config: %d ok, %d failed", ok.Load(), failed.Load())
	if ok.Load() < 10 { // about 40 under QEMU TCG, thousands on the host
		t.Errorf("only %d loop connections succeeded", ok.Load())
	}
	if failed.Load() != 0 {
		t.Errorf("%d loop connections failed, want 0; first: %v", failed.Load(), failures[:min(3, len(failures))])
	}

	// 3. Established connections kept their backend, be1's included.
	for i, c := range long {
		be, err := c.ask("again")
		if err != nil || be != longBE[i] {
			t.Errorf("long-lived connection %d (on %s) after the reloads: %q, %v", i, longBE[i], be, err)
		}
	}
	st := r.Status()
	draining := false
	for _, b := range st.VIPs[0].Backends {
		draining = draining || (b.Draining && b.Address == "10.200.0.11:80")
	}
	if !draining && slicesContains(longBE, "be1") {
		t.Errorf("be1 has established flows but is not shown draining: %+v", st.VIPs[0].Backends)
	}
	// New connections never reach be1 any more.
	for i := range 20 {
		c, err := dialVIP(tp.ns["client"])
		if err != nil {
			t.Fatalf("new connection %d: %v", i, err)
		}
		be, err := c.ask("new")
		c.c.Close()
		if err != nil || be == "be1" {
			t.Errorf("new connection %d after be1's removal went to %q (%v)", i, be, err)
		}
	}
	// Once its connections close, be1 leaves the table.
	for _, c := range long {
		c.c.Close()
	}
	long = nil
	deadline := time.Now().Add(40 * time.Second)
	for {
		if err := r.ReapDrained(); err != nil {
			t.Fatal(err)
		}
		gone := true
		for _, b := range r.Status().VIPs[0].Backends {
			gone = gone && !b.Draining
		}
		if gone {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("be1 still draining 40s after its connections closed: %+v", r.Status().VIPs[0].Backends)
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// TestStandaloneSNATv6: an IPv6 VIP with SNAT (replies come back through
// the load balancer), Maglev, tc and native XDP.
func TestStandaloneSNATv6(t *testing.T) {
	testutil.RequireRoot(t, "network namespaces, BPF programs, bpffs pins")
	for _, mode := range []string{"native", "disabled"} {
		t.Run("xdp="+mode, func(t *testing.T) {
			tp := build(t, 2)
			for i := 1; i <= 2; i++ {
				name := fmt.Sprintf("be%d", i)
				serveOn(t, tp.ns[name], name, fmt.Sprintf("[fd00:200::%d]:8080", 10+i))
			}
			if mode == "native" {
				pass, err := xdpPassProg()
				must(t, "load XDP pass program", err)
				t.Cleanup(func() { pass.Close() })
				attachIn(t, tp.ns["wire"], "w-lb", pass)
			}
			dir := filepath.Join(t.TempDir(), "axt-nsctl-"+testutil.RandSuffix(t))
			must(t, "config dir", os.Mkdir(dir, 0o755))
			cfgPath := filepath.Join(dir, "lb.yaml")
			pin := filepath.Join(datapath.BPFFSRoot, filepath.Base(dir))
			writeConfig(t, cfgPath, fmt.Sprintf(`interface: eth0
xdpMode: %s
bpfRoot: %s
socket: %s
maglev: {tableSize: 251}
vips:
- name: web6
  address: fd00:200:100::1
  port: 80
  forwarding: snat
  backends:
  - {address: "fd00:200::11", port: 8080}
  - {address: "fd00:200::12", port: 8080}
`, mode, pin, filepath.Join(dir, "l4lb.sock")))
			t.Cleanup(func() {
				if err := netnsutil.Do(tp.ns["lb"], func() error { return nodeport.Uninstall(pin) }); err != nil {
					t.Errorf("uninstall: %v", err)
				}
				_ = os.RemoveAll(pin)
			})
			ctx, cancel := context.WithCancel(context.Background())
			runErr := make(chan error, 1)
			ready := make(chan *Runner, 1)
			go func() {
				runErr <- netnsutil.Do(tp.ns["lb"], func() error {
					return Run(ctx, cfgPath, RunOptions{Ready: func(r *Runner) { ready <- r }})
				})
			}()
			t.Cleanup(func() {
				cancel()
				select {
				case <-runErr:
				case <-time.After(time.Minute):
					t.Error("Run did not return within a minute of its context's end")
				}
			})
			var r *Runner
			select {
			case r = <-ready:
			case err := <-runErr:
				t.Fatalf("Run failed: %v", err)
			case <-time.After(2 * time.Minute):
				t.Fatal("Run did not get ready in 2 minutes")
			}
			seen := map[string]int{}
			for i := range 20 {
				c, err := dial(tp.ns["client"], "[fd00:200:100::1]:80")
				if err != nil {
					t.Fatalf("IPv6 connection %d: %v (status %+v)", i, err, r.Status().Packets)
				}
				be, err := c.ask("hello6")
				c.c.Close()
				if err != nil {
					t.Fatalf("IPv6 connection %d: %v (packets %v)", i, err, r.Status().Packets)
				}
				seen[be]++
			}
			st := r.Status()
			t.Logf("%s: 20 IPv6 connections: %v; packets %v", st.Attach, seen, st.Packets)
			if seen["be1"] == 0 || seen["be2"] == 0 {
				t.Errorf("backends hit: %v, want both", seen)
			}
			if st.Packets["snat_fwd"] == 0 || st.Packets["rev_nat"] == 0 {
				t.Errorf("packets %v: want SNAT forwards and reverse NAT", st.Packets)
			}
		})
	}
}

// checkSocketAPI reads ct, maglev and explain over the status socket, as
// `axon bpf ct list --socket ...` etc. do.
func checkSocketAPI(t *testing.T, sock string) {
	t.Helper()
	c := api.NewClient(sock)
	ctx := context.Background()
	ct, err := c.CT(ctx)
	if err != nil || !ct.Enabled || len(ct.Entries) == 0 {
		t.Fatalf("ct over the socket: %+v, %v", ct, err)
	}
	for _, e := range ct.Entries {
		if e.Mode != "dsr" || e.Frontend != fmt.Sprintf("%s:%d", e2eVIP, e2ePort) || !strings.HasPrefix(e.Client, "10.200.0.1:") {
			t.Errorf("conntrack entry %+v, want a dsr flow from the client to the VIP", e)
		}
	}
	mg, err := c.Maglev(ctx, "web", "", false)
	if err != nil || len(mg.Tables) != 1 || mg.Tables[0].Size != 1021 || len(mg.Tables[0].Backends) != 2 {
		t.Errorf("maglev over the socket: %+v, %v", mg, err)
	}
	ex, err := c.Explain(ctx, "tcp", "10.200.0.1:40000", fmt.Sprintf("%s:%d", e2eVIP, e2ePort))
	if err != nil || ex.Mode != "dsr" || !strings.HasPrefix(ex.Backend, "10.200.0.1") {
		t.Errorf("explain over the socket: %+v, %v", ex, err)
	}
	// Maglev answers exactly: the table's slot for this flow is the backend explain named.
	ex2, err := c.Explain(ctx, "tcp", "10.200.0.1:40000", fmt.Sprintf("%s:%d", e2eVIP, e2ePort))
	if err != nil || ex2.Backend != ex.Backend {
		t.Errorf("explain is not stable for a Maglev VIP: %s then %s (%v)", ex.Backend, ex2.Backend, err)
	}
	t.Logf("explain: %s → %s (%s, %s); %d flows tracked", ex.Flow, ex.Backend, ex.Mode, ex.Verdict, len(ct.Entries))
}

func slicesContains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
