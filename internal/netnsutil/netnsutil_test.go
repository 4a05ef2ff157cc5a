package netnsutil_test

import (
	"runtime"
	"testing"

	"github.com/vishvananda/netns"

	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/testutil"
)

func TestPath(t *testing.T) {
	if got, want := netnsutil.Path("axt-x"), "/run/netns/axt-x"; got != want {
		t.Errorf("Path = %q, want %q", got, want)
	}
}

func TestDoMissing(t *testing.T) {
	if err := netnsutil.Do("axt-netnsutil-does-not-exist", func() error {
		t.Error("fn ran without its netns")
		return nil
	}); err == nil {
		t.Error("no error for a netns that does not exist")
	}
}

// TestDo: fn runs in the named netns, the caller's thread stays where it was.
func TestDo(t *testing.T) {
	testutil.RequireRoot(t, "creates a network namespace")
	name := testutil.NewNetns(t, "axt-nsu-")
	want, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	defer want.Close()

	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	before, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer before.Close()
	var inside bool
	if err := netnsutil.Do(name, func() error {
		cur, err := netns.Get()
		if err != nil {
			return err
		}
		defer cur.Close()
		inside = cur.Equal(want)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !inside {
		t.Error("fn did not run in the netns")
	}
	after, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer after.Close()
	if !after.Equal(before) {
		t.Error("the caller's thread changed netns")
	}
}
