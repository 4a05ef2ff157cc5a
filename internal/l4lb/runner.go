package l4lb

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/axonhq/axon/internal/lb"
)

// Datapath is what the runner programs: the north-south load balancer of
// internal/datapath, loaded and attached by the caller (cmd/axon).
type Datapath interface {
	// UpsertVIP programs a VIP with its backends and, for Maglev, its table
	// (slot → index into f.Backends); the new backend set replaces the old
	// one atomically for new flows, established flows keep their backend.
	UpsertVIP(f lb.Frontend, dsr bool, table []int) error
	// DeleteVIP removes a VIP (its established flows may finish).
	DeleteVIP(k lb.FrontendKey) error
}

// Counters is optionally implemented by a Datapath for status and for
// draining removed backends.
type Counters interface {
	// Flows counts conntrack entries per VIP and per backend, and returns
	// the table's use and size.
	Flows() (perVIP map[lb.FrontendKey]int, perBackend map[netip.AddrPort]int, used, max int, err error)
	// Packets returns the load balancer's packet counters by verdict.
	Packets() (map[string]uint64, error)
}

// Runner owns the current config and applies reloads. Safe for concurrent use.
type Runner struct {
	path string
	dp   Datapath
	log  *slog.Logger

	mu         sync.Mutex
	cur        *Config
	curSum     [32]byte
	loadedAt   time.Time
	generation int
	reloads    int
	rejected   int
	lastErr    string
	lastErrAt  time.Time
	badSum     [32]byte // content of the last rejected file: polling does not reject it again
	attachInfo string
	// draining: backends removed from a VIP by a reload, kept as
	// Terminating (no new flows) until their established flows end or
	// DrainTimeout passes, so a reload never breaks a connection.
	draining map[lb.FrontendKey]map[netip.AddrPort]time.Time
}

// DrainTimeout bounds how long a removed backend keeps its established
// flows (it is dropped earlier when it has none left).
var DrainTimeout = 10 * time.Minute

// NewRunner applies the validated initial config cfg (read from path) to dp.
func NewRunner(path string, cfg *Config, raw []byte, dp Datapath, log *slog.Logger) (*Runner, error) {
	if log == nil {
		log = slog.Default()
	}
	r := &Runner{path: path, dp: dp, log: log, draining: map[lb.FrontendKey]map[netip.AddrPort]time.Time{}}
	p, err := Diff(nil, cfg)
	if err != nil {
		return nil, err
	}
	if err := r.apply(cfg, p); err != nil {
		return nil, fmt.Errorf("program the initial config: %w", err)
	}
	r.cur, r.curSum, r.loadedAt, r.generation = cfg, sha256.Sum256(raw), time.Now(), 1
	log.Info("l4lb config loaded", "file", path, "vips", len(cfg.VIPs), "plan", p.String())
	return r, nil
}

// SetAttachInfo records how the program is attached (for status).
func (r *Runner) SetAttachInfo(s string) {
	r.mu.Lock()
	r.attachInfo = s
	r.mu.Unlock()
}

// Config returns the running config.
func (r *Runner) Config() *Config {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cur
}

// ErrUnchanged is returned by Reload when the file has the same content.
var ErrUnchanged = errors.New("config unchanged")

// Reload reads the file again and applies the difference. An invalid file,
// or one changing a start-only setting, is rejected: nothing is written and
// the old config keeps running. A datapath write failure rolls the written
// part back to the old config.
func (r *Runner) Reload() (Plan, error) { return r.reload(true) }

// reload: explicit (SIGHUP, `axon lb reload`) reports a rejected file
// again; a poll skips a file whose content was rejected already.
func (r *Runner) reload(explicit bool) (Plan, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	raw, err := os.ReadFile(r.path)
	if err != nil {
		return Plan{}, r.reject(fmt.Errorf("read config: %w", err))
	}
	sum := sha256.Sum256(raw)
	if bytes.Equal(sum[:], r.curSum[:]) || (!explicit && sum == r.badSum) {
		return Plan{}, ErrUnchanged
	}
	r.badSum = sum // until it is applied
	cfg, err := Parse(raw)
	if err != nil {
		return Plan{}, r.reject(fmt.Errorf("%s: %w", r.path, err))
	}
	p, err := Diff(r.cur, cfg)
	if err != nil {
		return Plan{}, r.reject(fmt.Errorf("%s: %w", r.path, err))
	}
	saved := r.markDraining(cfg)
	if err := r.apply(cfg, p); err != nil {
		r.draining = saved
		back, _ := Diff(cfg, r.cur)
		rbErr := r.apply(r.cur, back)
		if rbErr != nil {
			err = fmt.Errorf("%w; rolling back to the old config also failed: %v", err, rbErr)
		}
		r.curSum, r.badSum = [32]byte{}, [32]byte{} // the maps may differ from both: the next poll retries
		return Plan{}, r.reject(fmt.Errorf("apply %s: %w", r.path, err))
	}
	r.cur, r.curSum, r.loadedAt, r.badSum = cfg, sum, time.Now(), [32]byte{}
	r.generation++
	r.reloads++
	r.lastErr = ""
	r.log.Info("l4lb config reloaded", "file", r.path, "generation", r.generation, "plan", p.String())
	return p, nil
}

func (r *Runner) reject(err error) error {
	r.rejected++
	r.lastErr, r.lastErrAt = err.Error(), time.Now()
	r.log.Error("l4lb config rejected; the previous config keeps running", "error", err)
	return err
}

// apply writes a plan: upserts (new backends visible atomically per VIP)
// before deletes. Called with mu held (or before r is shared).
func (r *Runner) apply(cfg *Config, p Plan) error {
	var errs []error
	for _, v := range p.Upsert {
		tab, err := MaglevTable(v, cfg.MaglevSize, cfg.MaglevSeed)
		if err == nil {
			err = r.dp.UpsertVIP(r.frontendLocked(v), v.DSR, tab)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("program VIP %s: %w", fmtKey(v.Key), err))
		}
	}
	for _, k := range p.Delete {
		delete(r.draining, k)
		if err := r.dp.DeleteVIP(k); err != nil {
			errs = append(errs, fmt.Errorf("remove VIP %s: %w", fmtKey(k), err))
		}
	}
	return errors.Join(errs...)
}

// markDraining records the backends cfg removes from VIPs it keeps, and
// forgets draining backends cfg lists again. Returns the previous state.
// Called with mu held.
func (r *Runner) markDraining(cfg *Config) map[lb.FrontendKey]map[netip.AddrPort]time.Time {
	saved := map[lb.FrontendKey]map[netip.AddrPort]time.Time{}
	for k, m := range r.draining {
		saved[k] = maps.Clone(m)
	}
	old := map[lb.FrontendKey]VIP{}
	for _, v := range r.cur.VIPs {
		old[v.Key] = v
	}
	now := time.Now()
	for _, v := range cfg.VIPs {
		o, ok := old[v.Key]
		if !ok {
			continue
		}
		keep := map[netip.AddrPort]bool{}
		for _, b := range v.Backends {
			keep[netip.AddrPortFrom(b.Addr, b.Port)] = true
		}
		d := r.draining[v.Key]
		for ap := range d {
			if keep[ap] {
				delete(d, ap)
			}
		}
		for _, b := range o.Backends {
			ap := netip.AddrPortFrom(b.Addr, b.Port)
			if !keep[ap] {
				if d == nil {
					d = map[netip.AddrPort]time.Time{}
					r.draining[v.Key] = d
				}
				if _, already := d[ap]; !already {
					d[ap] = now
				}
			}
		}
	}
	return saved
}

// frontendLocked is v's frontend plus its draining backends (Terminating,
// after v's backends so Maglev indexes stay valid).
func (r *Runner) frontendLocked(v VIP) lb.Frontend {
	f := v.Frontend()
	var extra []netip.AddrPort
	for ap := range r.draining[v.Key] {
		extra = append(extra, ap)
	}
	slices.SortFunc(extra, func(a, b netip.AddrPort) int { return a.Compare(b) })
	for _, ap := range extra {
		f.Backends = append(f.Backends, lb.Backend{Addr: ap.Addr(), Port: ap.Port(), State: lb.Terminating})
	}
	return f
}

// ReapDrained removes draining backends without established flows (or
// older than DrainTimeout) and reprograms their VIPs. It needs a Datapath
// that implements Counters (else draining backends leave after DrainTimeout).
func (r *Runner) ReapDrained() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.draining) == 0 {
		return nil
	}
	var perBE map[netip.AddrPort]int
	if c, ok := r.dp.(Counters); ok {
		_, pb, _, _, err := c.Flows()
		if err != nil {
			return fmt.Errorf("count flows of draining backends: %w", err)
		}
		perBE = pb
	}
	var errs []error
	for _, v := range r.cur.VIPs {
		d := r.draining[v.Key]
		changed := false
		for ap, since := range d {
			if (perBE != nil && perBE[ap] == 0) || time.Since(since) > DrainTimeout {
				delete(d, ap)
				changed = true
				r.log.Info("drained backend removed", "vip", fmtKey(v.Key), "backend", ap.String())
			}
		}
		if len(d) == 0 {
			delete(r.draining, v.Key)
		}
		if !changed {
			continue
		}
		tab, err := MaglevTable(v, r.cur.MaglevSize, r.cur.MaglevSeed)
		if err == nil {
			err = r.dp.UpsertVIP(r.frontendLocked(v), v.DSR, tab)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("reprogram VIP %s: %w", fmtKey(v.Key), err))
		}
	}
	return errors.Join(errs...)
}

// Watch reloads on every value of hup (SIGHUP) and when the file's content
// changes (polled every interval), until ctx is done.
func (r *Runner) Watch(ctx context.Context, hup <-chan os.Signal, interval time.Duration) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		explicit := false
		select {
		case <-ctx.Done():
			return
		case <-hup:
			explicit = true
		case <-tick.C:
		}
		if _, err := r.reload(explicit); err == nil {
			r.log.Debug("reload done", "sighup", explicit)
		}
		if err := r.ReapDrained(); err != nil {
			r.log.Warn("draining backends", "error", err)
		}
	}
}

// Status is GET /v1/status of the l4lb socket (`axon lb status`).
type Status struct {
	ConfigFile      string            `json:"configFile"`
	Interface       string            `json:"interface"`
	Attach          string            `json:"attach"` // how the program is attached: "xdp-native, tc ingress tcx", ...
	Generation      int               `json:"generation"`
	LoadedAt        time.Time         `json:"loadedAt"`
	Reloads         int               `json:"reloads"`
	Rejected        int               `json:"rejected"`
	LastError       string            `json:"lastError,omitempty"` // last rejected reload, "" when the running config is the file's
	LastErrorAt     time.Time         `json:"lastErrorAt,omitzero"`
	CTEntries       int               `json:"ctEntries"`
	CTMax           int               `json:"ctMax"`
	MaglevTableSize int               `json:"maglevTableSize"`
	Packets         map[string]uint64 `json:"packets,omitempty"` // by datapath verdict, summed over hooks
	VIPs            []VIPStatus       `json:"vips"`
}

// VIPStatus is one VIP in Status.
type VIPStatus struct {
	Name       string          `json:"name,omitempty"`
	VIP        string          `json:"vip"` // addr:port/PROTO
	Algorithm  string          `json:"algorithm"`
	Forwarding string          `json:"forwarding"` // dsr (ipip) | snat
	Flows      int             `json:"flows"`      // conntrack entries
	Backends   []BackendStatus `json:"backends"`
}

// BackendStatus is one backend in Status.
type BackendStatus struct {
	Address  string  `json:"address"`
	Weight   uint32  `json:"weight"`
	Share    float64 `json:"share"` // fraction of Maglev slots (of weight for random)
	Flows    int     `json:"flows"`
	Draining bool    `json:"draining,omitempty"` // removed by a reload, finishing its flows
}

// Status reports the running config and counters.
func (r *Runner) Status() Status {
	r.mu.Lock()
	cfg := r.cur
	st := Status{ConfigFile: r.path, Interface: cfg.Interface, Attach: r.attachInfo, Generation: r.generation,
		LoadedAt: r.loadedAt, Reloads: r.reloads, Rejected: r.rejected, LastError: r.lastErr, LastErrorAt: r.lastErrAt,
		CTMax: cfg.CTMax, MaglevTableSize: cfg.MaglevSize}
	draining := map[lb.FrontendKey][]netip.AddrPort{}
	for k, d := range r.draining {
		for ap := range d {
			draining[k] = append(draining[k], ap)
		}
		slices.SortFunc(draining[k], func(a, b netip.AddrPort) int { return a.Compare(b) })
	}
	r.mu.Unlock()
	var perVIP map[lb.FrontendKey]int
	var perBE map[netip.AddrPort]int
	if c, ok := r.dp.(Counters); ok {
		if pv, pb, used, max, err := c.Flows(); err == nil {
			perVIP, perBE, st.CTEntries, st.CTMax = pv, pb, used, max
		}
		if p, err := c.Packets(); err == nil {
			st.Packets = p
		}
	}
	for _, v := range cfg.VIPs {
		vs := VIPStatus{Name: v.Name, VIP: fmtKey(v.Key), Algorithm: string(v.Algorithm), Forwarding: "snat", Flows: perVIP[v.Key]}
		if v.DSR {
			vs.Forwarding = "dsr (ipip)"
		}
		shares := make([]float64, len(v.Backends))
		if tab, err := MaglevTable(v, cfg.MaglevSize, cfg.MaglevSeed); err == nil && tab != nil {
			for _, i := range tab {
				shares[i] += 1 / float64(len(tab))
			}
		} else {
			var total float64
			for _, b := range v.Backends {
				total += float64(b.Weight)
			}
			for i, b := range v.Backends {
				if total > 0 {
					shares[i] = float64(b.Weight) / total
				}
			}
		}
		for i, b := range v.Backends {
			ap := netip.AddrPortFrom(b.Addr, b.Port)
			vs.Backends = append(vs.Backends, BackendStatus{Address: b.Name(), Weight: b.Weight, Share: shares[i], Flows: perBE[ap]})
		}
		for _, ap := range draining[v.Key] {
			vs.Backends = append(vs.Backends, BackendStatus{Address: ap.String(), Flows: perBE[ap], Draining: true})
		}
		st.VIPs = append(st.VIPs, vs)
	}
	return st
}
