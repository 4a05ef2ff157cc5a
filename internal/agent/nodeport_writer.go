package agent

// The Service watch drives one lb.Writer. teeWriter makes the
// north-south load balancer a second writer beside the socket LB without
// changing the watch: every frontend goes to the socket LB, the externally
// reachable ones (NodePort, LoadBalancer, externalIP, HostPort) also go to
// the north-south LB, and the read-back reports a frontend as programmed
// only when both writers hold it, so the watch's resync repairs either one.

import (
	"errors"
	"slices"

	"github.com/axonhq/axon/internal/lb"
)

// northSouth reports whether a frontend is reachable from outside the node
// and so belongs in the north-south load balancer.
func northSouth(f lb.Frontend) bool {
	return f.Kind != lb.KindClusterIP || f.Key.Scope != lb.ScopeCluster
}

func northSouthKey(k lb.FrontendKey, kind lb.Kind) bool {
	return northSouth(lb.Frontend{Key: k, Kind: kind})
}

// teeWriter writes to primary (may be nil: no socket LB) and, for
// north-south frontends, to secondary.
type teeWriter struct {
	primary   lb.Writer                  // socket LB; nil when disabled
	secondary lb.Writer                  // north-south LB
	kinds     map[lb.FrontendKey]lb.Kind // kind of every frontend written through the tee
	warm      bool                       // Frontends was called once (see there)
}

func newTeeWriter(primary, secondary lb.Writer) *teeWriter {
	return &teeWriter{primary: primary, secondary: secondary, kinds: map[lb.FrontendKey]lb.Kind{}}
}

// UpsertFrontend implements lb.Writer.
func (t *teeWriter) UpsertFrontend(f lb.Frontend) error {
	var errs []error
	if t.primary != nil {
		errs = append(errs, t.primary.UpsertFrontend(f))
	}
	if northSouth(f) {
		errs = append(errs, t.secondary.UpsertFrontend(f))
	} else if k, ok := t.kinds[f.Key]; ok && northSouthKey(f.Key, k) {
		errs = append(errs, ignoreNotFound(t.secondary.DeleteFrontend(f.Key))) // changed kind
	}
	t.kinds[f.Key] = f.Kind
	return errors.Join(errs...)
}

// DeleteFrontend implements lb.Writer. Deletes go to both (idempotent).
func (t *teeWriter) DeleteFrontend(k lb.FrontendKey) error {
	var errs []error
	if t.primary != nil {
		errs = append(errs, ignoreNotFound(t.primary.DeleteFrontend(k)))
	}
	errs = append(errs, ignoreNotFound(t.secondary.DeleteFrontend(k)))
	delete(t.kinds, k)
	return errors.Join(errs...)
}

// Frontends implements lb.Writer: the primary's read-back (or the
// secondary's when there is no primary), where a north-south frontend
// missing or different in the secondary is left out or replaced by the
// secondary's version (so the resync rewrites it), and frontends only the
// secondary holds are added (so the resync deletes them). Read-backs carry
// no Kind, so on the first call (a new tee: agent start or a writer change)
// every frontend the secondary lacks is reported missing: the resync then
// rewrites it through the tee (identical content for the socket LB) and the
// tee learns its kind.
func (t *teeWriter) Frontends() ([]lb.Frontend, error) { return t.FrontendsFor(nil) }

// FrontendsFor implements kindAwareReader: Frontends, told the kind the
// Service table wants for each key (wanted; nil = unknown), so a new tee
// can tell a ClusterIP (socket LB only) from a LoadBalancer IP or externalIP
// of the same exact-address scope instead of reporting every one missing
// (which made the resync after the north-south LB appeared rewrite the
// whole table: 10 000 Services again, ~120 MB of garbage).
func (t *teeWriter) FrontendsFor(wanted func(lb.FrontendKey) (lb.Kind, bool)) ([]lb.Frontend, error) {
	cold := !t.warm
	t.warm = true // also when a read below fails
	var prim []lb.Frontend
	if t.primary != nil {
		var err error
		if prim, err = t.primary.Frontends(); err != nil {
			return nil, err
		}
	}
	return t.merge(cold, prim, wanted)
}

// Primary implements primaryReader.
func (t *teeWriter) Primary() lb.Writer { return t.primary }

// FrontendsGivenPrimary implements primaryReader: FrontendsFor with the
// primary's content given instead of read back from its maps.
func (t *teeWriter) FrontendsGivenPrimary(prim []lb.Frontend, wanted func(lb.FrontendKey) (lb.Kind, bool)) ([]lb.Frontend, error) {
	cold := !t.warm
	t.warm = true
	return t.merge(cold, prim, wanted)
}

// merge combines the secondary's read-back with prim, the primary's
// content (unused without a primary); cold: the tee's first read-back.
func (t *teeWriter) merge(cold bool, prim []lb.Frontend, wanted func(lb.FrontendKey) (lb.Kind, bool)) ([]lb.Frontend, error) {
	sec, err := t.secondary.Frontends()
	if err != nil {
		return nil, err
	}
	if t.primary == nil {
		return sec, nil
	}
	secBy := make(map[lb.FrontendKey]lb.Frontend, len(sec))
	for _, f := range sec {
		secBy[f.Key] = f
	}
	out := make([]lb.Frontend, 0, len(prim)+len(sec))
	for _, f := range prim {
		s, inSec := secBy[f.Key]
		delete(secBy, f.Key)
		kind, known := t.kinds[f.Key]
		if !known && !inSec && wanted != nil && f.Key.Scope == lb.ScopeCluster {
			// the table wants a ClusterIP here and the secondary does not
			// hold it: programmed as wanted (it never goes to the secondary)
			kind, known = wanted(f.Key)
			known = known && kind == lb.KindClusterIP
		}
		ns := inSec || (known && northSouthKey(f.Key, kind)) || f.Key.Scope != lb.ScopeCluster || (cold && !known)
		switch {
		case !ns:
			out = append(out, f)
		case !inSec:
			// wanted in the secondary but absent: leave out, the resync upserts
		case !lb.SameDatapath(f, s):
			out = append(out, s)
		default:
			out = append(out, f)
		}
	}
	for _, s := range secBy {
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b lb.Frontend) int { return lb.CompareKeys(a.Key, b.Key) })
	return out, nil
}

// notFound is implemented by errors that mean "nothing to delete".
type notFound interface{ NotFound() bool }

func ignoreNotFound(err error) error {
	var nf notFound
	if errors.As(err, &nf) && nf.NotFound() {
		return nil
	}
	return err
}
