// Package unixsock serves a local HTTP API on a unix socket with the care
// such a socket needs on a node whose pods are untrusted: the socket file
// gets a fixed mode (and group) instead of the umask's, a path that is not a
// stale socket is never deleted, only the socket this process created is
// removed when it stops, and every request carries its caller's kernel
// credentials (SO_PEERCRED) so that a handler can refuse callers that may
// not change state.
package unixsock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// NoGroup leaves the socket's group as created (the process's) with mode
// 0600; any other Options.Group makes the socket root:Group 0660.
const NoGroup = -1

// Options says who may connect and who may change state.
type Options struct {
	// Group is the gid owning the socket file, which is then 0660; NoGroup
	// (or any negative value) makes it 0600: only root connects.
	Group int
	// WriterUIDs and WriterGIDs are the callers besides uid 0 that may call
	// the mutating routes (every method but GET and HEAD). A GID matches the
	// caller's primary gid (SO_PEERCRED reports no supplementary groups).
	WriterUIDs []uint32
	WriterGIDs []uint32
}

// Mode is the file mode the socket gets under o.
func (o Options) Mode() os.FileMode {
	if o.Group >= 0 {
		return 0o660
	}
	return 0o600
}

// Listener is a unix socket listener that, on Close, removes its socket file
// only if the file at its path is still the one it created (same device and
// inode): a socket another process made there after it is left alone.
type Listener struct {
	*net.UnixListener
	path     string
	dev, ino uint64
}

// Listen creates the socket at path (its directory 0755 if missing) with
// o's mode and group. An existing path is replaced only when it is a unix
// socket nobody answers on (left by a process that died); a live socket or a
// path that is not a socket is an error saying what to do.
func Listen(path string, o Options) (*Listener, error) {
	if path == "" {
		return nil, errors.New("unix socket path is empty")
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("create socket directory: %w", err)
	}
	if err := removeStale(path); err != nil {
		return nil, err
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	// Close removes the file itself, and only if it is still ours.
	ln.SetUnlinkOnClose(false)
	l := &Listener{UnixListener: ln, path: path}
	fail := func(err error) (*Listener, error) {
		_ = l.Close()
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return fail(fmt.Errorf("stat new socket %s: %w", path, err))
	}
	l.dev, l.ino = st.Dev, st.Ino
	if o.Group >= 0 {
		if err := os.Lchown(path, -1, o.Group); err != nil {
			return fail(fmt.Errorf("give socket %s to group %d: %w", path, o.Group, err))
		}
	}
	if err := os.Chmod(path, o.Mode()); err != nil {
		return fail(fmt.Errorf("chmod %s %o: %w", path, o.Mode(), err))
	}
	return l, nil
}

// removeStale removes path when it is a unix socket nobody listens on.
func removeStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("stat %s: %w", path, err)
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("%s exists and is not a unix socket (%s): it is not ours to delete; remove it yourself or choose another socket path", path, fi.Mode().Type())
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		pid := "unknown pid"
		if cr, ok := connCreds(c); ok {
			pid = fmt.Sprintf("pid %d", cr.PID)
		}
		_ = c.Close()
		return fmt.Errorf("another process (%s) is listening on %s: stop it first or choose another socket path", pid, path)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove stale socket %s: %w", path, err)
	}
	return nil
}

// Close stops listening and removes the socket file if it is still the one
// Listen created.
func (l *Listener) Close() error {
	err := l.UnixListener.Close()
	var st unix.Stat_t
	if unix.Lstat(l.path, &st) == nil && st.Dev == l.dev && st.Ino == l.ino && st.Mode&unix.S_IFMT == unix.S_IFSOCK {
		if rerr := os.Remove(l.path); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) && err == nil {
			err = fmt.Errorf("remove socket %s: %w", l.path, rerr)
		}
	}
	return err
}

// Creds are a caller's credentials as the kernel reports them (SO_PEERCRED:
// taken when the caller connected).
type Creds struct {
	PID      int32
	UID, GID uint32
}

type credsKey struct{}

// ConnContext is an http.Server ConnContext that puts the peer credentials
// of a unix socket connection into the context of its requests.
func ConnContext(ctx context.Context, c net.Conn) context.Context {
	if cr, ok := connCreds(c); ok {
		return context.WithValue(ctx, credsKey{}, cr)
	}
	return ctx
}

// PeerCreds returns the caller's credentials put there by ConnContext.
func PeerCreds(ctx context.Context) (Creds, bool) {
	cr, ok := ctx.Value(credsKey{}).(Creds)
	return cr, ok
}

func connCreds(c net.Conn) (Creds, bool) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return Creds{}, false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return Creds{}, false
	}
	var uc *unix.Ucred
	var gerr error
	if err := raw.Control(func(fd uintptr) {
		uc, gerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil || gerr != nil {
		return Creds{}, false
	}
	return Creds{PID: uc.Pid, UID: uc.Uid, GID: uc.Gid}, true
}

// MayWrite reports whether c may call mutating routes under o: uid 0, a
// WriterUIDs uid or a WriterGIDs primary gid.
func (o Options) MayWrite(c Creds) bool {
	return c.UID == 0 || slices.Contains(o.WriterUIDs, c.UID) || slices.Contains(o.WriterGIDs, c.GID)
}

// readOnly are the methods any caller that can connect may use.
func readOnly(method string) bool { return method == http.MethodGet || method == http.MethodHead }

// GuardWrites wraps h: a request with another method than GET or HEAD is
// answered 403 (a JSON {"message": ...}, logged, refused called) unless its
// caller may write under o. A request without credentials (not over a unix
// socket served with ConnContext) is refused too.
func GuardWrites(h http.Handler, o Options, log *slog.Logger, refused func()) http.Handler {
	if log == nil {
		log = slog.Default()
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if readOnly(r.Method) {
			h.ServeHTTP(w, r)
			return
		}
		cr, ok := PeerCreds(r.Context())
		var msg string
		switch {
		case !ok:
			msg = fmt.Sprintf("%s %s: the caller's credentials are unknown (not a unix socket connection): only root may change state", r.Method, r.URL.Path)
		case !o.MayWrite(cr):
			msg = fmt.Sprintf("%s %s: caller uid %d gid %d (pid %d) may not change state: only root%s may; read-only routes (GET) stay open",
				r.Method, r.URL.Path, cr.UID, cr.GID, cr.PID, o.writersText())
		default:
			h.ServeHTTP(w, r)
			return
		}
		log.Warn("api call refused: caller may not change state", "method", r.Method, "path", r.URL.Path,
			"uid", cr.UID, "gid", cr.GID, "pid", cr.PID, "credentials", ok)
		if refused != nil {
			refused()
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		_ = json.NewEncoder(w).Encode(struct {
			Message string `json:"message"`
		}{msg})
	})
}

func (o Options) writersText() string {
	s := ""
	if len(o.WriterUIDs) > 0 {
		s += fmt.Sprintf(", uid %v", o.WriterUIDs)
	}
	if len(o.WriterGIDs) > 0 {
		s += fmt.Sprintf(", gid %v", o.WriterGIDs)
	}
	return s
}
