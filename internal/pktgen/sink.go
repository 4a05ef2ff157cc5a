package pktgen

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

// Sink counts and drops, at native XDP on one device, the IPv4 UDP packets
// (no IP options) to one destination port, and passes everything else. It
// replaces the device's XDP program while attached; Close puts that program
// back.
type Sink struct {
	prog   *ebpf.Program
	counts *ebpf.Map // PERCPU_ARRAY[1] of u64: packets counted and dropped
	swap   *xdpSwap  // the device's program before, restored by Close
}

// AttachSink attaches a sink for UDP port to dev in the named network
// namespace, in driver mode. On a veth this also gives dev a NAPI receive
// ring, which its peer's XDP_TX, XDP redirects and (without TSO on the peer)
// plain transmits fill.
func AttachSink(nsName, dev string, port uint16) (*Sink, error) {
	counts, err := ebpf.NewMap(&ebpf.MapSpec{Name: "pktgen_sink", Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: 8, MaxEntries: 1})
	if err != nil {
		return nil, fmt.Errorf("pktgen: sink counter map: %w", err)
	}
	be := int32(port>>8 | port<<8) // the port as a little-endian load of its network-order bytes reads it
	insns := asm.Instructions{
		asm.LoadMem(asm.R2, asm.R1, 0, asm.Word), // data
		asm.LoadMem(asm.R3, asm.R1, 4, asm.Word), // data_end
		asm.Mov.Reg(asm.R4, asm.R2),
		asm.Add.Imm(asm.R4, HeaderLen),
		asm.JGT.Reg(asm.R4, asm.R3, "pass"),
		asm.LoadMem(asm.R5, asm.R2, 12, asm.Half), // ethertype
		asm.JNE.Imm(asm.R5, 0x0008, "pass"),       // htons(ETH_P_IP)
		asm.LoadMem(asm.R5, asm.R2, 14, asm.Byte), // version, IHL
		asm.JNE.Imm(asm.R5, 0x45, "pass"),
		asm.LoadMem(asm.R5, asm.R2, 23, asm.Byte), // protocol
		asm.JNE.Imm(asm.R5, 17, "pass"),
		asm.LoadMem(asm.R5, asm.R2, 36, asm.Half), // UDP destination port
		asm.JNE.Imm(asm.R5, be, "pass"),
	}
	insns = append(insns, lookupZero(counts, "drop")...)
	insns = append(insns,
		asm.LoadMem(asm.R1, asm.R0, 0, asm.DWord), // per-CPU slot: no atomics needed
		asm.Add.Imm(asm.R1, 1),
		asm.StoreMem(asm.R0, 0, asm.R1, asm.DWord),
		asm.Mov.Imm(asm.R0, XDPDrop).WithSymbol("drop"),
		asm.Return(),
		asm.Mov.Imm(asm.R0, XDPPass).WithSymbol("pass"),
		asm.Return(),
	)
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "pktgen_sink", Type: ebpf.XDP, License: "GPL", Instructions: insns})
	if err != nil {
		counts.Close()
		return nil, fmt.Errorf("pktgen: load the sink program: %w", err)
	}
	swap, err := swapXDP(nsName, dev, prog)
	if err != nil {
		prog.Close()
		counts.Close()
		return nil, err
	}
	return &Sink{prog: prog, counts: counts, swap: swap}, nil
}

// Count is the number of packets counted and dropped so far.
func (s *Sink) Count() (uint64, error) {
	var per []uint64
	if err := s.counts.Lookup(uint32(0), &per); err != nil {
		return 0, fmt.Errorf("pktgen: read the sink counter: %w", err)
	}
	var n uint64
	for _, v := range per {
		n += v
	}
	return n, nil
}

// Close detaches the sink and re-attaches the device's previous program,
// if it had one.
func (s *Sink) Close() error {
	return errors.Join(s.swap.restore(), s.prog.Close(), s.counts.Close())
}
