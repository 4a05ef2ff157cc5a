package dptest

import (
	"encoding/binary"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Running tc programs with BPF_PROG_TEST_RUN and a __sk_buff context.

// Verdicts of tc programs (TC_ACT_*).
const (
	TCActOK       = 0
	TCActShot     = 2
	TCActRedirect = 7
)

// Offsets in struct __sk_buff (UAPI, checked against <linux/bpf.h>).
const (
	SKBOffIfindex = 40
	SKBOffTstamp  = 152
	SKBOffWireLen = 160
	SKBOffGSOSegs = 164
	SKBOffGSOSize = 176
	SKBCtxLen     = 184 // up to hwtstamp: tstamp_type must stay 0 in ctx_in
)

// SKBFields are the __sk_buff fields the tests give PROG_TEST_RUN; zero
// leaves the kernel's default.
type SKBFields struct {
	Ifindex          int    // the device the packet arrived on
	Tstamp           uint64 // skb->tstamp
	WireLen          uint32 // 0: the frame's length
	GSOSize, GSOSegs uint32 // GSOSize set: a GSO skb (skb_is_gso), as BIG TCP sends it
}

// Ctx is the __sk_buff for PROG_TEST_RUN's context.
func (f SKBFields) Ctx() []byte {
	b := make([]byte, SKBCtxLen)
	binary.LittleEndian.PutUint32(b[SKBOffIfindex:], uint32(f.Ifindex))
	binary.LittleEndian.PutUint64(b[SKBOffTstamp:], f.Tstamp)
	binary.LittleEndian.PutUint32(b[SKBOffWireLen:], f.WireLen)
	binary.LittleEndian.PutUint32(b[SKBOffGSOSegs:], f.GSOSegs)
	binary.LittleEndian.PutUint32(b[SKBOffGSOSize:], f.GSOSize)
	return b
}

// EDTRun is one PROG_TEST_RUN of a tc program: its verdict, the
// skb->tstamp it left and the frame.
type EDTRun struct {
	Verdict       uint32
	Tstamp        uint64
	Out           []byte
	Before, After uint64 // CLOCK_MONOTONIC just before and after the run
}

// DepartsAfter: the packet left one booking of d after prev, or, when that
// moment had already passed while the program ran (a slow or descheduled
// CPU, e.g. QEMU TCG), at the program's "now". EDT stamps max(now, link free).
func (r EDTRun) DepartsAfter(prev, d uint64) bool {
	want := prev + d
	if want >= r.After {
		return r.Tstamp == want
	}
	return r.Tstamp >= max(want, r.Before) && r.Tstamp <= r.After
}

// RunEDT runs prog on pkt with skb->tstamp and wire_len set.
func RunEDT(t testing.TB, prog *ebpf.Program, pkt []byte, tstamp uint64, wireLen uint32) EDTRun {
	t.Helper()
	return RunEDTCtx(t, prog, pkt, SKBFields{Tstamp: tstamp, WireLen: wireLen}.Ctx())
}

// RunEDTCtx is RunEDT with a caller-built context (SKBFields.Ctx).
func RunEDTCtx(t testing.TB, prog *ebpf.Program, pkt, ctx []byte) EDTRun {
	t.Helper()
	ctxOut := make([]byte, 192) // sizeof(struct __sk_buff)
	out := make([]byte, len(pkt)+256)
	opts := ebpf.RunOptions{Data: pkt, DataOut: out, Context: ctx, ContextOut: ctxOut}
	before := MonoNow(t)
	ret, err := prog.Run(&opts)
	after := MonoNow(t)
	if err != nil {
		t.Fatalf("PROG_TEST_RUN: %v", err)
	}
	return EDTRun{Verdict: ret, Tstamp: binary.LittleEndian.Uint64(ctxOut[SKBOffTstamp:]), Out: opts.DataOut, Before: before, After: after}
}

// MonoNow is CLOCK_MONOTONIC in ns.
func MonoNow(t testing.TB) uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.Fatal(err)
	}
	return uint64(ts.Nano())
}
