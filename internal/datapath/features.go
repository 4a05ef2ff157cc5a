package datapath

import (
	"errors"
	"fmt"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
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
	SockDestroy   Capability // bpf_sock_destroy kfunc from tcp/udp socket iterators (the socket LB closes sockets to removed backends)
	FibCache      Capability // pod_egress loads with the rt_genid-checked IPv4 route cache
	SpliceGuard   Capability // the same-node TCP bypass's splice guard (fmod_ret on security_file_permission) loads and attaches
}

// A featureProbe is one row of the probe table: how one kernel feature is
// found and what axon does without it (the reason when absent).
type featureProbe struct {
	name  string                      // as listed by Features.List and `axon features`
	field func(*Features) *Capability // where Probe stores the result
	// run finds the feature: nil error means present, note is added to the
	// present reason. Device probes (netns) get a handle on a throwaway
	// network namespace and run there; the others get nil.
	run   func(h *netlink.Handle) (note string, err error)
	netns bool
	needs string // a feature that must be present for this one; else needsReason
	// present is the reason when found; absent the reason when not, with %v
	// the error run returned (it says what axon does without the feature).
	present, absent, needsReason string
}

// probes is the probe table, in the order Features.List shows the results.
var probes = []featureProbe{
	{name: "tcx", field: func(f *Features) *Capability { return &f.TCX }, netns: true, run: probeTCX,
		present: "tcx: kernel supports tcx links (probed)",
		absent:  "tcx: attach failed (kernel < 6.6?), falling back to clsact/cls_bpf: %v"},
	helperProbe("bpf_redirect_peer", asm.FnRedirectPeer, func(f *Features) *Capability { return &f.RedirectPeer }),
	helperProbe("bpf_redirect_neigh", asm.FnRedirectNeigh, func(f *Features) *Capability { return &f.RedirectNeigh }),
	helperProbe("bpf_fib_lookup", asm.FnFibLookup, func(f *Features) *Capability { return &f.FibLookup }),
	{name: "netkit", field: func(f *Features) *Capability { return &f.Netkit }, netns: true, run: probeNetkit,
		present: "netkit: device created (probed)",
		absent:  "netkit: creating a netkit device failed (CONFIG_NETKIT unset?): %v"},
	{name: "sch_fq", field: func(f *Features) *Capability { return &f.SchFQ }, netns: true, run: probeFQ,
		present: "sch_fq: fq qdisc added (probed)",
		absent:  "sch_fq: adding an fq qdisc failed (module missing?), EDT rate limiting unavailable: %v"},
	{name: "bpffs", field: func(f *Features) *Capability { return &f.BPFFS }, run: probeBPFFS,
		present: "bpffs mounted at " + BPFFSRoot,
		absent:  "%v"},
	{name: "big_tcp", field: func(f *Features) *Capability { return &f.BigTCP }, netns: true, run: probeBigTCP,
		present: "big_tcp: gso_max_size > 64k accepted (probed)",
		absent:  "big_tcp: %v"},
	{name: "bpf_sock_destroy", field: func(f *Features) *Capability { return &f.SockDestroy },
		run:     objectLoads(objectProbe{object: "sockdestroy", tinyMaps: true, iterators: true, verifierLog: true}),
		present: "bpf_sock_destroy: kfunc and tcp/udp socket iterators load (probed)",
		absent: "bpf_sock_destroy: load socket iterators (bpf_sock_destroy needs kernel >= 6.5 with BTF): %v" +
			"; connected sockets keep a removed backend until the application reconnects"},
	{name: "fib_cache", field: func(f *Features) *Capability { return &f.FibCache },
		run:         objectLoads(objectProbe{object: "podegress", set: map[string]uint8{"cfg_fib_cache": 1}}),
		needs:       "bpf_redirect_neigh",
		needsReason: "fib_cache: needs bpf_redirect_neigh, which this kernel lacks",
		present:     "fib_cache: pod_egress loads with the rt_genid-checked IPv4 route cache (probed)",
		absent: "fib_cache: pod_egress with the route cache does not load " +
			"(needs the bpf_cast_to_kern_ctx kfunc, Linux 6.3+, and kernel BTF); " +
			"routes are looked up per packet: %v"},
	{name: "splice_guard", field: func(f *Features) *Capability { return &f.SpliceGuard },
		run:     objectLoads(objectProbe{object: "socksplice", tinyMaps: true, tracing: true, verifierLog: true}),
		present: "splice_guard: fmod_ret on security_file_permission loads and attaches (probed)",
		absent: "splice_guard: the splice guard (fmod_ret on security_file_permission) does not load or attach " +
			"(needs kernel BTF and BPF trampolines, x86_64 or arm64); " +
			"the same-node TCP bypass stays off: without the guard splice(2) from a bypassed socket loses data: %v"},
}

// helperProbe is the row of a helper that axon's tc programs call.
func helperProbe(name string, fn asm.BuiltinFunc, field func(*Features) *Capability) featureProbe {
	return featureProbe{name: name, field: field,
		run: func(*netlink.Handle) (string, error) {
			return "", features.HaveProgramHelper(ebpf.SchedCLS, fn)
		},
		present: name + ": helper accepted by the verifier in a sched_cls program (probed)",
		absent:  name + ": %v"}
}

func (p featureProbe) result(note string, err error) Capability {
	if err != nil {
		return Capability{Reason: fmt.Sprintf(p.absent, err)}
	}
	return Capability{Available: true, Reason: p.present + note}
}

// List returns the probe results in the agent API form, in table order.
func (f Features) List() []api.Feature {
	out := make([]api.Feature, 0, len(probes))
	for _, p := range probes {
		c := *p.field(&f)
		out = append(out, api.Feature{Name: p.name, Available: c.Available, Reason: c.Reason})
	}
	return out
}

// Probe runs every feature probe of the table. It needs root
// (CAP_SYS_ADMIN, CAP_NET_ADMIN).
func Probe() Features {
	var f Features
	byName := map[string]Capability{}
	var device []featureProbe
	for _, p := range probes {
		if p.netns {
			device = append(device, p)
			continue
		}
		c := Capability{Reason: p.needsReason}
		if p.needs == "" || byName[p.needs].Available {
			c = p.result(p.run(nil))
		}
		byName[p.name] = c
		*p.field(&f) = c
	}
	err := inScratchNetns(func(h *netlink.Handle) error {
		for _, p := range device {
			*p.field(&f) = p.result(p.run(h))
		}
		return nil
	})
	if err != nil {
		for _, p := range device {
			*p.field(&f) = Capability{Reason: "scratch netns for device probes: " + err.Error()}
		}
	}
	return f
}

// ProbeTCX probes tcx alone (in a throwaway netns).
func ProbeTCX() Capability { return ProbeFeature("tcx") }

// ProbeNetkit creates (and deletes) a netkit pair in a throwaway netns.
func ProbeNetkit() Capability { return ProbeFeature("netkit") }

// ProbeFeature runs the probe of one feature (a name of Features.List), and
// the one it needs first.
func ProbeFeature(name string) Capability {
	for _, p := range probes {
		if p.name != name {
			continue
		}
		if p.needs != "" && !ProbeFeature(p.needs).Available {
			return Capability{Reason: p.needsReason}
		}
		if !p.netns {
			return p.result(p.run(nil))
		}
		var c Capability
		if err := inScratchNetns(func(h *netlink.Handle) error { c = p.result(p.run(h)); return nil }); err != nil {
			return Capability{Reason: name + ": scratch netns for the probe: " + err.Error()}
		}
		return c
	}
	return Capability{Reason: name + ": no such probe"}
}

// inScratchNetns runs fn on a locked OS thread inside a new, empty network
// namespace that disappears afterwards (ns.TempNetNS, ns.NetNS.Do).
func inScratchNetns(fn func(h *netlink.Handle) error) error {
	scratch, err := ns.TempNetNS()
	if err != nil {
		return fmt.Errorf("create netns: %w", err)
	}
	defer scratch.Close()
	return scratch.Do(func(ns.NetNS) error {
		// NETLINK_ROUTE only: the default set adds xfrm and netfilter
		// sockets, which fail (EPROTONOSUPPORT) where xfrm_user or
		// nfnetlink are not loaded, e.g. a minimal VM.
		h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
		if err != nil {
			return err
		}
		defer h.Close()
		return fn(h)
	})
}

func trivialTCProg() (*ebpf.Program, error) {
	return ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         ebpf.SchedCLS,
		License:      "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
	})
}

// probeTCX attaches a trivial program with tcx to the scratch netns' lo.
func probeTCX(*netlink.Handle) (string, error) {
	prog, err := trivialTCProg()
	if err != nil {
		return "", fmt.Errorf("cannot load a sched_cls program: %w", err)
	}
	defer prog.Close()
	l, err := link.AttachTCX(link.TCXOptions{Interface: 1, Program: prog, Attach: ebpf.AttachTCXIngress})
	if err != nil {
		return "", err
	}
	l.Close()
	return "", nil
}

func probeNetkit(h *netlink.Handle) (string, error) {
	nk := &netlink.Netkit{LinkAttrs: netlink.LinkAttrs{Name: "axprobe-nk0"}, Mode: netlink.NETKIT_MODE_L3}
	nk.SetPeerAttrs(&netlink.LinkAttrs{Name: "axprobe-nk1"})
	if err := h.LinkAdd(nk); err != nil {
		return "", err
	}
	_ = h.LinkDel(nk)
	return "", nil
}

func probeFQ(h *netlink.Handle) (string, error) {
	q := &netlink.Fq{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: 1, Parent: netlink.HANDLE_ROOT, Handle: netlink.MakeHandle(1, 0)}}
	return "", h.QdiscAdd(q)
}

func probeBPFFS(*netlink.Handle) (string, error) {
	ok, err := IsBPFFS(BPFFSRoot)
	if err == nil && !ok {
		err = errors.New("bpffs not mounted at " + BPFFSRoot + " (Load mounts it)")
	}
	return "", err
}

func probeBigTCP(h *netlink.Handle) (string, error) {
	const size = 196608
	d := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "axprobe-v0"}, PeerName: "axprobe-v1"}
	if err := h.LinkAdd(d); err != nil {
		return "", fmt.Errorf("cannot create a veth pair to probe: %w", err)
	}
	defer h.LinkDel(d)
	if err := h.LinkSetGSOMaxSize(d, size); err != nil {
		return "", fmt.Errorf("setting gso_max_size > 64k failed: %w", err)
	}
	l, err := h.LinkByName(d.Name)
	if err != nil {
		return "", err
	}
	if l.Attrs().GSOMaxSize != size {
		return "", fmt.Errorf("gso_max_size reads back %d, not %d", l.Attrs().GSOMaxSize, size)
	}
	if err := h.LinkSetGSOIPv4MaxSize(d, size); err == nil {
		return ", IPv4 too", nil
	}
	return "", nil
}

// objectProbe says how a probe loads one of axon's embedded objects: its
// maps unpinned (tinyMaps: with one entry each), the load-time constants in
// set, and for iterators every program attached as a BPF iterator.
type objectProbe struct {
	object      string // bpf2go stem of the embedded object (Object.Name), e.g. "podegress"
	set         map[string]uint8
	tinyMaps    bool
	iterators   bool
	verifierLog bool // a load error carries the whole verifier log
	// tracing: attach each program of the object as a tracing link
	// (fentry, fexit, fmod_ret: to the function its section names) and
	// detach it at once. A program that refuses nothing with its load-time
	// constants left 0 is safe to attach for a moment.
	tracing bool
}

// objectLoads is the probe that the object of o loads on this kernel.
func objectLoads(o objectProbe) func(*netlink.Handle) (string, error) {
	return func(*netlink.Handle) (string, error) {
		spec, err := objectByName(o.object)
		if err != nil {
			return "", err
		}
		for _, m := range spec.Maps {
			m.Pinning = ebpf.PinNone
			if o.tinyMaps && m.MaxEntries > 0 && m.Type != ebpf.RingBuf { // socket storage has none; a ring buffer needs a page multiple
				m.MaxEntries = 1
			}
		}
		for name, v := range o.set {
			if err := spec.Variables[name].Set(v); err != nil {
				return "", fmt.Errorf("set %s: %w", name, err)
			}
		}
		coll, err := ebpf.NewCollection(spec)
		if err != nil {
			if o.verifierLog {
				err = VerifierDetail(err)
			}
			if o.tracing && errors.Is(err, unix.EPERM) {
				// not a memlock limit (the library's hint): the kernel, or a
				// policy on it, refuses programs on BPF trampolines
				err = fmt.Errorf("the kernel refuses to load a tracing program (EPERM before verification: BPF trampolines are not allowed here): %s",
					strings.ReplaceAll(err.Error(), memlockHint, ""))
			}
			return "", err
		}
		defer coll.Close()
		if o.tracing {
			for name, p := range coll.Programs {
				l, err := link.AttachTracing(link.TracingOptions{Program: p})
				if err != nil {
					return "", fmt.Errorf("attach %s to %s: %w", name, spec.Programs[name].AttachTo, err)
				}
				l.Close()
			}
		}
		if !o.iterators {
			return "", nil
		}
		for name, p := range coll.Programs {
			it, err := link.AttachIter(link.IterOptions{Program: p})
			if err != nil {
				return "", fmt.Errorf("attach iterator %s: %w", name, err)
			}
			it.Close()
		}
		return "", nil
	}
}

// memlockHint is what cilium/ebpf appends to every EPERM of a load; for a
// tracing program refused by the kernel it points the wrong way.
const memlockHint = " (MEMLOCK may be too low, consider rlimit.RemoveMemlock)"
