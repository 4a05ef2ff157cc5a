package agent

// The Service watch's batch and capacity interfaces through the
// north-south tee (nodeport_writer.go), so the full sync keeps its batched
// socket-LB writes and Services stay whole-or-nothing when the north-south
// LB is enabled.

import "github.com/axonhq/axon/internal/lb"

var (
	_ lb.BatchWriter     = (*teeWriter)(nil)
	_ lb.CapacityChecker = (*teeWriter)(nil)
)

// UpsertFrontends implements lb.BatchWriter: ClusterIP frontends that never
// were north-south go to the primary in one batch; every other one takes
// UpsertFrontend (both writers, kind changes).
func (t *teeWriter) UpsertFrontends(fs []lb.Frontend) []error {
	errs := make([]error, len(fs))
	failed := false
	bw, _ := t.primary.(lb.BatchWriter)
	batch := make([]lb.Frontend, 0, len(fs))
	at := make([]int, 0, len(fs))
	for i, f := range fs {
		k, known := t.kinds[f.Key]
		if bw == nil || northSouth(f) || (known && northSouthKey(f.Key, k)) {
			if errs[i] = t.UpsertFrontend(f); errs[i] != nil {
				failed = true
			}
			continue
		}
		batch, at = append(batch, f), append(at, i)
	}
	if len(batch) > 0 {
		res := bw.UpsertFrontends(batch)
		for j, f := range batch {
			t.kinds[f.Key] = f.Kind
			if res != nil && res[j] != nil {
				errs[at[j]], failed = res[j], true
			}
		}
	}
	if !failed {
		return nil
	}
	return errs
}

// Fits implements lb.CapacityChecker with the primary's (socket LB) maps;
// without a primary everything fits.
func (t *teeWriter) Fits(fs []lb.Frontend) error {
	if cc, ok := t.primary.(lb.CapacityChecker); ok {
		return cc.Fits(fs)
	}
	return nil
}
