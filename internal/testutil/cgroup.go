package testutil

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netns"
)

// Tests of cgroup BPF programs (the socket LB's sock_addr hooks, the
// bypass's sock_ops) attach them to a test cgroup of their own and run the
// processes whose sockets they act on as helper processes: the test binary
// re-executed with one helper test selected, started straight into the test
// cgroup with clone3(CLONE_INTO_CGROUP). The test process itself stays
// outside: a cgroup program acts on sockets of the cgroup of the process
// that made them.

// Cgroup2Mount finds the cgroup v2 mount point in /proc/mounts; without one
// the test skips.
func Cgroup2Mount(t testing.TB) string {
	t.Helper()
	b, err := os.ReadFile("/proc/mounts")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[2] == "cgroup2" {
			return f[1]
		}
	}
	t.Skip("no cgroup v2 mount in /proc/mounts: cgroup BPF programs need cgroup v2")
	return ""
}

// NewCgroup makes the cgroup <cgroup2>/<prefix><pid>-<RandSuffix> and
// returns its path and an open directory fd for CLONE_INTO_CGROUP
// (HelperCommand). At cleanup, after the helper processes are gone, it is
// removed.
func NewCgroup(t testing.TB, prefix string) (string, int) {
	t.Helper()
	dir := filepath.Join(Cgroup2Mount(t), fmt.Sprintf("%s%d-%s", prefix, os.Getpid(), RandSuffix(t)))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatalf("create test cgroup: %v", err)
	}
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		f.Close()
		var err error
		for i := 0; i < 50; i++ { // a just-exited child may still be accounted for a moment
			if err = os.Remove(dir); err == nil || errors.Is(err, os.ErrNotExist) {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Errorf("remove test cgroup %s: %v", dir, err)
	})
	return dir, int(f.Fd())
}

// HelperCommand is the command that re-executes the test binary with only
// the test named test selected and the environment variable env set to req
// (the helper's request), inside the cgroup whose directory fd is cgFD (-1:
// the test process's own cgroup). The helper runs without asynchronous
// preemption: SIGURG would interrupt its raw blocking syscalls with EINTR.
func HelperCommand(ctx context.Context, test, env string, req []byte, cgFD int) *exec.Cmd {
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+test+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), env+"="+string(req), "GODEBUG=asyncpreemptoff=1")
	if cgFD >= 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: cgFD}
	}
	return cmd
}

// HelperStart begins a helper process started by HelperCommand: it skips
// with skipWhy unless the environment variable env holds a JSON request,
// decodes the request into in, and locks the goroutine to its OS thread
// inside the network namespace named by the request's Netns field ("" =
// stay), so the sockets the helper makes live there. A request that cannot
// be decoded or a netns that cannot be entered ends the process with
// status 2.
func HelperStart(t *testing.T, env, skipWhy string, in any) {
	req := os.Getenv(env)
	if req == "" {
		t.Skip(skipWhy)
	}
	var where struct{ Netns string }
	for _, v := range []any{in, &where} {
		if err := json.Unmarshal([]byte(req), v); err != nil {
			fmt.Fprintf(os.Stderr, "helper: bad request: %v\n", err)
			os.Exit(2)
		}
	}
	runtime.LockOSThread()
	if where.Netns == "" {
		return
	}
	h, err := netns.GetFromName(where.Netns)
	if err != nil {
		fmt.Fprintf(os.Stderr, "helper: open netns %s: %v\n", where.Netns, err)
		os.Exit(2)
	}
	if err := netns.Set(h); err != nil {
		fmt.Fprintf(os.Stderr, "helper: enter netns %s: %v\n", where.Netns, err)
		os.Exit(2)
	}
}
