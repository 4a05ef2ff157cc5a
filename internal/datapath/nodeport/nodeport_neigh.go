package nodeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// The LB's next-hop cache (bpf/lib/fib_cache.h, np_fib in
// bpf/lib/nodeport.h): a known IPv4 next hop (egress device and both MACs)
// is taken from a per-CPU cache instead of bpf_fib_lookup while the
// netns' route generation (rt_genid, read by the programs) and the
// neighbour generation (MapNeighGen, written here) are unchanged. The
// kernel does not count neighbour changes anywhere a program can read, so
// the LB watches the IPv4 neighbours of its netns and bumps the generation
// on every change that can alter a cached MAC: a neighbour that is new,
// gets another MAC, becomes unusable (FAILED, INCOMPLETE) or is removed
// (a device MAC change removes the device's neighbours). Generation 0
// turns the cache off: before WatchNeighbours and while the watch is down.
// An established flow's next hop is also kept in its CT entry (np_nh in
// bpf/lib/ct.h) under the same generations; those entries are pinned and
// outlive the LB, so each LB starts its generations at a random value.

// MapNeighGen: the neighbour generation of the next-hop cache (one __u32;
// not pinned, shared by the tc and XDP programs).
const MapNeighGen = "axon_np_neigh_gen"

// nudValid are the neighbour states whose MAC bpf_fib_lookup uses
// (NUD_VALID in the kernel).
const nudValid = unix.NUD_PERMANENT | unix.NUD_NOARP | unix.NUD_REACHABLE | unix.NUD_PROBE | unix.NUD_STALE | unix.NUD_DELAY

// kernelFibCache says whether the programs can read rt_genid: the
// bpf_cast_to_kern_ctx kfunc (Linux 6.3+) in the kernel's BTF.
func kernelFibCache() (bool, string) {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return false, fmt.Sprintf("no kernel BTF (%v): every forwarded packet is looked up in the FIB", err)
	}
	var fn *btf.Func
	if err := spec.TypeByName("bpf_cast_to_kern_ctx", &fn); err != nil {
		return false, "the kernel lacks the bpf_cast_to_kern_ctx kfunc (Linux 6.3+): every forwarded packet is looked up in the FIB"
	}
	return true, ""
}

// neighWatch is the running neighbour watch of an LB.
type neighWatch struct {
	stop chan struct{}
	wg   sync.WaitGroup
	gen  uint32 // last generation written (only the watch goroutine writes after start)
}

// FibCacheOn says whether the programs were loaded with the next-hop cache
// (cfg_fib_cache); it is used once WatchNeighbours runs.
func (n *LB) FibCacheOn() bool { return n.fibCache }

// WatchNeighbours turns the next-hop cache on for the network namespace of
// the calling thread, which must be the one the LB forwards in (its
// uplink's): it subscribes to the namespace's neighbour changes and keeps
// MapNeighGen current until Close. Attach calls it; callers that only run
// the programs with TestRun call it themselves. A second call is a no-op;
// without the cache (FibCacheOn false) it does nothing.
func (n *LB) WatchNeighbours() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.fibCache || n.neigh != nil {
		return nil
	}
	h, err := netns.Get()
	if err != nil {
		return fmt.Errorf("next-hop cache: open this thread's netns: %w", err)
	}
	// a random first generation: CT entries outlive the LB (pinned) and
	// keep the generation their next hop was found under (np_nh), so a
	// new LB must not count from where an earlier one did
	w := &neighWatch{stop: make(chan struct{}), gen: rand.Uint32()}
	ch, errc, err := neighSubscribe(h, w.stop)
	if err != nil {
		h.Close()
		return fmt.Errorf("next-hop cache: watch neighbours (the cache stays off, every packet is looked up): %w", err)
	}
	if err := w.bump(n.tc.AxonNpNeighGen); err != nil {
		close(w.stop)
		h.Close()
		return fmt.Errorf("next-hop cache: %w", err)
	}
	n.neigh = w
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		defer h.Close()
		n.watchNeighbours(w, h, ch, errc)
	}()
	return nil
}

func neighSubscribe(h netns.NsHandle, stop chan struct{}) (chan netlink.NeighUpdate, chan error, error) {
	ch := make(chan netlink.NeighUpdate, 256)
	errc := make(chan error, 1)
	err := netlink.NeighSubscribeWithOptions(ch, stop, netlink.NeighSubscribeOptions{
		Namespace: &h,
		ErrorCallback: func(err error) {
			select {
			case errc <- err:
			default:
			}
		},
	})
	return ch, errc, err
}

// watchNeighbours bumps the generation on every neighbour change that can
// alter a cached next hop. When the subscription ends (an error, e.g. the
// socket's buffer overflowed and changes were lost) the cache goes off
// (generation 0) and the watch subscribes again after a second, then
// resumes with a new generation: entries of the old ones never match again.
func (n *LB) watchNeighbours(w *neighWatch, h netns.NsHandle, ch chan netlink.NeighUpdate, errc chan error) {
	m := n.tc.AxonNpNeighGen
	seen := map[string]string{} // ifindex/IP -> MAC of a usable neighbour
	for {
		for u := range ch {
			if u.Family != netlink.FAMILY_V4 || !neighChanged(seen, u) {
				continue
			}
			if err := w.bump(m); err != nil {
				n.log.Warn("next-hop cache: bump the neighbour generation", "error", err)
			}
		}
		select {
		case <-w.stop:
			return
		default:
		}
		var err error
		select {
		case err = <-errc:
		default:
		}
		if err := w.set(m, 0); err != nil {
			n.log.Warn("next-hop cache: turn off", "error", err)
		}
		n.log.Warn("next-hop cache: the neighbour watch stopped, cache off until it is back", "error", err)
		clear(seen)
		for {
			select {
			case <-w.stop:
				return
			case <-time.After(time.Second):
			}
			var serr error
			if ch, errc, serr = neighSubscribe(h, w.stop); serr == nil {
				break
			}
			n.log.Warn("next-hop cache: watch neighbours again", "error", serr)
		}
		if err := w.bump(m); err != nil {
			n.log.Warn("next-hop cache: turn on again", "error", err)
		}
	}
}

// neighChanged records u in seen and says whether a cached next hop may
// differ now: a usable neighbour that was not seen before (or had another
// MAC), or any neighbour that went away or became unusable.
func neighChanged(seen map[string]string, u netlink.NeighUpdate) bool {
	key := fmt.Sprintf("%d/%s", u.LinkIndex, u.IP)
	if u.Type == unix.RTM_NEWNEIGH && u.State&nudValid != 0 && len(u.HardwareAddr) > 0 {
		mac := net.HardwareAddr(u.HardwareAddr).String()
		old, known := seen[key]
		seen[key] = mac
		return !known || old != mac
	}
	// unusable or removed: a neighbour that was usable before the watch
	// started is not in seen, so this counts whether known or not
	delete(seen, key)
	return true
}

// bump writes the next generation (never 0, never one this LB used before
// unless it wrapped around 2^32 changes).
func (w *neighWatch) bump(m *ebpf.Map) error {
	w.gen++
	if w.gen == 0 {
		w.gen = 1
	}
	return w.set(m, w.gen)
}

func (w *neighWatch) set(m *ebpf.Map, v uint32) error {
	if err := m.Update(uint32(0), v, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("write %s: %w", MapNeighGen, err)
	}
	return nil
}

// stopNeighbours ends the watch (Close).
func (n *LB) stopNeighbours() {
	n.mu.Lock()
	w := n.neigh
	n.neigh = nil
	n.mu.Unlock()
	if w != nil {
		close(w.stop)
		w.wg.Wait()
	}
}
