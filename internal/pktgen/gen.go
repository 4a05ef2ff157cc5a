package pktgen

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/netnsutil"
)

// Generator sends copies of template frames out of one device (see the
// package comment). Close releases its program and map.
type Generator struct {
	nsName string
	dev    string
	prog   *ebpf.Program
	tmpl   *ebpf.Map // ARRAY[1]: the frames' headers, one of which is written into every frame
	flows  *ebpf.Map // ARRAY[1] of u32: how many frames tmpl holds
}

// Result is what one Run sent.
type Result struct {
	// Sent counts frames handed to the device: the offered load. A frame
	// the peer's full receive ring refused is counted too (the peer counts
	// it as dropped, as a NIC counts a missed frame).
	Sent    uint64
	Elapsed time.Duration
}

// PPS is Sent per second.
func (r Result) PPS() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Sent) / r.Elapsed.Seconds()
}

// srcPortOff is the offset of an IPv4 frame's L4 source port.
const srcPortOff = 14 + 20

// MaxFlows is how many different frames one Run can send.
const MaxFlows = 16

// tmplStride is the space of one frame's headers in the template map.
const tmplStride = 48

// Option changes what a Generator writes into its frames.
type Option func(*genConfig)

type genConfig struct{ randomSrcPort bool }

// RandomSourcePort: every frame gets a random source port (bytes 34-35,
// the UDP or TCP source port of an IPv4 frame), so a run offers up to
// 65 536 different flows per template: a flood of new flows (e.g. TCP SYNs,
// TCP4SYN). The L4 checksum is left as in the template, so it is wrong for
// every port but the template's: a receiving stack drops such frames, the
// way an unanswered spoofed flood looks to a load balancer in front of it.
func RandomSourcePort() Option { return func(c *genConfig) { c.randomSrcPort = true } }

// NewGenerator loads a generator that sends out of dev in the named network
// namespace (/run/netns/<nsName>, as `ip netns` names it). dev must be a
// device whose transmit path takes XDP frames (ndo_xdp_xmit): a veth does
// when its peer has a NAPI ring (an XDP program or GRO on the peer).
func NewGenerator(nsName, dev string, opts ...Option) (*Generator, error) {
	var cfg genConfig
	for _, o := range opts {
		o(&cfg)
	}
	var ifindex int
	if err := netnsutil.Do(nsName, func() error {
		l, err := netlink.LinkByName(dev)
		if err != nil {
			return err
		}
		ifindex = l.Attrs().Index
		return nil
	}); err != nil {
		return nil, fmt.Errorf("pktgen: find %s in %s: %w", dev, nsName, err)
	}
	// tmpl[0] holds the headers of up to MaxFlows frames, tmplStride bytes
	// apart; flows[0] how many (a power of two).
	tmpl, err := ebpf.NewMap(&ebpf.MapSpec{Name: "pktgen_tmpl", Type: ebpf.Array, KeySize: 4, ValueSize: MaxFlows * tmplStride, MaxEntries: 1})
	if err != nil {
		return nil, fmt.Errorf("pktgen: template map: %w", err)
	}
	flows, err := ebpf.NewMap(&ebpf.MapSpec{Name: "pktgen_flows", Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		tmpl.Close()
		return nil, fmt.Errorf("pktgen: flow count map: %w", err)
	}
	// r6 = data (checked to hold HeaderLen bytes); r8 = flows - 1;
	// r7 = &tmpl[0][(prandom & r8) * tmplStride]; copy HeaderLen bytes from
	// r7 to r6; return bpf_redirect(ifindex, 0).
	insns := asm.Instructions{
		asm.LoadMem(asm.R6, asm.R1, 0, asm.Word), // xdp_md->data
		asm.LoadMem(asm.R3, asm.R1, 4, asm.Word), // xdp_md->data_end
		asm.Mov.Reg(asm.R4, asm.R6),
		asm.Add.Imm(asm.R4, HeaderLen),
		asm.JGT.Reg(asm.R4, asm.R3, "drop"),
	}
	insns = append(insns, lookupZero(flows, "drop")...)
	insns = append(insns, asm.LoadMem(asm.R8, asm.R0, 0, asm.Word), asm.Add.Imm(asm.R8, -1))
	insns = append(insns, lookupZero(tmpl, "drop")...)
	insns = append(insns,
		asm.Mov.Reg(asm.R7, asm.R0),
		asm.FnGetPrandomU32.Call(),
		asm.And.Reg(asm.R0, asm.R8),
		asm.And.Imm(asm.R0, MaxFlows-1), // bound for the verifier
		asm.Mul.Imm(asm.R0, tmplStride),
		asm.Add.Reg(asm.R7, asm.R0),
	)
	for off := int16(0); off+8 <= HeaderLen; off += 8 {
		insns = append(insns, asm.LoadMem(asm.R1, asm.R7, off, asm.DWord), asm.StoreMem(asm.R6, off, asm.R1, asm.DWord))
	}
	insns = append(insns,
		asm.LoadMem(asm.R1, asm.R7, HeaderLen-2, asm.Half), asm.StoreMem(asm.R6, HeaderLen-2, asm.R1, asm.Half))
	if cfg.randomSrcPort {
		// r6 (data, HeaderLen bytes checked) survives the call
		insns = append(insns, asm.FnGetPrandomU32.Call(), asm.StoreMem(asm.R6, srcPortOff, asm.R0, asm.Half))
	}
	insns = append(insns,
		asm.Mov.Imm(asm.R1, int32(ifindex)),
		asm.Mov.Imm(asm.R2, 0),
		asm.FnRedirect.Call(),
		asm.Return(),
		asm.Mov.Imm(asm.R0, 1).WithSymbol("drop"), // XDP_DROP
		asm.Return(),
	)
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "pktgen_gen", Type: ebpf.XDP, License: "GPL", Instructions: insns})
	if err != nil {
		tmpl.Close()
		flows.Close()
		return nil, fmt.Errorf("pktgen: load the generator program: %w", err)
	}
	return &Generator{nsName: nsName, dev: dev, prog: prog, tmpl: tmpl, flows: flows}, nil
}

// Close releases the generator.
func (g *Generator) Close() error {
	return errors.Join(g.prog.Close(), g.tmpl.Close(), g.flows.Close())
}

// callTime is about how long one BPF_PROG_RUN call runs. Every call sets up
// and tears down a page pool, which costs ~20 ms of wall time (not CPU) in
// which nothing is sent; long calls keep the stream steady.
const callTime = time.Second

// Run sends frames out of the device for about d, from one OS thread in the
// device's namespace pinned to cpu (cpu < 0: not pinned). Every frame sent
// is one of frames, picked at random: their number must be a power of two
// up to MaxFlows, and they may differ only in their first HeaderLen bytes
// (the headers the program rewrites; e.g. UDP4 frames of different ports).
func (g *Generator) Run(ctx context.Context, frames [][]byte, d time.Duration, cpu int) (Result, error) {
	n := len(frames)
	if n == 0 || n > MaxFlows || n&(n-1) != 0 {
		return Result{}, fmt.Errorf("pktgen: %d frames: want a power of two from 1 to %d", n, MaxFlows)
	}
	v := make([]byte, MaxFlows*tmplStride)
	for i, f := range frames {
		if len(f) < HeaderLen {
			return Result{}, fmt.Errorf("pktgen: frame %d is %d bytes, shorter than its %d header bytes", i, len(f), HeaderLen)
		}
		if !bytes.Equal(f[HeaderLen:], frames[0][HeaderLen:]) {
			return Result{}, fmt.Errorf("pktgen: frame %d differs from frame 0 after its headers: only headers are rewritten per frame", i)
		}
		copy(v[i*tmplStride:], f[:HeaderLen])
	}
	if err := g.tmpl.Put(uint32(0), v); err != nil {
		return Result{}, fmt.Errorf("pktgen: write the templates: %w", err)
	}
	if err := g.flows.Put(uint32(0), uint32(n)); err != nil {
		return Result{}, fmt.Errorf("pktgen: write the flow count: %w", err)
	}
	type out struct {
		r   Result
		err error
	}
	done := make(chan out, 1)
	go func() {
		// Never unlocked: this thread changes namespace and affinity, and
		// dies with the goroutine instead of going back to the scheduler.
		runtime.LockOSThread()
		r, err := g.run(ctx, frames, d, cpu)
		done <- out{r, err}
	}()
	o := <-done
	return o.r, o.err
}

func (g *Generator) run(ctx context.Context, frames [][]byte, d time.Duration, cpu int) (Result, error) {
	h, err := netns.GetFromName(g.nsName)
	if err != nil {
		return Result{}, fmt.Errorf("pktgen: open %s: %w", g.nsName, err)
	}
	defer h.Close()
	if err := netns.Set(h); err != nil {
		return Result{}, fmt.Errorf("pktgen: enter %s: %w", g.nsName, err)
	}
	if cpu >= 0 {
		var set unix.CPUSet
		set.Set(cpu)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			return Result{}, fmt.Errorf("pktgen: pin the generator to CPU %d: %w", cpu, err)
		}
	}
	var res Result
	repeat := uint32(1 << 14)
	t0 := time.Now()
	for {
		left := d - time.Since(t0)
		if left <= 0 {
			break
		}
		if err := ctx.Err(); err != nil {
			res.Elapsed = time.Since(t0)
			return res, err
		}
		c0 := time.Now()
		if _, err := g.prog.Run(&ebpf.RunOptions{Data: frames[0], Repeat: repeat, Flags: unix.BPF_F_TEST_XDP_LIVE_FRAMES}); err != nil {
			return res, fmt.Errorf("pktgen: BPF_PROG_RUN in live-frame mode out of %s (needs Linux ≥ 5.18, and a peer with a NAPI ring: an XDP program or GRO on it): %w", g.dev, err)
		}
		res.Sent += uint64(repeat)
		// Size the next call to about callTime, without running past d.
		took := time.Since(c0)
		want := min(callTime, left-took)
		if took > 0 && want > 0 {
			next := float64(repeat) * float64(want) / float64(took)
			repeat = uint32(max(1<<10, min(next, 1<<24)))
		}
	}
	res.Elapsed = time.Since(t0)
	return res, nil
}

// lookupZero is r0 = &m[0], jumping to miss when the lookup fails (it
// clobbers r1-r5 and the stack word at r10-4).
func lookupZero(m *ebpf.Map, miss string) asm.Instructions {
	return asm.Instructions{
		asm.StoreImm(asm.R10, -4, 0, asm.Word),
		asm.Mov.Reg(asm.R2, asm.R10),
		asm.Add.Imm(asm.R2, -4),
		asm.LoadMapPtr(asm.R1, m.FD()),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, miss),
	}
}
