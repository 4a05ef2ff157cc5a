package agent

// Issue 4: the socket load balancer (cgroup sock_addr hooks) is loaded after
// the tc datapath, attached to --cgroup-root and handed to the Service watch
// as its lb.Writer. A failure to load it never stops the agent: pods keep
// their connectivity and `axon status` says why Services are not translated.

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/lb"
)

// DecisionSocketLB is the name of the socket LB decision in `axon status`.
const DecisionSocketLB = "socket_lb"

// sockLB is what the agent needs of *datapath.SockLB.
type sockLB interface {
	lb.Writer
	SetLocalAddrs([]netip.Addr) error
	CgroupPath() string
	Close() error
}

// Cgroup2Mount returns the cgroup v2 mount point listed in /proc/mounts, or
// "" when there is none (Validate then says what to do).
func Cgroup2Mount() string {
	f, err := os.Open("/proc/mounts")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) >= 3 && fields[2] == "cgroup2" {
			return fields[1]
		}
	}
	return ""
}

// checkCgroup2Dir says what is wrong with --cgroup-root, nil when it is a
// directory on a cgroup v2 filesystem.
func checkCgroup2Dir(path string) error {
	if path == "" {
		return errors.New("--cgroup-root is empty and no cgroup2 filesystem is mounted (see /proc/mounts): mount one, pass --cgroup-root, or pass --socket-lb=false")
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(path, &fs); err != nil {
		return fmt.Errorf("--cgroup-root %s: %w: pass an existing cgroup v2 directory, or --socket-lb=false", path, err)
	}
	if fs.Type != unix.CGROUP2_SUPER_MAGIC {
		return fmt.Errorf("--cgroup-root %s is not on a cgroup v2 filesystem: pass the cgroup2 mount (see /proc/mounts) or a directory under it, or --socket-lb=false", path)
	}
	return nil
}

// loadSockLBFunc returns the loader used by Run.
func loadSockLBFunc(cfg Config, log *slog.Logger) func() (sockLB, error) {
	return func() (sockLB, error) {
		s, err := datapath.LoadSockLB(cfg.BPFRoot, cfg.CgroupRoot, log.With("component", "socklb"))
		if err != nil {
			return nil, err
		}
		return s, nil
	}
}

// ensureSockLB loads the socket LB once the tc datapath is loaded, hands it
// to the Service watch and keeps the node's local addresses current. It
// never fails the reconcile: a load error is reported in status and retried
// on the next pass. Called with dpMu held.
func (a *Agent) ensureSockLB() {
	if !a.cfg.SocketLB {
		a.disableSockLBOnce()
		return
	}
	if a.lb == nil {
		s, err := a.loadLB()
		if err != nil {
			msg := fmt.Sprintf("load failed, Services are not translated: %v", err)
			a.stMu.Lock()
			changed := a.lbErr != msg
			a.lbErr = msg
			a.stMu.Unlock()
			if changed {
				a.log.Warn("socket load balancing disabled; the agent keeps running without it", "cgroup", a.cfg.CgroupRoot, "error", err)
			}
			return
		}
		a.lb = s
		a.stMu.Lock()
		a.lbErr, a.lbCgroup = "", s.CgroupPath()
		a.stMu.Unlock()
		a.log.Info("socket load balancing enabled", "cgroup", s.CgroupPath())
		a.SetLBWriter(s)
	}
	addrs, err := nodeLocalAddrs(a.nl)
	if err != nil {
		a.log.Warn("socket LB: list node addresses", "error", err)
		return
	}
	if slices.Equal(addrs, a.lbAddrs) {
		return
	}
	if err := a.lb.SetLocalAddrs(addrs); err != nil {
		a.log.Warn("socket LB: set node addresses", "error", err)
		return
	}
	a.lbAddrs = addrs
	a.log.Info("socket LB node addresses set", "addresses", addrs)
}

// disableSockLBOnce removes hooks a previous run with --socket-lb pinned,
// so turning the flag off really turns translation off.
func (a *Agent) disableSockLBOnce() {
	if a.lbOffDone {
		return
	}
	a.lbOffDone = true
	if err := datapath.UninstallSockLB(a.cfg.BPFRoot, ""); err != nil {
		a.log.Warn("--socket-lb=false: could not remove the socket LB hooks of a previous run", "error", err)
	}
}

// nodeLocalAddrs lists the addresses NodePort/HostPort frontends match on:
// every global address in this netns except on pod devices (loopback always
// matches in the BPF program). Sorted, without duplicates.
func nodeLocalAddrs(h *netlink.Handle) ([]netip.Addr, error) {
	links, err := h.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	var out []netip.Addr
	for _, l := range links {
		name := l.Attrs().Name
		if strings.HasPrefix(name, "lxc") || l.Attrs().Flags&unix.IFF_LOOPBACK != 0 {
			continue
		}
		addrs, err := h.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return nil, fmt.Errorf("list addresses of %s: %w", name, err)
		}
		for _, ad := range addrs {
			ip, ok := netip.AddrFromSlice(ad.IP)
			if !ok {
				continue
			}
			ip = ip.Unmap()
			if ip.IsLoopback() || ip.IsLinkLocalUnicast() || ip.IsUnspecified() || ip.IsMulticast() {
				continue
			}
			out = append(out, ip)
		}
	}
	slices.SortFunc(out, func(x, y netip.Addr) int { return x.Compare(y) })
	return slices.Compact(out), nil
}

// sockLBDecision is the socket_lb line of `axon status`.
func (a *Agent) sockLBDecision() api.Decision {
	d := api.Decision{Name: DecisionSocketLB, Value: "disabled"}
	if !a.cfg.SocketLB {
		d.Reason = "--socket-lb=false"
		return d
	}
	a.stMu.Lock()
	lbErr, loaded := a.lbErr, a.lbCgroup
	a.stMu.Unlock()
	switch {
	case loaded != "":
		d.Value = "enabled"
		d.Reason = "cgroup " + loaded
		if a.svc != nil {
			st := a.svc.status()
			d.Reason += fmt.Sprintf(", %d frontend%s", st.Frontends, plural(st.Frontends))
			if !st.Synced {
				d.Reason += " (Service watch not synced yet)"
			}
		}
	case lbErr != "":
		d.Reason = lbErr
	default:
		d.Value = "pending"
		d.Reason = "loads after the tc datapath"
	}
	return d
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
