package vmguest

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/axonhq/axon/internal/datapath/podlb"
	"github.com/axonhq/axon/internal/datapath/socklb"
	"github.com/axonhq/axon/internal/datapath/vmbypass"
	"github.com/axonhq/axon/internal/lb"
	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/testutil"
	"github.com/axonhq/axon/internal/vmtest"
)

// The VM-pod lab of these tests, as KubeVirt's bridge binding wires a virt-launcher pod:
//
//	guest (QEMU, virtio-net, MAC 02:a0:00:00:01:05, 10.244.1.5/24 by DHCP)
//	  └ tap0 ─┐ launcher netns: bridge k6t-eth0 (169.254.75.10/32, udhcpd) enslaves tap0, eth0
//	  eth0 ───┘ (the pod's veth: its IP and MAC moved to the guest, a new MAC of its own)
//	      │
//	  vmhost 10.244.1.1/24 ── node netns (forwarding) ── peerhost 10.244.2.1/24
//	                                                         │
//	                                      peer netns: eth0 10.244.2.2/24 (an ordinary pod)
const (
	bridgeName = "k6t-eth0"
	tapName    = "tap0"
	guestMAC   = "02:a0:00:00:01:05"
)

var (
	guestAddr = netip.MustParsePrefix("10.244.1.5/24")
	vmGW      = netip.MustParseAddr("10.244.1.1")
	peerAddr  = netip.MustParseAddr("10.244.2.2")
)

type vmLab struct {
	t                      *testing.T
	launcher, node, peer   string // netns names
	launcherPath, peerPath string
	guest                  *Running
	bootTime               time.Duration
	kernelRelease          string
	b                      *vmbypass.Bypass
	id                     string
	attached               bool
	pinDir                 string
	plb                    *podlb.LB // serviceToPeer's
}

// guestKernel returns the cached kernel the guests boot ($AXON_VMGUEST_KERNEL, default
// debian-6.12), or skips saying how to get it.
func guestKernel(t *testing.T) *vmtest.Kernel {
	t.Helper()
	name := os.Getenv("AXON_VMGUEST_KERNEL")
	if name == "" {
		name = "debian-6.12"
	}
	spec, err := vmtest.LookupKernel(name)
	if err != nil {
		t.Fatal(err)
	}
	cache := os.Getenv("AXON_CACHE")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache", "axon")
	}
	k, err := (&vmtest.Fetcher{CacheRoot: cache}).Cached(spec)
	if err != nil {
		t.Skipf("no guest kernel: %v", err)
	}
	for _, need := range []string{vmtest.QEMUPath, vmtest.BusyboxPath, QperfPath, "nsenter"} {
		if _, err := exec.LookPath(need); err != nil {
			t.Skipf("%s missing (hack/install-packages.sh vm; apt-get install qperf): %v", need, err)
		}
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		t.Skipf("no /dev/net/tun: %v", err)
	}
	return k
}

// requireGuestRuns skips unless the guest boots fast enough for every test run: with
// hardware KVM, or when AXON_VMGUEST=1 asks for it. Under TCG on a 2-core machine a guest
// test takes 20-30 s (the kernel alone boots in 5-11 s), over make test's budget for it.
func requireGuestRuns(t *testing.T) {
	t.Helper()
	if os.Getenv("AXON_VMGUEST") != "1" && !vmtest.HardwareKVM() {
		t.Skip("boots a QEMU guest under TCG (no hardware KVM here), 20-30 s: AXON_VMGUEST=1 runs it")
	}
}

// newVMLab wires the netns, boots the guest and waits for its DHCP lease.
func newVMLab(t *testing.T) *vmLab {
	t.Helper()
	dptest.RequireRoot(t)
	requireGuestRuns(t)
	k := guestKernel(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	dir := t.TempDir()
	img := filepath.Join(dir, "guest-initramfs.img")
	if err := (Initramfs{Kernel: k}).Build(ctx, img); err != nil {
		t.Fatal(err)
	}

	l := &vmLab{t: t, launcher: dptest.NewNetns(t, "vmlauncher"), node: dptest.NewNetns(t, "vmnode"),
		peer: dptest.NewNetns(t, "vmpeer"), id: "vmguest-" + testutil.RandSuffix(t)}
	l.launcherPath, l.peerPath = netnsutil.Path(l.launcher), netnsutil.Path(l.peer)
	lc, nc, pc := dptest.NSConf(t, l.launcher), dptest.NSConf(t, l.node), dptest.NSConf(t, l.peer)
	lc.Veth("eth0", "02:a0:00:00:01:e0", "vmhost", "", l.node)
	pc.Veth("eth0", "", "peerhost", "", l.node)
	if err := lc.H.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: bridgeName}}); err != nil {
		t.Fatalf("add bridge: %v", err)
	}
	tap, err := OpenTap(l.launcherPath, tapName)
	if err != nil {
		t.Fatal(err)
	}
	for _, port := range []string{"eth0", tapName} {
		if err := lc.H.LinkSetMaster(lc.Link(port), lc.Link(bridgeName)); err != nil {
			t.Fatalf("enslave %s: %v", port, err)
		}
	}
	lc.NoBridgeNetfilter()
	lc.Up("eth0", tapName, bridgeName)
	lc.Addr(bridgeName, "169.254.75.10/32")
	nc.Addr("vmhost", vmGW.String()+"/24")
	nc.Addr("peerhost", "10.244.2.1/24")
	nc.Up("vmhost", "peerhost")
	nc.Sysctl("net.ipv4.ip_forward", "1")
	pc.Addr("eth0", peerAddr.String()+"/24")
	pc.Up("eth0")
	pc.Route("0.0.0.0/0", "10.244.2.1", "eth0")

	dhcp, err := StartDHCP(ctx, l.launcherPath, bridgeName, dir, Lease{MAC: dptest.MustMAC(t, guestMAC), Addr: guestAddr, Router: vmGW})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dhcp.Stop)

	pinDir := dptest.NewPinDir(t, datapath.BPFFSRoot, datapath.EnsureBPFFS, func(dir string) error { return os.RemoveAll(dir) })
	l.pinDir = pinDir
	l.b, err = vmbypass.New(vmbypass.Config{PinDir: pinDir, Logger: dptest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if l.attached {
			_ = l.b.Detach(l.id, l.launcherPath)
		}
	})

	console, err := os.Create(filepath.Join(dir, "console.log"))
	if err != nil {
		t.Fatal(err)
	}
	g := Guest{Kernel: k, Initramfs: img, Tap: tap, MAC: guestMAC, Console: console}
	start := time.Now()
	l.guest, err = g.Start(ctx)
	tap.Close() // QEMU holds the tap now: it goes when the guest does
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		l.guest.Stop()
		console.Close()
		if t.Failed() || os.Getenv("AXON_VMGUEST_SHOW_CONSOLE") != "" {
			b, _ := os.ReadFile(filepath.Join(dir, "udhcpd.log"))
			t.Logf("guest console:\n%s\nudhcpd:\n%s", tail(l.guest.Console(), 40), b)
		}
	})
	addr, _, err := l.guest.Ready(testutil.Stretch(t, 150*time.Second)) // 7-11 s on a quiet host, ~60-80 s with the host at 95 %+ CPU pressure
	if err != nil {
		t.Fatal(err)
	}
	l.bootTime = time.Since(start)
	l.kernelRelease = k.Release
	if addr != guestAddr.String() {
		t.Fatalf("guest leased %q, want %s", addr, guestAddr)
	}
	t.Logf("guest (%s, %s) up with %s by DHCP in %s", k.Release, l.guest.Accel(), addr, l.bootTime.Round(time.Millisecond))
	return l
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// setBypass attaches (on) or detaches the VM bypass of the launcher pod.
func (l *vmLab) setBypass(on bool) {
	l.t.Helper()
	if on == l.attached {
		return
	}
	if on {
		lay, err := l.b.Attach(l.id, l.launcherPath, "eth0")
		if err != nil {
			l.t.Fatal(err)
		}
		if lay.Tap != tapName || lay.Bridge != bridgeName {
			l.t.Fatalf("detected layout %+v, want tap %s on bridge %s", lay, tapName, bridgeName)
		}
	} else if err := l.b.Detach(l.id, l.launcherPath); err != nil {
		l.t.Fatal(err)
	}
	l.attached = on
}

// counters returns the bypass's counters (it must be attached).
func (l *vmLab) counters() map[string]uint64 {
	l.t.Helper()
	st, err := l.b.Stats(l.id, l.launcherPath)
	if err != nil {
		l.t.Fatal(err)
	}
	if st.Problem != "" {
		l.t.Fatalf("bypass: %s", st.Problem)
	}
	return st.Counters
}

// isolate makes the bridge's two ports isolated (on) or not: isolated ports forward
// nothing to each other, so whatever crosses the pod then came through the bypass.
func (l *vmLab) isolate(on bool) {
	l.t.Helper()
	lc := dptest.NSConf(l.t, l.launcher)
	for _, port := range []string{"eth0", tapName} {
		if err := lc.H.LinkSetIsolated(lc.Link(port), on); err != nil {
			l.t.Fatalf("set %s isolated %v: %v", port, on, err)
		}
	}
}

// inPeer runs argv in the peer pod's netns.
func (l *vmLab) inPeer(ctx context.Context, argv ...string) (string, error) {
	out, err := exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + l.peerPath}, argv...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s in the peer pod: %w: %s", strings.Join(argv, " "), err, out)
	}
	return string(out), nil
}

// ping pings the guest from the peer pod and returns how many of n answered. With
// answered, it waits up to 20 s for all n replies (a loaded host delays some by far more
// than ping's default linger of two round trips); without, it sends n (0.2 s apart) and
// waits 1 s after the last: the negative check.
func (l *vmLab) ping(n int, answered bool) int {
	l.t.Helper()
	wait := []string{"-W", "1"}
	if answered {
		wait = []string{"-w", "20"}
	}
	args := append([]string{"ping", "-n", "-q", "-c", fmt.Sprint(n), "-i", "0.2"}, wait...)
	out, _ := l.inPeer(context.Background(), append(args, guestAddr.Addr().String())...)
	var sent, recv int
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "packets transmitted") {
			fmt.Sscanf(line, "%d packets transmitted, %d received", &sent, &recv)
		}
	}
	if sent < n {
		l.t.Fatalf("ping sent %d of %d: %s", sent, n, out)
	}
	if sent > n {
		l.t.Logf("ping: %d sent for %d answered (a reply lost or later than 20 s)", sent, recv)
	}
	return recv
}

// qperf runs qperf tests from the peer pod against the guest's server.
func (l *vmLab) qperf(ctx context.Context, args ...string) (string, error) {
	return l.inPeer(ctx, append([]string{QperfPath, "-uu", guestAddr.Addr().String()}, args...)...)
}

// nodeLinkLocal is the IPv6 link-local address of the node's end of the VM pod's veth.
func (l *vmLab) nodeLinkLocal() string {
	l.t.Helper()
	var ll string
	dptest.InNetns(l.t, l.node, func() {
		lk, err := netlink.LinkByName("vmhost")
		if err != nil {
			l.t.Fatal(err)
		}
		addrs, err := netlink.AddrList(lk, netlink.FAMILY_V6)
		if err != nil {
			l.t.Fatal(err)
		}
		for _, a := range addrs {
			if a.IP.IsLinkLocalUnicast() {
				ll = a.IP.String()
			}
		}
	})
	if ll == "" {
		l.t.Fatal("vmhost has no IPv6 link-local address")
	}
	return ll
}

func linkTx(t *testing.T, ns, dev string) uint64 {
	t.Helper()
	var n uint64
	dptest.InNetns(t, ns, func() {
		lk, err := netlink.LinkByName(dev)
		if err != nil {
			t.Fatal(err)
		}
		n = lk.Attrs().Statistics.TxPackets
	})
	return n
}

// peerAnswer is what the peer pod's server behind serviceToPeer's ClusterIP says.
const peerAnswer = "peer-pod-via-clusterip"

// serviceToPeer gives the VM pod its pod LB (the socket LB's maps as the Service table, on a
// cgroup of its own that nothing runs in) with the replies at the tap, and a ClusterIP whose
// backend is a TCP server in the peer pod answering peerAnswer; it returns the ClusterIP.
func (l *vmLab) serviceToPeer() netip.AddrPort {
	t := l.t
	t.Helper()
	cg, _ := testutil.NewCgroup(t, "axt-vmguest-")
	sock, err := socklb.Load(l.pinDir, cg, dptest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sock.Close()
		if err := podlb.Uninstall(l.pinDir, []string{l.launcherPath}); err != nil {
			t.Errorf("pod LB uninstall: %v", err)
		}
		if err := socklb.Uninstall(l.pinDir, cg); err != nil {
			t.Errorf("socket LB uninstall: %v", err)
		}
	})
	fe, be := netip.MustParseAddrPort("10.96.9.1:80"), netip.AddrPortFrom(peerAddr, 8080)
	if err := sock.UpsertFrontend(lb.Frontend{Key: lb.FrontendKey{Addr: fe.Addr(), Port: fe.Port(), Proto: lb.TCP, Scope: lb.ScopeCluster},
		Backends: []lb.Backend{{Addr: be.Addr(), Port: be.Port(), State: lb.Active}}}); err != nil {
		t.Fatal(err)
	}
	var ln net.Listener
	dptest.InNetns(t, l.peer, func() {
		if ln, err = net.Listen("tcp", be.String()); err != nil {
			t.Fatal(err)
		}
	})
	t.Cleanup(func() { ln.Close() })
	testutil.ServeConns(ln, func(c net.Conn) {
		defer c.Close()
		c.Write([]byte(peerAnswer + "\n"))
	})
	p, err := podlb.New(podlb.Config{PinDir: l.pinDir, Logger: dptest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Attach(l.id, l.launcherPath, podlb.Target{Ifname: "eth0", Tap: tapName}); err != nil {
		t.Fatal(err)
	}
	l.plb = p
	return fe
}

// podLBCounters reads the VM pod's pod LB counters.
func (l *vmLab) podLBCounters() map[string]uint64 {
	l.t.Helper()
	c, err := l.plb.Counters(l.id)
	if err != nil {
		l.t.Fatal(err)
	}
	return c
}
