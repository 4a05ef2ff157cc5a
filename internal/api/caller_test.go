package api

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/axonhq/axon/internal/testutil"
	"github.com/axonhq/axon/internal/unixsock"
)

func TestMain(m *testing.M) {
	testutil.RunCallerHelper()
	os.Exit(m.Run())
}

// countingHandler is fakeHandler counting the callers Serve refused.
type countingHandler struct {
	*fakeHandler
	refused atomic.Int64
}

func (h *countingHandler) CallerRefused() { h.refused.Add(1) }

// TestServeCallerCredentials: a real unix socket served by Serve, called by
// helper processes of other uids/gids. Read-only routes answer whoever can
// open the socket; mutating ones only root and the configured writers; the
// socket's mode keeps everyone else out.
func TestServeCallerCredentials(t *testing.T) {
	testutil.RequireRoot(t, "runs helper processes as other users")
	const group, writer, member, stranger = 64201, 64202, 64203, 64204
	dir := testutil.ExecDir(t)
	sock := filepath.Join(dir, "axon.sock")
	h := &countingHandler{fakeHandler: newFake()}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	access := unixsock.Options{Group: group, WriterUIDs: []uint32{writer}}
	go func() { done <- Serve(ctx, sock, h, quietLog(), access) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	waitHealthy(t, NewClient(sock))

	fi, err := os.Stat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); fi.Mode().Perm() != 0o660 || st.Gid != group {
		t.Fatalf("socket mode %v gid %d, want 0660 gid %d", fi.Mode().Perm(), st.Gid, group)
	}

	put := `{"containerID":"c1","ifName":"eth0","hostIfName":"lxc1","hostIfIndex":7,"ips":["10.244.1.7"]}`
	for _, tt := range []struct {
		name            string
		uid, gid        uint32
		method, path    string
		body            string
		code            int
		want            string
		refused, stored bool
	}{
		{"group member reads status", member, group, "GET", "/v1/status", "", 200, `"node":"node1"`, false, false},
		{"group member may not PUT an endpoint", member, group, "PUT", "/v1/endpoints", put, 403, "uid 64203 gid 64201", true, false},
		{"group member may not GC", member, group, "POST", "/v1/gc", `{"all":true}`, 403, "may not change state", true, false},
		{"group member may not release", member, group, "POST", "/v1/ipam/release", `{"containerID":"c1","ifName":"eth0"}`, 403, "only root, uid [64202] may", true, false},
		{"group member may not DELETE", member, group, "DELETE", "/v1/endpoints?containerID=c1&ifname=eth0", "", 403, "may not change state", true, false},
		{"configured writer may PUT", writer, group, "PUT", "/v1/endpoints", put, 204, "", false, true},
		{"root may PUT", 0, 0, "PUT", "/v1/endpoints", put, 204, "", false, true},
		{"outside the group: the socket mode keeps it out", stranger, stranger, "GET", "/v1/status", "", 0, "permission denied", false, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h.mu.Lock()
			clear(h.eps)
			h.mu.Unlock()
			before := h.refused.Load()
			code, body := testutil.CallUnixAs(t, dir, tt.uid, tt.gid, sock, tt.method, tt.path, tt.body)
			if code != tt.code || !strings.Contains(body, tt.want) {
				t.Fatalf("%s %s as %d:%d: %d %q, want %d with %q", tt.method, tt.path, tt.uid, tt.gid, code, body, tt.code, tt.want)
			}
			if got := h.refused.Load() - before; got != map[bool]int64{true: 1}[tt.refused] {
				t.Errorf("refused count moved by %d", got)
			}
			h.mu.Lock()
			stored := len(h.eps) == 1
			h.mu.Unlock()
			if stored != tt.stored {
				t.Errorf("handler stored an endpoint: %v, want %v", stored, tt.stored)
			}
		})
	}
}

// TestServeSocketFile: 0600 without a group; a path that is not a socket is
// refused and kept; the socket is removed at the end only if it is still
// Serve's own.
func TestServeSocketFile(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "axon.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, sock, newFake(), quietLog(), unixsock.Options{Group: unixsock.NoGroup}) }()
	waitHealthy(t, NewClient(sock))
	fi, err := os.Stat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode %v, want 0600", fi.Mode().Perm())
	}
	// someone replaces the socket file while Serve runs: Serve's exit leaves it
	if err := os.Remove(sock); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(sock, []byte("not ours"), 0o600); err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not stop")
	}
	if b, err := os.ReadFile(sock); err != nil || string(b) != "not ours" {
		t.Fatalf("the file at the socket path after Serve stopped: %q %v, want it kept", b, err)
	}
	// and a new Serve refuses the path instead of deleting it
	err = Serve(context.Background(), sock, newFake(), quietLog(), unixsock.Options{Group: unixsock.NoGroup})
	if err == nil || !strings.Contains(err.Error(), "is not a unix socket") {
		t.Fatalf("Serve on a regular file: %v, want a refusal", err)
	}
	if b, err := os.ReadFile(sock); err != nil || string(b) != "not ours" {
		t.Fatalf("the file at the socket path after a refused Serve: %q %v", b, err)
	}
}
