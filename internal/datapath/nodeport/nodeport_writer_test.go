package nodeport

import (
	"net/netip"
	"testing"
	"time"

	"github.com/axonhq/axon/internal/lb"
)

// TestNodePortWriter: lb.Writer semantics (read back, replace, delete), bad
// input keeps the programmed state, and a second load adopts the pins.
func TestNodePortWriter(t *testing.T) {
	f := newNPFix(t, nil)
	fe := npNodePort(30080, lb.TCP, false, npBE("10.244.2.5:8080", "node2"), npBE("10.244.1.5:8080", "node1"))
	fe.Affinity = 90 * time.Second
	fe.LocalOnly = true
	f.upsert(t, fe, FrontendOptions{SourceRanges: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}})
	v6 := npVIP("[2001:db8::1]:443", lb.TCP, npBE("[fd00:10:244:2::5]:8443", "node2"))
	f.upsert(t, v6, FrontendOptions{})
	got, err := f.n.Frontends()
	if err != nil || len(got) != 2 {
		t.Fatalf("Frontends: %d, %v", len(got), err)
	}
	if g := got[0]; g.Key != fe.Key || len(g.Backends) != 2 || g.Affinity != fe.Affinity || !g.LocalOnly {
		t.Errorf("read back %+v", g)
	}
	bad := []struct {
		desc string
		f    lb.Frontend
		o    FrontendOptions
	}{
		{"Maglev slot beyond the backends", fe, FrontendOptions{Maglev: make([]uint32, DefaultMaglevTableSize)}},
		{"source range of the other family", fe, FrontendOptions{SourceRanges: []netip.Prefix{netip.MustParsePrefix("2001:db8::/32")}}},
		{"unknown mode", fe, FrontendOptions{Mode: "ipvs"}},
		{"backend of the other family", npNodePort(30080, lb.TCP, false, npBE("[fd00::1]:80", "node2")), FrontendOptions{}},
	}
	bad[0].o.Maglev[7] = 9
	for _, b := range bad {
		if err := f.n.UpsertFrontendWith(b.f, b.o); err == nil {
			t.Errorf("%s: accepted", b.desc)
		} else {
			t.Logf("%s: %v", b.desc, err)
		}
	}
	after, _ := f.n.Frontends()
	if len(after) != 2 || len(after[0].Backends) != 2 {
		t.Errorf("bad input changed the programmed state: %+v", after)
	}
	// a restarted agent adopts what is pinned
	n2, err := Load(f.n.Options())
	if err != nil {
		t.Fatal(err)
	}
	defer n2.Close()
	re, err := n2.Frontends()
	if err != nil || len(re) != 2 || len(re[0].Backends) != 2 {
		t.Fatalf("after reload: %+v, %v", re, err)
	}
	if err := n2.DeleteFrontend(v6.Key); err != nil {
		t.Fatal(err)
	}
	if err := n2.DeleteFrontend(v6.Key); err != nil {
		t.Errorf("second delete: %v", err)
	}
	re, _ = n2.Frontends()
	if len(re) != 1 {
		t.Errorf("after delete: %d frontends", len(re))
	}
	// the adopted frontend's source ranges are known: an upsert without them removes them
	fe.LocalOnly = false
	if err := n2.UpsertFrontendWith(fe, FrontendOptions{}); err != nil {
		t.Fatal(err)
	}
	var k lbTCNpSrcrangeKey
	var v uint8
	if it := n2.tc.AxonNpSrcrange.Iterate(); it.Next(&k, &v) {
		t.Errorf("source range left: %+v", k)
	}
}
