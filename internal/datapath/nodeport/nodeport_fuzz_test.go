package nodeport

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/lb"
)

// npFuzzTrace, when set, sees every packet before it runs (debugging).
var npFuzzTrace func(hook string, pkt []byte)

// TestNodePortFuzz feeds random and mutated packets through the tc and XDP
// programs (BPF_PROG_TEST_RUN): every run must succeed with a known verdict,
// and a frame that is not IPv4/IPv6 must come out untouched.
func TestNodePortFuzz(t *testing.T) {
	f := newNPFix(t, nil)
	f.upsert(t, npNodePort(30080, lb.TCP, false, npBE("10.244.2.5:8080", "node2"), npBE("10.244.1.5:8080", "node1")), FrontendOptions{})
	f.upsert(t, npNodePort(30080, lb.TCP, true, npBE("[fd00:10:244:2::5]:8080", "node2")), FrontendOptions{})
	f.upsert(t, npNodePort(30053, lb.UDP, false, npBE("10.244.2.6:53", "node2")), FrontendOptions{})
	f.upsert(t, npVIP("192.0.2.10:80", lb.TCP, npBE("10.244.2.7:80", "node2")), FrontendOptions{Mode: ModeDSR})
	seeds := [][]byte{
		f.wirePkt(npTCP("198.18.0.250:40000", "198.18.0.11:30080"), npSYN),
		f.wirePkt(npTCP("[fd00:198:18::250]:40000", "[fd00:198:18::11]:30080"), npSYN),
		f.wirePkt(npUDP("198.18.0.250:40000", "198.18.0.11:30053"), 0),
		f.wirePkt(npTCP("198.18.0.250:40000", "192.0.2.10:80"), npSYN),
		icmpErr(netip.MustParseAddr("198.18.0.1"), npNode, npPacket(npTCP("198.18.0.11:30080", "198.18.0.250:40000"), npACK), 1280),
		icmpErr(netip.MustParseAddr("fd00:198:18::1"), npNode6, npPacket(npTCP("[fd00:198:18::11]:30080", "[fd00:198:18::250]:40000"), npACK), 1280),
		npPacket(npTCP("10.244.2.5:8080", "198.18.0.11:61000"), npACK),
	}
	// IP fragments (frag.h): first, middle and last of UDP datagrams, v4 and v6
	for _, fl := range []Tuple{npUDP("198.18.0.250:40000", "198.18.0.11:30053"), npUDP("[fd00:198:18::250]:40000", "[fd00:198:18::11]:30080")} {
		seeds = append(seeds, npWithMACs(npFrags(npPacketPayload(fl, 0, npFragPayload), 0x77, npFragChunk), f.upMAC, f.cliMAC)...)
	}
	// establish flows so mutated packets also hit CT, NAT and ICMP paths
	for _, s := range seeds[:4] {
		f.run(t, "tc", s)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	const iterations = 3000
	counts := map[string]map[npVerdict]int{}
	refused := map[string]int{}
	for i := 0; i < iterations; i++ {
		var pkt []byte
		switch i % 4 {
		case 0: // random bytes, random length
			pkt = make([]byte, 1+rng.IntN(200))
			for j := range pkt {
				pkt[j] = byte(rng.Uint32())
			}
		case 1: // truncated seed
			s := seeds[rng.IntN(len(seeds))]
			pkt = append([]byte(nil), s[:1+rng.IntN(len(s))]...)
		default: // seed with flipped bytes (headers mostly)
			s := seeds[rng.IntN(len(seeds))]
			pkt = append([]byte(nil), s...)
			for n := 1 + rng.IntN(6); n > 0; n-- {
				pkt[rng.IntN(min(len(pkt), 80))] = byte(rng.Uint32())
			}
		}
		if len(pkt) < 14 {
			pkt = append(pkt, make([]byte, 14-len(pkt))...) // the kernel refuses shorter test frames
		}
		for _, hook := range npHooks {
			if npFuzzTrace != nil {
				npFuzzTrace(hook, pkt)
			}
			v, out, err := f.runErr(hook, pkt)
			if errors.Is(err, unix.EINVAL) {
				refused[hook]++ // the test harness refuses some short frames (not the program)
				continue
			}
			if err != nil {
				t.Fatalf("packet %x: %v", pkt, err)
			}
			if counts[hook] == nil {
				counts[hook] = map[npVerdict]int{}
			}
			counts[hook][v]++
			et := uint16(pkt[12])<<8 | uint16(pkt[13])
			if et != 0x0800 && et != 0x86dd && (v != npNext || !bytes.Equal(out, pkt)) {
				t.Fatalf("%s: non-IP frame %x: verdict %s, output %x", hook, pkt, v, out)
			}
		}
	}
	t.Logf("%d packets per hook, verdicts: %v, refused by BPF_PROG_TEST_RUN (too short): %v", iterations, counts, refused)
}
