// Package brnf turns br_netfilter off for the bridges of one network
// namespace: the lab's wire and the tests' wires stand for a switch, and a
// switch runs no netfilter.
//
// br_netfilter, loaded on most Kubernetes hosts, hands every bridged packet
// to iptables, ip6tables and arptables while the netns' switches
// net.bridge.bridge-nf-call-{iptables,ip6tables,arptables} are on, and they
// are on by default. That is work on the node's CPU that no real network puts
// there, and it breaks IPv6 BIG TCP on some kernels: br_netfilter sets a
// bridged IPv6 packet's transport header just past the IPv6 header, which in
// a packet over 64 KiB is the hop-by-hop jumbo header, and kernels that check
// the TCP header of GSO packets in __dev_queue_xmit (the backport of upstream
// 7fb4c19670110, e.g. Debian's 6.12.118) then drop it as SKB_BAD_GSO at the
// bridge port (docs/pod-networking.md).
package brnf

import (
	"errors"
	"fmt"
	"os"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
)

// Tables are the netfilter front ends br_netfilter can hand bridged packets
// to, each with its switch /proc/sys/net/bridge/bridge-nf-call-<table>.
func Tables() []string { return []string{"iptables", "ip6tables", "arptables"} }

// Path is the sysctl file of table's switch, as seen from the calling
// thread's netns.
func Path(table string) string { return "/proc/sys/net/bridge/bridge-nf-call-" + table }

// PerNetns reports whether kernel release has per-netns br_netfilter
// switches (Linux 5.3 and later). Before that they were global, and setting
// them in one netns would change the host's bridges too.
func PerNetns(release string) (bool, error) {
	var major, minor int
	if _, err := fmt.Sscanf(release, "%d.%d", &major, &minor); err != nil {
		return false, fmt.Errorf("kernel release %q: %w", release, err)
	}
	return major > 5 || major == 5 && minor >= 3, nil
}

// Disable turns every switch off in the netns at nsPath (e.g.
// /run/netns/<name>). Without br_netfilter loaded the switches do not exist
// and there is nothing to do; on a kernel whose switches are global it does
// nothing either, rather than change the host's bridges.
func Disable(nsPath string) error {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return fmt.Errorf("uname: %w", err)
	}
	if ok, err := PerNetns(unix.ByteSliceToString(u.Release[:])); err != nil || !ok {
		return err
	}
	return ns.WithNetNSPath(nsPath, func(ns.NetNS) error {
		for _, table := range Tables() {
			p := Path(table)
			if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) {
				continue
			}
			if err := os.WriteFile(p, []byte("0"), 0o644); err != nil {
				return fmt.Errorf("sysctl net.bridge.bridge-nf-call-%s=0 in %s: %w", table, nsPath, err)
			}
		}
		return nil
	})
}
