package datapath

import (
	"errors"
	"fmt"
	"runtime"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/api"
)

// Capability is one probed kernel feature.
type Capability struct {
	Available bool
	Reason    string // how it was found, or why it is missing
}

// Features holds the probe results. Every field is probed on the running
// kernel (no version guessing); device probes run in a throwaway netns.
type Features struct {
	TCX           Capability // link.AttachTCX on a device
	RedirectPeer  Capability // bpf_redirect_peer helper in sched_cls
	RedirectNeigh Capability // bpf_redirect_neigh helper in sched_cls
	FibLookup     Capability // bpf_fib_lookup helper in sched_cls
	Netkit        Capability // netkit device creation
	SchFQ         Capability // fq qdisc (needed for EDT)
	BPFFS         Capability // bpffs mounted at /sys/fs/bpf
	BigTCP        Capability // gso_max_size > 64k (BIG TCP)
	SockDestroy   Capability // bpf_sock_destroy kfunc from tcp/udp socket iterators (issue 4)
	FibCache      Capability // pod_egress loads with the rt_genid-checked IPv4 route cache
}

// List returns the probe results in the agent API form.
func (f Features) List() []api.Feature {
	mk := func(name string, c Capability) api.Feature {
		return api.Feature{Name: name, Available: c.Available, Reason: c.Reason}
	}
	return []api.Feature{
		mk("tcx", f.TCX),
		mk("bpf_redirect_peer", f.RedirectPeer),
		mk("bpf_redirect_neigh", f.RedirectNeigh),
		mk("bpf_fib_lookup", f.FibLookup),
		mk("netkit", f.Netkit),
		mk("sch_fq", f.SchFQ),
		mk("bpffs", f.BPFFS),
		mk("big_tcp", f.BigTCP),
		mk("bpf_sock_destroy", f.SockDestroy),
		mk("fib_cache", f.FibCache),
	}
}

func capFrom(err error, okReason, name string) Capability {
	if err == nil {
		return Capability{Available: true, Reason: okReason}
	}
	return Capability{Reason: fmt.Sprintf("%s: %v", name, err)}
}

// Probe runs every feature probe. It needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN).
func Probe() Features {
	var f Features
	helper := func(fn asm.BuiltinFunc, name string) Capability {
		return capFrom(features.HaveProgramHelper(ebpf.SchedCLS, fn),
			name+": helper accepted by the verifier in a sched_cls program (probed)", name)
	}
	f.RedirectPeer = helper(asm.FnRedirectPeer, "bpf_redirect_peer")
	f.RedirectNeigh = helper(asm.FnRedirectNeigh, "bpf_redirect_neigh")
	f.FibLookup = helper(asm.FnFibLookup, "bpf_fib_lookup")
	f.SockDestroy = ProbeSockDestroy()
	if f.RedirectNeigh.Available {
		f.FibCache = ProbeFibCache()
	} else {
		f.FibCache = Capability{Reason: "fib_cache: needs bpf_redirect_neigh, which this kernel lacks"}
	}

	if ok, err := isBPFFS(BPFFSRoot); err != nil {
		f.BPFFS = Capability{Reason: err.Error()}
	} else if ok {
		f.BPFFS = Capability{Available: true, Reason: "bpffs mounted at " + BPFFSRoot}
	} else {
		f.BPFFS = Capability{Reason: "bpffs not mounted at " + BPFFSRoot + " (Load mounts it)"}
	}

	err := inScratchNetns(func(h *netlink.Handle) error {
		f.TCX = probeTCX()
		f.Netkit = probeNetkit(h)
		f.SchFQ = probeFQ(h)
		f.BigTCP = probeBigTCP(h)
		return nil
	})
	if err != nil {
		r := Capability{Reason: "scratch netns for device probes: " + err.Error()}
		f.TCX, f.Netkit, f.SchFQ, f.BigTCP = r, r, r, r
	}
	return f
}

// inScratchNetns runs fn on a locked OS thread inside a new, empty network
// namespace that disappears afterwards. If the thread cannot return to its
// original netns it stays locked and dies with its goroutine.
func inScratchNetns(fn func(h *netlink.Handle) error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("get current netns: %w", err)
			return
		}
		defer orig.Close()
		scratch, err := netns.New()
		if err != nil {
			_ = netns.Set(orig)
			errc <- fmt.Errorf("create netns: %w", err)
			return // thread stays locked: its netns is unknown
		}
		// NETLINK_ROUTE only: the default set adds xfrm and netfilter
		// sockets, which fail (EPROTONOSUPPORT) where xfrm_user or
		// nfnetlink are not loaded, e.g. a minimal VM.
		h, err := netlink.NewHandleAt(scratch, unix.NETLINK_ROUTE)
		if err == nil {
			err = fn(h)
			h.Close()
		}
		scratch.Close()
		if serr := netns.Set(orig); serr != nil {
			errc <- errors.Join(err, fmt.Errorf("return to original netns: %w", serr))
			return
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
}

func trivialTCProg() (*ebpf.Program, error) {
	return ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         ebpf.SchedCLS,
		License:      "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
	})
}

// probeTCX attaches a trivial program with tcx to the scratch netns' lo.
func probeTCX() Capability {
	prog, err := trivialTCProg()
	if err != nil {
		return Capability{Reason: "tcx: cannot load a sched_cls program: " + err.Error()}
	}
	defer prog.Close()
	l, err := link.AttachTCX(link.TCXOptions{Interface: 1, Program: prog, Attach: ebpf.AttachTCXIngress})
	if err != nil {
		return Capability{Reason: "tcx: attach failed (kernel < 6.6?), falling back to clsact/cls_bpf: " + err.Error()}
	}
	l.Close()
	return Capability{Available: true, Reason: "tcx: kernel supports tcx links (probed)"}
}

func probeNetkit(h *netlink.Handle) Capability {
	nk := &netlink.Netkit{LinkAttrs: netlink.LinkAttrs{Name: "axprobe-nk0"}, Mode: netlink.NETKIT_MODE_L3}
	nk.SetPeerAttrs(&netlink.LinkAttrs{Name: "axprobe-nk1"})
	if err := h.LinkAdd(nk); err != nil {
		return Capability{Reason: "netkit: creating a netkit device failed (CONFIG_NETKIT unset?): " + err.Error()}
	}
	_ = h.LinkDel(nk)
	return Capability{Available: true, Reason: "netkit: device created (probed)"}
}

func probeFQ(h *netlink.Handle) Capability {
	q := &netlink.Fq{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: 1, Parent: netlink.HANDLE_ROOT, Handle: netlink.MakeHandle(1, 0)}}
	if err := h.QdiscAdd(q); err != nil {
		return Capability{Reason: "sch_fq: adding an fq qdisc failed (module missing?), EDT rate limiting unavailable: " + err.Error()}
	}
	return Capability{Available: true, Reason: "sch_fq: fq qdisc added (probed)"}
}

func probeBigTCP(h *netlink.Handle) Capability {
	const size = 196608
	d := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "axprobe-v0"}, PeerName: "axprobe-v1"}
	if err := h.LinkAdd(d); err != nil {
		return Capability{Reason: "big_tcp: cannot create a veth pair to probe: " + err.Error()}
	}
	defer h.LinkDel(d)
	if err := h.LinkSetGSOMaxSize(d, size); err != nil {
		return Capability{Reason: "big_tcp: setting gso_max_size > 64k failed: " + err.Error()}
	}
	l, err := h.LinkByName(d.Name)
	if err != nil {
		return Capability{Reason: "big_tcp: " + err.Error()}
	}
	if l.Attrs().GSOMaxSize != size {
		return Capability{Reason: fmt.Sprintf("big_tcp: gso_max_size reads back %d, not %d", l.Attrs().GSOMaxSize, size)}
	}
	reason := "big_tcp: gso_max_size > 64k accepted (probed)"
	if err := h.LinkSetGSOIPv4MaxSize(d, size); err == nil {
		reason += ", IPv4 too"
	}
	return Capability{Available: true, Reason: reason}
}

// ProbeFibCache loads axon_pod_egress with its IPv4 route cache on
// (cfg_fib_cache = 1, bpf/lib/fib_cache.h), with private maps: it needs the
// bpf_cast_to_kern_ctx kfunc (Linux 6.3+), the kernel's BTF for the CO-RE
// read of the netns' rt_genid, and bpf_redirect_neigh. Where it does not
// load, every packet to another node is looked up in the FIB, as before.
func ProbeFibCache() Capability {
	spec, err := loadPodEgress()
	if err != nil {
		return Capability{Reason: "fib_cache: parse pod_egress object: " + err.Error()}
	}
	for _, m := range spec.Maps {
		m.Pinning = ebpf.PinNone
	}
	if err := spec.Variables["cfg_fib_cache"].Set(uint8(1)); err != nil {
		return Capability{Reason: "fib_cache: " + err.Error()}
	}
	var pp podEgressPrograms
	if err := spec.LoadAndAssign(&pp, nil); err != nil {
		return Capability{Reason: "fib_cache: pod_egress with the route cache does not load " +
			"(needs the bpf_cast_to_kern_ctx kfunc, Linux 6.3+, and kernel BTF); " +
			"routes are looked up per packet: " + err.Error()}
	}
	pp.Close()
	return Capability{Available: true, Reason: "fib_cache: pod_egress loads with the rt_genid-checked IPv4 route cache (probed)"}
}
