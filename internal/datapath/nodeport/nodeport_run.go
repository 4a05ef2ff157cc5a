package nodeport

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Hooks of TestRun.
const (
	HookTC     = "tc"     // tc ingress program
	HookXDP    = "xdp"    // XDP program
	HookEgress = "egress" // tc egress program
	HookDecap  = "decap"  // tc program of a DSR backend without an ipip device (axon_lb_decap)
)

// npTestRunAttr is the BPF_PROG_TEST_RUN part of union bpf_attr.
type npTestRunAttr struct {
	progFD      uint32
	retval      uint32
	dataSizeIn  uint32
	dataSizeOut uint32
	dataIn      uint64
	dataOut     uint64
	repeat      uint32
	duration    uint32
	ctxSizeIn   uint32
	ctxSizeOut  uint32
	ctxIn       uint64
	ctxOut      uint64
	flags       uint32
	cpu         uint32
	batchSize   uint32
	_           uint32
}

// TestRun runs one packet through a loaded LB program with
// BPF_PROG_TEST_RUN, as received on ifindex (0: loopback), in the calling
// thread's netns (the FIB used for SNAT/DSR/reverse paths). It returns the
// program's return code and the kernel's measurement of the run alone
// (without the syscall): the LB rewrites packets in place, so benchmarks
// time single runs of fresh packets rather than repeat counts. The maps
// are the live ones: a translated packet creates real flows.
func (n *LB) TestRun(hook string, pkt []byte, ifindex int) (uint32, time.Duration, error) {
	return n.TestRunProgram(n.Program(hook), hook, pkt, ifindex)
}

// Program is the loaded program of hook (HookTC: axon_lb_ingress,
// HookEgress: axon_lb_egress, HookDecap: axon_lb_decap, HookXDP:
// axon_lb_xdp, loaded now if it was not yet), for tests and tools (the
// fuzzer, internal/datapath/fuzz); nil for another hook, or when the XDP
// program does not load (XDPProgram says why).
func (n *LB) Program(hook string) *ebpf.Program {
	switch hook {
	case HookTC:
		return n.tc.AxonLbIngress
	case HookEgress:
		return n.tc.AxonLbEgress
	case HookDecap:
		return n.tc.AxonLbDecap
	case HookXDP:
		p, err := n.XDPProgram()
		if err != nil {
			n.log.Warn("nodeport LB: XDP program", "error", err)
		}
		return p
	}
	return nil
}

// TestRunProgram is TestRun for any tc (hook tc/egress) or XDP (hook xdp)
// program, e.g. an empty one to calibrate benchmarks.
func (n *LB) TestRunProgram(p *ebpf.Program, hook string, pkt []byte, ifindex int) (uint32, time.Duration, error) {
	var fd int
	var ctx []byte
	if p == nil {
		return 0, 0, fmt.Errorf("test run: unknown hook %q (tc, xdp, egress, decap)", hook)
	}
	switch hook {
	case HookTC, HookEgress, HookDecap:
		fd = p.FD()
		if ifindex > 0 {
			ctx = make([]byte, 44) // struct __sk_buff up to ifindex
			binary.LittleEndian.PutUint32(ctx[40:], uint32(ifindex))
		}
	case HookXDP:
		fd = p.FD()
		if ifindex > 0 {
			ctx = make([]byte, 24) // struct xdp_md
			binary.LittleEndian.PutUint32(ctx[4:], uint32(len(pkt)))
			binary.LittleEndian.PutUint32(ctx[12:], uint32(ifindex))
		}
	default:
		return 0, 0, fmt.Errorf("test run: unknown hook %q (tc, xdp, egress, decap)", hook)
	}
	if len(pkt) == 0 {
		return 0, 0, errors.New("test run: empty packet")
	}
	in := append([]byte(nil), pkt...)
	out := make([]byte, len(pkt)+256)
	attr := npTestRunAttr{
		progFD: uint32(fd), dataSizeIn: uint32(len(in)), dataSizeOut: uint32(len(out)),
		dataIn: uint64(uintptr(unsafe.Pointer(&in[0]))), dataOut: uint64(uintptr(unsafe.Pointer(&out[0]))),
		repeat: 1,
	}
	if ctx != nil {
		attr.ctxSizeIn = uint32(len(ctx))
		attr.ctxIn = uint64(uintptr(unsafe.Pointer(&ctx[0])))
	}
	_, _, errno := unix.Syscall(unix.SYS_BPF, unix.BPF_PROG_TEST_RUN, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
	runtime.KeepAlive(in)
	runtime.KeepAlive(out)
	runtime.KeepAlive(ctx)
	if errno != 0 {
		return 0, 0, fmt.Errorf("test run %s: %w", hook, errno)
	}
	return attr.retval, time.Duration(attr.duration), nil
}

// Packet builds an ethernet frame of flow t with valid checksums: a TCP
// segment (SYN when syn, else ACK) or a UDP datagram with 8 bytes of
// payload. For tools (benchmarks, explain debugging).
func Packet(t Tuple, syn bool) []byte {
	if syn {
		return npPacket(t, npSYN)
	}
	return npPacket(t, npACK)
}
