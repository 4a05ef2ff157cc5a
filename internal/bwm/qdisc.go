package bwm

import (
	"errors"
	"fmt"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// QdiscState is what EnsureFQ found and did.
type QdiscState struct {
	Device  string
	Layout  string // "fq" or "mq+fq" (what is installed now)
	Queues  int    // TX queues of the device
	Found   string // what was there before, e.g. "noqueue", "mq+pfifo_fast"; "" when already right
	Applied bool   // EnsureFQ changed the qdiscs
}

// fqFor is the fq the EDT stamps need: pacing on (the timing wheel) and
// the same drop horizon as the BPF program, so both agree on what is too
// far in the future.
func fqFor(attrs netlink.QdiscAttrs, horizon time.Duration) *netlink.Fq {
	q := netlink.NewFq(attrs)
	q.Pacing = 1
	q.Horizon = uint32(horizon.Microseconds())
	q.HorizonDropPolicy = netlink.HORIZON_DROP_POLICY_DROP
	return q
}

// EnsureFQ makes sure dev has fq as its root qdisc (single TX queue) or mq
// with fq on every TX queue (multi-queue), replacing whatever else is there.
// Idempotent: a device that is already right is not touched. h is a netlink
// handle of the device's netns.
func EnsureFQ(h *netlink.Handle, dev string, horizon time.Duration) (QdiscState, error) {
	st := QdiscState{Device: dev}
	l, err := h.LinkByName(dev)
	if err != nil {
		return st, fmt.Errorf("fq on %s: device not found: %w", dev, err)
	}
	st.Queues = max(l.Attrs().NumTxQueues, 1)
	st.Layout = "fq"
	if st.Queues > 1 {
		st.Layout = "mq+fq"
	}
	cur, err := describe(h, l)
	if err != nil {
		return st, err
	}
	if cur == st.Layout {
		return st, nil
	}
	st.Found = cur
	if st.Queues == 1 {
		q := fqFor(netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Parent: netlink.HANDLE_ROOT, Handle: netlink.MakeHandle(0xa0, 0)}, horizon)
		if err := h.QdiscReplace(q); err != nil {
			return st, fmt.Errorf("install fq on %s: %w (is the sch_fq module available? modprobe sch_fq)", dev, err)
		}
		st.Applied = true
		return st, nil
	}
	mq := &netlink.GenericQdisc{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Parent: netlink.HANDLE_ROOT, Handle: netlink.MakeHandle(0xa0, 0)}, QdiscType: "mq"}
	if err := h.QdiscReplace(mq); err != nil {
		return st, fmt.Errorf("install mq on %s: %w", dev, err)
	}
	for i := 1; i <= st.Queues; i++ {
		q := fqFor(netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Parent: netlink.MakeHandle(0xa0, uint16(i))}, horizon)
		if err := h.QdiscReplace(q); err != nil {
			return st, fmt.Errorf("install fq on %s TX queue %d: %w (is the sch_fq module available? modprobe sch_fq)", dev, i, err)
		}
	}
	st.Applied = true
	return st, nil
}

// describe summarises dev's egress qdiscs: "fq", "mq+fq" (every TX queue
// has fq), or what is there instead ("noqueue", "mq+pfifo_fast", ...).
func describe(h *netlink.Handle, l netlink.Link) (string, error) {
	qs, err := h.QdiscList(l)
	if err != nil {
		return "", fmt.Errorf("list qdiscs of %s: %w", l.Attrs().Name, err)
	}
	var root netlink.Qdisc
	for _, q := range qs {
		if q.Attrs().Parent == netlink.HANDLE_ROOT {
			root = q
		}
	}
	if root == nil {
		return "noqueue", nil
	}
	if root.Type() != "mq" {
		return root.Type(), nil
	}
	children := map[string]int{}
	n := 0
	for _, q := range qs {
		if q.Attrs().Parent != netlink.HANDLE_ROOT && q.Attrs().Parent != netlink.HANDLE_INGRESS &&
			q.Attrs().Parent != netlink.HANDLE_CLSACT && major(q.Attrs().Parent) == major(root.Attrs().Handle) {
			children[q.Type()]++
			n++
		}
	}
	if n == max(l.Attrs().NumTxQueues, 1) && children["fq"] == n {
		return "mq+fq", nil
	}
	out := "mq"
	for t := range children {
		if t != "fq" || children["fq"] != n {
			out += "+" + t
		}
	}
	return out, nil
}

func major(h uint32) uint32 { return h >> 16 }

// RemoveFQ puts the device back to the kernel's default root qdisc
// (deletes the root qdisc axon installed). A device without one is fine.
func RemoveFQ(h *netlink.Handle, dev string) error {
	l, err := h.LinkByName(dev)
	if err != nil {
		return nil
	}
	qs, err := h.QdiscList(l)
	if err != nil {
		return fmt.Errorf("list qdiscs of %s: %w", dev, err)
	}
	for _, q := range qs {
		if q.Attrs().Parent == netlink.HANDLE_ROOT && q.Attrs().Handle == netlink.MakeHandle(0xa0, 0) {
			if err := h.QdiscDel(q); err != nil && !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("delete root qdisc of %s: %w", dev, err)
			}
		}
	}
	return nil
}

// PodGSOMaxSize is the GSO size cap for a pod limited to bits per second:
// PodGSOCapTime of its rate, at least PodGSOMin, at most 64 KiB. A pod whose
// RTT is below 512 µs otherwise sends full 64 KiB GSO packets
// (tcp_tso_rtt_log), each of which is 52 ms of link time at 10 Mbit/s that
// every other packet of the pod (a request/response flow) waits behind on
// the shared EDT clock.
func PodGSOMaxSize(bits uint64) uint32 { return GSOCap(bits, PodGSOCapTime, PodGSOMin) }

// The pod GSO cap and the egress catch-up credit the agent uses (measured
// A/B in the 6.12 VM, docs/bandwidth.md).
const (
	PodGSOCapTime = 5 * time.Millisecond // link time of one GSO packet at the pod's rate
	PodGSOMin     = 16 << 10             // bytes: floor of the cap
	// EgressSlack is how far behind its EDT schedule a limited pod may fall
	// (a late timer, a late TX completion) and still catch up, as a burst
	// of at most this much time at its rate (datapath.BWM.SetEgressSlack).
	EgressSlack = 10 * time.Millisecond
)

// GSOCap is d of bits per second in bytes, clamped to [floor, 64 KiB].
func GSOCap(bits uint64, d time.Duration, floor uint32) uint32 {
	b := bits / 8 * uint64(d.Microseconds()) / 1_000_000
	return uint32(min(max(b, uint64(floor)), 64<<10))
}

// SetPodGSOMaxSize sets gso_max_size (and, at or below 64 KiB, the IPv4
// one with it) of the pod interface ifname inside the netns at nsPath and
// returns the previous value. New TCP connections of the pod use it.
func SetPodGSOMaxSize(nsPath, ifname string, size uint32) (uint32, error) {
	ns, err := netns.GetFromPath(nsPath)
	if err != nil {
		return 0, fmt.Errorf("pod netns %s: %w", nsPath, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return 0, fmt.Errorf("netlink in pod netns %s: %w", nsPath, err)
	}
	defer h.Close()
	l, err := h.LinkByName(ifname)
	if err != nil {
		return 0, fmt.Errorf("pod interface %s in %s: %w", ifname, nsPath, err)
	}
	prev := l.Attrs().GSOMaxSize
	if prev == size {
		return prev, nil
	}
	if err := h.LinkSetGSOMaxSize(l, int(size)); err != nil {
		return prev, fmt.Errorf("set gso_max_size %d on %s in %s: %w", size, ifname, nsPath, err)
	}
	return prev, nil
}
