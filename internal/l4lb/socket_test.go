package l4lb

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/axonhq/axon/internal/testutil"
)

func TestMain(m *testing.M) {
	testutil.RunCallerHelper()
	os.Exit(m.Run())
}

// serveBG runs r.Serve on sock until the returned stop is called and
// returns Serve's result from it.
func serveBG(t *testing.T, r *Runner, sock string) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Serve(ctx, sock, nil) }()
	c := NewClient(sock)
	var err error
	for range 250 {
		if _, err = c.Status(ctx); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		cancel()
		t.Fatalf("status socket never answered: %v", err)
	}
	var stopped bool
	var res error
	stop = func() error {
		if !stopped {
			stopped = true
			cancel()
			select {
			case res = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("Serve did not stop")
			}
		}
		return res
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

// TestStatusSocketSafety: the status socket is 0600; a path that is not a
// socket, or a socket another process listens on, is refused and left as it
// was; at the end only the socket Serve made is removed.
func TestStatusSocketSafety(t *testing.T) {
	dir := t.TempDir()
	r, _, _ := newTestRunner(t, dir, newMemDP())

	t.Run("a regular file at the path is refused and kept", func(t *testing.T) {
		sock := filepath.Join(dir, "file.sock")
		if err := os.WriteFile(sock, []byte("precious"), 0o644); err != nil {
			t.Fatal(err)
		}
		// bounded: a Serve that took the path would serve until the deadline
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		err := r.Serve(ctx, sock, nil)
		if err == nil || !strings.Contains(err.Error(), "is not a unix socket") {
			t.Fatalf("Serve: %v, want a refusal naming the path", err)
		}
		if b, err := os.ReadFile(sock); err != nil || string(b) != "precious" {
			t.Fatalf("file after the refusal: %q %v", b, err)
		}
	})

	t.Run("a live socket is refused and keeps serving", func(t *testing.T) {
		sock := filepath.Join(dir, "live.sock")
		stop := serveBG(t, r, sock)
		fi, err := os.Stat(sock)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("socket mode %v, want 0600", fi.Mode().Perm())
		}
		err = r.Serve(context.Background(), sock, nil)
		if err == nil || !strings.Contains(err.Error(), "is listening on") {
			t.Fatalf("second Serve: %v, want a refusal", err)
		}
		if _, err := NewClient(sock).Status(context.Background()); err != nil {
			t.Fatalf("first server hurt by the refused second one: %v", err)
		}
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(sock); !os.IsNotExist(err) {
			t.Errorf("own socket left behind: %v", err)
		}
	})

	t.Run("stop removes only its own socket", func(t *testing.T) {
		sock := filepath.Join(dir, "replaced.sock")
		stop := serveBG(t, r, sock)
		if err := os.Remove(sock); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(sock, []byte("someone else's"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		if b, err := os.ReadFile(sock); err != nil || string(b) != "someone else's" {
			t.Fatalf("file after stop: %q %v, want it kept", b, err)
		}
	})
}

// TestStatusSocketCallers: should the socket's mode be loosened, a caller of
// another uid still reads the status but may not reload; root may.
func TestStatusSocketCallers(t *testing.T) {
	testutil.RequireRoot(t, "runs helper processes as other users")
	dir := testutil.ExecDir(t)
	r, path, _ := newTestRunner(t, t.TempDir(), newMemDP())
	sock := filepath.Join(dir, "l4lb.sock")
	serveBG(t, r, sock)
	const other = 64210
	if code, body := testutil.CallUnixAs(t, dir, other, other, sock, "GET", "/v1/status", ""); code != 0 || !strings.Contains(body, "permission denied") {
		t.Fatalf("uid %d on the 0600 socket: %d %q, want permission denied", other, code, body)
	}
	if err := os.Chmod(sock, 0o666); err != nil {
		t.Fatal(err)
	}
	// a changed file, so that a reload that happens shows in the generation
	writeConfig(t, path, strings.Replace(goodConfig, "      - address: 10.0.1.2\n", "      - address: 10.0.1.2\n      - address: 10.0.1.4\n", 1))
	gen := r.Status().Generation
	if code, body := testutil.CallUnixAs(t, dir, other, other, sock, "GET", "/v1/status", ""); code != 200 || !strings.Contains(body, `"generation"`) {
		t.Fatalf("GET /v1/status as uid %d: %d %q", other, code, body)
	}
	code, body := testutil.CallUnixAs(t, dir, other, other, sock, "POST", "/v1/reload", "")
	if code != 403 || !strings.Contains(body, "may not change state") {
		t.Fatalf("POST /v1/reload as uid %d: %d %q, want 403", other, code, body)
	}
	if got := r.Status().Generation; got != gen {
		t.Fatalf("a refused reload moved the generation %d -> %d", gen, got)
	}
	if code, body := testutil.CallUnixAs(t, dir, 0, 0, sock, "POST", "/v1/reload", ""); code != 200 {
		t.Fatalf("POST /v1/reload as root: %d %q", code, body)
	}
	if got := r.Status().Generation; got != gen+1 {
		t.Fatalf("root's reload: generation %d -> %d, want +1", gen, got)
	}
}
