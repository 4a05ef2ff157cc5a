// Command ctkeybench times one BPF_MAP_TYPE_LRU_HASH lookup by key size: the
// north-south LB's CT key is 40 bytes (np_tuple: two 16-byte addresses), an
// IPv4-only key would be 16. Each program builds its key on the stack and
// looks it up in a map holding 16 flows (the lab benchmark's), at the LB's
// default and the bench's table size; an empty program is the harness.
// Samples as hack/nplbbench takes them (the median of -calls single
// kernel-timed runs), interleaved for -rounds; and one hot loop (repeat).
// Needs root.
//
//	go run ./hack/ctkeybench -rounds 15
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

func main() {
	rounds := flag.Int("rounds", 15, "interleaved rounds")
	calls := flag.Int("calls", 300, "single runs per sample")
	flag.Parse()
	if err := run(*rounds, *calls, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "ctkeybench:", err)
		os.Exit(1)
	}
}

type variant struct {
	name       string
	keySize    int
	maxEntries uint32
	prog       *ebpf.Program
	m          *ebpf.Map
}

func key(size, flow int) []byte {
	k := make([]byte, size)
	for i := range k {
		k[i] = byte(i*7 + 1)
	}
	k[0], k[1] = byte(flow), byte(flow>>8)
	return k
}

// lookupProg stores key(size, 0) on the stack, looks it up, returns XDP_PASS
// on a hit and XDP_DROP on a miss.
func lookupProg(m *ebpf.Map, size int) asm.Instructions {
	k := key(size, 0)
	var ins asm.Instructions
	for off := 0; off < size; off += 4 {
		v := int64(int32(uint32(k[off]) | uint32(k[off+1])<<8 | uint32(k[off+2])<<16 | uint32(k[off+3])<<24))
		ins = append(ins, asm.StoreImm(asm.R10, int16(off-size), v, asm.Word))
	}
	return append(ins,
		asm.LoadMapPtr(asm.R1, m.FD()),
		asm.Mov.Reg(asm.R2, asm.R10),
		asm.Add.Imm(asm.R2, int32(-size)),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "miss"),
		asm.Mov.Imm(asm.R0, 2),
		asm.Return(),
		asm.Mov.Imm(asm.R0, 1).WithSymbol("miss"),
		asm.Return(),
	)
}

func run(rounds, calls int, w io.Writer) error {
	var vs []*variant
	for _, ks := range []int{16, 40} {
		for _, n := range []uint32{131072, 1048576} {
			m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.LRUHash, KeySize: uint32(ks), ValueSize: 48, MaxEntries: n})
			if err != nil {
				return err
			}
			defer m.Close()
			val := make([]byte, 48)
			for f := range 16 {
				if err := m.Put(key(ks, f), val); err != nil {
					return err
				}
			}
			p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.XDP, License: "GPL", Instructions: lookupProg(m, ks)})
			if err != nil {
				return err
			}
			defer p.Close()
			vs = append(vs, &variant{name: fmt.Sprintf("key %d B, %d entries", ks, n), keySize: ks, maxEntries: n, prog: p, m: m})
		}
	}
	empty, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.XDP, License: "GPL", Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2), asm.Return()}})
	if err != nil {
		return err
	}
	defer empty.Close()
	vs = append(vs, &variant{name: "empty program", prog: empty})
	pkt := make([]byte, 64)
	samples := map[string][]time.Duration{}
	hot := map[string]time.Duration{}
	for range rounds {
		for _, v := range vs {
			var ds []time.Duration
			for range calls {
				ret, d, err := v.prog.Benchmark(pkt, 1, nil)
				if err != nil {
					return err
				}
				if ret != 2 {
					return fmt.Errorf("%s: returned %d, want 2 (a hit)", v.name, ret)
				}
				ds = append(ds, d)
			}
			slices.Sort(ds)
			samples[v.name] = append(samples[v.name], ds[len(ds)/2])
		}
	}
	for _, v := range vs {
		_, d, err := v.prog.Benchmark(pkt, 1000000, nil)
		if err != nil {
			return err
		}
		hot[v.name] = d
	}
	fmt.Fprintf(w, "| program | single runs: ns, median of %d rounds (min–max) | hot loop (repeat 10^6): ns |\n|---|---:|---:|\n", rounds)
	for _, v := range vs {
		s := samples[v.name]
		slices.Sort(s)
		fmt.Fprintf(w, "| %s | %d (%d–%d) | %.1f |\n", v.name, s[len(s)/2].Nanoseconds(), s[0].Nanoseconds(), s[len(s)-1].Nanoseconds(), float64(hot[v.name].Nanoseconds()))
	}
	return nil
}
