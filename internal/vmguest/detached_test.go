package vmguest

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/proc"
	"github.com/axonhq/axon/internal/testutil"
)

// TestDetachedGuestBehindLinkLocalGateway is the guest as the lab's VM pods run it:
// QEMU started detached (QEMUArgv, proc.Start with the tap as fd 3, inside the
// launcher netns, its console in a file read by WaitReadyFile), and a /32 lease behind
// the link-local gateway axon-cni gives pods (169.254.1.1: the guest gets it as an
// on-link route by option 121 and resolves it by ARP from the node, which holds it on
// lo). A peer pod behind the node then reaches the guest's TCP echo (EchoPort) and
// pings it.
func TestDetachedGuestBehindLinkLocalGateway(t *testing.T) {
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
	const gw, pod, peer = "169.254.1.1", "10.244.1.7", "10.244.2.2"
	launcher, node, peerNS := dptest.NewNetns(t, "vmlaunch"), dptest.NewNetns(t, "vmnode"), dptest.NewNetns(t, "vmpeer")
	lc, nc, pc := dptest.NSConf(t, launcher), dptest.NSConf(t, node), dptest.NSConf(t, peerNS)
	lc.Veth("eth0", "02:a0:00:00:01:e7", "vmhost", "", node)
	pc.Veth("eth0", "", "peerhost", "", node)
	if err := lc.H.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: bridgeName}}); err != nil {
		t.Fatalf("add bridge: %v", err)
	}
	tap, err := OpenTap(netnsutil.Path(launcher), tapName)
	if err != nil {
		t.Fatal(err)
	}
	defer tap.Close()
	for _, port := range []string{"eth0", tapName} {
		if err := lc.H.LinkSetMaster(lc.Link(port), lc.Link(bridgeName)); err != nil {
			t.Fatalf("enslave %s: %v", port, err)
		}
	}
	lc.NoBridgeNetfilter()
	lc.Up("eth0", tapName, bridgeName)
	lc.Addr(bridgeName, "169.254.75.10/32")
	// The node: the pod's /32 on its host device, the gateway on lo (answers ARP).
	nc.Up("vmhost", "peerhost")
	nc.Addr("lo", gw+"/32")
	nc.Route(pod+"/32", "", "vmhost")
	nc.Addr("peerhost", "10.244.2.1/24")
	nc.Sysctl("net.ipv4.ip_forward", "1")
	pc.Addr("eth0", peer+"/24")
	pc.Up("eth0")
	pc.Route("0.0.0.0/0", "10.244.2.1", "eth0")

	mac := "02:a0:00:00:01:07"
	hw, _ := net.ParseMAC(mac)
	argv, err := DHCPArgv(netnsutil.Path(launcher), bridgeName, dir,
		Lease{MAC: hw, Addr: netip.MustParsePrefix(pod + "/32"), Router: netip.MustParseAddr(gw), RouterOnLink: true})
	if err != nil {
		t.Fatal(err)
	}
	dhcp, _, err := proc.Start(proc.Spec{Argv: argv, Log: filepath.Join(dir, "udhcpd.log")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dhcp.Stop(5 * time.Second) })
	console, commands := filepath.Join(dir, "console.log"), filepath.Join(dir, "command.sock")
	qemu, err := Guest{Kernel: k, Initramfs: img, MAC: mac}.QEMUArgv(console, commands)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	q, _, err := proc.Start(proc.Spec{Argv: append([]string{"/usr/bin/nsenter", "--net=" + netnsutil.Path(launcher), "--"}, qemu...),
		Log: filepath.Join(dir, "qemu.log"), ExtraFiles: []*os.File{tap}})
	if err != nil {
		t.Fatal(err)
	}
	tap.Close()
	t.Cleanup(func() {
		if err := q.Stop(5 * time.Second); err != nil {
			t.Error(err)
		}
		if q.Alive() {
			t.Errorf("QEMU pid %d still runs after Stop", q.PID)
		}
	})
	wctx, wcancel := context.WithTimeout(ctx, testutil.Stretch(t, 150*time.Second))
	defer wcancel()
	addr, err := WaitReadyFile(wctx, console, q.Alive)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("detached guest (%s) up with %s in %s", Accel(), addr, time.Since(start).Round(time.Millisecond))
	if addr != pod+"/32" {
		t.Fatalf("guest leased %q, want %s/32", addr, pod)
	}
	l := &vmLab{t: t, peerPath: netnsutil.Path(peerNS)}
	out, err := l.inPeer(ctx, "/bin/busybox", "sh", "-c", fmt.Sprintf("echo axon-echo | /bin/busybox nc -w 5 %s %d", pod, EchoPort))
	if err != nil || out != "axon-echo\n" {
		t.Fatalf("TCP echo from the peer pod to the guest: %q, %v", out, err)
	}
	if out, err := l.inPeer(ctx, "ping", "-n", "-c", "3", "-w", "20", pod); err != nil {
		t.Fatalf("ping from the peer pod: %v", err)
	} else {
		t.Logf("%s", tail(out, 2))
	}
	// The command port: probes from inside the guest, as the lab's check runs them.
	s, err := Dial(ctx, commands)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		cmd, want string
		rc        int
	}{
		{"/bin/busybox ip -4 -o addr show dev eth0", " " + pod + "/32 ", 0},
		{"/bin/busybox ping -c 1 -W 5 " + peer, "1 packets received", 0},
		{"echo from-the-guest; exit_code() { return 3; }; exit_code", "from-the-guest", 3},
		{"cat; echo stdin-was-null", "stdin-was-null", 0}, // a command reading stdin gets EOF, not the next command
	} {
		out, rc, err := s.Run(c.cmd, testutil.Stretch(t, 30*time.Second))
		if err != nil || rc != c.rc || !strings.Contains(out, c.want) {
			t.Errorf("in the guest: %s: rc %d, %q, %v; want rc %d and %q", c.cmd, rc, out, err, c.rc, c.want)
		}
	}
	// A command that outlives its timeout leaves its output behind; the next session
	// (another nonce) must not take it for its own.
	if _, _, err := s.Run("sleep 3; echo late", 500*time.Millisecond); err == nil {
		t.Error("a 3 s command finished within 500 ms")
	}
	s.Close()
	s2, err := Dial(ctx, commands)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if out, rc, err := s2.Run("echo second-session", testutil.Stretch(t, 30*time.Second)); err != nil || rc != 0 || !strings.HasSuffix(strings.TrimSpace(out), "second-session") {
		t.Errorf("second session: rc %d, %q, %v", rc, out, err)
	}
	// Nobody types at a file console: the guest's shell waits (init powers off when it exits).
	if !q.Alive() {
		b, _ := os.ReadFile(console)
		t.Fatalf("QEMU exited after boot; console:\n%s", tail(string(b), 10))
	}
}
