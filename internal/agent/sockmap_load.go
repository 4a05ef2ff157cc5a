package agent

// The same-node TCP bypass's links to internal/datapath/sockmap: the loader,
// the kernel self-test and the netns cookie.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/axonhq/axon/internal/datapath/sockmap"
	"github.com/axonhq/axon/internal/netnsutil"
)

// bypassConn is one socket in the SOCKHASH.
type bypassConn = sockmap.Conn

var _ bypassMaps = (*sockmap.Bypass)(nil)

// loadSockmapFunc returns the loader used by ensure: the programs, pinned
// under --bpf-root, sock_ops on --cgroup-root (the socket LB's cgroup).
func loadSockmapFunc(cfg Config, log *slog.Logger) func() (bypassMaps, string, error) {
	return func() (bypassMaps, string, error) {
		if cfg.CgroupRoot == "" {
			return nil, "", errors.New("--cgroup-root is empty and no cgroup2 filesystem is mounted (see /proc/mounts): mount one or pass --cgroup-root")
		}
		b, err := sockmap.Load(cfg.BPFRoot, cfg.CgroupRoot, sockmap.Config{}, log.With("component", "sockmap"))
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
// may turn on. The self-test (sockmap.SelfTest: real programs, a real socket
// pair in a private netns, FIONREAD, wake-ups, splice, half-close, MSG_PEEK,
// large writes, back-pressure) is not in this build yet: until it is, the
// bypass stays off and status says so. The kernel behaves differently from
// TCP in ways applications notice (docs/sockmap.md, Limits); turning the
// bypass on unchecked is not an option.
func sockmapSelfTest(context.Context) (bool, string) {
	return false, fmt.Sprintf("it is not in this build of axon-agent (%s) yet (sockmap.SelfTest), and the bypass turns on only after it passed", Version)
}
