package lb

import (
	"net/netip"
	"slices"
	"testing"
)

func fe(addr string, port uint16, svc string, backends ...string) Frontend {
	f := Frontend{Key: FrontendKey{Addr: netip.MustParseAddr(addr), Port: port, Proto: TCP}, Kind: KindClusterIP, Service: svc}
	for _, b := range backends {
		ap := netip.MustParseAddrPort(b)
		f.Backends = append(f.Backends, Backend{Addr: ap.Addr(), Port: ap.Port()})
	}
	return f
}

func keys(fs []Frontend) []string {
	var out []string
	for _, f := range fs {
		out = append(out, f.Key.String()+"@"+f.Service)
	}
	return out
}

func keyStrings(ks []FrontendKey) []string {
	var out []string
	for _, k := range ks {
		out = append(out, k.String())
	}
	return out
}

func TestTableApply(t *testing.T) {
	type step struct {
		svc     string
		fs      []Frontend
		upserts []string
		deletes []string
	}
	cases := []struct {
		name      string
		steps     []step
		final     []string
		conflicts int
	}{
		{name: "add change delete", steps: []step{
			{svc: "a/web", fs: []Frontend{fe("10.96.0.1", 80, "a/web", "10.244.1.5:8080"), fe("10.96.0.1", 443, "a/web")},
				upserts: []string{"10.96.0.1:80/TCP@a/web", "10.96.0.1:443/TCP@a/web"}},
			{svc: "b/db", fs: []Frontend{fe("10.96.0.2", 5432, "b/db", "10.244.1.6:5432")},
				upserts: []string{"10.96.0.2:5432/TCP@b/db"}},
			// one backend added to one port: only that frontend is written
			{svc: "a/web", fs: []Frontend{fe("10.96.0.1", 80, "a/web", "10.244.1.5:8080", "10.244.2.5:8080"), fe("10.96.0.1", 443, "a/web")},
				upserts: []string{"10.96.0.1:80/TCP@a/web"}},
			// same content again: nothing
			{svc: "a/web", fs: []Frontend{fe("10.96.0.1", 443, "a/web"), fe("10.96.0.1", 80, "a/web", "10.244.1.5:8080", "10.244.2.5:8080")}},
			// a port removed
			{svc: "a/web", fs: []Frontend{fe("10.96.0.1", 80, "a/web", "10.244.1.5:8080", "10.244.2.5:8080")},
				deletes: []string{"10.96.0.1:443/TCP"}},
			// service deleted
			{svc: "a/web", deletes: []string{"10.96.0.1:80/TCP"}},
			{svc: "nobody/there"},
		}, final: []string{"10.96.0.2:5432/TCP@b/db"}},
		{name: "conflict handover", steps: []step{
			{svc: "x/one", fs: []Frontend{fe("198.51.100.7", 80, "x/one", "10.244.1.5:80")}, upserts: []string{"198.51.100.7:80/TCP@x/one"}},
			// a second service claims the same externalIP:port: the first keeps it
			{svc: "a/two", fs: []Frontend{fe("198.51.100.7", 80, "a/two", "10.244.9.9:80")}},
			// the owner lets go: the claimant takes over with an upsert, no delete
			{svc: "x/one", upserts: []string{"198.51.100.7:80/TCP@a/two"}},
			{svc: "a/two", deletes: []string{"198.51.100.7:80/TCP"}},
		}},
		{name: "conflict stays", steps: []step{
			{svc: "x/one", fs: []Frontend{fe("198.51.100.7", 80, "x/one")}, upserts: []string{"198.51.100.7:80/TCP@x/one"}},
			{svc: "a/two", fs: []Frontend{fe("198.51.100.7", 80, "a/two"), fe("10.96.0.3", 80, "a/two")}, upserts: []string{"10.96.0.3:80/TCP@a/two"}},
		}, final: []string{"10.96.0.3:80/TCP@a/two", "198.51.100.7:80/TCP@x/one"}, conflicts: 1},
		{name: "service name forced", steps: []step{
			{svc: "a/web", fs: []Frontend{fe("10.96.0.1", 80, "wrong/name")}, upserts: []string{"10.96.0.1:80/TCP@a/web"}},
		}, final: []string{"10.96.0.1:80/TCP@a/web"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tb := NewTable()
			for i, s := range tc.steps {
				up, del := tb.Apply(s.svc, s.fs)
				if got := keys(up); !slices.Equal(got, s.upserts) {
					t.Errorf("step %d (%s): upserts %v, want %v", i, s.svc, got, s.upserts)
				}
				if got := keyStrings(del); !slices.Equal(got, s.deletes) {
					t.Errorf("step %d (%s): deletes %v, want %v", i, s.svc, got, s.deletes)
				}
			}
			if got := keys(tb.Frontends()); !slices.Equal(got, tc.final) {
				t.Errorf("final table %v, want %v", got, tc.final)
			}
			if got := tb.Conflicts(); len(got) != tc.conflicts {
				t.Errorf("conflicts %v, want %d", got, tc.conflicts)
			}
		})
	}
}

// TestTableReplay: applying a sequence and then replaying the final state of
// every service yields no writes (the table converges).
func TestTableReplay(t *testing.T) {
	tb := NewTable()
	tb.Apply("a/web", []Frontend{fe("10.96.0.1", 80, "a/web", "10.244.1.5:8080")})
	tb.Apply("b/web", []Frontend{fe("10.96.0.2", 80, "b/web", "10.244.1.6:8080")})
	tb.Apply("a/web", []Frontend{fe("10.96.0.1", 80, "a/web", "10.244.1.7:8080")})
	if up, del := tb.Apply("a/web", tb.Service("a/web")); len(up)+len(del) != 0 {
		t.Errorf("replay wrote %v %v", up, del)
	}
	if got := Render(tb.Frontends()); got != "10.96.0.1:80/TCP            ClusterIP     a/web  affinity=none\n  -> 10.244.1.7:8080          active       -\n10.96.0.2:80/TCP            ClusterIP     b/web  affinity=none\n  -> 10.244.1.6:8080          active       -\n" {
		t.Errorf("render:\n%s", got)
	}
	if tb.Services() != 2 {
		t.Errorf("services %d", tb.Services())
	}
}
