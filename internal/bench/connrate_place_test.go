package bench

import (
	"bufio"
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/axonhq/axon/internal/bench/connrate"
)

// TestConnRatePairedPlaces pairs two clients in different network
// namespaces and cgroups, as the Service benchmark pairs an axon pod on a
// node with kube-proxy's rules against one on a rules-free node: each
// side's server listens only on its own namespace's loopback, on its own
// port, so a connection made from the wrong namespace is refused and
// counted as an error; a watcher sees the process in each side's cgroup.
func TestConnRatePairedPlaces(t *testing.T) {
	requireRootAndTools(t)
	l := newLab(t)
	if l.cgroup == "" {
		t.Skip("no cgroup v2 mount: the cgroup moves cannot be checked")
	}
	home := ownCgroup(t)
	t.Cleanup(func() { // before newLab's cleanup removes the test cgroups
		if err := os.WriteFile(filepath.Join(home, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
			t.Errorf("return to cgroup %s: %v", home, err)
		}
	})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	lo := netip.MustParseAddr("127.0.0.1")
	targets := [2]netip.AddrPort{netip.AddrPortFrom(lo, 18081), netip.AddrPortFrom(lo, 18082)}
	for i, ns := range []string{l.a, l.b} {
		ready := make(chan error, 1)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread ends with the server
			h, err := netns.GetFromPath(ns)
			if err == nil {
				err = netns.Set(h)
				h.Close()
			}
			if err != nil {
				ready <- err
				return
			}
			if err := connrate.Serve(ctx, targets[i], func() { ready <- nil }); err != nil {
				ready <- err
			}
		}()
		if err := <-ready; err != nil {
			t.Fatalf("server in %s: %v", ns, err)
		}
	}
	cgs := [2]string{filepath.Join(l.cgroup, "client"), filepath.Join(l.cgroup, "server")}
	pid := strconv.Itoa(os.Getpid())
	var seen [2]bool
	var wg sync.WaitGroup
	watch, stop := context.WithCancel(ctx)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for watch.Err() == nil {
			for i, cg := range cgs {
				if slices.Contains(procsIn(cg), pid) {
					seen[i] = true
				}
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	res, err := connrate.RunPaired(ctx, connrate.Config{Target: targets[0], Duration: 1200 * time.Millisecond}, targets[1], 100*time.Millisecond,
		[2]connrate.Place{{Netns: l.a, Cgroup: cgs[0]}, {Netns: l.b, Cgroup: cgs[1]}})
	stop()
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("pairs %d, ratio %.3f; A %d conns %d errors, B %d conns %d errors", res.Pairs, res.RatioMedian, res.A.Conns, res.A.Errors, res.B.Conns, res.B.Errors)
	if res.Pairs < 4 || res.A.Conns == 0 || res.B.Conns == 0 || res.A.Errors+res.B.Errors != 0 {
		t.Errorf("each side must connect only from its own namespace: %+v (first errors: %q, %q)", res, res.A.FirstError, res.B.FirstError)
	}
	if !seen[0] || !seen[1] {
		t.Errorf("process seen in the client cgroup %v, in the server cgroup %v: want both", seen[0], seen[1])
	}
	// the calling thread is back in its own namespace
	self, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer self.Close()
	for _, ns := range []string{l.a, l.b} {
		h, err := netns.GetFromPath(ns)
		if err != nil {
			t.Fatal(err)
		}
		if self.Equal(h) {
			t.Errorf("the thread was left in %s", ns)
		}
		h.Close()
	}

	// bad input: a cgroup for one side only, a namespace that does not exist
	if _, err := connrate.RunPaired(ctx, connrate.Config{Target: targets[0], Duration: time.Second}, targets[1], 100*time.Millisecond,
		[2]connrate.Place{{Cgroup: cgs[0]}, {}}); err == nil || !strings.Contains(err.Error(), "both sides a cgroup or neither") {
		t.Errorf("one side's cgroup: %v, want the both-or-neither error", err)
	}
	if _, err := connrate.RunPaired(ctx, connrate.Config{Target: targets[0], Duration: time.Second}, targets[1], 100*time.Millisecond,
		[2]connrate.Place{{Netns: "/run/netns/axt-no-such-ns"}, {}}); err == nil || !strings.Contains(err.Error(), "axt-no-such-ns") {
		t.Errorf("missing netns: %v, want an error naming it", err)
	}
}

// ownCgroup is the cgroup v2 directory of this process.
func ownCgroup(t *testing.T) string {
	t.Helper()
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if p, ok := strings.CutPrefix(sc.Text(), "0::"); ok {
			return filepath.Join(cgroup2Mount(t), p)
		}
	}
	t.Fatal("no cgroup v2 line in /proc/self/cgroup")
	return ""
}
