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
	// RouterOnLink: the router is outside Addr (a /32 pod address behind a link-local
	// gateway, as axon-cni wires pods): the lease also carries classless static routes
	// (option 121), the router's /32 on-link and the default route via it, as
	// virt-launcher derives them from the pod's routes. The guest applies them first.
	RouterOnLink bool
}

// DHCP is busybox udhcpd serving one static lease on an interface of a pod's netns: the
// stand-in for virt-launcher's DHCP server.
type DHCP struct{ cmd *exec.Cmd }

// DHCPArgv writes the responder's config under dir and returns its command line: busybox
// udhcpd in the foreground in the netns at netnsPath on iface (which needs an IPv4
// address: KubeVirt's k6t-eth0 has 169.254.75.10/32), for a caller that starts it
// itself (detached, e.g. the lab's VM pods). Its leases and pid file live in dir.
func DHCPArgv(netnsPath, iface, dir string, l Lease) ([]string, error) {
	if !l.Addr.Addr().Is4() || !l.Router.Is4() || len(l.MAC) != 6 {
		return nil, fmt.Errorf("DHCP lease %v via %v for %v: want an IPv4 prefix, an IPv4 router and a MAC", l.Addr, l.Router, l.MAC)
	}
	conf := dhcpConfig(iface, dir, l)
	path := filepath.Join(dir, "udhcpd.conf")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		return nil, fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "udhcpd.leases"), nil, 0o644); err != nil {
		return nil, err
	}
	return []string{"nsenter", "--net=" + netnsPath, "/bin/busybox", "udhcpd", "-f", path}, nil
}

// dhcpConfig is udhcpd's config for the one lease.
func dhcpConfig(iface, dir string, l Lease) string {
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
	if l.RouterOnLink {
		conf += fmt.Sprintf("option staticroutes %s/32 0.0.0.0, 0.0.0.0/0 %s\n", l.Router, l.Router)
	}
	return conf
}

// StartDHCP starts the responder (DHCPArgv) as a child of the caller: it dies with it.
func StartDHCP(ctx context.Context, netnsPath, iface, dir string, l Lease) (*DHCP, error) {
	argv, err := DHCPArgv(netnsPath, iface, dir, l)
	if err != nil {
		return nil, err
	}
	log, err := os.Create(filepath.Join(dir, "udhcpd.log"))
	if err != nil {
		return nil, err
	}
	defer log.Close()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
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
