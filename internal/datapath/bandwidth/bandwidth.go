package bandwidth

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"github.com/vishvananda/netlink"

	"github.com/axonhq/axon/internal/datapath"
)

// BW directions (enum axon_bw_dir).
const (
	Egress  uint8 = 0
	Ingress uint8 = 1
)

// bwStatNames mirror enum axon_bw_stat (same order; enums_btf_test.go
// checks them against the object's BTF).
var bwStatNames = []string{
	"egress_paced",         // departure time set
	"egress_drop_horizon",  // dropped beyond the horizon
	"egress_unlimited",     // packet of a pod without egress limit (or no pod)
	"ingress_pass",         // within the destination pod's bucket
	"ingress_drop",         // dropped: bucket empty
	"egress_clock_reset",   // t_last was beyond the horizon: restarted at now
	"egress_delivery_time", // limited packet came with a mono delivery time (pod TCP pacing/BBR kept across netns)
	"egress_with_socket",   // limited packet still carries skb->sk (TCP small queues back-pressure works)
	"egress_pod_paced",     // the pod's own delivery time, not the limit, set the departure
	"egress_small_bypass",  // small packet left without waiting behind the pod's backlog
}

// Config selects where the Bandwidth Manager program is attached.
type Config struct {
	PinDir     string // bpffs dir of the node (same as Config.PinDir)
	Uplink     string // device whose egress gets the EDT program
	AttachMode string // auto | tcx | legacy
	Logger     *slog.Logger
}

// Manager is the loaded Bandwidth Manager of one node. Safe for concurrent use;
// call it from the netns it was loaded in.
type Manager struct {
	cfg   Config
	slack time.Duration // egress catch-up window written with every egress limit
	log   *slog.Logger
	objs  uplinkEgressObjects
	mode  string // datapath.ModeTCX | datapath.ModeLegacy
	mu    sync.Mutex
}

type bwState = uplinkEgressBwState
type bwStateKey = uplinkEgressBwStateKey

// Load loads the EDT program with the limit maps pinned under cfg.PinDir
// (reused when present: limits survive an agent restart) and attaches it to
// the uplink's egress (an existing pinned link is updated in place).
func Load(cfg Config) (*Manager, error) {
	b, err := loadObjects(cfg)
	if err != nil {
		return nil, err
	}
	if err := b.Attach(); err != nil {
		b.Close()
		return nil, err
	}
	b.log.Info("bandwidth manager loaded", "uplink", cfg.Uplink, "attach", b.mode)
	return b, nil
}

func loadObjects(cfg Config) (*Manager, error) {
	if cfg.PinDir == "" {
		return nil, errors.New("load bandwidth manager: pin dir is empty: set a bpffs directory such as /sys/fs/bpf/axon")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if err := datapath.EnsurePinDir(cfg.PinDir); err != nil {
		return nil, fmt.Errorf("load bandwidth manager: %w", err)
	}
	spec, err := loadUplinkEgress()
	if err != nil {
		return nil, fmt.Errorf("load bandwidth manager: parse uplink_egress object: %w", err)
	}
	setTstamp := features.HaveProgramHelper(ebpf.SchedCLS, asm.FnSkbSetTstamp) == nil
	if err := spec.Variables["cfg_set_tstamp"].Set(datapath.BoolU8(setTstamp)); err != nil {
		return nil, fmt.Errorf("load bandwidth manager: set cfg_set_tstamp: %w", err)
	}
	b := &Manager{cfg: cfg, log: cfg.Logger, slack: DefaultEgressSlack}
	mode, err := datapath.ResolveAttachMode(cfg.AttachMode)
	if err != nil {
		return nil, fmt.Errorf("load bandwidth manager: %w", err)
	}
	b.mode = mode
	opts := &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: cfg.PinDir}}
	if err := spec.LoadAndAssign(&b.objs, opts); err != nil {
		return nil, fmt.Errorf("load bandwidth manager program: %w", datapath.VerifierDetail(datapath.IncompatibleHint(err, cfg.PinDir)))
	}
	return b, nil
}

// SetEgressSlack sets the catch-up window written with egress limits from
// the next Apply on (0 = strict EDT, every late packet loses its time).
func (b *Manager) SetEgressSlack(d time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.slack = max(d, 0)
}

// AttachMode returns "tcx" or "legacy".
func (b *Manager) AttachMode() string { return b.mode }

// Uplink returns the device the program is attached to.
func (b *Manager) Uplink() string { return b.cfg.Uplink }

// datapath.Attach (re)attaches the program to the uplink's egress. Idempotent.
func (b *Manager) Attach() error {
	if err := datapath.ValidIfname(b.cfg.Uplink); err != nil {
		return fmt.Errorf("attach bandwidth manager: uplink: %w", err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	dev, err := netlink.LinkByName(b.cfg.Uplink)
	if err != nil {
		return fmt.Errorf("attach bandwidth manager to %s: device not found in this netns: %w", b.cfg.Uplink, err)
	}
	if err := datapath.Attach(b.cfg.PinDir, dev, b.objs.AxonUplinkEgress, b.hook()); err != nil {
		return fmt.Errorf("attach bandwidth manager to %s: %w", b.cfg.Uplink, err)
	}
	return nil
}

// hook is the program's place: the uplink's tc egress (datapath.RoleBandwidth, pins
// links/<tcx|tc>-bwm-<uplink>).
func (b *Manager) hook() datapath.Hook {
	return datapath.TCHook(datapath.RoleBandwidth, b.mode == datapath.ModeLegacy)
}

// datapath.Attached reports whether the program is attached to the uplink's egress
// right now (the pinned link is alive on the device, or the filter exists).
func (b *Manager) Attached() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	dev, err := netlink.LinkByName(b.cfg.Uplink)
	if err != nil {
		return false
	}
	return datapath.Attached(b.cfg.PinDir, dev, b.hook())
}

// datapath.Detach removes the program from the uplink (limits stay in the maps but
// nothing paces). Idempotent.
func (b *Manager) Detach() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return datapath.Detach(b.cfg.PinDir, b.cfg.Uplink, datapath.TCHook(datapath.RoleBandwidth, false))
}

// Uninstall detaches the Bandwidth Manager from uplink and removes every
// limit (used when the agent runs with --bandwidth-manager=false after a run
// with it). Missing pins are fine.
func Uninstall(pinDir, uplink string) error {
	var errs []error
	if uplink != "" {
		errs = append(errs, datapath.Detach(pinDir, uplink, datapath.TCHook(datapath.RoleBandwidth, false)))
	}
	// The ingress policer reads the pinned maps from the pod programs:
	// close its gate and empty them rather than unpinning (the programs
	// hold them).
	if m, err := ebpf.LoadPinnedMap(pinDir+"/"+datapath.MapBWGate, nil); err == nil {
		if err := m.Put(uint32(0), uint32(0)); err != nil {
			errs = append(errs, fmt.Errorf("close %s: %w", datapath.MapBWGate, err))
		}
		m.Close()
	} else if !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("open pinned %s: %w", datapath.MapBWGate, err))
	}
	for _, name := range []string{datapath.MapBWAddr, datapath.MapBWState} {
		m, err := ebpf.LoadPinnedMap(pinDir+"/"+name, nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("open pinned %s: %w", name, err))
			continue
		}
		errs = append(errs, clearMap(m))
		m.Close()
	}
	return errors.Join(errs...)
}

func clearMap(m *ebpf.Map) error {
	var keys [][]byte
	it := m.Iterate()
	var k, v []byte
	for it.Next(&k, &v) {
		keys = append(keys, slices.Clone(k))
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("iterate %s: %w", m, err)
	}
	for _, k := range keys {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete from %s: %w", m, err)
		}
	}
	return nil
}

// Close releases file descriptors; pins and the attachment stay.
func (b *Manager) Close() error { return b.objs.Close() }

// Program returns the EDT program (for tests and benchmarks).
func (b *Manager) Program() *ebpf.Program { return b.objs.AxonUplinkEgress }

// Limit is the desired bandwidth of one pod.
type Limit struct {
	Addrs       []netip.Addr // the pod's addresses (all share the limit)
	EgressBits  uint64       // bits per second; 0 = no egress limit
	IngressBits uint64       // bits per second; 0 = no ingress limit
}

// Row is one limit read back from the maps.
type Row struct {
	ID      uint32
	Addrs   []netip.Addr
	Dir     string // "egress" | "ingress"
	Bits    uint64 // bits per second
	Horizon time.Duration
	Burst   uint64        // bytes (ingress)
	Slack   time.Duration // egress catch-up window
	Drops   uint64
}

// DefaultEgressSlack is how far a limited pod may fall behind its EDT
// schedule and still catch up (see edt_schedule in bpf/lib/edt.h): a burst
// of at most this much time at the pod's rate.
const DefaultEgressSlack = time.Millisecond

// IngressBurst is the token bucket depth for an ingress rate: 100 ms of
// traffic, at least 128 KiB (two full GRO aggregates).
func IngressBurst(bits uint64) uint64 {
	return max(bits/8, 128<<10)
}

func bwKey(a netip.Addr) [16]byte { return a.Unmap().As16() } // v4 as ::ffff:a.b.c.d

func addrOfKey(k [16]byte) netip.Addr { return netip.AddrFrom16(k).Unmap() }

// Apply makes the maps hold exactly want: every pod's addresses map to one
// id (kept from the maps when any address already has one, so a rate change
// keeps the running state), limits are written or removed, stale addresses
// and ids are deleted. horizon is the egress drop horizon.
func (b *Manager) Apply(want []Limit, horizon time.Duration) error {
	if horizon <= 0 {
		return fmt.Errorf("bandwidth horizon %s must be positive", horizon)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	cur, err := b.readAddrs()
	if err != nil {
		return err
	}
	used := map[uint32]bool{}
	for _, id := range cur {
		used[id] = false
	}
	nextFree := func() uint32 {
		for id := uint32(1); ; id++ {
			if _, taken := used[id]; !taken {
				return id
			}
		}
	}
	var errs []error
	keepAddr := map[netip.Addr]bool{}
	keepState := map[bwStateKey]bool{}
	ingress := uint32(0) // 1: some pod keeps an ingress limit (axon_bw_gate)
	for _, w := range want {
		if len(w.Addrs) == 0 || (w.EgressBits == 0 && w.IngressBits == 0) {
			continue
		}
		id := uint32(0)
		for _, a := range w.Addrs {
			if cid, ok := cur[a.Unmap()]; ok && !used[cid] {
				id = cid
				break
			}
		}
		if id == 0 {
			id = nextFree()
		}
		used[id] = true
		for _, a := range w.Addrs {
			a = a.Unmap()
			keepAddr[a] = true
			if cur[a] == id {
				continue
			}
			if err := b.objs.AxonBwAddr.Put(bwKey(a), id); err != nil {
				errs = append(errs, fmt.Errorf("write %s %s: %w", datapath.MapBWAddr, a, err))
			}
		}
		for _, d := range []struct {
			dir  uint8
			bits uint64
		}{{Egress, w.EgressBits}, {Ingress, w.IngressBits}} {
			if d.bits == 0 {
				continue
			}
			k := bwStateKey{Id: id, Dir: d.dir}
			keepState[k] = true
			if d.dir == Ingress {
				ingress = 1
			}
			if err := b.putLimit(k, d.bits, horizon); err != nil {
				errs = append(errs, err)
			}
		}
	}
	// the ingress policer looks limits up only while one exists: open the
	// gate after writing them, close it before deleting the last one
	if err := b.objs.AxonBwGate.Put(uint32(0), ingress); err != nil {
		errs = append(errs, fmt.Errorf("write %s: %w", datapath.MapBWGate, err))
	}
	// delete limits first, then addresses: a packet never sees an address
	// whose id points at a half-written state.
	var st bwState
	var k bwStateKey
	var staleKeys []bwStateKey
	it := b.objs.AxonBwState.Iterate()
	for it.Next(&k, &st) {
		if !keepState[k] {
			staleKeys = append(staleKeys, k)
		}
	}
	if err := it.Err(); err != nil {
		errs = append(errs, fmt.Errorf("iterate %s: %w", datapath.MapBWState, err))
	}
	for _, k := range staleKeys {
		if err := b.objs.AxonBwState.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("delete %s id %d dir %d: %w", datapath.MapBWState, k.Id, k.Dir, err))
		}
	}
	for a := range cur {
		if keepAddr[a] {
			continue
		}
		if err := b.objs.AxonBwAddr.Delete(bwKey(a)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("delete %s %s: %w", datapath.MapBWAddr, a, err))
		}
	}
	return errors.Join(errs...)
}

// putLimit writes rate/horizon/burst, keeping the running time and tokens
// of an existing entry so a live rate change does not reset the pacing.
func (b *Manager) putLimit(k bwStateKey, bits uint64, horizon time.Duration) error {
	rate := bits / 8
	if rate == 0 {
		rate = 1
	}
	burst := uint64(b.slack) // egress: catch-up window, ns
	if k.Dir == Ingress {
		burst = IngressBurst(bits) // ingress: bucket depth, bytes
	}
	var st bwState
	err := b.objs.AxonBwState.Lookup(k, &st)
	switch {
	case err == nil:
		if st.Rate == rate && st.Horizon == uint64(horizon) && st.Burst == burst {
			return nil
		}
	case errors.Is(err, ebpf.ErrKeyNotExist):
		st = bwState{}
		if k.Dir == Ingress {
			st.Tokens = IngressBurst(bits) // a new bucket starts full
		}
	default:
		return fmt.Errorf("read %s id %d: %w", datapath.MapBWState, k.Id, err)
	}
	st.Rate, st.Horizon, st.Burst = rate, uint64(horizon), burst
	if k.Dir == Ingress && int64(st.Tokens) > int64(st.Burst) { // signed balance
		st.Tokens = st.Burst
	}
	if err := b.objs.AxonBwState.Put(k, st); err != nil {
		return fmt.Errorf("write %s id %d dir %d: %w", datapath.MapBWState, k.Id, k.Dir, err)
	}
	return nil
}

func (b *Manager) readAddrs() (map[netip.Addr]uint32, error) {
	out := map[netip.Addr]uint32{}
	var k [16]byte
	var id uint32
	it := b.objs.AxonBwAddr.Iterate()
	for it.Next(&k, &id) {
		out[addrOfKey(k)] = id
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("iterate %s: %w", datapath.MapBWAddr, err)
	}
	return out, nil
}

// List reads every limit back from the maps, sorted by id and direction.
func (b *Manager) List() ([]Row, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	addrs, err := b.readAddrs()
	if err != nil {
		return nil, err
	}
	byID := map[uint32][]netip.Addr{}
	for a, id := range addrs {
		byID[id] = append(byID[id], a)
	}
	var rows []Row
	var k bwStateKey
	var st bwState
	it := b.objs.AxonBwState.Iterate()
	for it.Next(&k, &st) {
		as := byID[k.Id]
		slices.SortFunc(as, func(x, y netip.Addr) int { return x.Compare(y) })
		r := Row{ID: k.Id, Addrs: as, Bits: st.Rate * 8, Drops: st.Drops, Dir: "egress"}
		if k.Dir == Ingress {
			r.Dir, r.Burst = "ingress", st.Burst
		} else {
			r.Horizon, r.Slack = time.Duration(st.Horizon), time.Duration(st.Burst)
		}
		rows = append(rows, r)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("iterate %s: %w", datapath.MapBWState, err)
	}
	slices.SortFunc(rows, func(x, y Row) int {
		if x.ID != y.ID {
			return int(x.ID) - int(y.ID)
		}
		return len(x.Dir) - len(y.Dir) // egress (6) before ingress (7)
	})
	return rows, nil
}

// Stats returns the node-wide counters summed over CPUs, by name.
func (b *Manager) Stats() (map[string]uint64, error) {
	out := make(map[string]uint64, len(bwStatNames))
	for i, n := range bwStatNames {
		var perCPU []uint64
		if err := b.objs.AxonBwStats.Lookup(uint32(i), &perCPU); err != nil {
			return nil, fmt.Errorf("read %s[%d] (%s): %w", datapath.MapBWStats, i, n, err)
		}
		var s uint64
		for _, v := range perCPU {
			s += v
		}
		out[n] = s
	}
	return out, nil
}
