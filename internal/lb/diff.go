package lb

import (
	"cmp"
	"slices"
	"sort"
)

// Table is the desired set of frontends, by key and by service. Apply
// replaces one service's frontends and returns only what changed, so one
// changed EndpointSlice touches only its service's entries.
//
// Two services may claim the same key (e.g. the same externalIP and port):
// the one that had it keeps it; when it lets go, the claimant with the
// smallest service key takes over. Conflicts lists the losers.
//
// A Table is not safe for concurrent use.
type Table struct {
	want   map[string]map[FrontendKey]Frontend // service → its translated frontends
	claims map[FrontendKey][]string            // key → services wanting it, sorted
	owner  map[FrontendKey]string              // key → service whose frontend is programmed
}

// NewTable returns an empty table.
func NewTable() *Table {
	return &Table{
		want:   map[string]map[FrontendKey]Frontend{},
		claims: map[FrontendKey][]string{},
		owner:  map[FrontendKey]string{},
	}
}

// Apply sets the frontends of service (nil or empty deletes the service) and
// returns the frontends to write (new or changed content) and the keys to
// delete, both sorted by key.
func (t *Table) Apply(service string, fs []Frontend) (upserts []Frontend, deletes []FrontendKey) {
	old := t.want[service]
	next := make(map[FrontendKey]Frontend, len(fs))
	for _, f := range fs {
		f.Service = service
		next[f.Key] = f
	}
	// keys whose programmed frontend may change: each once (old ones that
	// go, then every new one)
	affected := make([]FrontendKey, 0, len(old)+len(next))
	for k := range old {
		if _, still := next[k]; !still {
			t.unclaim(k, service)
			affected = append(affected, k)
		}
	}
	for k := range next {
		if _, had := old[k]; !had {
			t.claim(k, service)
		}
		affected = append(affected, k)
	}
	// Compute what was programmed before changing want.
	type prev struct {
		f   Frontend
		had bool
	}
	before := make([]prev, len(affected))
	for i, k := range affected {
		before[i].f, before[i].had = t.programmed(k)
	}
	if len(next) == 0 {
		delete(t.want, service)
	} else {
		t.want[service] = next
	}
	for i, k := range affected {
		cur, had := before[i].f, before[i].had
		ow, ok := t.owner[k]
		if !ok || !slices.Contains(t.claims[k], ow) {
			if cl := t.claims[k]; len(cl) > 0 {
				ow, ok = cl[0], true
				t.owner[k] = ow
			} else {
				delete(t.owner, k)
				ok = false
			}
		}
		switch {
		case !ok && had:
			deletes = append(deletes, k)
		case ok:
			f := t.want[ow][k]
			if !had || !Equal(cur, f) {
				upserts = append(upserts, f)
			}
		}
	}
	slices.SortFunc(upserts, func(a, b Frontend) int { return CompareKeys(a.Key, b.Key) })
	slices.SortFunc(deletes, CompareKeys)
	return upserts, deletes
}

func (t *Table) claim(k FrontendKey, svc string) {
	cl := t.claims[k]
	i := sort.SearchStrings(cl, svc)
	if i < len(cl) && cl[i] == svc {
		return
	}
	t.claims[k] = slices.Insert(cl, i, svc)
}

func (t *Table) unclaim(k FrontendKey, svc string) {
	cl := t.claims[k]
	if i := sort.SearchStrings(cl, svc); i < len(cl) && cl[i] == svc {
		cl = slices.Delete(cl, i, i+1)
	}
	if len(cl) == 0 {
		delete(t.claims, k)
	} else {
		t.claims[k] = cl
	}
}

func (t *Table) programmed(k FrontendKey) (Frontend, bool) {
	ow, ok := t.owner[k]
	if !ok {
		return Frontend{}, false
	}
	f, ok := t.want[ow][k]
	return f, ok
}

// Get returns the frontend programmed for k.
func (t *Table) Get(k FrontendKey) (Frontend, bool) { return t.programmed(k) }

// Frontends returns every programmed frontend, sorted by key.
func (t *Table) Frontends() []Frontend {
	out := make([]Frontend, 0, len(t.owner))
	for k := range t.owner {
		if f, ok := t.programmed(k); ok {
			out = append(out, f)
		}
	}
	slices.SortFunc(out, func(a, b Frontend) int { return CompareKeys(a.Key, b.Key) })
	return out
}

// Service returns the programmed frontends of one service, sorted by key.
func (t *Table) Service(service string) []Frontend {
	var out []Frontend
	for k := range t.want[service] {
		if t.owner[k] == service {
			out = append(out, t.want[service][k])
		}
	}
	slices.SortFunc(out, func(a, b Frontend) int { return CompareKeys(a.Key, b.Key) })
	return out
}

// Services returns the number of services with at least one frontend wanted.
func (t *Table) Services() int { return len(t.want) }

// Conflict is a frontend key wanted by a service that does not own it.
type Conflict struct {
	Key     FrontendKey
	Service string // the service left out
	Owner   string // the service whose frontend is programmed
}

// Conflicts lists keys claimed by more than one service, sorted.
func (t *Table) Conflicts() []Conflict {
	var out []Conflict
	for k, cl := range t.claims {
		for _, s := range cl {
			if s != t.owner[k] {
				out = append(out, Conflict{Key: k, Service: s, Owner: t.owner[k]})
			}
		}
	}
	slices.SortFunc(out, func(a, b Conflict) int {
		if c := CompareKeys(a.Key, b.Key); c != 0 {
			return c
		}
		return cmp.Compare(a.Service, b.Service)
	})
	return out
}

// Equal reports whether two frontends program the same thing (backends
// compared in order).
func Equal(a, b Frontend) bool {
	return a.Key == b.Key && a.Kind == b.Kind && a.Service == b.Service && a.PortName == b.PortName &&
		a.Affinity == b.Affinity && a.LocalOnly == b.LocalOnly && slices.Equal(a.Backends, b.Backends) &&
		a.Algorithm == b.Algorithm && slices.Equal(a.SourceRanges, b.SourceRanges) && a.HealthCheckNodePort == b.HealthCheckNodePort
}

// SameDatapath reports whether a frontend read back from a Writer programs
// the same thing as a desired one: key, affinity and backends (address,
// port, state) in order. Display-only fields (service and port names, kind,
// node, zone) may not survive a round trip through BPF maps and are ignored.
func SameDatapath(a, b Frontend) bool {
	if a.Key != b.Key || a.Affinity != b.Affinity || len(a.Backends) != len(b.Backends) {
		return false
	}
	for i := range a.Backends {
		x, y := a.Backends[i], b.Backends[i]
		if x.Addr != y.Addr || x.Port != y.Port || x.State != y.State {
			return false
		}
	}
	return true
}
