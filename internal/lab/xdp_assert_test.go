package lab_test

// What the XDP variants of the north-south tests must see before their
// traffic counts as "at XDP": the kernel's veth driver runs XDP natively
// (probed on a scratch veth pair; the only reason to skip), every node's
// uplink carries axon_lb_xdp in driver mode (read from netlink, not from
// the agent's description of itself), and the XDP row of the LB's counters
// moved during the test (the packets went through the program, not
// around it).

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/lab"
	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/testutil"
)

// vethNativeXDP reports whether this kernel's veth driver takes an XDP
// program in driver mode, by attaching an XDP_PASS program to one end of
// a veth pair in a scratch namespace; "" when it does, else why not.
func vethNativeXDP(t *testing.T) string {
	t.Helper()
	ns := testutil.NewNetns(t, "axt-xdpprobe-")
	var why string
	err := netnsutil.Do(ns, func() error {
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "xp0"}, PeerName: "xp1"}
		if err := netlink.LinkAdd(veth); err != nil {
			return fmt.Errorf("add veth pair: %w", err)
		}
		for _, n := range []string{"xp0", "xp1"} {
			l, err := netlink.LinkByName(n)
			if err != nil {
				return err
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
		}
		dev, err := netlink.LinkByName("xp0")
		if err != nil {
			return err
		}
		prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.XDP, License: "GPL",
			Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2 /* XDP_PASS */), asm.Return()}})
		if err != nil {
			return fmt.Errorf("load an XDP_PASS program: %w", err)
		}
		defer prog.Close()
		l, err := link.AttachXDP(link.XDPOptions{Program: prog, Interface: dev.Attrs().Index, Flags: link.XDPDriverMode})
		if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL) {
			why = fmt.Sprintf("the veth driver of kernel %s refuses XDP in driver mode: %v", kernelRelease(), err)
			return nil
		}
		if err != nil {
			return fmt.Errorf("attach XDP in driver mode to a veth: %w", err)
		}
		return l.Close()
	})
	if err != nil {
		t.Fatalf("probe native XDP on veth: %v", err)
	}
	return why
}

func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "?"
	}
	return unix.ByteSliceToString(u.Release[:])
}

// requireNativeXDP skips when the kernel's veth has no native XDP and
// otherwise fails unless every node's agent says xdp-native and the node's
// uplink (eth0 in the node netns) holds axon_lb_xdp attached in driver mode.
func requireNativeXDP(t *testing.T, l *lab.Lab) {
	t.Helper()
	if why := vethNativeXDP(t); why != "" {
		t.Skipf("no native XDP to test: %s", why)
	}
	np := nodePortLBStatus(t, l)
	for _, n := range l.Nodes() {
		if !strings.HasPrefix(np[n.Name], "xdp-native ") {
			t.Errorf("%s: the kernel's veth runs XDP natively, but the agent's north-south LB is %q: --lb-acceleration best-effort fell back", n.Name, np[n.Name])
		}
		mode, name, err := uplinkXDP(n.Netns, "eth0")
		if err != nil {
			t.Fatalf("%s: %v", n.Name, err)
		}
		if mode != nl.XDP_ATTACHED_DRV || name != "axon_lb_xdp" {
			t.Errorf("%s: eth0 has XDP program %q attached in mode %s, want axon_lb_xdp in driver mode (%s)", n.Name, name, xdpModeName(mode), xdpModeName(nl.XDP_ATTACHED_DRV))
		} else {
			t.Logf("%s: eth0 runs %s in %s mode (netlink)", n.Name, name, xdpModeName(mode))
		}
	}
	if t.Failed() {
		t.FailNow()
	}
}

// uplinkXDP reads ifname's XDP attachment in netns ns from netlink: the
// attach mode (nl.XDP_ATTACHED_*) and the program's name.
func uplinkXDP(ns, ifname string) (mode uint32, name string, err error) {
	err = netnsutil.Do(ns, func() error {
		dev, err := netlink.LinkByName(ifname)
		if err != nil {
			return fmt.Errorf("%s in %s: %w", ifname, ns, err)
		}
		x := dev.Attrs().Xdp
		if x == nil || !x.Attached {
			mode = nl.XDP_ATTACHED_NONE
			return nil
		}
		mode = x.AttachMode
		p, err := ebpf.NewProgramFromID(ebpf.ProgramID(x.ProgId))
		if err != nil {
			return fmt.Errorf("XDP program %d of %s: %w", x.ProgId, ifname, err)
		}
		defer p.Close()
		info, err := p.Info()
		if err != nil {
			return fmt.Errorf("info of XDP program %d: %w", x.ProgId, err)
		}
		name = info.Name
		return nil
	})
	return mode, name, err
}

func xdpModeName(m uint32) string {
	switch m {
	case nl.XDP_ATTACHED_NONE:
		return "none"
	case nl.XDP_ATTACHED_DRV:
		return "driver"
	case nl.XDP_ATTACHED_SKB:
		return "generic (skb)"
	case nl.XDP_ATTACHED_HW:
		return "offload"
	case 4: // XDP_ATTACHED_MULTI
		return "multi"
	}
	return fmt.Sprintf("mode %d", m)
}

// npCounters reads every node's north-south LB counters (npPinnedCounters).
func npCounters(t *testing.T, l *lab.Lab) map[string]map[string]map[string]uint64 {
	t.Helper()
	out := map[string]map[string]map[string]uint64{}
	for _, n := range l.Nodes() {
		out[n.Name] = npPinnedCounters(t, n.PinDir)
	}
	return out
}

// npMoved is after - before of one node's counters of hook, only the
// reasons that moved.
func npMoved(before, after map[string]map[string]uint64, hook string) map[string]uint64 {
	moved := map[string]uint64{}
	for r, v := range after[hook] {
		if d := v - before[hook][r]; d != 0 {
			moved[r] = d
		}
	}
	return moved
}

// requireXDPTranslated fails unless on every node the XDP program itself
// translated packets (ct_new or ct_hit in its row) between before and now.
func requireXDPTranslated(t *testing.T, l *lab.Lab, before map[string]map[string]map[string]uint64) {
	t.Helper()
	for n, after := range npCounters(t, l) {
		moved := npMoved(before[n], after, "xdp")
		keys := slices.Sorted(maps.Keys(moved))
		var parts []string
		for _, k := range keys {
			parts = append(parts, fmt.Sprintf("%s +%d", k, moved[k]))
		}
		if moved["ct_new"]+moved["ct_hit"] == 0 {
			t.Errorf("%s: the XDP program translated nothing (its counters: %v; tc: %v): the traffic went around it", n, parts, npMoved(before[n], after, "tc"))
		} else {
			t.Logf("%s: XDP counters moved: %s", n, strings.Join(parts, ", "))
		}
	}
}
