package main

import (
	"fmt"
	"net"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/axonhq/axon/internal/pktgen"
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
	p, err := pktgen.NewForwarder(fwdDstMAC, fwdSrcMAC)
	if err != nil {
		closeAll(out)
		return nil, err
	}
	return append(out, calibration{name: "xdp_forwarder", hook: "xdp", prog: p, want: xdpTX}), nil
}

func closeAll(cs []calibration) {
	for _, c := range cs {
		c.prog.Close()
	}
}

const (
	xdpPass = pktgen.XDPPass
	xdpTX   = pktgen.XDPTX
)

// The forwarder's next hop: node2's MAC (setupNetns) from eth0's.
var (
	fwdDstMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x12}
	fwdSrcMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x11}
)
