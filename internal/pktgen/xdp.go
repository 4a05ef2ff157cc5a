package pktgen

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"

	"github.com/axonhq/axon/internal/netnsutil"
)

// xdpSwap is a bench program attached at native XDP in place of the
// device's own program, which restore puts back.
type xdpSwap struct {
	nsName, dev string
	prev        *ebpf.Program // the device's program before, held until restore
}

// swapXDP attaches prog to dev in the named network namespace, in driver
// mode, holding the program it replaces.
func swapXDP(nsName, dev string, prog *ebpf.Program) (*xdpSwap, error) {
	s := &xdpSwap{nsName: nsName, dev: dev}
	if err := netnsutil.Do(nsName, func() error {
		l, err := netlink.LinkByName(dev)
		if err != nil {
			return err
		}
		if x := l.Attrs().Xdp; x != nil && x.Attached && x.ProgId != 0 {
			// Hold the current program: replacing it drops the device's
			// reference, which may be its last.
			if s.prev, err = ebpf.NewProgramFromID(ebpf.ProgramID(x.ProgId)); err != nil {
				return fmt.Errorf("hold %s's XDP program %d to restore it later: %w", dev, x.ProgId, err)
			}
		}
		return netlink.LinkSetXdpFdWithFlags(l, prog.FD(), nl.XDP_FLAGS_DRV_MODE)
	}); err != nil {
		if s.prev != nil {
			s.prev.Close()
		}
		return nil, fmt.Errorf("pktgen: attach %s to %s in %s: %w", prog, dev, nsName, err)
	}
	return s, nil
}

// restore re-attaches the device's previous program, or detaches when it
// had none.
func (s *xdpSwap) restore() error {
	err := netnsutil.Do(s.nsName, func() error {
		l, err := netlink.LinkByName(s.dev)
		if err != nil {
			return err
		}
		fd := -1
		if s.prev != nil {
			fd = s.prev.FD()
		}
		return netlink.LinkSetXdpFdWithFlags(l, fd, nl.XDP_FLAGS_DRV_MODE)
	})
	if err != nil {
		err = fmt.Errorf("pktgen: restore the XDP program of %s in %s: %w", s.dev, s.nsName, err)
	}
	if s.prev != nil {
		err = errors.Join(err, s.prev.Close())
	}
	return err
}

// XDP return codes.
const (
	XDPDrop = 1
	XDPPass = 2
	XDPTX   = 3
)

// ForwarderInstructions is the least an XDP forwarder of IPv4 does:
// bounds-check the Ethernet and IPv4 headers, check the EtherType,
// version/IHL and TTL, write the next hop's (dst) and its own (src) MAC,
// XDP_TX. Anything else: XDP_PASS. No lookup of any kind: the floor a load
// balancer's forward is compared to.
func ForwarderInstructions(dst, src net.HardwareAddr) asm.Instructions {
	ne := binary.NativeEndian // packet bytes as the loads and stores see them
	imm32 := func(b []byte) int64 { return int64(int32(ne.Uint32(b))) }
	imm16 := func(b []byte) int64 { return int64(ne.Uint16(b)) }
	return asm.Instructions{
		asm.LoadMem(asm.R2, asm.R1, 0, asm.Word), // xdp_md.data
		asm.LoadMem(asm.R3, asm.R1, 4, asm.Word), // xdp_md.data_end
		asm.Mov.Reg(asm.R4, asm.R2),
		asm.Add.Imm(asm.R4, 14+20), // Ethernet + IPv4 without options
		asm.JGT.Reg(asm.R4, asm.R3, "pass"),
		asm.LoadMem(asm.R5, asm.R2, 12, asm.Half), // EtherType
		asm.JNE.Imm(asm.R5, int32(ne.Uint16([]byte{0x08, 0x00})), "pass"),
		asm.LoadMem(asm.R5, asm.R2, 14, asm.Byte), // version, IHL
		asm.JNE.Imm(asm.R5, 0x45, "pass"),
		asm.LoadMem(asm.R5, asm.R2, 14+8, asm.Byte), // TTL
		asm.JLE.Imm(asm.R5, 1, "pass"),
		asm.StoreImm(asm.R2, 0, imm32(dst[0:4]), asm.Word),
		asm.StoreImm(asm.R2, 4, imm16(dst[4:6]), asm.Half),
		asm.StoreImm(asm.R2, 6, imm32(src[0:4]), asm.Word),
		asm.StoreImm(asm.R2, 10, imm16(src[4:6]), asm.Half),
		asm.Mov.Imm(asm.R0, XDPTX),
		asm.Return(),
		asm.Mov.Imm(asm.R0, XDPPass).WithSymbol("pass"),
		asm.Return(),
	}
}

// NewForwarder loads ForwarderInstructions as an XDP program.
func NewForwarder(dst, src net.HardwareAddr) (*ebpf.Program, error) {
	if len(dst) != 6 || len(src) != 6 {
		return nil, fmt.Errorf("pktgen: forwarder MACs %v → %v: want two 6-byte Ethernet addresses", src, dst)
	}
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "xdp_forwarder", Type: ebpf.XDP, License: "GPL",
		Instructions: ForwarderInstructions(dst, src)})
	if err != nil {
		return nil, fmt.Errorf("pktgen: load the XDP forwarder: %w", err)
	}
	return p, nil
}

// Forwarder is the trivial XDP forwarder attached to one device: every IPv4
// frame it receives goes back out of that device to one next hop.
type Forwarder struct {
	prog *ebpf.Program
	swap *xdpSwap
}

// AttachForwarder attaches a forwarder that sends IPv4 frames back out of
// dev with dst as their destination and src as their source MAC, in driver
// mode, in place of dev's own XDP program until Close.
func AttachForwarder(nsName, dev string, dst, src net.HardwareAddr) (*Forwarder, error) {
	prog, err := NewForwarder(dst, src)
	if err != nil {
		return nil, err
	}
	swap, err := swapXDP(nsName, dev, prog)
	if err != nil {
		prog.Close()
		return nil, err
	}
	return &Forwarder{prog: prog, swap: swap}, nil
}

// Close detaches the forwarder and re-attaches the device's previous program.
func (f *Forwarder) Close() error {
	return errors.Join(f.swap.restore(), f.prog.Close())
}
