package fuzz

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Return codes of tc and XDP programs (TC_ACT_*, enum xdp_action).
const (
	TCActUnspec   = 0xffffffff // TC_ACT_UNSPEC (-1): the next program of the chain
	TCActOK       = 0
	TCActShot     = 2
	TCActRedirect = 7
	XDPAborted    = 0
	XDPDrop       = 1
	XDPPass       = 2
	XDPTX         = 3
	XDPRedirect   = 4
)

// Offsets in struct __sk_buff and struct xdp_md (UAPI).
const (
	skbOffIfindex = 40
	skbOffTstamp  = 152
	skbOffGSOSegs = 164
	skbOffGSOSize = 176
	skbCtxLen     = 184 // up to hwtstamp: tstamp_type must stay 0 in ctx_in
	skbCtxOutLen  = 192 // sizeof(struct __sk_buff)
	xdpCtxLen     = 24
)

// gsoSize is the gso_size of runs as a GSO packet (Run.GSO): what a GRO
// aggregate or a BIG TCP packet of a 1500-byte MTU carries.
const gsoSize = 1448

// Run is one BPF_PROG_TEST_RUN of a packet.
type Run struct {
	In, Out       []byte
	GSO           bool // tc: run as a GSO skb (gso_size set), as GRO and BIG TCP hand them over
	Verdict       uint32
	Tstamp        uint64 // skb->tstamp after the run (tc)
	Before, After uint64 // CLOCK_MONOTONIC just before and after the run
}

// Target is one program under test with its rules.
type Target struct {
	Name     string
	XDP      bool // an XDP program (else tc)
	Prog     *ebpf.Program
	Ifindex  int               // the device the packets arrive on
	Verdicts map[uint32]string // the documented return codes and their names
	Seeds    [][]byte
	// Drops: verdicts whose output is not looked at (the packet is gone).
	Drops []uint32
	// Check is a rule of this program for every run (nil: none).
	Check func(r *Run) error
	// Counters reads the program's counters; each must only grow.
	Counters func() (map[string]uint64, error)
	// Invariants checks the maps after every batch.
	Invariants func() error
	// Maintain runs every MaintainEvery batches before Invariants (e.g. the
	// agent's conntrack GC, and the seed flows set up again).
	Maintain      func() error
	MaintainEvery int
	// Setup runs once before the first packet (e.g. flows the replies of
	// the seeds belong to, opened through another program).
	Setup func() error
}

// Config is one fuzzing pass.
type Config struct {
	Packets int    // per target
	Seed    uint64 // the random source (with the target's index as stream)
	Stream  uint64
	Batch   int // packets between map checks (0: 10 000)
}

// Stats is what one pass did.
type Stats struct {
	Target    string
	Packets   int
	Verdicts  map[string]int
	Kinds     map[string]int
	Rewritten int               // packets let through changed
	Refused   int               // frames BPF_PROG_TEST_RUN refused as documented (Refused)
	Counters  map[string]uint64 // how far each counter moved
	Batches   int
	Elapsed   time.Duration
}

// Failure is a broken rule, with what it takes to replay it.
type Failure struct {
	Target string
	Index  int // packet number in the pass (0-based)
	Kind   string
	Seed   uint64
	Stream uint64
	Packet []byte
	GSO    bool // run as a GSO skb
	Err    error
}

func (f *Failure) Error() string {
	if f.Packet == nil {
		return fmt.Sprintf("%s: after packet %d (seed %d): %v", f.Target, f.Index, f.Seed, f.Err)
	}
	gso, spec := "", f.Target+":"+hex.EncodeToString(f.Packet)
	if f.GSO {
		gso, spec = ", as a GSO skb", spec+":gso"
	}
	return fmt.Sprintf("%s: packet %d (%s%s, seed %d) broke a rule: %v\npacket: %s\n"+
		"replay it alone: AXON_FUZZ_REPLAY=%s go test -count=1 -run '^TestFuzzDatapath$' ./internal/datapath/fuzz\n"+
		"replay the pass up to it: AXON_FUZZ_SEED=%d AXON_FUZZ_PACKETS=%d AXON_FUZZ_ONLY=%s go test -count=1 -run '^TestFuzzDatapath$' ./internal/datapath/fuzz",
		f.Target, f.Index, f.Kind, gso, f.Seed, f.Err, hex.EncodeToString(f.Packet),
		spec, f.Seed, f.Index+1, f.Target)
}

func (f *Failure) Unwrap() error { return f.Err }

func monoNow() uint64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return uint64(ts.Nano())
}

// runner runs packets through one program, reusing its buffers.
type runner struct {
	t           *Target
	ctx, ctxOut []byte
	out         []byte
	opts        ebpf.RunOptions
	drop        map[uint32]bool
}

func newRunner(t *Target) *runner {
	r := &runner{t: t, out: make([]byte, 4096), drop: map[uint32]bool{}}
	for _, v := range t.Drops {
		r.drop[v] = true
	}
	if t.XDP {
		r.ctx, r.ctxOut = make([]byte, xdpCtxLen), make([]byte, xdpCtxLen)
		binary.LittleEndian.PutUint32(r.ctx[12:], uint32(t.Ifindex))
	} else {
		r.ctx, r.ctxOut = make([]byte, skbCtxLen), make([]byte, skbCtxOutLen)
		binary.LittleEndian.PutUint32(r.ctx[skbOffIfindex:], uint32(t.Ifindex))
	}
	return r
}

// errRefused: BPF_PROG_TEST_RUN refused the frame, as it documents (see
// refusable); the program did not run.
var errRefused = errors.New("refused by BPF_PROG_TEST_RUN")

// refusable: the one error BPF_PROG_TEST_RUN may return here. For tc
// programs the kernel (6.18) refuses with EINVAL an IPv4 frame shorter than
// an Ethernet and an IPv4 header (34 bytes) and an IPv6 frame shorter than
// an Ethernet and an IPv6 header (54 bytes); XDP takes every frame of at
// least an Ethernet header.
func refusable(xdp bool, pkt []byte, err error) bool {
	if xdp || !errors.Is(err, unix.EINVAL) || len(pkt) < 14 {
		return false
	}
	switch binary.BigEndian.Uint16(pkt[12:]) {
	case EtherIPv4:
		return len(pkt) < 14+20
	case EtherIPv6:
		return len(pkt) < 14+40
	}
	return false
}

// Once runs pkt through the program (a tc program with gso: as a GSO skb)
// and checks the rules of one run.
func (r *runner) once(pkt []byte, gso bool) (*Run, error) {
	gso = gso && !r.t.XDP
	if r.t.XDP {
		binary.LittleEndian.PutUint32(r.ctx[4:], uint32(len(pkt))) // data_end
	} else {
		size, segs := uint32(0), uint32(0)
		if gso {
			size, segs = gsoSize, uint32(max(1, (len(pkt)+gsoSize-1)/gsoSize))
		}
		binary.LittleEndian.PutUint32(r.ctx[skbOffGSOSize:], size)
		binary.LittleEndian.PutUint32(r.ctx[skbOffGSOSegs:], segs)
	}
	r.opts = ebpf.RunOptions{Data: pkt, DataOut: r.out, Context: r.ctx, ContextOut: r.ctxOut}
	run := &Run{In: pkt, GSO: gso, Before: monoNow()}
	v, err := r.t.Prog.Run(&r.opts)
	run.After = monoNow()
	if err != nil {
		if refusable(r.t.XDP, pkt, err) {
			return run, errRefused
		}
		return run, fmt.Errorf("BPF_PROG_TEST_RUN failed: %w", err)
	}
	run.Verdict, run.Out = v, r.opts.DataOut
	if !r.t.XDP {
		run.Tstamp = binary.LittleEndian.Uint64(r.ctxOut[skbOffTstamp:])
	}
	if _, ok := r.t.Verdicts[v]; !ok {
		return run, fmt.Errorf("returned %d (%#x), not one of the documented verdicts %s", int32(v), v, verdictList(r.t.Verdicts))
	}
	if !r.drop[v] {
		if err := CheckRewrite(pkt, run.Out, gso); err != nil {
			return run, fmt.Errorf("verdict %s: %w\noutput: %s", r.t.Verdicts[v], err, hex.EncodeToString(run.Out))
		}
	}
	if r.t.Check != nil {
		if err := r.t.Check(run); err != nil {
			return run, fmt.Errorf("verdict %s: %w", r.t.Verdicts[v], err)
		}
	}
	return run, nil
}

func verdictList(v map[uint32]string) string {
	var s []string
	for _, k := range slices.Sorted(maps.Keys(v)) {
		s = append(s, fmt.Sprintf("%s=%d", v[k], int32(k)))
	}
	return strings.Join(s, " ")
}

// RunOne runs one packet through t with all per-packet rules (a replay).
func RunOne(t *Target, pkt []byte, gso bool) (*Run, error) {
	return newRunner(t).once(pkt, gso)
}

// Execute runs cfg.Packets generated packets through t in the calling
// thread's network namespace (the FIB the programs look up), checking the
// per-packet rules on every run and the counters and maps after every
// batch. It stops at the first broken rule (*Failure).
func Execute(t *Target, cfg Config) (*Stats, error) {
	if cfg.Batch <= 0 {
		cfg.Batch = 10000
	}
	st := &Stats{Target: t.Name, Verdicts: map[string]int{}, Kinds: map[string]int{}, Counters: map[string]uint64{}}
	start := time.Now()
	defer func() { st.Elapsed = time.Since(start) }()
	r := newRunner(t)
	m := NewMutator(t.Seeds, cfg.Seed, cfg.Stream)
	fail := func(i int, kind string, pkt []byte, gso bool, err error) error {
		return &Failure{Target: t.Name, Index: i, Kind: kind, Seed: cfg.Seed, Stream: cfg.Stream, Packet: pkt, GSO: gso, Err: err}
	}
	if t.Setup != nil {
		if err := t.Setup(); err != nil {
			return st, &Failure{Target: t.Name, Seed: cfg.Seed, Stream: cfg.Stream, Err: fmt.Errorf("setup: %w", err)}
		}
	}
	first, err := readCounters(t)
	if err != nil {
		return st, err
	}
	prev := first
	for i := 0; i < cfg.Packets; {
		end := min(i+cfg.Batch, cfg.Packets)
		for ; i < end; i++ {
			pkt, kind := m.Next()
			gso := m.GSO()
			run, err := r.once(pkt, gso)
			st.Packets++
			st.Kinds[kind]++
			if errors.Is(err, errRefused) {
				st.Refused++
				continue
			}
			if err != nil {
				return st, fail(i, kind, pkt, gso, err)
			}
			st.Verdicts[t.Verdicts[run.Verdict]]++
			if !r.drop[run.Verdict] && string(run.Out) != string(pkt) {
				st.Rewritten++
			}
		}
		st.Batches++
		if t.Maintain != nil && t.MaintainEvery > 0 && st.Batches%t.MaintainEvery == 0 && i < cfg.Packets {
			// between batches, as the agent's GC runs between packets
			cur, err := readCounters(t)
			if err != nil {
				return st, err
			}
			addMoved(st.Counters, first, cur)
			if err := t.Maintain(); err != nil {
				return st, &Failure{Target: t.Name, Index: i - 1, Seed: cfg.Seed, Stream: cfg.Stream, Err: fmt.Errorf("maintenance: %w", err)}
			}
			if first, err = readCounters(t); err != nil {
				return st, err
			}
			prev = first
		}
		cur, err := readCounters(t)
		if err != nil {
			return st, err
		}
		for k, v := range prev {
			if cur[k] < v {
				return st, &Failure{Target: t.Name, Index: i - 1, Seed: cfg.Seed, Stream: cfg.Stream,
					Err: fmt.Errorf("counter %s went back from %d to %d", k, v, cur[k])}
			}
		}
		prev = cur
		if t.Invariants != nil {
			if err := t.Invariants(); err != nil {
				return st, &Failure{Target: t.Name, Index: i - 1, Seed: cfg.Seed, Stream: cfg.Stream, Err: err}
			}
		}
	}
	addMoved(st.Counters, first, prev)
	return st, nil
}

func readCounters(t *Target) (map[string]uint64, error) {
	if t.Counters == nil {
		return map[string]uint64{}, nil
	}
	c, err := t.Counters()
	if err != nil {
		return nil, fmt.Errorf("%s: read counters: %w", t.Name, err)
	}
	return c, nil
}

func addMoved(acc, from, to map[string]uint64) {
	for k, v := range to {
		if d := v - from[k]; v >= from[k] && d > 0 {
			acc[k] += d
		}
	}
}

// Report is st as lines for a reader: packets, rate, verdicts, kinds and
// the counters that moved (and those that did not).
func (st *Stats) Report(all []string) string {
	var b strings.Builder
	rate := float64(st.Packets) / st.Elapsed.Seconds()
	fmt.Fprintf(&b, "%s: %d packets in %s (%.0f/s), %d let through rewritten, %d refused by the kernel (short IP frames), %d map checks\n",
		st.Target, st.Packets, st.Elapsed.Round(time.Millisecond), rate, st.Rewritten, st.Refused, st.Batches)
	fmt.Fprintf(&b, "  verdicts: %s\n", sortedCounts(st.Verdicts))
	fmt.Fprintf(&b, "  packets:  %s\n", sortedCounts(st.Kinds))
	var moved, still []string
	for _, k := range slices.Sorted(maps.Keys(st.Counters)) {
		moved = append(moved, fmt.Sprintf("%s=%d", k, st.Counters[k]))
	}
	for _, k := range all {
		if st.Counters[k] == 0 {
			still = append(still, k)
		}
	}
	fmt.Fprintf(&b, "  counters moved: %s\n", strings.Join(moved, " "))
	fmt.Fprintf(&b, "  counters never moved: %s", strings.Join(still, " "))
	return b.String()
}

func sortedCounts(m map[string]int) string {
	keys := slices.SortedFunc(maps.Keys(m), func(a, b string) int {
		if m[a] != m[b] {
			return m[b] - m[a]
		}
		return strings.Compare(a, b)
	})
	var s []string
	for _, k := range keys {
		s = append(s, fmt.Sprintf("%s=%d", k, m[k]))
	}
	return strings.Join(s, " ")
}
