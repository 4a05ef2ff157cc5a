package l4lb

import (
	"fmt"
	"slices"
	"strings"

	"github.com/axonhq/axon/internal/lb"
	"github.com/axonhq/axon/internal/maglev"
)

// Plan is what a reload writes: VIPs to (re)program and VIPs to remove.
type Plan struct {
	Upsert    []VIP            // new VIPs and VIPs whose settings or backends changed, sorted by key
	Delete    []lb.FrontendKey // VIPs no longer in the config, sorted
	Unchanged int              // VIPs left alone
}

// Empty reports whether the plan writes nothing.
func (p Plan) Empty() bool { return len(p.Upsert) == 0 && len(p.Delete) == 0 }

func (p Plan) String() string {
	return fmt.Sprintf("%d VIPs to program, %d to remove, %d unchanged", len(p.Upsert), len(p.Delete), p.Unchanged)
}

// Diff computes the plan from old (nil = nothing programmed) to new. It
// fails, naming the field, when new changes a setting that only takes
// effect at start (the interface, XDP mode, pin directory, socket, table
// size, conntrack size): restart `axon lb` for those.
func Diff(old, new *Config) (Plan, error) {
	var p Plan
	if old != nil {
		var fixed []string
		check := func(field string, changed bool, o, n any) {
			if changed {
				fixed = append(fixed, fmt.Sprintf("%s: %v → %v", field, o, n))
			}
		}
		check("interface", old.Interface != new.Interface, old.Interface, new.Interface)
		check("xdpMode", old.XDPMode != new.XDPMode, old.XDPMode, new.XDPMode)
		check("bpfRoot", old.BPFRoot != new.BPFRoot, old.BPFRoot, new.BPFRoot)
		check("socket", old.Socket != new.Socket, old.Socket, new.Socket)
		check("maglev.tableSize", old.MaglevSize != new.MaglevSize, old.MaglevSize, new.MaglevSize)
		check("conntrack.max", old.CTMax != new.CTMax, old.CTMax, new.CTMax)
		check("sourceAddress", old.SourceAddress != new.SourceAddress, old.SourceAddress, new.SourceAddress)
		if len(fixed) > 0 {
			return Plan{}, fmt.Errorf("these settings take effect only at start and cannot be reloaded: %s: restore them in the file, or restart axon lb to apply them (established flows are kept across a restart)", strings.Join(fixed, "; "))
		}
	}
	have := map[lb.FrontendKey]VIP{}
	if old != nil {
		for _, v := range old.VIPs {
			have[v.Key] = v
		}
	}
	seedChanged := old != nil && old.MaglevSeed != new.MaglevSeed
	for _, v := range new.VIPs {
		o, ok := have[v.Key]
		delete(have, v.Key)
		if ok && sameVIP(o, v) && !(seedChanged && v.Algorithm == lb.AlgorithmMaglev) {
			p.Unchanged++
			continue
		}
		p.Upsert = append(p.Upsert, v)
	}
	for k := range have {
		p.Delete = append(p.Delete, k)
	}
	slices.SortFunc(p.Delete, lb.CompareKeys)
	return p, nil
}

func sameVIP(a, b VIP) bool {
	return a.Key == b.Key && a.Name == b.Name && a.Algorithm == b.Algorithm && a.DSR == b.DSR && slices.Equal(a.Backends, b.Backends)
}

// MaglevTable computes a VIP's Maglev table: slot → index into v.Backends.
// Random VIPs have none (nil).
func MaglevTable(v VIP, size int, seed string) ([]int, error) {
	if v.Algorithm != lb.AlgorithmMaglev {
		return nil, nil
	}
	bs := make([]maglev.Backend, len(v.Backends))
	for i, b := range v.Backends {
		bs[i] = maglev.Backend{Name: b.Name(), Weight: b.Weight}
	}
	t, err := maglev.Build(bs, maglev.Config{Size: size, Seed: seed})
	if err != nil {
		return nil, fmt.Errorf("VIP %s: %w", fmtKey(v.Key), err)
	}
	return t, nil
}

// Frontend is the VIP in the lb model (what the datapath programs). Drained
// backends (weight 0) are Terminating: they keep their established flows
// and get no new ones.
func (v VIP) Frontend() lb.Frontend {
	f := lb.Frontend{Key: v.Key, Kind: KindVIP, Service: v.Name, Algorithm: v.Algorithm}
	for _, b := range v.Backends {
		st := lb.Active
		if b.Weight == 0 {
			st = lb.Terminating
		}
		f.Backends = append(f.Backends, lb.Backend{Addr: b.Addr, Port: b.Port, State: st})
	}
	return f
}

// KindVIP marks frontends of the standalone load balancer in lb.Render output.
const KindVIP lb.Kind = "VIP"
