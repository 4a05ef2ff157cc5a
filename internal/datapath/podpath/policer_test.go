package podpath_test

import (
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/datapath"
	"github.com/axonhq/axon/internal/datapath/bandwidth"
	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/axonhq/axon/internal/datapath/podpath"
)

// The ingress policer runs inside pod_egress and uplink_ingress and reads
// the limits the Bandwidth Manager (package bandwidth) writes: these tests
// need both, so they are external tests of this package.

// newBWMFixture loads the Bandwidth Manager with the maps pinned in f's pin
// dir, on f's uplink (in f's netns).
func newBWMFixture(t *testing.T, f *podpath.ProgFixture) *bandwidth.Manager {
	t.Helper()
	var b *bandwidth.Manager
	dptest.InNetns(t, f.NS, func() {
		var err error
		b, err = bandwidth.Load(bandwidth.Config{PinDir: f.PinDir, Uplink: "eth0", Logger: dptest.Logger(t)})
		if err != nil {
			t.Fatal(err)
		}
	})
	t.Cleanup(func() { b.Close() })
	return b
}

func bwStat(t *testing.T, b *bandwidth.Manager, name string) uint64 {
	t.Helper()
	s, err := b.Stats()
	if err != nil {
		t.Fatal(err)
	}
	return s[name]
}

// TestIngressPolicer runs the pod_egress and uplink_ingress programs with a
// limit on the destination pod: the token bucket passes the burst, then
// drops until it refills; pods without a limit keep being redirected.
func TestIngressPolicer(t *testing.T) {
	f := podpath.NewProgFixture(t)
	b := newBWMFixture(t, f)
	const bits = 1_000_000 // 125 kB/s: the bucket is the 128 KiB minimum
	if err := b.Apply([]bandwidth.Limit{{Addrs: []netip.Addr{f.EP.IP, f.EP6.IP}, IngressBits: bits}}, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	payload := make([]byte, 1400)
	frame := func(src, dst netip.Addr) []byte {
		var p []byte
		if dst.Is4() {
			p = dptest.IPv4Packet(f.UpMAC, f.GwMAC, src, dst, 64, nil)
		} else {
			p = dptest.IPv6Packet(f.UpMAC, f.GwMAC, src, dst, 64)
		}
		return append(p, payload...)
	}
	remote4 := netip.MustParseAddr("10.244.2.9")
	for _, c := range []struct {
		desc     string
		prog     *ebpf.Program
		src, dst netip.Addr
		ifindex  int  // the device it comes from (pod_egress: the sender's, whose address it must be)
		big      bool // IPv4 BIG TCP: tot_len 0 on a GSO skb
	}{
		{"uplink_ingress IPv4", f.Up, remote4, f.EP.IP, 0, false},
		{"pod_egress (same node) IPv6", f.Pod, f.Sender6.IP, f.EP6.IP, f.PodIf, false},
		{"uplink_ingress IPv4 BIG TCP", f.Up, remote4, f.EP.IP, 0, true},
	} {
		t.Run(c.desc, func(t *testing.T) {
			if err := b.Apply(nil, time.Second); err != nil { // fresh, full bucket
				t.Fatal(err)
			}
			if err := b.Apply([]bandwidth.Limit{{Addrs: []netip.Addr{f.EP.IP, f.EP6.IP}, IngressBits: bits}}, 2*time.Second); err != nil {
				t.Fatal(err)
			}
			pkt, ctx := frame(c.src, c.dst), dptest.SKBFields{Ifindex: c.ifindex}.Ctx()
			if c.big {
				pkt, ctx = dptest.BigTCP4(pkt, unix.IPPROTO_TCP), dptest.SKBFields{Ifindex: c.ifindex, GSOSize: 1448}.Ctx()
			}
			drop0 := bwStat(t, b, "ingress_drop")
			var passed, dropped int
			start := dptest.MonoNow(t)
			for range 200 {
				r := dptest.RunEDTCtx(t, c.prog, pkt, ctx)
				switch r.Verdict {
				case dptest.TCActRedirect:
					if dropped > 0 {
						continue // refilled meanwhile; fine
					}
					passed++
				case dptest.TCActShot:
					dropped++
				default:
					t.Fatalf("verdict %d", r.Verdict)
				}
			}
			elapsed := dptest.MonoNow(t) - start
			burst := bandwidth.IngressBurst(bits)
			refill := elapsed * (bits / 8) / 1e9
			maxPass := (burst+refill)/uint64(len(pkt)) + 1 // one packet of debt
			if dropped == 0 || uint64(passed) < burst/uint64(len(pkt)) || uint64(passed) > maxPass+1 {
				t.Fatalf("passed %d dropped %d: want about burst/len = %d to pass first (+%d refilled)", passed, dropped, burst/uint64(len(pkt)), refill/uint64(len(pkt)))
			}
			if bwStat(t, b, "ingress_drop") < drop0+uint64(dropped) {
				t.Fatal("ingress_drop not counted")
			}
			// another local pod without a limit is still redirected
			other := f.EP
			other.IP = netip.MustParseAddr("10.244.1.8")
			if err := f.D.UpsertEndpoint(other); err != nil {
				t.Fatal(err)
			}
			src := remote4
			if c.prog == f.Pod {
				src = f.Sender.IP
			}
			if r := dptest.RunEDTCtx(t, c.prog, frame(src, other.IP), dptest.SKBFields{Ifindex: c.ifindex}.Ctx()); r.Verdict != dptest.TCActRedirect {
				t.Fatalf("unlimited pod: verdict %d, want redirect", r.Verdict)
			}
		})
	}
}

// TestIngressGate: axon_bw_gate is open exactly while some pod has an
// ingress limit (Apply), closed by UninstallBWM, and the policer obeys it: a
// limit behind a closed gate is not looked up, so its packets pass.
func TestIngressGate(t *testing.T) {
	f := podpath.NewProgFixture(t)
	b := newBWMFixture(t, f)
	gateMap, err := ebpf.LoadPinnedMap(filepath.Join(f.PinDir, datapath.MapBWGate), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer gateMap.Close()
	gate := func() uint32 {
		t.Helper()
		var v uint32
		if err := gateMap.Lookup(uint32(0), &v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	pods := []netip.Addr{f.EP.IP, f.EP6.IP}
	steps := []struct {
		desc string
		want []bandwidth.Limit
		gate uint32
	}{
		{"no limits", nil, 0},
		{"an egress limit only", []bandwidth.Limit{{Addrs: pods, EgressBits: 1_000_000}}, 0},
		{"an ingress limit", []bandwidth.Limit{{Addrs: pods, IngressBits: 1_000_000}}, 1},
		{"both", []bandwidth.Limit{{Addrs: pods, EgressBits: 1_000_000, IngressBits: 1_000_000}}, 1},
		{"the ingress limit removed", []bandwidth.Limit{{Addrs: pods, EgressBits: 1_000_000}}, 0},
		{"an ingress limit again", []bandwidth.Limit{{Addrs: pods, IngressBits: 1_000_000}}, 1},
	}
	for _, s := range steps {
		if err := b.Apply(s.want, time.Second); err != nil {
			t.Fatal(err)
		}
		if g := gate(); g != s.gate {
			t.Fatalf("%s: gate %d, want %d", s.desc, g, s.gate)
		}
	}

	// the limit (128 KiB bucket) drops a burst of 200 × 1.4 kB with the gate
	// open; with the gate closed by hand the same burst all passes
	pkt := append(dptest.IPv4Packet(f.UpMAC, f.GwMAC, netip.MustParseAddr("10.244.2.9"), f.EP.IP, 64, nil), make([]byte, 1400)...)
	burst := func() (dropped int) {
		for range 200 {
			if r := dptest.RunEDT(t, f.Up, pkt, 0, 0); r.Verdict == dptest.TCActShot {
				dropped++
			}
		}
		return dropped
	}
	if d := burst(); d == 0 {
		t.Fatal("gate open: nothing dropped, the limit is not enforced")
	}
	if err := gateMap.Put(uint32(0), uint32(0)); err != nil {
		t.Fatal(err)
	}
	if d := burst(); d != 0 {
		t.Fatalf("gate closed: %d of 200 dropped, want none (the policer must not look the limit up)", d)
	}

	if err := gateMap.Put(uint32(0), uint32(1)); err != nil {
		t.Fatal(err)
	}
	if err := bandwidth.Uninstall(f.PinDir, ""); err != nil {
		t.Fatal(err)
	}
	if g := gate(); g != 0 {
		t.Fatalf("after UninstallBWM: gate %d, want 0", g)
	}
}
