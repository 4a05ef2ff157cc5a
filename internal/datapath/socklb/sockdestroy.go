package socklb

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/datapath/lbmap"
	"github.com/axonhq/axon/internal/lb"
	"github.com/axonhq/axon/internal/netnsutil"
)

// Socket destruction (bpf/sock_destroy.c): when backends leave a frontend,
// the sockets that the socket LB connected to them are aborted with
// bpf_sock_destroy from tcp/udp socket iterators, so applications holding a
// connected socket (DNS resolvers) reconnect to a live backend instead of
// talking to a deleted one forever. Needs the bpf_sock_destroy kfunc
// (kernel >= 6.5); where it is missing a connected socket stays on its
// backend until the application reconnects (recvmsg/getpeername reverse
// translation stays correct).

// Which sockets of a gone backend are aborted (value bits of axon_lb_gone).
const (
	goneUDP = 0x1
	goneTCP = 0x2
)

// GoneBackend is a backend removed from one frontend (by frontend id, as
// the reverse map records it).
type GoneBackend struct {
	FrontendID uint32
	Addr       netip.Addr
	Port       uint16
	TCP        bool // abort TCP sockets too (UDP ones always)
}

// DestroyedSocket is one socket aborted by a Destroy pass.
type DestroyedSocket struct {
	Netns      string // "" = the agent's own netns
	Cookie     uint64
	FrontendID uint32
	Peer       netip.AddrPort
	Proto      lb.Proto
	Err        error // bpf_sock_destroy failed (nil: aborted)
}

// sdRecord is struct sd_record of bpf/sock_destroy.c (40 bytes).
type sdRecord struct {
	Cookie     uint64
	FrontendID uint32
	Ret        int32
	Addr       [16]byte
	Port       uint16 // network order as stored
	Proto      uint8
	Pad        [5]uint8
}

// SockDestroyer runs the socket iterators. Safe for concurrent use (calls
// are serialised: the gone map is shared state of one pass).
type SockDestroyer struct {
	log  *slog.Logger
	mu   sync.Mutex
	objs sockDestroyObjects
	tcp  *link.Iter
	udp  *link.Iter
}

// loadSockDestroyer loads the iterators, sharing the LB maps of s (the
// reverse entries above all) through map replacements.
func loadSockDestroyer(maps map[string]*ebpf.Map, log *slog.Logger) (*SockDestroyer, error) {
	spec, err := loadSockDestroy()
	if err != nil {
		return nil, fmt.Errorf("parse sock_destroy object: %w", err)
	}
	repl := map[string]*ebpf.Map{}
	for name, ms := range spec.Maps {
		if m := maps[name]; m != nil {
			ms.MaxEntries = m.MaxEntries()
			ms.Pinning = ebpf.PinNone
			repl[name] = m
		} else {
			ms.Pinning = ebpf.PinNone
		}
	}
	d := &SockDestroyer{log: log}
	if err := spec.LoadAndAssign(&d.objs, &ebpf.CollectionOptions{MapReplacements: repl}); err != nil {
		return nil, fmt.Errorf("load socket iterators (bpf_sock_destroy needs kernel >= 6.5 with BTF): %w", datapath.VerifierDetail(err))
	}
	if d.tcp, err = link.AttachIter(link.IterOptions{Program: d.objs.AxonSockDestroyTcp}); err != nil {
		d.Close()
		return nil, fmt.Errorf("attach tcp socket iterator: %w", err)
	}
	if d.udp, err = link.AttachIter(link.IterOptions{Program: d.objs.AxonSockDestroyUdp}); err != nil {
		d.Close()
		return nil, fmt.Errorf("attach udp socket iterator: %w", err)
	}
	return d, nil
}

// Close releases the iterators and their maps (nothing is pinned).
func (d *SockDestroyer) Close() error {
	if d.tcp != nil {
		d.tcp.Close()
	}
	if d.udp != nil {
		d.udp.Close()
	}
	return d.objs.Close()
}

// ProbeSockDestroy reports whether this kernel can abort sockets from a
// socket iterator (bpf_sock_destroy kfunc and iter/tcp, iter/udp): it loads
// and attaches the real programs with throwaway maps.
func ProbeSockDestroy() datapath.Capability { return datapath.ProbeFeature("bpf_sock_destroy") }

// Destroy aborts, in each network namespace of netnsPaths ("" = the
// calling process's own), the sockets the socket LB connected to one of
// gone. A namespace that no longer exists is skipped. More gone backends
// than axon_lb_gone holds are done in several passes.
func (d *SockDestroyer) Destroy(netnsPaths []string, gone []GoneBackend) ([]DestroyedSocket, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []DestroyedSocket
	var errs []error
	chunk := max(int(d.objs.AxonLbGone.MaxEntries()), 1)
	for len(gone) > 0 {
		n := min(chunk, len(gone))
		res, err := d.destroyLocked(netnsPaths, gone[:n])
		out = append(out, res...)
		if err != nil {
			errs = append(errs, err)
		}
		gone = gone[n:]
	}
	return out, errors.Join(errs...)
}

func (d *SockDestroyer) destroyLocked(netnsPaths []string, gone []GoneBackend) ([]DestroyedSocket, error) {
	keys := make([]sockDestroyLbGoneKey, 0, len(gone))
	for _, g := range gone {
		k := sockDestroyLbGoneKey{FrontendId: g.FrontendID, Port: lbmap.Port(g.Port), Addr: lbmap.Addr16(g.Addr.Unmap())}
		v := uint8(goneUDP)
		if g.TCP {
			v |= goneTCP
		}
		if err := d.objs.AxonLbGone.Put(&k, &v); err != nil {
			d.clearGone(keys)
			return nil, fmt.Errorf("destroy sockets: fill %s: %w", "axon_lb_gone", lbmap.MapFullHint(err, "axon_lb_gone"))
		}
		keys = append(keys, k)
	}
	defer d.clearGone(keys)
	var out []DestroyedSocket
	var errs []error
	for _, ns := range netnsPaths {
		recs, err := d.runIn(ns)
		if errors.Is(err, os.ErrNotExist) {
			continue // the pod went away meanwhile
		}
		if err != nil {
			errs = append(errs, err)
		}
		for _, r := range recs {
			ds := DestroyedSocket{Netns: ns, Cookie: r.Cookie, FrontendID: r.FrontendID, Proto: lb.Proto(r.Proto),
				Peer: netip.AddrPortFrom(lbmap.FromAddr16(r.Addr), lbmap.PortHost(r.Port))}
			if r.Ret != 0 {
				ds.Err = fmt.Errorf("bpf_sock_destroy: %w", unix.Errno(-r.Ret))
			}
			out = append(out, ds)
		}
	}
	return out, errors.Join(errs...)
}

func (d *SockDestroyer) clearGone(keys []sockDestroyLbGoneKey) {
	for i := range keys {
		_ = d.objs.AxonLbGone.Delete(&keys[i])
	}
}

// runIn opens both iterators inside netns ns (an iterator walks the
// sockets of the netns it is opened in) and reads their records.
func (d *SockDestroyer) runIn(ns string) ([]sdRecord, error) {
	var readers []io.ReadCloser
	err := inNetnsPath(ns, func() error {
		for _, it := range []*link.Iter{d.tcp, d.udp} {
			r, err := it.Open()
			if err != nil {
				return fmt.Errorf("open socket iterator: %w", err)
			}
			readers = append(readers, r)
		}
		return nil
	})
	defer func() {
		for _, r := range readers {
			r.Close()
		}
	}()
	if err != nil {
		return nil, err
	}
	var recs []sdRecord
	for _, r := range readers {
		b, err := io.ReadAll(r)
		if err != nil {
			return recs, fmt.Errorf("read socket iterator in netns %q: %w", ns, err)
		}
		for len(b) >= binary.Size(sdRecord{}) {
			var rec sdRecord
			n := binary.Size(rec)
			if err := binary.Read(bytes.NewReader(b[:n]), binary.NativeEndian, &rec); err != nil {
				return recs, fmt.Errorf("decode socket iterator record: %w", err)
			}
			recs = append(recs, rec)
			b = b[n:]
		}
	}
	return recs, nil
}

// inNetnsPath runs fn inside the netns at path ("" = run in place), on a
// locked OS thread (ns.NetNS.Do). A netns that is gone (its pod was deleted
// meanwhile) is an error that matches os.ErrNotExist.
func inNetnsPath(path string, fn func() error) error {
	if path == "" {
		return fn()
	}
	err := ns.WithNetNSPath(path, func(ns.NetNS) error { return fn() })
	if errors.As(err, new(ns.NSPathNotExistErr)) {
		return fmt.Errorf("%w: %w", os.ErrNotExist, err)
	}
	return err
}

// NetnsCookie returns the netns cookie (what bpf_get_netns_cookie gives the
// socket LB hooks) of the network namespace at path ("" = the caller's):
// netnsutil.Cookie.
func NetnsCookie(path string) (uint64, error) { return netnsutil.Cookie(path) }
