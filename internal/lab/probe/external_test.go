package probe

import (
	"context"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/testutil"
)

func TestParseExternal(t *testing.T) {
	for _, good := range []string{"tcp/198.18.0.11:30080", "udp/[fd00:198:18::200]:80", "http/198.18.0.11:30082"} {
		p, err := ParseExternal(good)
		if err != nil || p.String() != good {
			t.Errorf("ParseXProbe(%q) = %v, %v", good, p, err)
		}
	}
	for _, bad := range []string{"", "icmp/1.2.3.4:1", "tcp/1.2.3.4", "tcp:1.2.3.4:80", "udp/[::1]"} {
		if _, err := ParseExternal(bad); err == nil {
			t.Errorf("ParseXProbe(%q) accepted", bad)
		}
	}
}

// TestPeerEchoAndExternal runs the peer-echo server and the prober over real
// sockets in a private network namespace.
func TestPeerEchoAndExternal(t *testing.T) {
	testutil.RequireRoot(t, "a private network namespace")
	tns := testutil.NewNetns(t, "axt-probe-")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	readyR, readyW, _ := os.Pipe()
	defer readyR.Close()
	done := make(chan error, 1)
	go func() {
		done <- netnsutil.Do(tns, func() error { return ServePeerEcho(ctx, PeerEchoPort, readyW, nil) })
	}()
	if err := ReadReady(readyR); err != nil {
		t.Fatal(err)
	}
	for _, spec := range []string{"tcp/127.0.0.1:5658", "tcp/[::1]:5658", "udp/127.0.0.1:5658", "udp/[::1]:5658"} {
		p, _ := ParseExternal(spec)
		var r ExternalResult
		_ = netnsutil.Do(tns, func() error {
			pctx, c := context.WithTimeout(ctx, 2*time.Second)
			defer c()
			r = exchange(pctx, p)
			return nil
		})
		seen, err := netip.ParseAddrPort(r.Seen)
		if !r.OK || err != nil || seen.Addr() != p.Addr.Addr() {
			t.Errorf("%s: %+v (want the server to see %s)", spec, r, p.Addr.Addr())
		}
		if p.Proto == "tcp" && r.Server != p.Addr.String() {
			t.Errorf("%s: server address %q", spec, r.Server)
		}
	}
	// Nothing listens on 5659: a fast failure, not a pass.
	p, _ := ParseExternal("tcp/127.0.0.1:5659")
	_ = netnsutil.Do(tns, func() error {
		if r := exchange(ctx, p); r.OK {
			t.Errorf("probe to a closed port passed: %+v", r)
		}
		return nil
	})
	cancel()
	if err := <-done; err != nil {
		t.Errorf("ServePeerEcho: %v", err)
	}
}
