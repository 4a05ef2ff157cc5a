package vmguest

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// Lease is what the pod's DHCP responder gives the guest: KubeVirt's bridge binding moves
// the pod's IP and MAC to the guest this way (virt-launcher serves DHCP on k6t-eth0).
type Lease struct {
	MAC    net.HardwareAddr
	Addr   netip.Prefix // the pod's IP and prefix length
	Router netip.Addr
}

// DHCP is busybox udhcpd serving one static lease on an interface of a pod's netns: the
// stand-in for virt-launcher's DHCP server.
type DHCP struct{ cmd *exec.Cmd }

// StartDHCP starts the responder in the netns at netnsPath on iface (which needs an IPv4
// address: KubeVirt's k6t-eth0 has 169.254.75.10/32), its files under dir.
func StartDHCP(ctx context.Context, netnsPath, iface, dir string, l Lease) (*DHCP, error) {
	if !l.Addr.Addr().Is4() || !l.Router.Is4() || len(l.MAC) != 6 {
		return nil, fmt.Errorf("DHCP lease %v via %v for %v: want an IPv4 prefix, an IPv4 router and a MAC", l.Addr, l.Router, l.MAC)
	}
	mask := net.IP(net.CIDRMask(l.Addr.Bits(), 32)).String()
	conf := fmt.Sprintf(`interface %s
start %s
end %s
max_leases 1
static_lease %s %s
option subnet %s
option router %s
option lease 86400
lease_file %s
pidfile %s
auto_time 0
`, iface, l.Addr.Addr(), l.Addr.Addr(), l.MAC, l.Addr.Addr(), mask, l.Router,
		filepath.Join(dir, "udhcpd.leases"), filepath.Join(dir, "udhcpd.pid"))
	path := filepath.Join(dir, "udhcpd.conf")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		return nil, fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "udhcpd.leases"), nil, 0o644); err != nil {
		return nil, err
	}
	log, err := os.Create(filepath.Join(dir, "udhcpd.log"))
	if err != nil {
		return nil, err
	}
	defer log.Close()
	cmd := exec.CommandContext(ctx, "nsenter", "--net="+netnsPath, "/bin/busybox", "udhcpd", "-f", path)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = 2 * time.Second
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start udhcpd in %s: %w", netnsPath, err)
	}
	return &DHCP{cmd: cmd}, nil
}

// Stop kills the responder by its PID.
func (d *DHCP) Stop() {
	_ = d.cmd.Process.Kill()
	_ = d.cmd.Wait()
}
