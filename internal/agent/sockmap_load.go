package agent

// The same-node TCP bypass's links to internal/datapath/sockmap: the loader,
// the kernel self-test and the netns cookie.

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/axonhq/axon/internal/datapath/sockmap"
	"github.com/axonhq/axon/internal/netnsutil"
)

// bypassConn is one socket in the SOCKHASH.
type bypassConn = sockmap.Conn

var _ bypassMaps = (*sockmap.Bypass)(nil)

// loadSockmapFunc returns the loader used by ensure: the programs, pinned
// under --bpf-root, sock_ops on --cgroup-root (the socket LB's cgroup).
// base is the rest of the load configuration: the agent passes the zero
// Config (the splice guard always on); only tests of the wiring on a kernel
// that cannot run the guard set NoSpliceGuard.
func loadSockmapFunc(cfg Config, base sockmap.Config, log *slog.Logger) func(streamVerdict bool) (bypassMaps, string, error) {
	return func(streamVerdict bool) (bypassMaps, string, error) {
		if cfg.CgroupRoot == "" {
			return nil, "", errors.New("--cgroup-root is empty and no cgroup2 filesystem is mounted (see /proc/mounts): mount one or pass --cgroup-root")
		}
		lc := base
		lc.StreamVerdict = streamVerdict
		b, err := sockmap.Load(cfg.BPFRoot, cfg.CgroupRoot, lc, log.With("component", "sockmap"))
		if err != nil {
			return nil, "", err
		}
		return b, cfg.CgroupRoot, nil
	}
}

// sockmapPinned reports whether a previous run left the bypass pinned under
// --bpf-root.
func sockmapPinned(cfg Config) func() bool {
	return func() bool {
		_, err := os.Stat(filepath.Join(cfg.BPFRoot, sockmap.MapSockHash))
		return err == nil
	}
}

// netnsCookie is the netns cookie of a pod's network namespace.
func netnsCookie(path string) (uint64, error) { return netnsutil.Cookie(path) }

// sockmapSelfTest is the kernel self-test that decides whether the bypass
// may turn on (sockmap.SelfTest: the real programs and a real socket pair in
// a private netns; FIONREAD, wake-ups, splice, half-close, MSG_PEEK, large
// writes, back-pressure). It is bounded: a kernel that hangs a check must
// not hold the reconcile.
func sockmapSelfTest(ctx context.Context) sockmap.Result {
	ctx, cancel := context.WithTimeout(ctx, sockmapSelfTestTimeout)
	defer cancel()
	return sockmap.SelfTest(ctx)
}

// sockmapSelfTestTimeout bounds the kernel self-test.
const sockmapSelfTestTimeout = time.Minute
