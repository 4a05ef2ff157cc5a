package agent

// The socket load balancer (cgroup sock_addr hooks) is loaded after
// the tc datapath, attached to --cgroup-root and handed to the Service watch
// as its lb.Writer. A failure to load it never stops the agent: pods keep
// their connectivity and `axon status` says why Services are not translated.

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/datapath/podlb"
	"github.com/axonhq/axon/internal/datapath/socklb"
	"github.com/axonhq/axon/internal/lb"
)

// DecisionSocketLB is the name of the socket LB decision in `axon status`.
const DecisionSocketLB = "socket_lb"

// --socket-lb-mode values.
const (
	SocketLBModeAll    = "all"         // every socket under --cgroup-root
	SocketLBModeHostNS = "hostns-only" // only the node's own netns
)

// sockLB is what the agent needs of *socklb.LB.
type sockLB interface {
	lb.Writer
	SetLocalAddrs([]netip.Addr) error
	SetSkipNetns([]uint64) error
	EnableSockDestroy(netns func() []string) error
	SockDestroyStatus() (enabled bool, reason string, st socklb.DestroyStats)
	CgroupPath() string
	Close() error
}

// validateSocketLB checks --socket-lb-mode and the map sizes.
func (c Config) validateSocketLB() error {
	var errs []error
	switch c.SocketLBMode {
	case SocketLBModeAll, SocketLBModeHostNS, "": // "" (a Config built by hand) = all
	default:
		errs = append(errs, fmt.Errorf("--socket-lb-mode %q is invalid: use %s (every socket) or %s (only the node's own netns; each pod gets its own per-packet pod LB)",
			c.SocketLBMode, SocketLBModeAll, SocketLBModeHostNS))
	}
	for _, m := range []struct {
		flag string
		v    uint32
	}{{"--lb-service-map-size", c.LBServiceMapSize}, {"--lb-backend-map-size", c.LBBackendMapSize}} {
		if m.v != 0 && (m.v < 16 || m.v > 1<<24) {
			errs = append(errs, fmt.Errorf("%s %d is out of range: use 16..%d, or 0 for the default", m.flag, m.v, 1<<24))
		}
	}
	return errors.Join(errs...)
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
		s, err := socklb.LoadWithConfig(cfg.BPFRoot, cfg.CgroupRoot, socklb.Config{
			ServiceMapSize: cfg.LBServiceMapSize,
			BackendMapSize: cfg.LBBackendMapSize,
			HostNetnsOnly:  cfg.SocketLBMode == SocketLBModeHostNS,
		}, log.With("component", "socklb"))
		if err != nil {
			return nil, err
		}
		return s, nil
	}
}

// socketLB is the socket load balancer feature: the cgroup hooks, the
// node's local addresses in their maps and the per-pod opt-out
// (optout.go). The Service watch writes the Service table through it.
type socketLB struct {
	cfg  Config
	log  *slog.Logger
	nl   *netlink.Handle
	reg  *registry
	load func() (sockLB, error)
	kube func() *kube // the agent's kube client, nil until it is built
	kick func()       // asks the agent for a reconcile pass
	svc  *serviceSync // the Service watch, nil until the agent runs it

	// mu serialises the work on the loaded socket LB and guards the fields
	// up to stMu. It is held across the load and the BPF writes; status
	// readers do not take it.
	mu       sync.Mutex
	lb       sockLB // nil until loaded
	addrs    []netip.Addr
	offDone  bool
	opt      optOutState
	plb      podLBState               // the per-packet pod LB (podlb.go)
	newPodLB func() (podLBer, error)  // its loader
	vmTaps   func() map[string]string // the VM bypass's pods: endpoint (cookieKey) → tap; nil: none

	// stMu guards the fields below, what status reads. Nothing is called
	// with it held.
	stMu       sync.Mutex
	err        string            // why the socket LB is not loaded
	cgroup     string            // cgroup the hooks are attached to, "" until loaded
	optOutPods []string          // opted-out pods (namespace/name), sorted
	plbPods    []string          // pods with the per-packet pod LB (namespace/name), sorted
	plbFail    map[string]string // pod → why its pod LB is not attached; "*": the pod LB is unavailable
	plbByEP    map[string]string // endpoint (cookieKey) → its api.Endpoint.PodLB
}

func newSocketLB(cfg Config, log *slog.Logger, nl *netlink.Handle, reg *registry, kube func() *kube, kick func()) *socketLB {
	return &socketLB{cfg: cfg, log: log, nl: nl, reg: reg, load: loadSockLBFunc(cfg, log), kube: kube, kick: kick,
		newPodLB: func() (podLBer, error) {
			return podlb.New(podlb.Config{PinDir: cfg.BPFRoot, AttachMode: cfg.AttachMode, Logger: log.With("component", "podlb")})
		}}
}

// ensure loads the socket LB once the tc datapath is loaded, hands it to
// the Service watch and keeps the node's local addresses current. It
// never fails the reconcile: a load error is reported in status and
// retried on the next pass.
func (s *socketLB) ensure() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.cfg.SocketLB {
		s.disableOnceLocked()
		return
	}
	if s.lb == nil {
		l, err := s.load()
		if err != nil {
			msg := fmt.Sprintf("load failed, Services are not translated: %v", err)
			s.stMu.Lock()
			changed := s.err != msg
			s.err = msg
			s.stMu.Unlock()
			if changed {
				s.log.Warn("socket load balancing disabled; the agent keeps running without it", "cgroup", s.cfg.CgroupRoot, "error", err)
			}
			return
		}
		s.lb = l
		s.stMu.Lock()
		s.err, s.cgroup = "", l.CgroupPath()
		s.stMu.Unlock()
		s.log.Info("socket load balancing enabled", "cgroup", l.CgroupPath(), "mode", cmp.Or(s.cfg.SocketLBMode, SocketLBModeAll))
		if err := l.EnableSockDestroy(s.destroyNetns); err != nil {
			s.log.Warn("socket LB: sockets connected to a removed backend are not aborted (they keep it until the application reconnects; replies stay correctly translated)", "reason", err)
		}
		if s.svc != nil {
			s.svc.setNamespaceHook(s.kick)
			s.svc.SetWriter(l)
		}
	}
	s.syncOptOutLocked()
	addrs, err := nodeLocalAddrs(s.nl)
	if err != nil {
		s.log.Warn("socket LB: list node addresses", "error", err)
		return
	}
	if slices.Equal(addrs, s.addrs) {
		return
	}
	if err := s.lb.SetLocalAddrs(addrs); err != nil {
		s.log.Warn("socket LB: set node addresses", "error", err)
		return
	}
	s.addrs = addrs
	s.log.Info("socket LB node addresses set", "addresses", addrs)
}

// disableOnceLocked removes hooks a previous run with --socket-lb pinned,
// so turning the flag off really turns translation off.
func (s *socketLB) disableOnceLocked() {
	if s.offDone {
		return
	}
	s.offDone = true
	var netns []string
	for _, ep := range s.reg.List() {
		netns = append(netns, ep.Netns)
	}
	if err := errors.Join(podlb.Uninstall(s.cfg.BPFRoot, netns), socklb.Uninstall(s.cfg.BPFRoot, "")); err != nil {
		s.log.Warn("--socket-lb=false: could not remove the socket LB hooks and pod LBs of a previous run", "error", err)
	}
}

// writer is the loaded socket LB as an lb.Writer, nil until loaded.
func (s *socketLB) writer() lb.Writer {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lb == nil {
		return nil
	}
	return s.lb
}

// close releases the socket LB's file descriptors (pins and hooks stay).
func (s *socketLB) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lb != nil {
		if err := s.lb.Close(); err != nil {
			s.log.Warn("close socket LB", "error", err)
		}
		s.lb = nil
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

// state returns why the socket LB is not loaded and the cgroup it is
// attached to ("" until loaded).
func (s *socketLB) state() (err, cgroup string) {
	s.stMu.Lock()
	defer s.stMu.Unlock()
	return s.err, s.cgroup
}

// decision is the socket_lb line of `axon status`.
func (s *socketLB) decision() api.Decision {
	d := api.Decision{Name: DecisionSocketLB, Value: "disabled"}
	if !s.cfg.SocketLB {
		d.Reason = "--socket-lb=false"
		return d
	}
	lbErr, loaded := s.state()
	switch {
	case loaded != "":
		d.Value = "enabled"
		d.Reason = "cgroup " + loaded + ", mode " + cmp.Or(s.cfg.SocketLBMode, SocketLBModeAll)
		if s.cfg.SocketLBMode == SocketLBModeHostNS {
			d.Reason += " (pods' sockets untranslated: each pod's own per-packet LB serves them)"
		}
		if s.svc != nil {
			st := s.svc.status()
			d.Reason += fmt.Sprintf(", %d frontend%s", st.Frontends, plural(st.Frontends))
			if !st.Synced {
				d.Reason += " (Service watch not synced yet)"
			}
			if pods := s.optedOut(); len(pods) > 0 {
				d.Reason += fmt.Sprintf("; opted out (%s): %s", AnnotationSocketLB, strings.Join(pods, " "))
			}
			d.Reason += "; " + s.podLBReason()
		}
		d.Reason += "; " + s.destroyReason()
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

// destroyNetns lists the network namespaces whose sockets socket
// destruction walks: the agent's own ("") and every endpoint's.
func (s *socketLB) destroyNetns() []string {
	out := []string{""}
	seen := map[string]bool{}
	for _, ep := range s.reg.List() {
		if ep.Netns != "" && !seen[ep.Netns] {
			seen[ep.Netns] = true
			out = append(out, ep.Netns)
		}
	}
	return out
}

// destroyReason describes socket destruction for the socket_lb decision.
func (s *socketLB) destroyReason() string {
	// through the Service watch's writer: mu may be held by a long load
	var l interface {
		SockDestroyStatus() (bool, string, socklb.DestroyStats)
	}
	if s.svc != nil {
		l, _ = s.svc.writer().(interface {
			SockDestroyStatus() (bool, string, socklb.DestroyStats)
		})
	}
	if l == nil {
		return "socket destruction: not loaded yet"
	}
	on, why, st := l.SockDestroyStatus()
	if !on {
		if why == "" {
			why = "not loaded"
		}
		return "sockets of removed backends are not aborted (" + why + "): connected sockets keep a removed backend until the application reconnects"
	}
	r := fmt.Sprintf("sockets of removed backends are aborted (bpf_sock_destroy): %d so far", st.Destroyed)
	if st.Failed > 0 {
		r += fmt.Sprintf(", %d failed (last: %s)", st.Failed, st.LastError)
	}
	return r
}
