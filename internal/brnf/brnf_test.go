package brnf

import (
	"os"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/testutil"
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
	testutil.RequireRoot(t, "creates a network namespace")
	host := map[string]string{}
	for _, tb := range Tables() {
		if b, err := os.ReadFile(Path(tb)); err == nil {
			host[tb] = string(b)
		}
	}
	if len(host) == 0 {
		t.Skip("no br_netfilter in this kernel (no /proc/sys/net/bridge): nothing to turn off")
	}
	name := testutil.NewNetns(t, "axt-brnf-")
	path := netnsutil.Path(name)
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
