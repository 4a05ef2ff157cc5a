package lb

import (
	"errors"
	"net/netip"
	"testing"
)

// TestMemWriterCapacity: Fits counts one entry per frontend plus one per
// backend, credits what a frontend already holds, and a write beyond the
// capacity fails with ErrFull without changing anything.
func TestMemWriterCapacity(t *testing.T) {
	w := NewMemWriter(0)
	w.SetCapacity(5)
	fe := func(addr string, nb int) Frontend {
		f := Frontend{Key: FrontendKey{Addr: netip.MustParseAddr(addr), Port: 80, Proto: TCP}}
		for i := range nb {
			f.Backends = append(f.Backends, Backend{Addr: netip.AddrFrom4([4]byte{10, 244, 0, byte(1 + i)}), Port: 80})
		}
		return f
	}
	steps := []struct {
		name    string
		fits    []Frontend
		wantErr bool
	}{
		{"3 entries into 5", []Frontend{fe("10.96.0.1", 2)}, false},
		{"two frontends, 6 entries", []Frontend{fe("10.96.0.1", 2), fe("10.96.0.2", 2)}, true},
	}
	for _, st := range steps {
		err := w.Fits(st.fits)
		if (err != nil) != st.wantErr || (err != nil && !errors.Is(err, ErrFull)) {
			t.Errorf("%s: Fits = %v, want error %v (ErrFull)", st.name, err, st.wantErr)
		}
	}
	if err := w.UpsertFrontend(fe("10.96.0.1", 2)); err != nil {
		t.Fatal(err)
	}
	if err := w.Fits([]Frontend{fe("10.96.0.1", 4)}); err != nil {
		t.Errorf("growing a programmed frontend by 2 into 2 free: %v", err)
	}
	if err := w.Fits([]Frontend{fe("10.96.0.2", 2)}); !errors.Is(err, ErrFull) {
		t.Errorf("3 more entries into 2 free: %v, want ErrFull", err)
	}
	before := w.Render()
	if err := w.UpsertFrontend(fe("10.96.0.2", 2)); !errors.Is(err, ErrFull) {
		t.Errorf("write beyond the capacity: %v, want ErrFull", err)
	}
	if w.Render() != before {
		t.Errorf("a refused write changed the content")
	}
	if err := w.DeleteFrontend(fe("10.96.0.1", 0).Key); err != nil {
		t.Fatal(err)
	}
	if err := w.Fits([]Frontend{fe("10.96.0.2", 4)}); err != nil {
		t.Errorf("after a delete: %v", err)
	}
}
