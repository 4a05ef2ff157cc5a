package testutil

// Calls to a unix socket HTTP API made by a process of another uid/gid, for
// the tests of who may call a local API: the test binary runs itself again
// as that user (SysProcAttr.Credential, which needs root) and makes one
// request. A package using CallUnixAs calls RunCallerHelper first in its
// TestMain.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

const callerEnv = "AXON_TEST_UNIX_CALLER"

type callerReq struct {
	Socket, Method, Path, Body string
}

// RunCallerHelper makes the request of CallUnixAs and exits when the
// process is such a helper; otherwise it returns at once.
func RunCallerHelper() {
	raw := os.Getenv(callerEnv)
	if raw == "" {
		return
	}
	var r callerReq
	if err := json.Unmarshal([]byte(raw), &r); err != nil {
		fmt.Printf("dial-error bad request %v\n", err)
		os.Exit(0)
	}
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", r.Socket)
		}}}
	req, err := http.NewRequest(r.Method, "http://local"+r.Path, strings.NewReader(r.Body))
	if err == nil {
		var resp *http.Response
		if resp, err = c.Do(req); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			fmt.Printf("%d %s", resp.StatusCode, b)
			os.Exit(0)
		}
	}
	fmt.Printf("dial-error %v\n", err)
	os.Exit(0)
}

// CallUnixAs makes one HTTP request on the unix socket sock from a process
// running as uid:gid (no supplementary groups) and returns the status code
// (0 when it could not connect) and the body or the connect error. dir is
// from ExecDir (the helper binary is copied there once); the socket's
// directory must be searchable by uid too.
func CallUnixAs(t testing.TB, dir string, uid, gid uint32, sock, method, path, body string) (int, string) {
	t.Helper()
	RequireRoot(t, "runs a helper process as another user")
	bin := filepath.Join(dir, "caller.test")
	if _, err := os.Stat(bin); err != nil {
		copyExecutable(t, os.Args[0], bin)
	}
	raw, _ := json.Marshal(callerReq{Socket: sock, Method: method, Path: path, Body: body})
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = append(os.Environ(), callerEnv+"="+string(raw))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid, NoSetGroups: false, Groups: []uint32{}}}
	cmd.Dir = "/"
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("caller helper as %d:%d: %v (%s)", uid, gid, err, out)
	}
	s := string(out)
	if rest, ok := strings.CutPrefix(s, "dial-error "); ok {
		return 0, strings.TrimSpace(rest)
	}
	code, rest, _ := strings.Cut(s, " ")
	n, err := strconv.Atoi(code)
	if err != nil {
		t.Fatalf("caller helper output %q", s)
	}
	return n, rest
}

// ExecDir returns a directory that every user may enter (0755), removed at
// cleanup; t.TempDir's are 0700. One per test.
func ExecDir(t testing.TB) string {
	t.Helper()
	d := filepath.Join(t.TempDir(), "x")
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	// every parent up to the temp root must be searchable too
	for p := filepath.Dir(d); p != filepath.Clean(os.TempDir()) && p != "/"; p = filepath.Dir(p) {
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

func copyExecutable(t testing.TB, from, to string) {
	t.Helper()
	src, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
}
