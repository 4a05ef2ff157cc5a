package sockmap

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/datapath"
)

// The splice guard (bpf/sock_splice.c). A bypassed socket's redirected bytes
// wait in its psock queue, which splice(2) (and sendfile(2) into a pipe)
// never reads: Go's io.Copy between two bypassed TCP conns would return 0
// bytes and lose the data. The guard, an fmod_ret program on
// security_file_permission, fails those syscalls with EINVAL when the socket
// read from is in axon_sock_hash; callers (Go's io.Copy, HAProxy) then fall
// back to read/write. Load attaches it before anything can enter the map,
// through a link pinned at <pinDir>/links/<SplicePin> that survives an agent
// restart; the next Load attaches its own guard first and then replaces the
// pin, so no bypassed socket is ever unguarded.

// SplicePin is the name of the splice guard's link pin under <pinDir>/links.
const SplicePin = "fmodret-splice"

// ErrNoSpliceGuard is returned by Load when the kernel cannot run the splice
// guard: the bypass stays off there.
var ErrNoSpliceGuard = errors.New("the splice guard (fmod_ret on security_file_permission) cannot run on this kernel")

// ia32 syscall numbers of the splice family (arch/x86/entry/syscalls/
// syscall_32.tbl), for 32-bit processes on x86_64: x/sys/unix has the
// numbers of the binary's own architecture only. The 64-bit syscalls with the
// same numbers (readahead, get_mempolicy, finit_module) never read a socket
// through security_file_permission, so matching them in either mode is safe.
const (
	ia32SysSendfile   = 187
	ia32SysSendfile64 = 239
	ia32SysSplice     = 313
)

// spliceNrNone is an unused slot of cfg_splice_nrs (AXON_SPLICE_NR_NONE).
const spliceNrNone = 0xfffffffe

// spliceSyscalls are the numbers of the syscalls the guard acts in on the
// running architecture: the ones that read a file through its splice_read.
func spliceSyscalls() ([]uint32, error) {
	nrs := []uint32{unix.SYS_SPLICE, unix.SYS_SENDFILE}
	switch runtime.GOARCH {
	case "amd64":
		return append(nrs, ia32SysSplice, ia32SysSendfile, ia32SysSendfile64), nil
	case "arm64":
		return nrs, nil
	}
	return nil, fmt.Errorf("the splice guard reads the syscall number from the user registers of x86_64 and arm64 only, not %s", runtime.GOARCH)
}

// loadSpliceGuard loads axon_sock_splice on the maps of b.ops and attaches
// it through the pinned link <pinDir>/links/<SplicePin>.
func (b *Bypass) loadSpliceGuard() error {
	if err := loadGuard(&b.ops, &b.splice); err != nil {
		return err
	}
	if err := os.MkdirAll(datapath.LinksDir(b.pinDir), 0o700); err != nil {
		return err
	}
	return attachPinnedTracing(filepath.Join(datapath.LinksDir(b.pinDir), SplicePin), b.splice.AxonSockSplice)
}

// loadGuard loads axon_sock_splice into dst on ops' maps (counters in
// axon_sockmap_metrics), for the map ID of ops' axon_sock_hash and the
// splice syscalls of this architecture. The caller attaches it.
func loadGuard(ops *sockOpsObjects, dst *sockSpliceObjects) error {
	spec, err := loadSockSplice()
	if err != nil {
		return fmt.Errorf("parse splice guard object: %w", err)
	}
	info, err := ops.AxonSockHash.Info()
	if err != nil {
		return fmt.Errorf("read the ID of %s: %w", MapSockHash, err)
	}
	id, ok := info.ID()
	if !ok {
		return fmt.Errorf("the kernel does not report the ID of %s (needs Linux 4.13+)", MapSockHash)
	}
	nrs, err := spliceSyscalls()
	if err != nil {
		return err
	}
	var arr [6]uint32 // AXON_SPLICE_NRS
	if len(nrs) > len(arr) {
		return fmt.Errorf("%d splice syscalls, room for %d", len(nrs), len(arr))
	}
	for i := range arr {
		arr[i] = spliceNrNone
	}
	copy(arr[:], nrs)
	for name, v := range map[string]any{"cfg_sock_hash_id": uint32(id), "cfg_splice_nrs": arr} {
		if err := spec.Variables[name].Set(v); err != nil {
			return fmt.Errorf("set %s: %w", name, err)
		}
	}
	if err := loadOnMaps(ops, spec, dst); err != nil {
		return fmt.Errorf("%w: %w", ErrNoSpliceGuard, datapath.VerifierDetail(err))
	}
	return nil
}

// attachPinnedTracing attaches prog (fentry/fexit/fmod_ret) and pins the
// link at pin. A link already pinned there (an earlier agent's) is replaced
// only after prog is attached: the new link is pinned beside it (<pin>-next) and renamed
// over it, and the old one detaches when its pin and descriptor are gone.
// Tracing links cannot be updated in place; for a moment both programs run,
// which for the splice guard only means the same answer twice.
func attachPinnedTracing(pin string, prog *ebpf.Program) error {
	l, err := link.AttachTracing(link.TracingOptions{Program: prog})
	if err != nil {
		return fmt.Errorf("%w: attach: %w", ErrNoSpliceGuard, err)
	}
	defer l.Close()
	old, err := link.LoadPinnedLink(pin, nil)
	switch {
	case err == nil:
		defer old.Close()
	case !errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("load pinned link %s: %w", pin, err)
	}
	tmp := pin + "-next" // bpffs refuses names with a dot
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale %s: %w", tmp, err)
	}
	if err := l.Pin(tmp); err != nil {
		return fmt.Errorf("pin tracing link at %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, pin); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("move tracing link pin %s to %s: %w", tmp, pin, err)
	}
	return nil
}

// removeSplicePin removes the splice guard's link pin under pinDir (the
// guard detaches once no descriptor holds it). A missing pin is no error.
func removeSplicePin(pinDir string) error {
	pin := filepath.Join(datapath.LinksDir(pinDir), SplicePin)
	if err := os.Remove(pin); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove splice guard pin %s: %w", pin, err)
	}
	return nil
}
