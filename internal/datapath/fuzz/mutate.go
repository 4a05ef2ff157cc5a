package fuzz

import (
	"encoding/binary"
	"math/rand/v2"
)

// Kinds of generated packets (Stats.Kinds).
const (
	KindSeed     = "seed"     // a seed as it is
	KindRandom   = "random"   // random bytes (an Ethernet header with an IP EtherType half the time)
	KindFlip     = "flip"     // a seed with bits flipped, mostly in the headers
	KindTruncate = "truncate" // a seed cut short
	KindLength   = "length"   // a seed whose IP / L4 length fields lie
	KindOptions  = "options"  // a seed with IPv4 options / TCP options / IPv6 extension bytes damaged
	KindSplice   = "splice"   // the headers of one seed with the rest of another
)

// minFrame: BPF_PROG_TEST_RUN refuses shorter frames (EINVAL).
const minFrame = 14

// Mutator makes the packets of one run from seeds and a deterministic
// random source.
type Mutator struct {
	rng   *rand.Rand
	seeds [][]byte
}

// NewMutator returns a mutator over seeds drawing from seed and stream (two
// runs with the same values make the same packets).
func NewMutator(seeds [][]byte, seed, stream uint64) *Mutator {
	return &Mutator{rng: rand.New(rand.NewPCG(seed, stream)), seeds: seeds}
}

// Next returns the next packet and its kind.
func (m *Mutator) Next() ([]byte, string) {
	r := m.rng
	s := m.seeds[r.IntN(len(m.seeds))]
	var pkt []byte
	var kind string
	switch n := r.IntN(100); {
	case n < 5:
		pkt, kind = clone(s), KindSeed
	case n < 15:
		pkt, kind = m.random(), KindRandom
	case n < 50:
		pkt, kind = m.flip(clone(s)), KindFlip
	case n < 60:
		pkt, kind = clone(s[:1+r.IntN(len(s))]), KindTruncate
	case n < 80:
		pkt, kind = m.length(clone(s)), KindLength
	case n < 92:
		pkt, kind = m.options(clone(s)), KindOptions
	default:
		o := m.seeds[r.IntN(len(m.seeds))]
		cut := 14 + r.IntN(60)
		pkt, kind = append(clone(s[:min(cut, len(s))]), o[min(cut, len(o)):]...), KindSplice
	}
	if len(pkt) < minFrame {
		pkt = append(pkt, make([]byte, minFrame-len(pkt))...)
	}
	return pkt, kind
}

// GSO says whether the next run is one of a GSO skb (one in eight), as GRO
// aggregates and BIG TCP packets arrive.
func (m *Mutator) GSO() bool { return m.rng.IntN(8) == 0 }

func clone(b []byte) []byte { return append([]byte(nil), b...) }

func (m *Mutator) random() []byte {
	r := m.rng
	b := make([]byte, minFrame+r.IntN(180))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	switch r.IntN(4) {
	case 0:
		binary.BigEndian.PutUint16(b[12:], EtherIPv4)
		b[14%len(b)] = 0x45
	case 1:
		binary.BigEndian.PutUint16(b[12:], EtherIPv6)
		b[14%len(b)] = 0x60
	}
	return b
}

// flip flips 1-8 bits, 80 % of them in the first 94 bytes (Ethernet, IP,
// IPIP / extension headers, L4).
func (m *Mutator) flip(b []byte) []byte {
	r := m.rng
	for n := 1 + r.IntN(8); n > 0; n-- {
		lim := len(b)
		if r.IntN(5) != 0 {
			lim = min(lim, 94)
		}
		i := r.IntN(lim)
		if r.IntN(3) == 0 {
			b[i] = byte(r.Uint32())
		} else {
			b[i] ^= 1 << r.IntN(8)
		}
	}
	return b
}

// interesting values for length fields
var lies = []uint16{0, 1, 7, 8, 19, 20, 21, 39, 40, 41, 59, 60, 0x7fff, 0x8000, 0xfffe, 0xffff}

// length makes a length field lie: IPv4 IHL or total length, IPv6 payload
// length, the UDP length or the TCP data offset, of the outer or (IPIP) the
// inner packet; or appends bytes after the packet.
func (m *Mutator) length(b []byte) []byte {
	r := m.rng
	off, ok := l3Start(b)
	if !ok {
		return m.flip(b)
	}
	if r.IntN(4) == 0 { // the inner packet of IPIP / an ICMP quote, where there is one
		if p := parseIP(b[off:], 0, false); p != nil && p.inner != nil && off+40 < len(b) {
			if b[off]>>4 == 4 {
				off += int(b[off]&0x0f) * 4
			} else {
				off += 40
			}
			if p.quoted {
				off += 8
			}
		}
	}
	lie := func() uint16 {
		if r.IntN(2) == 0 {
			return lies[r.IntN(len(lies))]
		}
		return uint16(r.Uint32())
	}
	put := func(i int, v uint16) {
		if i+2 <= len(b) {
			binary.BigEndian.PutUint16(b[i:], v)
		}
	}
	if off >= len(b) {
		return b
	}
	switch b[off] >> 4 {
	case 4:
		l4 := off + int(b[off]&0x0f)*4
		switch r.IntN(5) {
		case 0:
			b[off] = 0x40 | byte(r.IntN(16))
		case 1, 2:
			put(off+2, lie())
		case 3:
			put(l4+4, lie()) // UDP length
		default:
			if l4+12 < len(b) {
				b[l4+12] = byte(r.IntN(16)) << 4 // TCP data offset
			}
		}
	case 6:
		switch r.IntN(3) {
		case 0, 1:
			put(off+4, lie())
		default:
			put(off+40+4, lie()) // UDP length without extension headers
		}
	}
	if r.IntN(4) == 0 {
		b = append(b, make([]byte, 1+r.IntN(64))...) // bytes beyond the packet
	}
	return b
}

// options damages option bytes: IPv4 options (the IHL grown over the
// transport header), TCP options, IPv6 extension header lengths and types.
func (m *Mutator) options(b []byte) []byte {
	r := m.rng
	off, ok := l3Start(b)
	if !ok || off >= len(b) {
		return m.flip(b)
	}
	switch b[off] >> 4 {
	case 4:
		if r.IntN(2) == 0 {
			ihl := 6 + r.IntN(10)
			b[off] = 0x40 | byte(ihl)
			for i := off + 20; i < min(off+ihl*4, len(b)); i++ {
				b[i] = []byte{0, 1, 7, 68, 130, 148, 255}[r.IntN(7)] // EOL, NOP, RR, TS, security, router alert, junk
			}
			return b
		}
		l4 := off + int(b[off]&0x0f)*4
		if l4+20 < len(b) && b[off+9] == ProtoTCP {
			doff := 5 + r.IntN(11)
			b[l4+12] = byte(doff) << 4
			for i := l4 + 20; i < min(l4+doff*4, len(b)); i++ {
				b[i] = []byte{0, 1, 2, 3, 4, 8, 30, 34, 255}[r.IntN(9)] // EOL NOP MSS WS SACKOK TS MPTCP TFO junk
			}
			return b
		}
	case 6:
		if off+41 < len(b) {
			b[off+6] = []byte{ProtoHop, ProtoDstOpt, ProtoRoute, ProtoFrag, ProtoTCP, ProtoUDP, ProtoICMPv6, 59}[r.IntN(8)]
			b[off+41] = byte(r.IntN(256)) // the first extension's length
			return b
		}
	}
	return m.flip(b)
}
