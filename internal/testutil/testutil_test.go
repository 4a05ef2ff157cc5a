package testutil

import (
	"fmt"
	"net"
	"os"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/axonhq/axon/internal/netnsutil"
)

func TestRandSuffix(t *testing.T) {
	a, b := RandSuffix(t), RandSuffix(t)
	if !regexp.MustCompile(`^[0-9a-f]{6}$`).MatchString(a) {
		t.Errorf("RandSuffix = %q, want 6 hex digits", a)
	}
	if a == b {
		t.Errorf("two suffixes are both %q", a)
	}
}

func TestRequireRoot(t *testing.T) {
	ran := false
	t.Run("sub", func(t *testing.T) {
		RequireRoot(t, "testing RequireRoot")
		ran = true
	})
	if root := os.Geteuid() == 0; ran != root {
		t.Errorf("root %v: the test ran %v", root, ran)
	}
}

// TestNewNetns: a netns with lo up and DAD off (or left alone), gone after
// the test.
func TestNewNetns(t *testing.T) {
	RequireRoot(t, "creates network namespaces")
	for _, tc := range []struct {
		name    string
		newNS   func(testing.TB, string) string
		wantDAD func(*testing.T) [2]string
	}{
		{"NewNetns", NewNetns, func(*testing.T) [2]string { return [2]string{"0", "0"} }},
		{"NewNetnsKernelDAD", NewNetnsKernelDAD, kernelDAD},
	} {
		var name string
		t.Run(tc.name, func(t *testing.T) {
			name = tc.newNS(t, "axt-tu-")
			if !strings.HasPrefix(name, "axt-tu-") {
				t.Errorf("name %q", name)
			}
			InNetns(t, name, func() error {
				lo, err := netlink.LinkByName("lo")
				if err != nil {
					return err
				}
				if lo.Attrs().Flags&net.FlagUp == 0 {
					t.Errorf("lo is down in %s", name)
				}
				got, err := acceptDAD()
				if err != nil {
					return err
				}
				if want := tc.wantDAD(t); got != want {
					t.Errorf("%s: accept_dad (default, all) %v, want %v", name, got, want)
				}
				return nil
			})
		})
		if _, err := os.Stat(netnsutil.Path(name)); !os.IsNotExist(err) {
			t.Errorf("netns %s still there after the test (%v)", name, err)
		}
		if h, err := netns.GetFromName(name); err == nil {
			h.Close()
			t.Errorf("netns %s still opens after the test", name)
		}
	}
}

// TestNewNetnsDeletedByTest: a test may delete its netns itself (a container
// runtime does before a CNI DEL); the cleanup then has nothing to do.
func TestNewNetnsDeletedByTest(t *testing.T) {
	RequireRoot(t, "creates network namespaces")
	ft := &fakeTB{TB: t}
	name := NewNetns(ft, "axt-tu-")
	if err := netns.DeleteNamed(name); err != nil {
		t.Fatal(err)
	}
	ft.runCleanups()
	if ft.failed {
		t.Errorf("cleanup failed: %v", ft.logs)
	}
}

// acceptDAD reads net.ipv6.conf.{default,all}.accept_dad in the calling
// thread's netns.
func acceptDAD() ([2]string, error) {
	var v [2]string
	for i, f := range []string{"default", "all"} {
		b, err := os.ReadFile("/proc/sys/net/ipv6/conf/" + f + "/accept_dad")
		if err != nil {
			return v, err
		}
		v[i] = strings.TrimSpace(string(b))
	}
	return v, nil
}

// kernelDAD is what a new netns gets from the kernel.
func kernelDAD(t *testing.T) [2]string {
	t.Helper()
	tmp, err := ns.TempNetNS()
	if err != nil {
		t.Fatal(err)
	}
	defer tmp.Close()
	var v [2]string
	if err := tmp.Do(func(ns.NetNS) (err error) { v, err = acceptDAD(); return err }); err != nil {
		t.Fatal(err)
	}
	return v
}

// TestInNetnsEnds: an error, t.FailNow or a panic in fn fails the test and
// ends it (seen through a testing.TB that records instead of failing).
func TestInNetnsEnds(t *testing.T) {
	RequireRoot(t, "creates network namespaces")
	name := NewNetns(t, "axt-tu-")
	for _, tc := range []struct {
		name     string
		fn       func(t testing.TB) error
		failed   bool
		finished bool
	}{
		{"ok", func(testing.TB) error { return nil }, false, true},
		{"error", func(testing.TB) error { return os.ErrNotExist }, true, false},
		{"FailNow", func(t testing.TB) error { t.FailNow(); return nil }, true, false},
		{"panic", func(testing.TB) error { panic("boom") }, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ft := &fakeTB{TB: t}
			done := make(chan bool)
			go func() { // InNetns ends this goroutine when it fails the test
				finished := false
				defer func() { done <- finished }()
				InNetns(ft, name, func() error { return tc.fn(ft) })
				finished = true
			}()
			if finished := <-done; finished != tc.finished || ft.failed != tc.failed {
				t.Errorf("finished %v, failed %v; want %v, %v (%v)", finished, ft.failed, tc.finished, tc.failed, ft.logs)
			}
		})
	}
}

// fakeTB records failures and cleanups instead of handing them to the real
// test.
type fakeTB struct {
	testing.TB
	failed   bool
	logs     []string
	cleanups []func()
}

func (f *fakeTB) Cleanup(fn func()) { f.cleanups = append(f.cleanups, fn) }

func (f *fakeTB) runCleanups() {
	for i := len(f.cleanups) - 1; i >= 0; i-- {
		f.cleanups[i]()
	}
}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Fatal(args ...any) {
	f.logs = append(f.logs, strings.TrimSpace(fmt.Sprintln(args...)))
	f.FailNow()
}
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.Fatal(fmt.Sprintf(format, args...))
}
func (f *fakeTB) FailNow()              { f.failed = true; runtime.Goexit() }
func (f *fakeTB) Failed() bool          { return f.failed }
func (f *fakeTB) Skipped() bool         { return false }
func (f *fakeTB) Errorf(string, ...any) { f.failed = true }
