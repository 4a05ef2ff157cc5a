package sockmap

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/datapath"
)

// Map names, pinned by name under the node's pin dir.
const (
	MapSockHash = "axon_sock_hash"
	MapPods     = "axon_sockmap_pods"
	MapNetns    = "axon_sockmap_netns"
	MapState    = "axon_sockmap_state"
	MapMetrics  = "axon_sockmap_metrics"
	// MapSockAlias holds the bypassed sockets again under their alias keys
	// (the client endpoint of their connection): how the two sockets of a
	// connection a sidecar's netfilter REDIRECT rewrote find each other.
	MapSockAlias = "axon_sock_alias"
	// MapAliasPoison holds the alias keys two sockets claimed at once: never
	// paired through.
	MapAliasPoison = "axon_sockmap_alias_poison"
	// MapQuiet holds, under each key of a socket that entered
	// axon_sock_hash (its exact key and its alias keys), whether it may
	// still redirect into its peer (live) or never will (quiet): what its
	// peer reads to decide whether it may leave the map. Entries stay until
	// the socket closes.
	MapQuiet = "axon_sockmap_quiet"
)

// LinkPin is the name of the sock_ops cgroup link's pin under
// <pinDir>/links (the socket LB's cgroup links are cgroup-<hook> too).
const LinkPin = "cgroup-sockops"

// DefaultMaxEntries is max_entries of axon_sock_hash when Config leaves it
// 0: one entry per bypassed socket, two per connection.
const DefaultMaxEntries = 65536

// pinnedMaps are the maps Uninstall removes.
var pinnedMaps = []string{MapSockHash, MapPods, MapNetns, MapState, MapMetrics, MapSockAlias, MapAliasPoison, MapQuiet}

// metricNames are the counters of axon_sockmap_metrics, index = enum
// axon_sockmap_counter (bpf/lib/common.h; TestEnumsMatchBTF keeps them equal).
var metricNames = []string{
	"admit_pod", "admit_loopback", "skip_not_pod", "skip_netns_mismatch", "skip_not_enabled",
	"insert_failed", "redirect_msgs", "redirect_bytes", "pass_no_peer", "pass_sticky", "pass_bytes",
	"switch_stack", "splice_refused", "backpressure", "admit_intrapod", "alias_paired", "alias_collision",
	"alias_poisoned", "left",
}

// Per-socket modes of axon_sockmap_state (enum axon_sockmap_mode).
const (
	modeUndecided = 0
	modeBypass    = 1
	modeStack     = 2
	modeUnknown   = 3 // the connection list: the socket has no state
)

// Bits of axon_sockmap_state's flags (enum axon_sockmap_flag): the socket's
// role in its connection, and that its peer was found by alias key; the
// mode machine's: quiet (never redirects again), left the map, the sk_msg
// program's vouch for its sendmsg, quiet written under all its keys, never
// quiet (the resume probe's writers), and the small-write streak (a count).
const (
	flagClient    = 0x1
	flagServer    = 0x2
	flagPeerAlias = 0x4
	flagQuiet     = 0x100
	flagLeft      = 0x200
	flagVouch     = 0x400
	flagPublished = 0x800
	flagHold      = 0x1000
	flagStreak    = 0xff0000
)

// modeNames are the modes as Conn shows them.
var modeNames = map[uint32]string{modeUndecided: "undecided", modeBypass: "bypass", modeStack: "stack"}

// Config is the load-time configuration of the bypass.
type Config struct {
	// MaxEntries is max_entries of axon_sock_hash (0: DefaultMaxEntries),
	// and half of axon_sock_alias's (a socket has up to two alias keys).
	// A socket that finds the map full stays on the TCP stack (counted as
	// insert_failed). A pinned map of another size is not adopted: Load
	// fails and says to Uninstall (bypassed connections then fall back).
	MaxEntries uint32
	// StreamVerdict attaches the no-op stream verdict axon_sk_skb_pass to
	// axon_sock_hash, for kernels whose FIONREAD of a socket in a SOCKHASH
	// misses bytes that arrived through TCP (SelfTest sets
	// Result.StreamVerdict there). Sockets take the map's programs when they
	// enter it: a change applies to new connections only.
	StreamVerdict bool
	// NoSpliceGuard loads the bypass without its splice guard (splice.go),
	// on a kernel that cannot run it. splice(2) and sendfile(2) from a
	// bypassed socket then lose the redirected bytes: for tests of the
	// admission and the redirect only; the agent never sets it.
	NoSpliceGuard bool
}

// Bypass is the loaded same-node TCP bypass of one node. Methods are safe
// for concurrent use.
type Bypass struct {
	log        *slog.Logger
	pinDir     string
	cgroupPath string

	mu     sync.Mutex
	ops    sockOpsObjects
	msg    skMsgObjects
	splice sockSpliceObjects  // zero with Config.NoSpliceGuard
	iter   sockmapIterObjects // the connection list; nil program: not loaded (iterErr)
	it     *link.Iter
	// iterErr says why the connection list has no per-socket counters.
	iterErr error
}

// Conn is one socket in axon_sock_hash: its local and remote address as the
// socket sees them (IPv4 unmapped) and, for a loopback pair, its netns
// cookie (0 for pod <-> pod); with the connection list's iterator (see
// Conns) also its cookie, mode and byte counters.
type Conn struct {
	Local, Remote netip.AddrPort
	Netns         uint64
	Cookie        uint64 // socket cookie (0: unknown)
	// Mode is "undecided" (nothing written yet), "bypass" (writes go to the
	// peer socket), "stack" (writes go through TCP, for good), or "" when
	// unknown.
	Mode string
	// Alias: the socket found its peer by the client endpoint of its
	// connection (a sidecar's netfilter REDIRECT), not by the reversed tuple.
	Alias           bool
	RedirectedMsgs  uint64 // writes moved into the peer socket
	RedirectedBytes uint64 // their bytes
	PassedBytes     uint64 // bytes written through TCP
}

// Load loads both programs, pins the maps under pinDir (adopting pinned maps
// of the same layout, so a restarted or upgraded agent keeps every bypassed
// connection flowing), attaches axon_sk_msg to axon_sock_hash
// (BPF_SK_MSG_VERDICT; sockets already in the map keep the program they were
// linked with) and axon_sockops to the cgroup v2 directory cgroupPath through
// a link pinned at <pinDir>/links/cgroup-sockops (updated in place when it
// is on the same cgroup). Before attaching anything it attaches the splice
// guard (splice.go, link pinned at <pinDir>/links/fmodret-splice); a kernel
// that cannot run the guard fails Load with ErrNoSpliceGuard (unless
// Config.NoSpliceGuard).
func Load(pinDir, cgroupPath string, cfg Config, log *slog.Logger) (*Bypass, error) {
	if log == nil {
		log = slog.Default()
	}
	if pinDir == "" {
		return nil, errors.New("load sockmap bypass: pin dir is empty: set a bpffs directory such as /sys/fs/bpf/axon")
	}
	cgID, err := datapath.CgroupID(cgroupPath)
	if err != nil {
		return nil, fmt.Errorf("load sockmap bypass: %w", err)
	}
	// a kernel that cannot run the splice guard gets nothing pinned: ask
	// the probe (it loads and attaches a private guard) before the maps
	if !cfg.NoSpliceGuard {
		if c := datapath.ProbeFeature("splice_guard"); !c.Available {
			return nil, fmt.Errorf("load sockmap bypass: %w (the bypass stays off: without the guard "+
				"splice(2) from a bypassed socket loses data): %s", ErrNoSpliceGuard, c.Reason)
		}
	}
	if err := datapath.EnsurePinDir(pinDir); err != nil {
		return nil, fmt.Errorf("load sockmap bypass: %w", err)
	}
	spec, err := loadSockOps()
	if err != nil {
		return nil, fmt.Errorf("load sockmap bypass: parse sockops object: %w", err)
	}
	max := cfg.MaxEntries
	if max == 0 {
		max = DefaultMaxEntries
	}
	spec.Maps[MapSockHash].MaxEntries = max
	spec.Maps[MapSockAlias].MaxEntries = 2 * max
	quietMax, err := quietMaxEntries(pinDir, max, log)
	if err != nil {
		return nil, fmt.Errorf("load sockmap bypass: %w", err)
	}
	spec.Maps[MapQuiet].MaxEntries = quietMax
	if err := replaceSmallerMetrics(pinDir, spec.Maps[MapMetrics].MaxEntries, log); err != nil {
		return nil, fmt.Errorf("load sockmap bypass: %w", err)
	}
	b := &Bypass{log: log, pinDir: pinDir, cgroupPath: cgroupPath}
	if err := spec.LoadAndAssign(&b.ops, &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: pinDir}}); err != nil {
		err = datapath.IncompatibleHint(err, pinDir)
		if errors.Is(err, ebpf.ErrMapIncompatible) {
			err = fmt.Errorf("%w (a pinned map of another size, e.g. %s with another MaxEntries, is not adopted: run sockmap.Uninstall first; bypassed connections then continue on the TCP stack)", err, MapSockHash)
		}
		return nil, fmt.Errorf("load sockmap bypass: sockops program: %w", datapath.VerifierDetail(err))
	}
	msgSpec, err := loadSkMsg()
	if err != nil {
		b.ops.Close()
		return nil, fmt.Errorf("load sockmap bypass: parse sk_msg object: %w", err)
	}
	if err := b.loadOnMaps(msgSpec, &b.msg); err != nil {
		b.ops.Close()
		return nil, fmt.Errorf("load sockmap bypass: sk_msg program: %w", datapath.VerifierDetail(err))
	}
	b.loadIter()
	// the splice guard before anything can enter the map: no bypassed
	// socket is ever readable with splice(2)
	if !cfg.NoSpliceGuard {
		if err := b.loadSpliceGuard(); err != nil {
			b.Close()
			return nil, fmt.Errorf("load sockmap bypass: splice guard: %w "+
				"(the bypass stays off: without the guard splice(2) from a bypassed socket loses data; "+
				"`axon status` shows the splice_guard probe)", err)
		}
	} else {
		log.Warn("sockmap bypass loaded without its splice guard: splice(2) and sendfile(2) from a bypassed socket lose data")
	}
	// sk_msg first: a socket that sockops inserts must find the verdict
	// program on the map (a socket is linked with the program the map has
	// when it enters).
	if err := link.RawAttachProgram(link.RawAttachProgramOptions{
		Target: b.ops.AxonSockHash.FD(), Program: b.msg.AxonSkMsg, Attach: ebpf.AttachSkMsgVerdict,
	}); err != nil {
		b.Close()
		return nil, fmt.Errorf("load sockmap bypass: attach axon_sk_msg to %s: %w", MapSockHash, err)
	}
	if err := attachStreamVerdict(b.ops.AxonSockHash, b.msg.AxonSkSkbPass, cfg.StreamVerdict); err != nil {
		b.Close()
		return nil, fmt.Errorf("load sockmap bypass: %w", err)
	}
	pin := filepath.Join(datapath.LinksDir(pinDir), LinkPin)
	if err := os.MkdirAll(datapath.LinksDir(pinDir), 0o700); err != nil {
		b.Close()
		return nil, fmt.Errorf("load sockmap bypass: %w", err)
	}
	if err := datapath.AttachCgroupLink(pin, cgroupPath, cgID, ebpf.AttachCGroupSockOps, b.ops.AxonSockops); err != nil {
		b.Close()
		return nil, fmt.Errorf("load sockmap bypass: sock_ops: %w", err)
	}
	// after the attach no socket enters through an earlier sockops program
	if n, err := b.markLive(); err != nil {
		log.Warn("sockmap: sockets of an earlier load not marked live in "+MapQuiet+
			": their peers may leave the map while they still redirect", "marked", n, "error", err)
	}
	log.Info("sockmap bypass loaded", "pinDir", pinDir, "cgroup", cgroupPath, "maxEntries", max, "connCounters", b.iterErr == nil)
	return b, nil
}

// markLive gives every socket already in axon_sock_hash or axon_sock_alias
// that has no entry in axon_sockmap_quiet under that key (inserted by a
// loader without the mode machine, or, for alias keys, without the alias
// pairs' leave) a live one, so that its peer, if a newer sockops inserted
// it, never reads it as gone and leaves while it still redirects. Such
// sockets themselves never leave (an earlier sockops set no callbacks on
// them, or one that never publishes under alias keys), and their entries
// stay after they close (an earlier sockops does not delete them): one per
// key of the sockets open at the upgrade. It returns how many it marked.
func (b *Bypass) markLive() (int, error) {
	var (
		n    int
		errs []error
	)
	for name, m := range map[string]*ebpf.Map{MapSockHash: b.ops.AxonSockHash, MapSockAlias: b.ops.AxonSockAlias} {
		var (
			k      sockOpsSockmapKey
			cookie uint64
		)
		it := m.Iterate()
		for it.Next(&k, &cookie) {
			err := b.ops.AxonSockmapQuiet.Update(k, sockOpsSockmapQuiet{State: 0, Cookie: cookie}, ebpf.UpdateNoExist)
			switch {
			case err == nil:
				n++
			case !errors.Is(err, ebpf.ErrKeyExist):
				errs = append(errs, err)
			}
		}
		if err := it.Err(); err != nil {
			errs = append(errs, fmt.Errorf("iterate %s: %w", name, err))
		}
	}
	return n, errors.Join(errs...)
}

// quietMaxEntries is max_entries for axon_sockmap_quiet: four per socket of
// axon_sock_hash (max sockets: the exact key, two alias keys, a placeholder
// for a peer that never enters), or the pinned map's size when one is
// pinned, so that the entries of open connections are adopted rather than
// dropped (a pinned map of an older agent, one entry per socket, then
// bounds how many sockets enter: a socket without room for its entries takes
// the stack, counted insert_failed; sockmap.Uninstall with the connections
// idle gives the new size).
func quietMaxEntries(pinDir string, max uint32, log *slog.Logger) (uint32, error) {
	want := 4 * max
	path := filepath.Join(pinDir, MapQuiet)
	m, err := ebpf.LoadPinnedMap(path, nil)
	if errors.Is(err, os.ErrNotExist) {
		return want, nil
	}
	if err != nil {
		return 0, fmt.Errorf("open pinned %s: %w", path, err)
	}
	defer m.Close()
	if have := m.MaxEntries(); have != want {
		log.Warn("sockmap: adopting the pinned "+MapQuiet+" of another size: fewer sockets may enter the bypass than "+
			"max entries allow (insert_failed counts them); run sockmap.Uninstall with the connections idle to resize it",
			"have", have, "want", want)
		return have, nil
	}
	return want, nil
}

// replaceSmallerMetrics removes a pinned axon_sockmap_metrics whose size is
// not want (an agent of another version, with fewer counters), so that Load
// pins a new one instead of refusing the adoption: counters restart from 0,
// and the sockets of the older programs keep counting into the old map
// until they close. The other maps are adopted or refused as they are.
func replaceSmallerMetrics(pinDir string, want uint32, log *slog.Logger) error {
	path := filepath.Join(pinDir, MapMetrics)
	m, err := ebpf.LoadPinnedMap(path, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open pinned %s: %w", path, err)
	}
	have := m.MaxEntries()
	m.Close()
	if have == want {
		return nil
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("replace pinned %s of %d counters (this version has %d): %w", path, have, want, err)
	}
	log.Info("sockmap: counters restart from 0: the pinned counter map had another number of counters",
		"map", MapMetrics, "had", have, "now", want)
	return nil
}

// loadOnMaps loads the programs of spec (the sk_msg or iterator object) into
// dst on the sockops object's maps.
func (b *Bypass) loadOnMaps(spec *ebpf.CollectionSpec, dst any) error {
	return loadOnMaps(&b.ops, spec, dst)
}

// loadOnMaps loads spec into dst with ops' maps in place of the object's
// own copies of them (a private load's unpinned maps, or the adopted pinned
// ones): every program of the bypass works on one set of maps.
func loadOnMaps(ops *sockOpsObjects, spec *ebpf.CollectionSpec, dst any) error {
	have := map[string]*ebpf.Map{
		MapSockHash: ops.AxonSockHash, MapPods: ops.AxonSockmapPods, MapNetns: ops.AxonSockmapNetns,
		MapState: ops.AxonSockmapState, MapMetrics: ops.AxonSockmapMetrics,
		MapSockAlias: ops.AxonSockAlias, MapAliasPoison: ops.AxonSockmapAliasPoison, MapQuiet: ops.AxonSockmapQuiet,
	}
	repl := map[string]*ebpf.Map{}
	for name, ms := range spec.Maps {
		m, ok := have[name]
		if !ok {
			continue // .rodata and friends: the object's own
		}
		ms.MaxEntries = m.MaxEntries()
		ms.Pinning = ebpf.PinNone
		repl[name] = m
	}
	return spec.LoadAndAssign(dst, &ebpf.CollectionOptions{MapReplacements: repl})
}

// loadIter loads and attaches the connection list's iterator; without it
// (a kernel without BTF or iter/sockmap) Conns lists keys only, and iterErr
// says why.
func (b *Bypass) loadIter() {
	spec, err := loadSockmapIter()
	if err == nil {
		err = b.loadOnMaps(spec, &b.iter)
	}
	if err == nil {
		b.it, err = link.AttachIter(link.IterOptions{Program: b.iter.AxonSockmapConns, Map: b.ops.AxonSockHash})
		if err != nil {
			b.iter.Close()
			b.iter = sockmapIterObjects{}
		}
	}
	if err != nil {
		b.iterErr = fmt.Errorf("connection counters unavailable (iter/sockmap needs kernel BTF, 5.10+): %w", err)
		b.log.Warn("sockmap: the connection list shows keys only", "error", err)
	}
}

// Close releases file descriptors. Pinned maps and the link stay: bypassed
// connections keep flowing and new ones keep entering while the agent is
// down; the next Load adopts them.
func (b *Bypass) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	var errs []error
	if b.it != nil {
		errs = append(errs, b.it.Close())
		b.it = nil
	}
	return errors.Join(append(errs, b.splice.Close(), b.iter.Close(), b.msg.Close(), b.ops.Close())...)
}

// Uninstall detaches axon_sockops (the link pinned under pinDir) and removes
// the bypass's pins, the splice guard's last. The SOCKHASH goes with its last
// reference: sockets in it return to the plain TCP stack (bytes redirected but not yet read by the
// peer are lost, so uninstall with connections idle). Missing pins are no
// error; the rest of pinDir is left alone.
func Uninstall(pinDir string) error {
	if _, err := os.Stat(pinDir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	ok, err := datapath.IsBPFFS(pinDir)
	if err != nil {
		return fmt.Errorf("uninstall sockmap bypass: %w", err)
	}
	if !ok {
		return fmt.Errorf("uninstall sockmap bypass: %s is not on a bpf filesystem, refusing to remove pins there", pinDir)
	}
	var errs []error
	pin := filepath.Join(datapath.LinksDir(pinDir), LinkPin)
	l, err := link.LoadPinnedLink(pin, nil)
	switch {
	case err == nil:
		if err := l.Detach(); err != nil && !errors.Is(err, link.ErrNotSupported) {
			errs = append(errs, fmt.Errorf("detach %s: %w", pin, err))
		}
		if err := l.Unpin(); err != nil {
			errs = append(errs, fmt.Errorf("unpin %s: %w", pin, err))
		}
		l.Close()
	case !errors.Is(err, os.ErrNotExist):
		errs = append(errs, fmt.Errorf("load pinned link %s: %w", pin, err))
	}
	for _, m := range pinnedMaps {
		if err := os.Remove(filepath.Join(pinDir, m)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove map pin %s: %w", m, err))
		}
	}
	// the splice guard last: sockets leave the map with the map
	if err := removeSplicePin(pinDir); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("uninstall sockmap bypass under %s: %w", pinDir, errors.Join(errs...))
	}
	return nil
}

// addrKey is the 16-byte key of an address (IPv4 as ::ffff:a.b.c.d) after
// checking that it can be a pod's.
func addrKey(ip netip.Addr) ([16]byte, error) {
	switch {
	case !ip.IsValid():
		return [16]byte{}, errors.New("no address")
	case ip.Zone() != "":
		return [16]byte{}, fmt.Errorf("address %s has a zone: pod addresses have none", ip)
	case ip.IsUnspecified(), ip.IsLoopback(), ip.IsMulticast(), ip.IsLinkLocalUnicast():
		return [16]byte{}, fmt.Errorf("address %s cannot be a pod's (unspecified, loopback, multicast or link-local)", ip)
	}
	return ip.Unmap().As16(), nil
}

// SetPod admits the local pod address ip, owned by the network namespace
// with cookie netns, to the bypass (added or updated). Its new connections
// to other admitted pods enter the bypass.
func (b *Bypass) SetPod(ip netip.Addr, netns uint64) error {
	k, err := addrKey(ip)
	if err != nil {
		return fmt.Errorf("sockmap: set pod: %w", err)
	}
	if netns == 0 {
		return fmt.Errorf("sockmap: set pod %s: netns cookie 0: pass the pod netns' cookie (netnsutil.Cookie)", ip)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.ops.AxonSockmapPods.Put(k, sockOpsSockmapPod{Netns: netns}); err != nil {
		return fmt.Errorf("sockmap: set pod %s in %s (holds %d pods): %w", ip, MapPods, b.ops.AxonSockmapPods.MaxEntries(), err)
	}
	return nil
}

// DeletePod withdraws ip: its new connections stay on the TCP stack; the
// ones already bypassed continue (their keys are never deleted, that would
// drop queued data) until they close. A missing address is no error.
func (b *Bypass) DeletePod(ip netip.Addr) error {
	if !ip.IsValid() {
		return errors.New("sockmap: delete pod: no address")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.ops.AxonSockmapPods.Delete(ip.Unmap().As16()); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("sockmap: delete pod %s: %w", ip, err)
	}
	return nil
}

// SetNetns admits loopback connections inside the pod netns with cookie
// netns (app <-> sidecar).
func (b *Bypass) SetNetns(netns uint64) error {
	if netns == 0 {
		return errors.New("sockmap: set netns: cookie 0: pass the pod netns' cookie (netnsutil.Cookie)")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.ops.AxonSockmapNetns.Put(netns, uint32(0)); err != nil {
		return fmt.Errorf("sockmap: set netns %d in %s (holds %d): %w", netns, MapNetns, b.ops.AxonSockmapNetns.MaxEntries(), err)
	}
	return nil
}

// DeleteNetns withdraws the loopback admission of netns (bypassed
// connections continue until they close). A missing cookie is no error.
func (b *Bypass) DeleteNetns(netns uint64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.ops.AxonSockmapNetns.Delete(netns); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("sockmap: delete netns %d: %w", netns, err)
	}
	return nil
}

// Pods lists the admitted pod addresses and their netns cookies.
func (b *Bypass) Pods() (map[netip.Addr]uint64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := map[netip.Addr]uint64{}
	var (
		k [16]byte
		v sockOpsSockmapPod
	)
	it := b.ops.AxonSockmapPods.Iterate()
	for it.Next(&k, &v) {
		out[netip.AddrFrom16(k).Unmap()] = v.Netns
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("sockmap: read %s: %w", MapPods, err)
	}
	return out, nil
}

// Netns lists the netns cookies whose loopback connections are admitted,
// sorted.
func (b *Bypass) Netns() ([]uint64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var (
		k   uint64
		v   uint32
		out []uint64
	)
	it := b.ops.AxonSockmapNetns.Iterate()
	for it.Next(&k, &v) {
		out = append(out, k)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("sockmap: read %s: %w", MapNetns, err)
	}
	slices.Sort(out)
	return out, nil
}

// Metrics returns the counters of axon_sockmap_metrics summed over CPUs,
// by name (the members of enum axon_sockmap_counter without AXON_SM_, lower
// case).
func (b *Bypass) Metrics() (map[string]uint64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make(map[string]uint64, len(metricNames))
	for i, name := range metricNames {
		var per []uint64
		if err := b.ops.AxonSockmapMetrics.Lookup(uint32(i), &per); err != nil {
			return nil, fmt.Errorf("sockmap: read %s[%s]: %w", MapMetrics, name, err)
		}
		var sum uint64
		for _, v := range per {
			sum += v
		}
		out[name] = sum
	}
	return out, nil
}

// Conns lists the sockets in axon_sock_hash (two per bypassed connection:
// one per end). With the iterator (bpf/sockmap_iter.c) each comes with its
// cookie, mode and byte counters, read from the socket's own state; without
// it (ConnCountersErr says why) with its key only.
func (b *Bypass) Conns() ([]Conn, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.it != nil {
		return b.iterConns()
	}
	return b.keyConns()
}

// ConnCountersErr says why Conns shows no cookies, modes and counters (nil:
// it does).
func (b *Bypass) ConnCountersErr() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.iterErr
}

// iterConns runs the iterator once and decodes its records.
//
// The kernel's SOCKHASH iterator resumes a read() at the start of the hash
// bucket it stopped in, so a read that ends inside a bucket makes the next
// one emit that bucket's first sockets again (and one record per read would
// never end on a bucket of two). Reads are therefore large (many records
// each), records are de-duplicated by key (keys are unique in the map), and
// the walk is bounded.
func (b *Bypass) iterConns() ([]Conn, error) {
	rd, err := b.it.Open()
	if err != nil {
		return nil, fmt.Errorf("sockmap: open the connection iterator: %w", err)
	}
	defer rd.Close()
	recSize := binary.Size(sockmapIterSockmapConnRec{})
	limit := (2*int(b.ops.AxonSockHash.MaxEntries()) + 64) * recSize
	var data []byte
	buf := make([]byte, 256*recSize)
	for {
		n, err := rd.Read(buf)
		data = append(data, buf[:n]...)
		if errors.Is(err, io.EOF) || (err == nil && n == 0) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("sockmap: read the connection iterator: %w", err)
		}
		if len(data) > limit {
			return nil, fmt.Errorf("sockmap: the connection iterator gave more than %d bytes for a map of %d sockets: stopped", limit, b.ops.AxonSockHash.MaxEntries())
		}
	}
	if len(data)%recSize != 0 {
		return nil, fmt.Errorf("sockmap: the connection iterator gave %d bytes, not a whole number of %d-byte records", len(data), recSize)
	}
	var out []Conn
	seen := map[sockmapIterSockmapKey]bool{}
	for off := 0; off < len(data); off += recSize {
		var rec sockmapIterSockmapConnRec
		if _, err := binary.Decode(data[off:off+recSize], binary.NativeEndian, &rec); err != nil {
			return nil, fmt.Errorf("sockmap: decode a connection record: %w", err)
		}
		if seen[rec.Key] {
			continue
		}
		seen[rec.Key] = true
		c := connOf(sockOpsSockmapKey(rec.Key))
		c.Cookie, c.Mode, c.Alias = rec.Cookie, modeNames[rec.Mode], rec.Flags&flagPeerAlias != 0
		c.RedirectedMsgs, c.RedirectedBytes, c.PassedBytes = rec.RedirMsgs, rec.RedirBytes, rec.PassBytes
		out = append(out, c)
	}
	return out, nil
}

// keyConns walks the map's keys.
func (b *Bypass) keyConns() ([]Conn, error) {
	var (
		out  []Conn
		k    sockOpsSockmapKey
		next sockOpsSockmapKey
		cur  any // nil: the first key
	)
	m := b.ops.AxonSockHash
	seen := map[sockOpsSockmapKey]bool{}
	// a key deleted under the walk (a socket closed) restarts it at the
	// first key: skip what was seen, and stop after a bounded number of steps
	for steps := 2*int(m.MaxEntries()) + 1; steps > 0; steps-- {
		err := m.NextKey(cur, &next)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("sockmap: read %s: %w", MapSockHash, err)
		}
		if !seen[next] {
			seen[next] = true
			out = append(out, connOf(next))
		}
		k = next
		cur = &k
	}
	return out, nil
}

// connOf turns a key of axon_sock_hash into a Conn.
func connOf(k sockOpsSockmapKey) Conn {
	return Conn{
		Local:  netip.AddrPortFrom(addrOf(k.Local), uint16(k.Lport)),
		Remote: netip.AddrPortFrom(addrOf(k.Remote), uint16(k.Rport)),
		Netns:  k.Netns,
	}
}

// addrOf is the address of a key's four words (network order bytes as the
// kernel keeps them), IPv4 unmapped.
func addrOf(w [4]uint32) netip.Addr {
	var b [16]byte
	for i, v := range w {
		binary.NativeEndian.PutUint32(b[4*i:], v)
	}
	return netip.AddrFrom16(b).Unmap()
}

// attachStreamVerdict attaches (on) or detaches (off, a no-op when it is not
// attached) the no-op stream verdict prog on the SOCKHASH m.
func attachStreamVerdict(m *ebpf.Map, prog *ebpf.Program, on bool) error {
	if on {
		if err := link.RawAttachProgram(link.RawAttachProgramOptions{
			Target: m.FD(), Program: prog, Attach: ebpf.AttachSkSKBStreamVerdict,
		}); err != nil {
			return fmt.Errorf("attach axon_sk_skb_pass to %s: %w", MapSockHash, err)
		}
		return nil
	}
	err := link.RawDetachProgram(link.RawDetachProgramOptions{
		Target: m.FD(), Program: prog, Attach: ebpf.AttachSkSKBStreamVerdict,
	})
	if err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("detach the stream verdict from %s: %w", MapSockHash, err)
	}
	return nil
}
