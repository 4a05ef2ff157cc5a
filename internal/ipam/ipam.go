// Package ipam allocates pod addresses from the node's podCIDRs and persists
// every allocation on disk before handing it out, so that a restarted agent
// never gives the same address to two pods.
//
// On-disk layout (like the reference host-local plugin), all in one directory:
//
//	<ip>                          one file per allocated address: "containerID\nifName\n"
//	last_reserved_ip.<pool>       the last address handed out from a pool (round-robin hint)
//	lock                          flock(2)ed for the Allocator's lifetime
//
// Files named like an address whose content cannot be parsed keep that address
// reserved and are logged, never deleted.
package ipam

import (
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/api"
)

// Owner is the key of an allocation: one pod interface.
type Owner struct {
	ContainerID string
	IfName      string
}

func (o Owner) String() string { return o.ContainerID + "/" + o.IfName }

// ErrNoPools is returned by Allocate before SetPools gave it a podCIDR.
var ErrNoPools = errors.New("no podCIDR assigned to this node yet")

// ExhaustedError is returned by Allocate when a pool has no free address.
type ExhaustedError struct {
	Pool  netip.Prefix
	InUse int
}

func (e *ExhaustedError) Error() string {
	return fmt.Sprintf("pool %s exhausted (%d addresses in use)", e.Pool, e.InUse)
}

const (
	lockName   = "lock"
	lastPrefix = "last_reserved_ip."
	tmpPrefix  = ".tmp-"
)

// Allocator hands out addresses. It is safe for concurrent use; the on-disk
// directory is exclusively locked by one Allocator at a time.
type Allocator struct {
	dir  string
	log  *slog.Logger
	lock *os.File

	mu      sync.Mutex
	pools   []netip.Prefix
	byIP    map[netip.Addr]Owner // every reserved address; zero Owner = corrupt file
	byOwner map[Owner][]netip.Addr
	last    map[netip.Prefix]netip.Addr
}

// New opens (creating if needed) the state directory dir, takes its lock and
// loads the persisted allocations.
func New(dir string, log *slog.Logger) (*Allocator, error) {
	if log == nil {
		log = slog.Default()
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create ipam dir: %w", err)
	}
	lf, err := os.OpenFile(filepath.Join(dir, lockName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open ipam lock: %w", err)
	}
	if err := unix.Flock(int(lf.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		lf.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("ipam dir %s is locked by another process (is another axon-agent running for this node?)", dir)
		}
		return nil, fmt.Errorf("lock ipam dir %s: %w", dir, err)
	}
	a := &Allocator{
		dir:     dir,
		log:     log,
		lock:    lf,
		byIP:    map[netip.Addr]Owner{},
		byOwner: map[Owner][]netip.Addr{},
		last:    map[netip.Prefix]netip.Addr{},
	}
	if err := a.load(); err != nil {
		lf.Close()
		return nil, err
	}
	return a, nil
}

// Close releases the directory lock. The Allocator must not be used afterwards.
func (a *Allocator) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.lock == nil {
		return nil
	}
	err := a.lock.Close() // closing the descriptor drops the flock
	a.lock = nil
	return err
}

func (a *Allocator) load() error {
	entries, err := os.ReadDir(a.dir)
	if err != nil {
		return fmt.Errorf("read ipam dir: %w", err)
	}
	for _, e := range entries {
		name := e.Name()
		switch {
		case name == lockName:
			continue
		case strings.HasPrefix(name, tmpPrefix):
			// An interrupted write never renamed: the address was not handed out.
			if err := os.Remove(filepath.Join(a.dir, name)); err != nil {
				a.log.Warn("ipam: cannot remove leftover temp file", "file", name, "err", err)
			}
			continue
		case strings.HasPrefix(name, lastPrefix):
			a.loadLast(name)
			continue
		}
		ip, err := netip.ParseAddr(name)
		if err != nil || ip.Zone() != "" {
			a.log.Warn("ipam: ignoring unknown file in state dir (left in place)", "file", filepath.Join(a.dir, name))
			continue
		}
		ip = ip.Unmap()
		data, err := os.ReadFile(filepath.Join(a.dir, name))
		o, perr := parseOwner(data)
		if err != nil || perr != nil {
			a.log.Warn("ipam: corrupt allocation file; keeping the address reserved (remove the file by hand once no pod uses it)",
				"file", filepath.Join(a.dir, name), "readErr", err, "parseErr", perr)
			a.byIP[ip] = Owner{}
			continue
		}
		a.byIP[ip] = o
		a.byOwner[o] = append(a.byOwner[o], ip)
	}
	for o := range a.byOwner {
		slices.SortFunc(a.byOwner[o], v4First)
	}
	return nil
}

func (a *Allocator) loadLast(name string) {
	key := strings.ReplaceAll(strings.TrimPrefix(name, lastPrefix), "_", "/")
	p, err := netip.ParsePrefix(key)
	if err != nil {
		a.log.Warn("ipam: ignoring unreadable round-robin hint", "file", name)
		return
	}
	data, err := os.ReadFile(filepath.Join(a.dir, name))
	if err != nil {
		return
	}
	ip, err := netip.ParseAddr(strings.TrimSpace(string(data)))
	if err != nil || !p.Contains(ip) {
		return
	}
	a.last[p] = ip
}

func parseOwner(data []byte) (Owner, error) {
	lines := strings.Split(strings.TrimRight(strings.ReplaceAll(string(data), "\r\n", "\n"), "\n"), "\n")
	if len(lines) != 2 || lines[0] == "" || lines[1] == "" {
		return Owner{}, fmt.Errorf("want 2 lines (containerID, ifName), got %q", data)
	}
	return Owner{ContainerID: lines[0], IfName: lines[1]}, nil
}

func v4First(x, y netip.Addr) int {
	if x.Is4() != y.Is4() {
		if x.Is4() {
			return -1
		}
		return 1
	}
	return x.Compare(y)
}

// SetPools sets the node's podCIDRs: at most one IPv4 and one IPv6 prefix.
// Existing allocations are kept even when their pool goes away.
func (a *Allocator) SetPools(pools []netip.Prefix) error {
	var out []netip.Prefix
	seen := map[bool]netip.Prefix{}
	for _, p := range pools {
		if !p.IsValid() {
			return fmt.Errorf("invalid podCIDR %v", p)
		}
		if p.Masked() != p {
			return fmt.Errorf("podCIDR %s has host bits set: use %s", p, p.Masked())
		}
		p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits())
		if p.Addr().BitLen()-p.Bits() < 2 {
			return fmt.Errorf("podCIDR %s is too small: use at least a /%d", p, p.Addr().BitLen()-2)
		}
		if prev, dup := seen[p.Addr().Is4()]; dup {
			return fmt.Errorf("podCIDRs %s and %s are the same family: give at most one IPv4 and one IPv6 podCIDR", prev, p)
		}
		seen[p.Addr().Is4()] = p
		out = append(out, p)
	}
	slices.SortFunc(out, func(x, y netip.Prefix) int { return v4First(x.Addr(), y.Addr()) })
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pools = out
	return nil
}

// Pools returns the current podCIDRs, IPv4 first.
func (a *Allocator) Pools() []netip.Prefix {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.pools)
}

func validOwner(o Owner) error {
	if o.ContainerID == "" || o.IfName == "" {
		return errors.New("allocation owner needs a containerID and an ifName")
	}
	if strings.ContainsAny(o.ContainerID+o.IfName, "\r\n") {
		return errors.New("containerID and ifName must not contain newlines")
	}
	return nil
}

// Allocate returns one address per pool (IPv4 first) for o, reusing what o
// already holds: calling it twice for the same Owner gives the same addresses.
// New addresses are on disk before Allocate returns.
func (a *Allocator) Allocate(o Owner) ([]api.Address, error) {
	if err := validOwner(o); err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.lock == nil {
		return nil, errors.New("ipam allocator is closed")
	}
	if len(a.pools) == 0 {
		return nil, ErrNoPools
	}
	var out []api.Address
	var fresh []netip.Addr
	for _, p := range a.pools {
		ip, ok := a.ownedIn(o, p)
		if !ok {
			var err error
			ip, err = a.allocateIn(o, p)
			if err != nil {
				for _, f := range fresh {
					if rerr := a.free(f); rerr != nil {
						a.log.Error("ipam: rollback failed", "ip", f, "err", rerr)
					}
				}
				return nil, err
			}
			fresh = append(fresh, ip)
		}
		out = append(out, api.Address{IP: ip, Prefix: p})
	}
	if len(fresh) > 0 {
		a.log.Info("ipam: allocated", "owner", o.String(), "ips", fresh)
	}
	return out, nil
}

func (a *Allocator) ownedIn(o Owner, p netip.Prefix) (netip.Addr, bool) {
	for _, ip := range a.byOwner[o] {
		if p.Contains(ip) {
			return ip, true
		}
	}
	return netip.Addr{}, false
}

// allocateIn picks the next free address of p after the last one handed out.
func (a *Allocator) allocateIn(o Owner, p netip.Prefix) (netip.Addr, error) {
	first, lastUsable, size := usableRange(p)
	start := first
	if l, ok := a.last[p]; ok && p.Contains(l) {
		start = l.Next()
		if !start.IsValid() || lastUsable.Less(start) {
			start = first
		}
	}
	// Among len(byIP)+1 consecutive candidates at least one is free, so the
	// scan is short even for a /64.
	tries := uint64(len(a.byIP)) + 1
	if size.IsUint64() && size.Uint64() < tries {
		tries = size.Uint64()
	}
	ip := start
	for range tries {
		if _, taken := a.byIP[ip]; !taken {
			if err := a.persist(ip, o); err != nil {
				return netip.Addr{}, err
			}
			a.byIP[ip] = o
			a.byOwner[o] = append(a.byOwner[o], ip)
			slices.SortFunc(a.byOwner[o], v4First)
			a.last[p] = ip
			a.saveLast(p, ip)
			return ip, nil
		}
		ip = ip.Next()
		if !ip.IsValid() || lastUsable.Less(ip) {
			ip = first
		}
	}
	used := 0
	for r := range a.byIP {
		if p.Contains(r) {
			used++
		}
	}
	return netip.Addr{}, &ExhaustedError{Pool: p, InUse: used}
}

// usableRange skips the network address (and, for IPv4, the broadcast).
func usableRange(p netip.Prefix) (first, last netip.Addr, size *big.Int) {
	first = p.Addr().Next()
	hostBits := p.Addr().BitLen() - p.Bits()
	b := p.Addr().AsSlice()
	for i := range hostBits {
		b[len(b)-1-i/8] |= 1 << (i % 8)
	}
	last, _ = netip.AddrFromSlice(b)
	size = new(big.Int).Lsh(big.NewInt(1), uint(hostBits))
	size.Sub(size, big.NewInt(1)) // network address
	if p.Addr().Is4() {
		last = last.Prev()
		size.Sub(size, big.NewInt(1)) // broadcast
	}
	return first, last, size
}

// persist writes the allocation file atomically: temp file, fsync, rename, fsync dir.
func (a *Allocator) persist(ip netip.Addr, o Owner) error {
	target := filepath.Join(a.dir, ip.String())
	if err := writeAtomic(a.dir, target, []byte(o.ContainerID+"\n"+o.IfName+"\n")); err != nil {
		return fmt.Errorf("persist allocation of %s: %w", ip, err)
	}
	return nil
}

func (a *Allocator) saveLast(p netip.Prefix, ip netip.Addr) {
	name := lastPrefix + strings.ReplaceAll(p.String(), "/", "_")
	// Only a hint: atomic (rename) but not fsynced; after a crash an older
	// hint just moves the round-robin start back a little.
	if err := writeAtomicNoSync(a.dir, filepath.Join(a.dir, name), []byte(ip.String()+"\n")); err != nil {
		a.log.Warn("ipam: cannot save round-robin hint", "pool", p, "err", err)
	}
}

func writeAtomic(dir, target string, data []byte) error {
	f, err := os.CreateTemp(dir, tmpPrefix+filepath.Base(target)+"-")
	if err != nil {
		return err
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if _, err := f.Write(data); err != nil {
		return err
	}
	if err := f.Chmod(0o600); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, target); err != nil {
		return err
	}
	ok = true
	return syncDir(dir)
}

func writeAtomicNoSync(dir, target string, data []byte) error {
	f, err := os.CreateTemp(dir, tmpPrefix+filepath.Base(target)+"-")
	if err != nil {
		return err
	}
	_, werr := f.Write(data)
	cerr := f.Close()
	if err := errors.Join(werr, cerr); err != nil {
		os.Remove(f.Name())
		return err
	}
	if err := os.Rename(f.Name(), target); err != nil {
		os.Remove(f.Name())
		return err
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// free removes one address file and forgets it. Caller holds a.mu.
func (a *Allocator) free(ip netip.Addr) error {
	if err := os.Remove(filepath.Join(a.dir, ip.String())); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("release %s: %w", ip, err)
	}
	o := a.byIP[ip]
	delete(a.byIP, ip)
	rest := slices.DeleteFunc(a.byOwner[o], func(x netip.Addr) bool { return x == ip })
	if len(rest) == 0 {
		delete(a.byOwner, o)
	} else {
		a.byOwner[o] = rest
	}
	return nil
}

// Release frees every address held by o. Releasing an unknown Owner is a no-op.
func (a *Allocator) Release(o Owner) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.releaseLocked(o)
}

func (a *Allocator) releaseLocked(o Owner) error {
	ips := slices.Clone(a.byOwner[o])
	for _, ip := range ips {
		if err := a.free(ip); err != nil {
			return err
		}
	}
	if len(ips) > 0 {
		if err := syncDir(a.dir); err != nil {
			return fmt.Errorf("sync ipam dir: %w", err)
		}
		a.log.Info("ipam: released", "owner", o.String(), "ips", ips)
	}
	return nil
}

// Allocations returns a copy of every allocation by owner, including those
// outside the current pools. Addresses reserved by corrupt files are not listed.
func (a *Allocator) Allocations() map[Owner][]netip.Addr {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[Owner][]netip.Addr, len(a.byOwner))
	for o, ips := range a.byOwner {
		out[o] = slices.Clone(ips)
	}
	return out
}

// Lookup returns the addresses held by o.
func (a *Allocator) Lookup(o Owner) []netip.Addr {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.byOwner[o])
}

// GC releases every owner not in valid and returns them, sorted.
func (a *Allocator) GC(valid map[Owner]bool) ([]Owner, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var removed []Owner
	for o := range a.byOwner {
		if !valid[o] {
			removed = append(removed, o)
		}
	}
	slices.SortFunc(removed, func(x, y Owner) int { return strings.Compare(x.String(), y.String()) })
	for i, o := range removed {
		if err := a.releaseLocked(o); err != nil {
			return removed[:i], fmt.Errorf("gc %s: %w", o, err)
		}
	}
	return removed, nil
}
