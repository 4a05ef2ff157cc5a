package socklb

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/datapath/lbmap"
	"github.com/axonhq/axon/internal/lb"
)

// Socket load balancing (bpf/sock_lb.c, maps in bpf/lib/lb.h): cgroup v2
// sock_addr hooks translate service addresses at connect/sendmsg time and
// back at recvmsg/getpeername time. LB loads them, attaches them to one
// cgroup (the agent's cgroup root) and is the only writer of the service and
// backend maps; it implements lb.Writer.

// Map names, pinned by name under the node's pin dir.
const (
	MapLBService  = "axon_lb_svc"
	MapLBBackend  = "axon_lb_be"
	MapLBReverse  = "axon_lb_rev"
	MapLBSock     = "axon_lb_sock"
	MapLBAffinity = "axon_lb_aff"
	MapLBLocal    = "axon_lb_local"
	MapLBSkip     = "axon_lb_skip"

	// mapLBSockStorage is the socket-storage map that held connected
	// sockets' reverse entries in builds of 2026-11-25 (now axon_lb_sock):
	// its pin is removed at load and uninstall.
	mapLBSockStorage = "axon_lb_sk"
)

// Config is the load-time configuration of the socket LB.
type Config struct {
	// ServiceMapSize is max_entries of axon_lb_svc: one entry per frontend
	// plus one per backend slot (0 = the default of bpf/lib/lb.h). A
	// Service that does not fit is refused whole (see Fits).
	ServiceMapSize uint32
	// BackendMapSize is max_entries of axon_lb_be: one entry per backend
	// of every frontend (0 = default).
	BackendMapSize uint32
	// HostNetnsOnly translates only sockets of the agent's own network
	// namespace (--socket-lb-mode hostns-only): pods' sockets reach
	// Service addresses untranslated; the agent gives each pod its own
	// per-packet LB (package podlb).
	HostNetnsOnly bool
}

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
	{"release", ebpf.AttachCgroupInetSockRelease, func(p *sockLBPrograms) *ebpf.Program { return p.AxonSockRelease }},
}

// LB is the loaded socket load balancer of one node. Methods are safe
// for concurrent use.
type LB struct {
	log        *slog.Logger
	pinDir     string
	cgroupPath string
	objs       sockLBObjects

	mu    sync.Mutex
	fe    map[lb.FrontendKey]*feState // what the maps hold, rebuilt on load
	feIDs lbmap.IDAlloc
	beIDs lbmap.IDAlloc
	// svcEntries counts axon_lb_svc entries in use (masters + slots), for Fits.
	svcEntries int
	// destroy aborts sockets of removed backends (nil: not available).
	// Writes queue the removed backends in destroyQ; a worker runs one pass
	// for everything queued (a pass walks the socket tables of every netns
	// of the node, ~2 ms each here), off the Service write path.
	destroy     *SockDestroyer
	destroyErr  string          // why destroy is nil
	destroyNS   func() []string // netns paths to walk ("" = own)
	destroyStat DestroyStats
	destroyQ    []GoneBackend
	destroyKick chan struct{} // buffered(1): work queued
	destroyStop chan struct{} // closed by Close
	destroyDone chan struct{} // closed when the worker returned
}

// DestroyStats counts what socket destruction did since load.
type DestroyStats struct {
	Passes    uint64 // Destroy passes run (one per write that removed backends)
	Destroyed uint64 // sockets aborted
	Failed    uint64 // bpf_sock_destroy or iterator errors
	LastError string
}

// sockLBOptions are test knobs: shrink maps to test "map full".
type sockLBOptions struct {
	maxEntries map[string]uint32
	cfg        Config
}

// Load loads the socket LB programs with their maps pinned under
// pinDir (existing pins are reused, so services survive an agent restart),
// attaches every hook to the cgroup v2 directory cgroupPath through links
// pinned as <pinDir>/links/cgroup-<hook> (a pinned link on the same cgroup is
// updated in place), and reads the programmed frontends back from the maps.
func Load(pinDir, cgroupPath string, log *slog.Logger) (*LB, error) {
	return loadSockLBWith(pinDir, cgroupPath, log, sockLBOptions{})
}

// LoadWithConfig is Load with map sizes and mode. A pinned map
// of another size is migrated: its entries are copied into a map of the
// new size, which replaces the pin once the programs use it.
func LoadWithConfig(pinDir, cgroupPath string, cfg Config, log *slog.Logger) (*LB, error) {
	return loadSockLBWith(pinDir, cgroupPath, log, sockLBOptions{cfg: cfg})
}

func loadSockLBWith(pinDir, cgroupPath string, log *slog.Logger, o sockLBOptions) (*LB, error) {
	if log == nil {
		log = slog.Default()
	}
	if pinDir == "" {
		return nil, errors.New("load socket LB: pin dir is empty: set a bpffs directory such as /sys/fs/bpf/axon")
	}
	cgID, err := datapath.CgroupID(cgroupPath)
	if err != nil {
		return nil, fmt.Errorf("load socket LB: %w", err)
	}
	if err := datapath.EnsurePinDir(pinDir); err != nil {
		return nil, fmt.Errorf("load socket LB: %w", err)
	}
	spec, err := loadSockLB()
	if err != nil {
		return nil, fmt.Errorf("load socket LB: parse sock_lb object: %w", err)
	}
	sizes := map[string]uint32{MapLBService: o.cfg.ServiceMapSize, MapLBBackend: o.cfg.BackendMapSize}
	for name, n := range o.maxEntries {
		sizes[name] = n
	}
	for name, n := range sizes {
		if ms := spec.Maps[name]; ms != nil && n > 0 {
			ms.MaxEntries = n
		}
	}
	if o.cfg.HostNetnsOnly {
		cookie, err := NetnsCookie("")
		if err != nil {
			return nil, fmt.Errorf("load socket LB: hostns-only mode: %w", err)
		}
		if err := spec.Variables["cfg_hostns_only"].Set(uint8(1)); err != nil {
			return nil, fmt.Errorf("load socket LB: set cfg_hostns_only: %w", err)
		}
		if err := spec.Variables["cfg_host_netns_cookie"].Set(cookie); err != nil {
			return nil, fmt.Errorf("load socket LB: set cfg_host_netns_cookie: %w", err)
		}
	}
	s := &LB{log: log, pinDir: pinDir, cgroupPath: cgroupPath, fe: map[lb.FrontendKey]*feState{}}
	migrated, err := migrateResized(spec, pinDir, log)
	if err != nil {
		return nil, fmt.Errorf("load socket LB: %w", err)
	}
	defer func() {
		for _, m := range migrated {
			m.Close()
		}
	}()
	opts := &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: pinDir}, MapReplacements: migrated}
	if err := spec.LoadAndAssign(&s.objs, opts); err != nil {
		return nil, fmt.Errorf("load socket LB programs: %w", datapath.VerifierDetail(datapath.IncompatibleHint(err, pinDir)))
	}
	if err := s.rebuild(); err != nil {
		s.Close()
		return nil, fmt.Errorf("load socket LB: %w", err)
	}
	for _, h := range sockHooks {
		pin := filepath.Join(datapath.LinksDir(pinDir), sockHookPrefix+h.name)
		if err := datapath.AttachCgroupLink(pin, cgroupPath, cgID, h.attach, h.prog(&s.objs.sockLBPrograms)); err != nil {
			s.Close()
			return nil, fmt.Errorf("load socket LB: hook %s: %w", h.name, err)
		}
	}
	// the old programs, and with them the maps only they used, are gone
	if err := os.Remove(filepath.Join(pinDir, mapLBSockStorage)); err != nil && !errors.Is(err, os.ErrNotExist) {
		s.Close()
		return nil, fmt.Errorf("load socket LB: remove the pin of the replaced map %s: %w", mapLBSockStorage, err)
	}
	// the programs now use the resized maps: move the pins over
	for name, m := range migrated {
		pin := filepath.Join(pinDir, name)
		if err := os.Remove(pin); err != nil && !errors.Is(err, os.ErrNotExist) {
			s.Close()
			return nil, fmt.Errorf("load socket LB: replace pin of resized map %s: %w", name, err)
		}
		if err := m.Pin(pin); err != nil {
			s.Close()
			return nil, fmt.Errorf("load socket LB: pin resized map %s: %w", name, err)
		}
	}
	log.Info("socket LB loaded", "pinDir", pinDir, "cgroup", cgroupPath, "frontends", len(s.fe),
		"serviceMapSize", s.objs.AxonLbSvc.MaxEntries(), "backendMapSize", s.objs.AxonLbBe.MaxEntries(), "hostNetnsOnly", o.cfg.HostNetnsOnly)
	return s, nil
}

// migrateResized copies each pinned service/backend map whose size differs
// from spec into a new, unpinned map of the spec's size (same content).
func migrateResized(spec *ebpf.CollectionSpec, pinDir string, log *slog.Logger) (map[string]*ebpf.Map, error) {
	out := map[string]*ebpf.Map{}
	for _, name := range []string{MapLBService, MapLBBackend} {
		ms := spec.Maps[name]
		old, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, name), nil)
		if errors.Is(err, os.ErrNotExist) || ms == nil {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("open pinned map %s: %w", name, err)
		}
		if old.MaxEntries() == ms.MaxEntries {
			old.Close()
			continue
		}
		fresh := ms.Copy()
		fresh.Pinning = ebpf.PinNone
		m, err := ebpf.NewMap(fresh)
		if err != nil {
			old.Close()
			return nil, fmt.Errorf("create resized map %s: %w", name, err)
		}
		k := make([]byte, ms.KeySize)
		v := make([]byte, ms.ValueSize)
		n := 0
		it := old.Iterate()
		for it.Next(&k, &v) {
			if err := m.Put(k, v); err != nil {
				old.Close()
				m.Close()
				return nil, fmt.Errorf("map %s: %d entries do not fit the new size %d: %w (raise the size or delete Services first)",
					name, n+1, ms.MaxEntries, err)
			}
			n++
		}
		ierr := it.Err()
		old.Close()
		if ierr != nil {
			m.Close()
			return nil, fmt.Errorf("read pinned map %s: %w", name, ierr)
		}
		log.Info("socket LB map resized", "map", name, "from", old.MaxEntries(), "to", ms.MaxEntries, "entries", n)
		out[name] = m
	}
	return out, nil
}

// EnableSockDestroy loads the socket iterators that abort sockets of removed
// backends; netns lists the network namespaces to walk ("" = the agent's
// own, plus every pod's). Without it (error: kernel < 6.5), connected
// sockets keep their backend until the application reconnects.
func (s *LB) EnableSockDestroy(netns func() []string) error {
	maps := map[string]*ebpf.Map{
		MapLBService: s.objs.AxonLbSvc, MapLBBackend: s.objs.AxonLbBe, MapLBReverse: s.objs.AxonLbRev, MapLBSock: s.objs.AxonLbSock,
		MapLBAffinity: s.objs.AxonLbAff, MapLBLocal: s.objs.AxonLbLocal, MapLBSkip: s.objs.AxonLbSkip,
	}
	d, err := loadSockDestroyer(maps, s.log)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.destroyErr = err.Error()
		return err
	}
	if s.destroy != nil {
		d.Close()
		return errors.New("socket destruction is already enabled")
	}
	s.destroy, s.destroyNS, s.destroyErr = d, netns, ""
	s.destroyKick, s.destroyStop, s.destroyDone = make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
	go s.destroyWorker(d, s.destroyKick, s.destroyStop, s.destroyDone)
	return nil
}

// destroyWorker runs a destroy pass whenever writes queued removed backends.
func (s *LB) destroyWorker(d *SockDestroyer, kick, stop, done chan struct{}) {
	defer close(done)
	for {
		select {
		case <-stop:
			return
		case <-kick:
		}
		s.mu.Lock()
		gone := s.destroyQ
		s.destroyQ = nil
		nsf := s.destroyNS
		s.mu.Unlock()
		ns := []string{""}
		if nsf != nil {
			ns = nsf()
		}
		res, err := d.Destroy(ns, gone)
		s.mu.Lock()
		s.destroyStat.Passes++
		if err != nil {
			s.destroyStat.Failed++
			s.destroyStat.LastError = err.Error()
			s.log.Warn("socket LB: aborting sockets of removed backends failed", "error", err)
		}
		for _, r := range res {
			if r.Err != nil {
				s.destroyStat.Failed++
				s.destroyStat.LastError = r.Err.Error()
				s.log.Warn("socket LB: could not abort a socket of a removed backend", "backend", r.Peer, "proto", r.Proto, "netns", r.Netns, "error", r.Err)
				continue
			}
			s.destroyStat.Destroyed++
			s.log.Info("socket LB: aborted a socket of a removed backend", "backend", r.Peer, "proto", r.Proto, "netns", r.Netns, "cookie", r.Cookie)
		}
		s.mu.Unlock()
	}
}

// SockDestroyStatus says whether removed backends' sockets are aborted, and
// what that did so far.
func (s *LB) SockDestroyStatus() (enabled bool, reason string, st DestroyStats) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.destroy != nil, s.destroyErr, s.destroyStat
}

// destroyLocked queues the sockets connected to gone backends for the
// destroy worker. Called with s.mu held, after the maps no longer hold
// those backends (a reconnect cannot pick them again).
func (s *LB) destroyLocked(gone []GoneBackend) {
	if s.destroy == nil || len(gone) == 0 {
		return
	}
	s.destroyQ = append(s.destroyQ, gone...)
	select {
	case s.destroyKick <- struct{}{}:
	default: // a pass is queued already and will take these too
	}
}

// SetSkipNetns replaces the set of netns cookies whose sockets are never
// translated (pods that opted out of socket LB).
func (s *LB) SetSkipNetns(cookies []uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	want := map[uint64]bool{}
	for _, c := range cookies {
		want[c] = true
	}
	if max := int(s.objs.AxonLbSkip.MaxEntries()); len(want) > max {
		return fmt.Errorf("set opted-out netns: %d namespaces, the map %s holds at most %d", len(want), MapLBSkip, max)
	}
	if err := datapath.ReplaceKeys(s.objs.AxonLbSkip, MapLBSkip, want); err != nil {
		return fmt.Errorf("set opted-out netns: %w", err)
	}
	return nil
}

// SkipNetns lists the netns cookies in axon_lb_skip, sorted.
func (s *LB) SkipNetns() ([]uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var (
		k   uint64
		v   uint8
		out []uint64
	)
	it := s.objs.AxonLbSkip.Iterate()
	for it.Next(&k, &v) {
		out = append(out, k)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", MapLBSkip, err)
	}
	slices.Sort(out)
	return out, nil
}

// Close releases file descriptors. Pinned maps and links stay: services keep
// working while the agent is down and the next Load adopts them.
func (s *LB) Close() error {
	s.mu.Lock()
	d, stop, done := s.destroy, s.destroyStop, s.destroyDone
	s.destroy, s.destroyStop = nil, nil
	s.mu.Unlock()
	if d != nil {
		close(stop)
		<-done
		d.Close()
	}
	return s.objs.Close()
}

// CgroupPath returns the cgroup the hooks are attached to.
func (s *LB) CgroupPath() string { return s.cgroupPath }

// Uninstall detaches the socket LB hooks pinned under pinDir and
// removes their link pins and the LB maps; the rest of pinDir (the node's
// tc datapath) is left alone. Missing pins are no error. cgroupPath is then
// checked for axon socket programs still attached (held by a running agent).
func Uninstall(pinDir, cgroupPath string) error {
	if _, err := os.Stat(pinDir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	ok, err := datapath.IsBPFFS(pinDir)
	if err != nil {
		return fmt.Errorf("uninstall socket LB: %w", err)
	}
	if !ok {
		return fmt.Errorf("uninstall socket LB: %s is not on a bpf filesystem, refusing to remove pins there", pinDir)
	}
	var errs []error
	for _, h := range sockHooks {
		pin := filepath.Join(datapath.LinksDir(pinDir), sockHookPrefix+h.name)
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
	for _, m := range []string{MapLBService, MapLBBackend, MapLBReverse, MapLBSock, MapLBAffinity, MapLBLocal, MapLBSkip, mapLBSockStorage} {
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

// MapUsage is how full one of the socket LB's maps is.
type MapUsage struct {
	Map     string // pinned name (MapLBService, MapLBBackend)
	Entries int    // entries in use, as the LB wrote them
	Max     uint32 // the map's size
}

// MapPressure returns the fill of the service and backend maps (from the
// LB's own bookkeeping: no map walk).
func (s *LB) MapPressure() []MapUsage {
	s.mu.Lock()
	defer s.mu.Unlock()
	return []MapUsage{
		{Map: MapLBService, Entries: s.svcEntries, Max: s.objs.AxonLbSvc.MaxEntries()},
		{Map: MapLBBackend, Entries: s.beIDs.Len(), Max: s.objs.AxonLbBe.MaxEntries()},
	}
}
