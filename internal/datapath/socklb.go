package datapath

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/lb"
)

// Socket load balancing (bpf/sock_lb.c, maps in bpf/lib/lb.h): cgroup v2
// sock_addr hooks translate service addresses at connect/sendmsg time and
// back at recvmsg/getpeername time. SockLB loads them, attaches them to one
// cgroup (the agent's cgroup root) and is the only writer of the service and
// backend maps; it implements lb.Writer.

// Map names, pinned by name under the node's pin dir.
const (
	MapLBService  = "axon_lb_svc"
	MapLBBackend  = "axon_lb_be"
	MapLBReverse  = "axon_lb_rev"
	MapLBAffinity = "axon_lb_aff"
	MapLBLocal    = "axon_lb_local"
)

// sockHookPrefix prefixes the link pins: <pinDir>/links/cgroup-<hook>.
const sockHookPrefix = "cgroup-"

type sockHook struct {
	name   string
	attach ebpf.AttachType
	prog   func(*sockLBPrograms) *ebpf.Program
}

var sockHooks = []sockHook{
	{"connect4", ebpf.AttachCGroupInet4Connect, func(p *sockLBPrograms) *ebpf.Program { return p.AxonSockConnect4 }},
	{"connect6", ebpf.AttachCGroupInet6Connect, func(p *sockLBPrograms) *ebpf.Program { return p.AxonSockConnect6 }},
	{"sendmsg4", ebpf.AttachCGroupUDP4Sendmsg, func(p *sockLBPrograms) *ebpf.Program { return p.AxonSockSendmsg4 }},
	{"sendmsg6", ebpf.AttachCGroupUDP6Sendmsg, func(p *sockLBPrograms) *ebpf.Program { return p.AxonSockSendmsg6 }},
	{"recvmsg4", ebpf.AttachCGroupUDP4Recvmsg, func(p *sockLBPrograms) *ebpf.Program { return p.AxonSockRecvmsg4 }},
	{"recvmsg6", ebpf.AttachCGroupUDP6Recvmsg, func(p *sockLBPrograms) *ebpf.Program { return p.AxonSockRecvmsg6 }},
	{"getpeername4", ebpf.AttachCgroupInet4GetPeername, func(p *sockLBPrograms) *ebpf.Program { return p.AxonSockGetpeername4 }},
	{"getpeername6", ebpf.AttachCgroupInet6GetPeername, func(p *sockLBPrograms) *ebpf.Program { return p.AxonSockGetpeername6 }},
	{"bind4", ebpf.AttachCGroupInet4Bind, func(p *sockLBPrograms) *ebpf.Program { return p.AxonSockBind4 }},
	{"bind6", ebpf.AttachCGroupInet6Bind, func(p *sockLBPrograms) *ebpf.Program { return p.AxonSockBind6 }},
}

// SockLB is the loaded socket load balancer of one node. Methods are safe
// for concurrent use.
type SockLB struct {
	log        *slog.Logger
	pinDir     string
	cgroupPath string
	objs       sockLBObjects

	mu    sync.Mutex
	fe    map[lb.FrontendKey]*feState // what the maps hold, rebuilt on load
	feIDs idAlloc
	beIDs idAlloc
}

// sockLBOptions are test knobs: shrink maps to test "map full".
type sockLBOptions struct {
	maxEntries map[string]uint32
}

// LoadSockLB loads the socket LB programs with their maps pinned under
// pinDir (existing pins are reused, so services survive an agent restart),
// attaches every hook to the cgroup v2 directory cgroupPath through links
// pinned as <pinDir>/links/cgroup-<hook> (a pinned link on the same cgroup is
// updated in place), and reads the programmed frontends back from the maps.
func LoadSockLB(pinDir, cgroupPath string, log *slog.Logger) (*SockLB, error) {
	return loadSockLBWith(pinDir, cgroupPath, log, sockLBOptions{})
}

func loadSockLBWith(pinDir, cgroupPath string, log *slog.Logger, o sockLBOptions) (*SockLB, error) {
	if log == nil {
		log = slog.Default()
	}
	if pinDir == "" {
		return nil, errors.New("load socket LB: pin dir is empty: set a bpffs directory such as /sys/fs/bpf/axon")
	}
	cgID, err := cgroupID(cgroupPath)
	if err != nil {
		return nil, fmt.Errorf("load socket LB: %w", err)
	}
	if err := ensurePinDir(pinDir); err != nil {
		return nil, fmt.Errorf("load socket LB: %w", err)
	}
	spec, err := loadSockLB()
	if err != nil {
		return nil, fmt.Errorf("load socket LB: parse sock_lb object: %w", err)
	}
	for name, n := range o.maxEntries {
		if ms := spec.Maps[name]; ms != nil {
			ms.MaxEntries = n
		}
	}
	s := &SockLB{log: log, pinDir: pinDir, cgroupPath: cgroupPath, fe: map[lb.FrontendKey]*feState{}}
	opts := &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: pinDir}}
	if err := spec.LoadAndAssign(&s.objs, opts); err != nil {
		return nil, fmt.Errorf("load socket LB programs: %w", verifierDetail(incompatibleHint(err, pinDir)))
	}
	if err := s.rebuild(); err != nil {
		s.Close()
		return nil, fmt.Errorf("load socket LB: %w", err)
	}
	for _, h := range sockHooks {
		pin := filepath.Join(linksDir(pinDir), sockHookPrefix+h.name)
		if err := attachCgroupLink(pin, cgroupPath, cgID, h.attach, h.prog(&s.objs.sockLBPrograms)); err != nil {
			s.Close()
			return nil, fmt.Errorf("load socket LB: hook %s: %w", h.name, err)
		}
	}
	log.Info("socket LB loaded", "pinDir", pinDir, "cgroup", cgroupPath, "frontends", len(s.fe))
	return s, nil
}

// cgroupID checks that path is a cgroup v2 directory and returns its id.
func cgroupID(path string) (uint64, error) {
	if path == "" {
		return 0, errors.New("cgroup path is empty: pass a cgroup v2 directory (the cgroup2 mount or a subtree of it, see /proc/mounts)")
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(path, &fs); err != nil {
		return 0, fmt.Errorf("cgroup %s: %w", path, err)
	}
	if fs.Type != unix.CGROUP2_SUPER_MAGIC {
		return 0, fmt.Errorf("cgroup %s is not on a cgroup v2 filesystem: pass a directory under the cgroup2 mount (see /proc/mounts)", path)
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("cgroup %s: %w", path, err)
	}
	return st.Ino, nil // a cgroup2 directory's inode number is the cgroup id
}

// attachCgroupLink updates the link pinned at pin when it is attached to
// cgroup cgID, otherwise (missing, or left on another cgroup) attaches a new
// link and pins it.
func attachCgroupLink(pin, cgroupPath string, cgID uint64, attach ebpf.AttachType, prog *ebpf.Program) error {
	if prog == nil {
		return errors.New("program not loaded")
	}
	old, err := link.LoadPinnedLink(pin, nil)
	switch {
	case err == nil:
		defer old.Close()
		info, ierr := old.Info()
		if ierr == nil && info.Cgroup() != nil && info.Cgroup().CgroupId == cgID {
			if err := old.Update(prog); err != nil {
				return fmt.Errorf("update pinned cgroup link %s: %w", pin, err)
			}
			return nil
		}
		// attached elsewhere (the cgroup root changed) or defunct: replace it
		_ = old.Detach()
		if err := old.Unpin(); err != nil {
			return fmt.Errorf("unpin stale cgroup link %s: %w", pin, err)
		}
	case !errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("load pinned cgroup link %s: %w", pin, err)
	}
	l, err := link.AttachCgroup(link.CgroupOptions{Path: cgroupPath, Attach: attach, Program: prog})
	if err != nil {
		return fmt.Errorf("attach to cgroup %s: %w", cgroupPath, err)
	}
	defer l.Close()
	if err := l.Pin(pin); err != nil {
		_ = l.Close()
		return fmt.Errorf("pin cgroup link at %s (kernel without bpf_link for cgroups?): %w", pin, err)
	}
	return nil
}

// Close releases file descriptors. Pinned maps and links stay: services keep
// working while the agent is down and the next LoadSockLB adopts them.
func (s *SockLB) Close() error {
	return s.objs.Close()
}

// CgroupPath returns the cgroup the hooks are attached to.
func (s *SockLB) CgroupPath() string { return s.cgroupPath }

// UninstallSockLB detaches the socket LB hooks pinned under pinDir and
// removes their link pins and the LB maps; the rest of pinDir (the node's
// tc datapath) is left alone. Missing pins are no error. cgroupPath is then
// checked for axon socket programs still attached (held by a running agent).
func UninstallSockLB(pinDir, cgroupPath string) error {
	if _, err := os.Stat(pinDir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	ok, err := isBPFFS(pinDir)
	if err != nil {
		return fmt.Errorf("uninstall socket LB: %w", err)
	}
	if !ok {
		return fmt.Errorf("uninstall socket LB: %s is not on a bpf filesystem, refusing to remove pins there", pinDir)
	}
	var errs []error
	for _, h := range sockHooks {
		pin := filepath.Join(linksDir(pinDir), sockHookPrefix+h.name)
		l, err := link.LoadPinnedLink(pin, nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("load pinned link %s: %w", pin, err))
			continue
		}
		if err := l.Detach(); err != nil && !errors.Is(err, link.ErrNotSupported) {
			errs = append(errs, fmt.Errorf("detach %s: %w", pin, err))
		}
		if err := l.Unpin(); err != nil {
			errs = append(errs, fmt.Errorf("unpin %s: %w", pin, err))
		}
		l.Close()
	}
	for _, m := range []string{MapLBService, MapLBBackend, MapLBReverse, MapLBAffinity, MapLBLocal} {
		if err := os.Remove(filepath.Join(pinDir, m)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove map pin %s: %w", m, err))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("uninstall socket LB under %s: %w", pinDir, errors.Join(errs...))
	}
	if cgroupPath != "" {
		left, err := attachedSockPrograms(cgroupPath)
		if err != nil {
			return fmt.Errorf("uninstall socket LB: %w", err)
		}
		if len(left) > 0 {
			return fmt.Errorf("uninstall socket LB: %s still has %s attached (held by a running agent?): stop it and retry",
				cgroupPath, strings.Join(left, ", "))
		}
	}
	return nil
}

// attachedSockPrograms lists axon socket LB programs attached to cgroupPath.
func attachedSockPrograms(cgroupPath string) ([]string, error) {
	f, err := os.Open(cgroupPath)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open cgroup %s: %w", cgroupPath, err)
	}
	defer f.Close()
	var out []string
	for _, h := range sockHooks {
		res, err := link.QueryPrograms(link.QueryOptions{Target: int(f.Fd()), Attach: h.attach})
		if err != nil {
			continue // nothing attached, or query unsupported: no evidence of a leftover
		}
		for _, p := range res.Programs {
			prog, err := ebpf.NewProgramFromID(p.ID)
			if err != nil {
				continue
			}
			info, err := prog.Info()
			prog.Close()
			if err == nil && strings.HasPrefix(info.Name, "axon_sock_") {
				out = append(out, fmt.Sprintf("%s (prog id %d)", h.name, p.ID))
			}
		}
	}
	return out, nil
}
