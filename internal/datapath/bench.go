package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/cilium/ebpf"
)

// BenchmarkPrograms runs each loaded program repeat times on pkt with
// BPF_PROG_TEST_RUN, as if received on device ifindex (0: loopback), and
// returns the mean time per run by program name ("pod_egress",
// "uplink_ingress"). The packet's fate depends on the maps and the FIB of the
// calling thread's netns. Needs bpf host routing.
func (d *Datapath) BenchmarkPrograms(pkt []byte, ifindex, repeat int) (map[string]time.Duration, error) {
	if d.podProg == nil || d.upProg == nil {
		return nil, errors.New("benchmark: programs not loaded (host routing is legacy)")
	}
	out := make(map[string]time.Duration, 2)
	for name, p := range map[string]*ebpf.Program{"pod_egress": d.podProg, "uplink_ingress": d.upProg} {
		dur, err := benchProgram(p, pkt, ifindex, repeat)
		if err != nil {
			return nil, fmt.Errorf("benchmark %s: %w", name, err)
		}
		out[name] = dur
	}
	return out, nil
}

func benchProgram(p *ebpf.Program, pkt []byte, ifindex, repeat int) (time.Duration, error) {
	if repeat < 1 {
		repeat = 1
	}
	opts := &ebpf.RunOptions{Data: pkt, Repeat: uint32(repeat)}
	if ifindex > 0 {
		// prefix of struct __sk_buff up to ifindex (offset 40)
		ctx := make([]byte, 44)
		binary.LittleEndian.PutUint32(ctx[40:], uint32(ifindex))
		opts.Context = ctx
	}
	// Run does not return the kernel's per-run time: measure the whole call,
	// the syscall cost is spread over repeat runs.
	start := time.Now()
	if _, err := p.Run(opts); err != nil {
		return 0, err
	}
	return time.Since(start) / time.Duration(repeat), nil
}

// VerifiedInstructions reports, per loaded program, how many instructions
// the verifier processed (the kernel-matrix verifier report). Empty with
// legacy host routing.
func (d *Datapath) VerifiedInstructions() (map[string]uint32, error) {
	out := map[string]uint32{}
	for name, p := range map[string]*ebpf.Program{"pod_egress": d.podProg, "uplink_ingress": d.upProg} {
		if p == nil {
			continue
		}
		info, err := p.Info()
		if err != nil {
			return nil, fmt.Errorf("program info %s: %w", name, err)
		}
		n, ok := info.VerifiedInstructions()
		if !ok {
			return nil, fmt.Errorf("program %s: verified instruction count not reported by this kernel", name)
		}
		out[name] = n
	}
	return out, nil
}
