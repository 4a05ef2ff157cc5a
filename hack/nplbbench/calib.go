package main

import (
	"encoding/binary"
	"fmt"
	"net"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

// calibration is a bench-only program measured beside the LB in every
// round, on the same packet: not part of any product object.
type calibration struct {
	name, hook string
	prog       *ebpf.Program
	want       uint32 // its return code on the ct_hit packet
}

// calibrationPrograms loads the empty program at both hooks (the test-run
// harness's own cost per run) and the trivial XDP forwarder.
func calibrationPrograms() ([]calibration, error) {
	var out []calibration
	for _, c := range []struct {
		hook string
		typ  ebpf.ProgramType
		ret  int32
	}{{"tc", ebpf.SchedCLS, -1}, {"xdp", ebpf.XDP, xdpPass}} {
		p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "empty_program", Type: c.typ, License: "GPL",
			Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, c.ret), asm.Return()}})
		if err != nil {
			closeAll(out)
			return nil, fmt.Errorf("empty %s program: %w", c.hook, err)
		}
		out = append(out, calibration{name: "empty_program", hook: c.hook, prog: p, want: uint32(c.ret)})
	}
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "xdp_forwarder", Type: ebpf.XDP, License: "GPL",
		Instructions: forwarderInsns(fwdDstMAC, fwdSrcMAC)})
	if err != nil {
		closeAll(out)
		return nil, fmt.Errorf("xdp forwarder program: %w", err)
	}
	return append(out, calibration{name: "xdp_forwarder", hook: "xdp", prog: p, want: xdpTX}), nil
}

func closeAll(cs []calibration) {
	for _, c := range cs {
		c.prog.Close()
	}
}

const (
	xdpPass = 2
	xdpTX   = 3
)

// The forwarder's next hop: node2's MAC (setupNetns) from eth0's.
var (
	fwdDstMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x12}
	fwdSrcMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x11}
)

// forwarderInsns is the least an XDP forwarder of IPv4 does: bounds-check
// the Ethernet and IPv4 headers, check the EtherType, version/IHL and TTL,
// write the next hop's and its own MAC, XDP_TX. Anything else: XDP_PASS.
// No lookup of any kind: the floor an LB's forward is compared to.
func forwarderInsns(dst, src net.HardwareAddr) asm.Instructions {
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
		asm.Mov.Imm(asm.R0, xdpTX),
		asm.Return(),
		asm.Mov.Imm(asm.R0, xdpPass).WithSymbol("pass"),
		asm.Return(),
	}
}
