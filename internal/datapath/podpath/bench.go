package podpath

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
// "uplink_ingress"). pkt should carry TTL / hop limit 255 (benchProgram).
// The packet's fate depends on the maps and the FIB of the calling thread's
// netns. Needs bpf host routing.
func (d *Datapath) BenchmarkPrograms(pkt []byte, ifindex, repeat int) (map[string]time.Duration, error) {
	if d.podProg == nil || d.upProg == nil {
		return nil, errors.New("benchmark: programs not loaded (host routing is legacy)")
	}
	out := make(map[string]time.Duration, 2)
	for name, p := range map[string]*ebpf.Program{"pod_egress": d.podProg, "uplink_ingress": d.upProg} {
		dur, _, err := benchProgram(p, pkt, ifindex, repeat)
		if err != nil {
			return nil, fmt.Errorf("benchmark %s: %w", name, err)
		}
		out[name] = dur
	}
	return out, nil
}

// maxRunsPerCall bounds the repetitions of one BPF_PROG_TEST_RUN call. The
// programs decrement the TTL / hop limit of what they forward, and the kernel
// runs every repetition of a call on the same skb: a TTL-64 packet took the
// TTL-expired path from its 64th run on, which is what a single call of
// b.N runs measured. Each call starts from a fresh copy of pkt, so with pkt's
// TTL at 255 every run of a call up to this bound takes the path measured.
const maxRunsPerCall = 250

// benchProgram runs p repeat times on pkt (TTL / hop limit 255), in calls of
// at most maxRunsPerCall, and returns the mean wall time per run, which
// includes each call's syscall and skb setup spread over its runs, and the
// verdict of the last run.
func benchProgram(p *ebpf.Program, pkt []byte, ifindex, repeat int) (time.Duration, uint32, error) {
	if repeat < 1 {
		repeat = 1
	}
	opts := &ebpf.RunOptions{Data: pkt}
	if ifindex > 0 {
		// prefix of struct __sk_buff up to ifindex (offset 40)
		ctx := make([]byte, 44)
		binary.LittleEndian.PutUint32(ctx[40:], uint32(ifindex))
		opts.Context = ctx
	}
	var ret uint32
	start := time.Now()
	for left := repeat; left > 0; left -= maxRunsPerCall {
		opts.Repeat = uint32(min(left, maxRunsPerCall))
		var err error
		if ret, err = p.Run(opts); err != nil {
			return 0, 0, err
		}
	}
	return time.Since(start) / time.Duration(repeat), ret, nil
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
