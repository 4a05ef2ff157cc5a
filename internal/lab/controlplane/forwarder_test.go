package controlplane

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/testutil"
)

// testNetns creates a named netns with lo down, as the kernel makes it (testutil.NewNetns sets
// lo up, and the forwarder must do that itself), and deletes it on cleanup.
func testNetns(t *testing.T, suffix string) string {
	t.Helper()
	name := "axt-cp-" + suffix + "-" + testutil.RandSuffix(t)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", name, err, out)
		}
	})
	return filepath.Join("/run/netns", name)
}

// dialInNetns opens a TCP connection from inside the netns at path.
func dialInNetns(ctx context.Context, path, addr string) (net.Conn, error) {
	var c net.Conn
	err := netnsutil.DoAt(path, func() (err error) {
		var d net.Dialer
		c, err = d.DialContext(ctx, "tcp", addr)
		return err
	})
	return c, err
}

func loUp(t *testing.T, path string) bool {
	t.Helper()
	ns, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	return lo.Attrs().Flags&net.FlagUp != 0
}

// echoServer echoes on root-netns loopback until the test ends.
func echoServer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveEcho(t, l)
}

// serveEcho echoes every connection of l until the test ends; it returns
// l's address.
func serveEcho(t *testing.T, l net.Listener) string {
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return l.Addr().String()
}

func TestForwarderProxiesFromEachNetns(t *testing.T) {
	testutil.RequireRoot(t, "creates network namespaces")
	target := echoServer(t)
	paths := []string{testNetns(t, "fa"), testNetns(t, "fb")}
	for _, p := range paths {
		if loUp(t, p) {
			t.Fatalf("fresh netns %s already has lo up; the test would prove nothing", p)
		}
	}
	// Same fixed address in every netns, as the lab uses 127.0.0.1:6443 in each node.
	const listen = "127.0.0.1:6443"
	f, err := ListenForwarder(paths, listen, target, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})

	for _, p := range paths {
		t.Run(filepath.Base(p), func(t *testing.T) {
			if !loUp(t, p) {
				t.Error("ListenForwarder did not bring lo up")
			}
			for _, size := range []int{1, 4096, 1 << 20} {
				c, err := dialInNetns(ctx, p, listen)
				if err != nil {
					t.Fatalf("dial %s in %s: %v", listen, p, err)
				}
				msg := bytes.Repeat([]byte("axon"), size/4+1)[:size]
				go func() {
					_, _ = c.Write(msg)
					_ = c.(*net.TCPConn).CloseWrite() // half-close must reach the target
				}()
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				got, err := io.ReadAll(c)
				c.Close()
				if err != nil {
					t.Fatalf("read echo of %d bytes: %v", size, err)
				}
				if !bytes.Equal(got, msg) {
					t.Fatalf("echo of %d bytes came back as %d bytes", size, len(got))
				}
			}
		})
	}

	// The root netns's 127.0.0.1:6443 is not ours: the listeners live only in the node netns.
	for p, a := range f.Addrs() {
		if a.String() != listen {
			t.Errorf("listener in %s on %s, want %s", p, a, listen)
		}
	}
}

func TestForwarderErrors(t *testing.T) {
	testutil.RequireRoot(t, "creates network namespaces")
	ok := testNetns(t, "fe")
	for _, tc := range []struct {
		name    string
		paths   []string
		listen  string
		target  string
		wantErr string
	}{
		{"missing netns", []string{ok, "/run/netns/axt-cp-does-not-exist"}, "127.0.0.1:6443", "127.0.0.1:1", "axt-cp-does-not-exist"},
		{"bad listen", []string{ok}, "127.0.0.1", "127.0.0.1:1", "listen address"},
		{"bad target", []string{ok}, "127.0.0.1:6443", "nowhere", "target address"},
		{"address not in netns", []string{ok}, "192.0.2.1:6443", "127.0.0.1:1", "listen on 192.0.2.1:6443"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := ListenForwarder(tc.paths, tc.listen, tc.target, nil)
			if err == nil {
				f.Close()
				t.Fatal("ListenForwarder succeeded")
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("error %q does not mention %q", err, tc.wantErr)
			}
		})
	}
	// The failed attempts closed their listeners: the good netns's port is free again.
	f, err := ListenForwarder([]string{ok}, "127.0.0.1:6443", "127.0.0.1:1", nil)
	if err != nil {
		t.Fatalf("listen again after failures: %v", err)
	}
	f.Close()
}
