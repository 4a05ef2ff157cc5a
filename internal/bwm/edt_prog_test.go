package bwm

import (
	"encoding/binary"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/datapath/bandwidth"
	"github.com/axonhq/axon/internal/datapath/podpath"
	"github.com/axonhq/axon/internal/testutil"
)

// Offsets in struct __sk_buff (UAPI) for PROG_TEST_RUN.
const (
	skbOffTstamp  = 152
	skbOffWireLen = 160
	skbCtxLen     = 184 // up to hwtstamp: tstamp_type stays 0 in ctx_in
)

// ipv4TCP is an Ethernet + IPv4 + TCP frame of n bytes from src.
func ipv4TCP(src netip.Addr, n int) []byte {
	b := make([]byte, n)
	binary.BigEndian.PutUint16(b[12:], 0x0800)
	ip := b[14:]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(n-14))
	ip[8], ip[9] = 64, 6
	s := src.As4()
	copy(ip[12:], s[:])
	copy(ip[16:], []byte{198, 18, 0, 250})
	tcp := ip[20:]
	binary.BigEndian.PutUint16(tcp[0:], 40000)
	binary.BigEndian.PutUint16(tcp[2:], 5201)
	tcp[12] = 5 << 4
	tcp[13] = 0x10 // ACK
	return b
}

func monoNow(t *testing.T) uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.Fatal(err)
	}
	return uint64(ts.Nano())
}

// runEgress runs the EDT program on one frame with the given wire length
// and returns the departure time it wrote (0: untouched) and the verdict.
func runEgress(t *testing.T, prog *ebpf.Program, frame []byte, wireLen uint32) (uint64, uint32) {
	t.Helper()
	ctx := make([]byte, skbCtxLen)
	binary.LittleEndian.PutUint32(ctx[skbOffWireLen:], wireLen)
	ctxOut := make([]byte, 192)
	opts := ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+256), Context: ctx, ContextOut: ctxOut}
	ret, err := prog.Run(&opts)
	if err != nil {
		t.Fatalf("PROG_TEST_RUN: %v", err)
	}
	return binary.LittleEndian.Uint64(ctxOut[skbOffTstamp:]), ret
}

// TestEDTSmallBypass (BPF_PROG_TEST_RUN, everywhere): by default a small
// packet of a pod with a backlog departs
// now instead of behind it, is still charged to the pod's clock (the next
// big packet moves on by its time), stops bypassing once the clock is more
// than AXON_EDT_BYPASS_AHEAD ahead; with AXON_BW_F_NO_SMALL_BYPASS it
// waits; the pod's L2
// byte counter sums every paced packet's wire length.
func TestEDTSmallBypass(t *testing.T) {
	testutil.RequireRoot(t, "BPF, network namespaces")
	ns := testutil.NewNetns(t, "axt-bw-u-")
	nsRun(t, ns, "ip", "link", "add", "eth0", "type", "veth", "peer", "name", "p0")
	pin := "/sys/fs/bpf/" + ns
	var b *bandwidth.Manager
	testutil.InNetns(t, ns, func() error {
		var err error
		b, err = bandwidth.Load(bandwidth.Config{PinDir: pin, Uplink: "eth0"})
		return err
	})
	t.Cleanup(func() {
		b.Close()
		testutil.InNetns(t, ns, func() error { return podpath.Uninstall(pin) })
		_ = os.RemoveAll(pin)
	})
	pod := netip.MustParseAddr("10.244.1.7")
	const bits = 1_000_000 // 125 000 B/s: 10 000 wire bytes = 80 ms
	const big, small = 10_000, 130
	ms := func(n uint64) uint64 { return n * uint64(time.Millisecond) }
	charge := func(n uint64) uint64 { return n * 8 * uint64(time.Second) / bits }
	setup := func(flags uint64) {
		t.Helper()
		if err := b.Apply(nil, 2*time.Second); err != nil { // fresh state: clock and counters
			t.Fatal(err)
		}
		b.SetEgressSlack(0)
		if err := b.Apply([]bandwidth.Limit{{Addrs: []netip.Addr{pod}, EgressBits: bits}}, 2*time.Second); err != nil {
			t.Fatal(err)
		}
		if err := setEgressFlags(pin, pod, flags); err != nil {
			t.Fatal(err)
		}
	}
	frame := ipv4TCP(pod, 130)

	// AXON_BW_F_NO_SMALL_BYPASS: the small packet waits behind the big one
	setup(flagNoSmallBypass)
	t0 := monoNow(t)
	d1, _ := runEgress(t, b.Program(), frame, big)
	d2, _ := runEgress(t, b.Program(), frame, small)
	if d1 < t0 || d1 > monoNow(t) {
		t.Fatalf("first packet of an idle pod departs at %d, want now (%d..)", d1, t0)
	}
	if d2 != d1+charge(big) {
		t.Errorf("no bypass: small packet departs %v after the big one, want %v", time.Duration(d2-d1), time.Duration(charge(big)))
	}

	// default: it leaves now, charged: the next big packet moves on by its time too
	setup(0)
	d1, _ = runEgress(t, b.Program(), frame, big)
	before := monoNow(t)
	d2, _ = runEgress(t, b.Program(), frame, small)
	after := monoNow(t)
	d3, _ := runEgress(t, b.Program(), frame, big)
	if d2 < before || d2 > after {
		t.Errorf("bypass: small packet departs %v after the big one's start, want now (%v..%v)", time.Duration(d2-d1), time.Duration(before-d1), time.Duration(after-d1))
	}
	if d3 != d1+charge(big)+charge(small) {
		t.Errorf("bypass: the next big packet departs %v after the first, want %v (the small one is charged)", time.Duration(d3-d1), time.Duration(charge(big)+charge(small)))
	}
	// the clock is now ~160 ms ahead (> AXON_EDT_BYPASS_AHEAD, 100 ms): small packets are paced again
	d4, _ := runEgress(t, b.Program(), frame, small)
	if want := d3 + charge(big); d4 != want {
		t.Errorf("bypass beyond %v ahead: small packet departs %v after the first, want %v", time.Duration(ms(100)), time.Duration(d4-d1), time.Duration(want-d1))
	}
	got, err := podBytes(pin, bandwidth.Egress)
	if err != nil {
		t.Fatal(err)
	}
	if want := uint64(big + small + big + small); got[pod] != want {
		t.Errorf("egress byte counter %d, want %d (wire lengths of the paced packets)", got[pod], want)
	}
	if n := statCount(pin, 9); n != 1 { // AXON_BW_EGRESS_SMALL_BYPASS
		t.Errorf("small_bypass counter %d, want 1", n)
	}
}
