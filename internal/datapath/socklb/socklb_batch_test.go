package socklb

import (
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/axonhq/axon/internal/datapath/lbmap"
	"github.com/axonhq/axon/internal/lb"
)

// TestSockLBBatch: UpsertFrontends writes new frontends in batches with
// the same result as one-by-one upserts (read back, entry counts, a later
// single upsert/delete of a batched frontend), attributes errors to their
// frontend, refuses a batch that does not fit without leaving anything
// behind, and a restarted loader sees the batched frontends.
func TestSockLBBatch(t *testing.T) {
	e := newSockLBEnv(t, sockLBOptions{maxEntries: map[string]uint32{MapLBService: 64, MapLBBackend: 64}})
	s := e.s
	mk := func(i, nBackends int) lb.Frontend {
		f := lb.Frontend{Key: fkey(fmt.Sprintf("10.96.1.%d:80", i), lb.TCP, lb.ScopeCluster), Kind: lb.KindClusterIP,
			Service: fmt.Sprintf("default/s%d", i)}
		for j := range nBackends {
			f.Backends = append(f.Backends, lb.Backend{Addr: netip.AddrFrom4([4]byte{10, 244, byte(i), byte(j + 1)}), Port: 8080,
				State: lb.BackendState(j % 3)})
		}
		if i%2 == 0 {
			f.Affinity = time.Minute
		}
		return f
	}
	var fs []lb.Frontend
	for i := range 8 {
		fs = append(fs, mk(i+1, 3))
	}
	bad := lb.Frontend{Key: fkey("10.96.1.100:0", lb.TCP, lb.ScopeCluster)} // port 0
	errs := s.UpsertFrontends(append(fs, bad))
	if len(errs) != 9 || errs[8] == nil || !strings.Contains(errs[8].Error(), "port 0") {
		t.Fatalf("errors %v: want only the last one (port 0)", errs)
	}
	for i, err := range errs[:8] {
		if err != nil {
			t.Fatalf("frontend %d: %v", i, err)
		}
	}
	got, err := s.Frontends()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 8 {
		t.Fatalf("read back %d frontends, want 8", len(got))
	}
	for i, f := range got {
		want, _ := lbmap.NormFrontend(fs[i])
		want.Backends = slicesSorted(want.Backends)
		if !reflect.DeepEqual(f, want) {
			t.Errorf("frontend %d read back:\n got %+v\nwant %+v", i, f, want)
		}
	}
	if n := dptest.MapLen(t, s.objs.AxonLbSvc); n != 8*4 {
		t.Errorf("service map holds %d entries, want 8 × (master + 3 slots)", n)
	}
	if n := dptest.MapLen(t, s.objs.AxonLbBe); n != 8*3 {
		t.Errorf("backend map holds %d entries, want 24", n)
	}
	// a batched frontend behaves like any other afterwards
	shrunk := fs[0]
	shrunk.Backends = shrunk.Backends[:1]
	e.upsert(t, shrunk)
	if err := s.DeleteFrontend(fs[1].Key); err != nil {
		t.Fatal(err)
	}
	if n := dptest.MapLen(t, s.objs.AxonLbSvc); n != 8*4-2-4 {
		t.Errorf("service map holds %d entries after shrink + delete, want %d", n, 8*4-2-4)
	}
	// does not fit (26 free service entries, 10 × 4 needed): refused whole
	before := dptest.MapLen(t, s.objs.AxonLbSvc)
	var big []lb.Frontend
	for i := range 10 {
		big = append(big, mk(50+i, 3))
	}
	errs = s.UpsertFrontends(big)
	if errs == nil {
		t.Fatal("a batch larger than the map was accepted")
	}
	full := 0
	for _, err := range errs {
		if err != nil && strings.Contains(err.Error(), "is full") {
			full++
		}
	}
	if full == 0 {
		t.Errorf("no frontend reported a full map: %v", errs)
	}
	// the one-by-one fallback programs what fits, each whole
	got, _ = s.Frontends()
	for _, f := range got {
		if len(f.Backends) == 0 && f.Key != fs[0].Key {
			t.Errorf("frontend %v programmed without backends", f.Key)
		}
	}
	if after := dptest.MapLen(t, s.objs.AxonLbSvc); after > 64 || (after-before)%4 != 0 {
		t.Errorf("service map holds %d entries (before %d): a partial frontend was left", after, before)
	}
	// restart: the batched frontends are read back from the pins
	want, _ := s.Frontends()
	s.Close()
	s2, err := loadSockLBWith(e.pinDir, e.cgroup, dptest.Logger(t), sockLBOptions{maxEntries: map[string]uint32{MapLBService: 64, MapLBBackend: 64}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s2.Close() })
	got, err = s2.Frontends()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("after reload %d frontends, want %d", len(got), len(want))
	}
	for i := range got {
		if !lb.SameDatapath(got[i], want[i]) {
			t.Errorf("after reload %v differs", got[i].Key)
		}
	}
	// an unchanged upsert after a restart writes nothing
	if err := s2.UpsertFrontend(want[0]); err != nil {
		t.Fatal(err)
	}
}

func slicesSorted(bs []lb.Backend) []lb.Backend {
	out := append([]lb.Backend(nil), bs...)
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && lb.CompareBackends(out[j], out[j-1]) < 0; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}
