package brnf

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netns"
)

func TestPerNetns(t *testing.T) {
	for _, tc := range []struct {
		release string
		want    bool
		err     bool
	}{
		{"6.18.44-fc-v657", true, false},
		{"6.12.118+deb13-amd64", true, false},
		{"5.3.0", true, false},
		{"5.2.21", false, false},
		{"4.19.0-27-amd64", false, false},
		{"10.0.1", true, false},
		{"garbage", false, true},
	} {
		got, err := PerNetns(tc.release)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("PerNetns(%q) = %v, %v; want %v, error %v", tc.release, got, err, tc.want, tc.err)
		}
	}
}

// TestDisable: in a fresh netns every switch br_netfilter has is 0 afterwards,
// and the test's own netns (the host's) keeps its values.
func TestDisable(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates a network namespace")
	}
	host := map[string]string{}
	for _, tb := range Tables() {
		if b, err := os.ReadFile(Path(tb)); err == nil {
			host[tb] = string(b)
		}
	}
	if len(host) == 0 {
		t.Skip("no br_netfilter in this kernel (no /proc/sys/net/bridge): nothing to turn off")
	}
	name := fmt.Sprintf("axt-brnf-%d", os.Getpid())
	func() { // NewNamed switches the thread: create on a locked thread, switch back
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		orig, err := netns.Get()
		if err != nil {
			t.Fatal(err)
		}
		defer orig.Close()
		h, err := netns.NewNamed(name)
		if err != nil {
			t.Fatalf("create netns %s: %v", name, err)
		}
		h.Close()
		if err := netns.Set(orig); err != nil {
			t.Fatalf("back to the test's netns: %v", err)
		}
	}()
	t.Cleanup(func() {
		if err := netns.DeleteNamed(name); err != nil {
			t.Errorf("delete netns %s: %v", name, err)
		}
	})
	path := "/run/netns/" + name
	read := func() map[string]string {
		got := map[string]string{}
		if err := ns.WithNetNSPath(path, func(ns.NetNS) error {
			for _, tb := range Tables() {
				b, err := os.ReadFile(Path(tb))
				if err != nil {
					return err
				}
				got[tb] = strings.TrimSpace(string(b))
			}
			return nil
		}); err != nil {
			t.Fatalf("read the switches in %s: %v", name, err)
		}
		return got
	}
	if err := Disable(path); err != nil {
		t.Fatal(err)
	}
	for tb, v := range read() {
		if v != "0" {
			t.Errorf("%s: bridge-nf-call-%s = %s, want 0", name, tb, v)
		}
	}
	for tb, v := range host {
		if b, err := os.ReadFile(Path(tb)); err != nil || string(b) != v {
			t.Errorf("host bridge-nf-call-%s changed from %q to %q (%v)", tb, v, b, err)
		}
	}
	if err := Disable("/run/netns/axt-brnf-no-such-netns"); err == nil {
		t.Error("Disable of a missing netns: want an error")
	}
}
