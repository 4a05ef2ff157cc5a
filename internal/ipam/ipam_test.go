package ipam

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func pfx(s ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, x := range s {
		out = append(out, netip.MustParsePrefix(x))
	}
	return out
}

func open(t *testing.T, dir string, pools ...string) *Allocator {
	t.Helper()
	a, err := New(dir, quiet())
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { a.Close() })
	if len(pools) > 0 {
		if err := a.SetPools(pfx(pools...)); err != nil {
			t.Fatalf("SetPools: %v", err)
		}
	}
	return a
}

func owner(i int) Owner { return Owner{ContainerID: fmt.Sprintf("c%03d", i), IfName: "eth0"} }

func TestAllocateFamilies(t *testing.T) {
	tests := []struct {
		name  string
		pools []string
		want  []string
	}{
		{"v4 only", []string{"10.244.1.0/24"}, []string{"10.244.1.1"}},
		{"v6 only", []string{"fd00:10:244:1::/64"}, []string{"fd00:10:244:1::1"}},
		{"dual, v6 given first", []string{"fd00:10:244:1::/64", "10.244.1.0/24"}, []string{"10.244.1.1", "fd00:10:244:1::1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := open(t, t.TempDir(), tc.pools...)
			got, err := a.Allocate(owner(1))
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for i, w := range tc.want {
				if got[i].IP.String() != w || !got[i].Prefix.Contains(got[i].IP) {
					t.Errorf("addr %d = %v, want %s", i, got[i], w)
				}
			}
			again, err := a.Allocate(owner(1))
			if err != nil || fmt.Sprint(again) != fmt.Sprint(got) {
				t.Errorf("second Allocate = %v, %v; want the same %v", again, err, got)
			}
		})
	}
}

func TestSetPoolsValidation(t *testing.T) {
	tests := []struct {
		name  string
		pools []string
		err   string
	}{
		{"host bits", []string{"10.244.1.5/24"}, "use 10.244.1.0/24"},
		{"two v4", []string{"10.244.1.0/24", "10.244.2.0/24"}, "same family"},
		{"too small", []string{"10.244.1.0/31"}, "too small"},
		{"ok dual", []string{"10.244.1.0/24", "fd00::/64"}, ""},
		{"empty", nil, ""},
	}
	a := open(t, t.TempDir())
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := a.SetPools(pfx(tc.pools...))
			if tc.err == "" && err != nil {
				t.Fatalf("unexpected error %v", err)
			}
			if tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("error %v, want containing %q", err, tc.err)
			}
		})
	}
}

func TestNoPools(t *testing.T) {
	a := open(t, t.TempDir())
	_, err := a.Allocate(owner(1))
	if !errors.Is(err, ErrNoPools) || err.Error() != "no podCIDR assigned to this node yet" {
		t.Fatalf("got %v", err)
	}
	if _, err := a.Allocate(Owner{ContainerID: "x"}); err == nil {
		t.Fatal("owner without ifName accepted")
	}
}

func TestExhaustion(t *testing.T) {
	tests := []struct {
		pool   string
		usable int
	}{
		{"10.244.1.0/24", 254},
		{"10.244.1.0/30", 2},
		{"fd00:1::/125", 7},
	}
	for _, tc := range tests {
		t.Run(tc.pool, func(t *testing.T) {
			a := open(t, t.TempDir(), tc.pool)
			p := netip.MustParsePrefix(tc.pool)
			seen := map[netip.Addr]bool{}
			for i := range tc.usable {
				got, err := a.Allocate(owner(i))
				if err != nil {
					t.Fatalf("allocation %d: %v", i, err)
				}
				ip := got[0].IP
				if seen[ip] || ip == p.Addr() {
					t.Fatalf("bad address %s", ip)
				}
				seen[ip] = true
			}
			_, err := a.Allocate(owner(9999))
			want := fmt.Sprintf("pool %s exhausted (%d addresses in use)", tc.pool, tc.usable)
			var ex *ExhaustedError
			if !errors.As(err, &ex) || err.Error() != want {
				t.Fatalf("got %v, want %q", err, want)
			}
			if p.Addr().Is4() {
				bcast := netip.MustParseAddr(strings.TrimSuffix(tc.pool, "0/"+fmt.Sprint(p.Bits())) + fmt.Sprint(255))
				if tc.pool == "10.244.1.0/24" && seen[bcast] {
					t.Fatal("broadcast address handed out")
				}
			}
			// Freeing one makes room again, and exactly that one comes back.
			if err := a.Release(owner(0)); err != nil {
				t.Fatal(err)
			}
			got, err := a.Allocate(owner(9999))
			if err != nil || len(got) != 1 {
				t.Fatalf("after release: %v, %v", got, err)
			}
		})
	}
}

func TestRoundRobinDoesNotReuseJustFreed(t *testing.T) {
	a := open(t, t.TempDir(), "10.244.1.0/24")
	first, _ := a.Allocate(owner(1))
	if err := a.Release(owner(1)); err != nil {
		t.Fatal(err)
	}
	second, err := a.Allocate(owner(2))
	if err != nil {
		t.Fatal(err)
	}
	if first[0].IP == second[0].IP {
		t.Fatalf("just-freed %s handed out again", first[0].IP)
	}
	if second[0].IP.String() != "10.244.1.2" {
		t.Fatalf("got %s, want 10.244.1.2", second[0].IP)
	}
}

func TestRestartPersistence(t *testing.T) {
	dir := t.TempDir()
	a, err := New(dir, quiet())
	if err != nil {
		t.Fatal(err)
	}
	if err := a.SetPools(pfx("10.244.1.0/24", "fd00:10:244:1::/64")); err != nil {
		t.Fatal(err)
	}
	held := map[netip.Addr]bool{}
	for i := range 5 {
		got, err := a.Allocate(owner(i))
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range got {
			held[g.IP] = true
		}
	}
	if err := a.Release(owner(4)); err != nil {
		t.Fatal(err)
	}

	// A second allocator on the same dir is refused while the first lives.
	if _, err := New(dir, quiet()); err == nil || !strings.Contains(err.Error(), "locked by another process") {
		t.Fatalf("second New: %v", err)
	}
	a.Close()

	b := open(t, dir, "10.244.1.0/24", "fd00:10:244:1::/64")
	allocs := b.Allocations()
	if len(allocs) != 4 {
		t.Fatalf("after restart %d owners, want 4: %v", len(allocs), allocs)
	}
	got, err := b.Allocate(owner(2))
	if err != nil || len(got) != 2 || !held[got[0].IP] || !held[got[1].IP] {
		t.Fatalf("idempotent Allocate after restart = %v, %v", got, err)
	}
	// New owners get fresh addresses, never one held before the restart, and
	// the round-robin hint survives (owner 4's freed .5 is not reused).
	fresh, err := b.Allocate(owner(100))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fresh {
		if held[f.IP] {
			t.Fatalf("address %s handed out twice across a restart", f.IP)
		}
	}
	if fresh[0].IP.String() != "10.244.1.6" {
		t.Fatalf("after restart got %s, want 10.244.1.6 (round robin)", fresh[0].IP)
	}
}

func TestPoolChangeKeepsAllocations(t *testing.T) {
	a := open(t, t.TempDir(), "10.244.1.0/24")
	old, _ := a.Allocate(owner(1))
	if err := a.SetPools(pfx("10.244.9.0/24")); err != nil {
		t.Fatal(err)
	}
	if got := a.Allocations()[owner(1)]; len(got) != 1 || got[0] != old[0].IP {
		t.Fatalf("allocation lost on pool change: %v", got)
	}
	n, err := a.Allocate(owner(2))
	if err != nil || n[0].IP.String() != "10.244.9.1" {
		t.Fatalf("new pool: %v %v", n, err)
	}
	if err := a.Release(owner(1)); err != nil {
		t.Fatal(err)
	}
	if _, ok := a.Allocations()[owner(1)]; ok {
		t.Fatal("release of an out-of-pool allocation failed")
	}
}

func TestCorruptAndUnknownFiles(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"10.244.1.1":       "only-one-line",
		"10.244.1.2":       "c9\neth0\n",
		"README":           "hello",
		".tmp-10.244.1.3-": "partial",
	}
	for n, c := range files {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(c), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	a := open(t, dir, "10.244.1.0/24")
	got, err := a.Allocate(owner(1))
	if err != nil {
		t.Fatal(err)
	}
	if got[0].IP.String() != "10.244.1.3" {
		t.Fatalf("got %s, want 10.244.1.3 (.1 corrupt, .2 taken)", got[0].IP)
	}
	for _, keep := range []string{"10.244.1.1", "README"} {
		if _, err := os.Stat(filepath.Join(dir, keep)); err != nil {
			t.Errorf("%s was removed: %v", keep, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, ".tmp-10.244.1.3-")); !os.IsNotExist(err) {
		t.Errorf("temp file not cleaned: %v", err)
	}
	if ips := a.Allocations()[Owner{"c9", "eth0"}]; len(ips) != 1 {
		t.Errorf("valid file not loaded: %v", ips)
	}
	// GC never touches the corrupt reservation.
	if _, err := a.GC(map[Owner]bool{}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "10.244.1.1")); err != nil {
		t.Errorf("GC removed corrupt file: %v", err)
	}
}

func TestFileFormat(t *testing.T) {
	dir := t.TempDir()
	a := open(t, dir, "10.244.1.0/24", "fd00:10:244:1::/64")
	if _, err := a.Allocate(Owner{"abc", "net1"}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"10.244.1.1", "fd00:10:244:1::1"} {
		b, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil || string(b) != "abc\nnet1\n" {
			t.Errorf("%s = %q, %v", n, b, err)
		}
	}
	if err := a.Release(Owner{"abc", "net1"}); err != nil {
		t.Fatal(err)
	}
	if err := a.Release(Owner{"abc", "net1"}); err != nil {
		t.Fatalf("second release: %v", err)
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if _, err := netip.ParseAddr(e.Name()); err == nil {
			t.Errorf("address file %s left after release", e.Name())
		}
	}
}

func TestGC(t *testing.T) {
	a := open(t, t.TempDir(), "10.244.1.0/24")
	for i := range 4 {
		if _, err := a.Allocate(owner(i)); err != nil {
			t.Fatal(err)
		}
	}
	removed, err := a.GC(map[Owner]bool{owner(1): true, owner(3): true})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(removed) != fmt.Sprint([]Owner{owner(0), owner(2)}) {
		t.Fatalf("removed %v", removed)
	}
	if len(a.Allocations()) != 2 {
		t.Fatalf("left %v", a.Allocations())
	}
}

func TestConcurrentAllocate(t *testing.T) {
	a := open(t, t.TempDir(), "10.244.1.0/24", "fd00:10:244:1::/64")
	const n = 200
	var wg sync.WaitGroup
	results := make([][]netip.Addr, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Every owner asks twice, racing with itself.
			for range 2 {
				got, err := a.Allocate(owner(i))
				if err != nil {
					errs[i] = err
					return
				}
				if results[i] != nil && results[i][0] != got[0].IP {
					errs[i] = fmt.Errorf("not idempotent: %v then %v", results[i], got)
				}
				results[i] = []netip.Addr{got[0].IP, got[1].IP}
			}
		}()
	}
	wg.Wait()
	seen := map[netip.Addr]int{}
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("owner %d: %v", i, errs[i])
		}
		for _, ip := range results[i] {
			if prev, dup := seen[ip]; dup {
				t.Fatalf("%s given to owners %d and %d", ip, prev, i)
			}
			seen[ip] = i
		}
	}
	if len(a.Allocations()) != n {
		t.Fatalf("%d owners recorded, want %d", len(a.Allocations()), n)
	}
}
