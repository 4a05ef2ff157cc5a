package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// ensureForwarding turns on IPv4 and IPv6 forwarding in the agent's netns.
// IPv6 may be disabled on the host: that is reported, not fatal.
func ensureForwarding() (warnings []string, err error) {
	for _, s := range []struct {
		path string
		v6   bool
	}{
		{"/proc/sys/net/ipv4/ip_forward", false},
		{"/proc/sys/net/ipv6/conf/all/forwarding", true},
	} {
		cur, rerr := os.ReadFile(s.path)
		if rerr != nil {
			if s.v6 && errors.Is(rerr, fs.ErrNotExist) {
				warnings = append(warnings, "IPv6 is disabled in this kernel/netns: IPv6 pod traffic will not be forwarded")
				continue
			}
			return warnings, fmt.Errorf("read %s: %w", s.path, rerr)
		}
		if strings.TrimSpace(string(cur)) == "1" {
			continue
		}
		if werr := os.WriteFile(s.path, []byte("1\n"), 0o644); werr != nil {
			return warnings, fmt.Errorf("enable forwarding %s: %w", s.path, werr)
		}
	}
	return warnings, nil
}

// defaultRouteDevice returns the device of the IPv4 (else IPv6) default route.
func defaultRouteDevice(h *netlink.Handle) (string, error) {
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rs, err := h.RouteListFiltered(fam, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return "", fmt.Errorf("list routes: %w", err)
		}
		for _, r := range rs {
			if r.Dst != nil {
				if ones, _ := r.Dst.Mask.Size(); ones != 0 {
					continue
				}
			}
			idx := r.LinkIndex
			if idx == 0 && len(r.MultiPath) > 0 {
				idx = r.MultiPath[0].LinkIndex
			}
			if idx == 0 {
				continue
			}
			l, err := h.LinkByIndex(idx)
			if err != nil {
				return "", fmt.Errorf("default route device #%d: %w", idx, err)
			}
			return l.Attrs().Name, nil
		}
	}
	return "", nil
}

// deviceWithAddr returns the device holding one of ips.
func deviceWithAddr(h *netlink.Handle, ips []netip.Addr) (string, error) {
	addrs, err := h.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return "", fmt.Errorf("list addresses: %w", err)
	}
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		for _, want := range ips {
			if ip.Unmap() == want {
				l, err := h.LinkByIndex(a.LinkIndex)
				if err != nil {
					return "", fmt.Errorf("device #%d: %w", a.LinkIndex, err)
				}
				return l.Attrs().Name, nil
			}
		}
	}
	return "", nil
}

// lookupLink returns a device's index and MAC, false when it does not exist.
func lookupLink(h *netlink.Handle, name string) (linkInfo, bool) {
	l, err := h.LinkByName(name)
	if err != nil {
		return linkInfo{}, false
	}
	return linkInfo{Index: l.Attrs().Index, MAC: append(net.HardwareAddr(nil), l.Attrs().HardwareAddr...)}, true
}
