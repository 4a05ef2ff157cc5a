package main

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/axonhq/axon/internal/datapath/nodeport"
	"github.com/axonhq/axon/internal/lb"
	"github.com/axonhq/axon/internal/testutil"
)

// TestForwarder runs the bench's trivial XDP forwarder in the kernel: an
// IPv4 frame leaves with the next hop's and its own MAC (XDP_TX), the rest
// of the frame untouched; what it must not forward passes unchanged.
func TestForwarder(t *testing.T) {
	testutil.RequireRoot(t, "loads an XDP program")
	cs, err := calibrationPrograms()
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(cs)
	var fwd *ebpf.Program
	for _, c := range cs {
		if c.name == "xdp_forwarder" {
			fwd = c.prog
		}
	}
	ipv4 := nodeport.Packet(nodeport.Tuple{Proto: lb.TCP, Src: netip.MustParseAddrPort("198.18.0.250:40000"),
		Dst: netip.MustParseAddrPort("198.18.0.11:30080")}, false)
	with := func(off int, b ...byte) []byte {
		p := bytes.Clone(ipv4)
		copy(p[off:], b)
		return p
	}
	for _, c := range []struct {
		name string
		pkt  []byte
		want uint32
	}{
		{"IPv4", ipv4, xdpTX},
		{"ARP", with(12, 0x08, 0x06), xdpPass},
		{"IPv4 with options", with(14, 0x46), xdpPass},
		{"TTL 1", with(14+8, 1), xdpPass},
		{"truncated IPv4 header", ipv4[:14+19], xdpPass},
	} {
		t.Run(c.name, func(t *testing.T) {
			out := make([]byte, len(c.pkt)+256)
			opts := &ebpf.RunOptions{Data: c.pkt, DataOut: out}
			ret, err := fwd.Run(opts)
			if err != nil {
				t.Fatal(err)
			}
			out = opts.DataOut
			if ret != c.want {
				t.Fatalf("return code %d, want %d", ret, c.want)
			}
			want := bytes.Clone(c.pkt)
			if c.want == xdpTX {
				copy(want[0:], fwdDstMAC)
				copy(want[6:], fwdSrcMAC)
			}
			if !bytes.Equal(out, want) {
				t.Fatalf("frame out\n%x\nwant\n%x", out, want)
			}
		})
	}
}

// TestCompare: the paired comparison of saved runs. new's XDP hit is half
// of old's in every repetition, its tc hit 0.9 of it; the forwarder row is
// only in new.
func TestCompare(t *testing.T) {
	dir := t.TempDir()
	const reps = 8
	for rep := 1; rep <= reps; rep++ {
		for _, b := range []string{"old", "new"} {
			hitTC, hitXDP := 400+10*rep, 300+10*rep
			fw := "| xdp_forwarder | – | 101 (100–110) | – |\n"
			if b == "new" {
				hitTC, hitXDP = hitTC*9/10, hitXDP/2
			} else {
				fw = ""
			}
			md := fmt.Sprintf("Kernel x, 2 CPUs, ...; CPU pressure avg10 %d.5 %% before, 12 %% after; now\n\n"+
				"As loaded here, verified instructions: axon_lb_ingress 100, axon_lb_xdp %d\n\n"+
				"| scenario | tc ns/packet median (min–max) | XDP ns/packet median (min–max) | XDP / tc |\n|---|---:|---:|---:|\n"+
				"| ct_hit | %d (1–2) | %d (1–2) | 0.70× |\n| empty_program | 100 (100–100) | 100 (100–100) | 1.00× |\n%s",
				rep, 50+len(b), hitTC, hitXDP, fw)
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%s.%d.md", b, rep)), []byte(md), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	var out strings.Builder
	csvPath := filepath.Join(dir, "results.csv")
	if err := compare(dir, []string{"old", "new"}, csvPath, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"old: 8 runs; verified instructions axon_lb_ingress 100, axon_lb_xdp 53;",
		"| ct_hit | XDP | 345 | 172 | 245 | 72 | 0.50× (0.500–0.500) |",
		"| ct_hit | tc | 445 | 400 | 345 | 300 | 0.90× (0.900–0.900) |",
		"| xdp_forwarder | XDP | – | 101 | – | 1 | – |",
		"new: XDP ct_hit against the trivial forwarder of the same run: 172 ns against 101 ns",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	csv, err := os.ReadFile(csvPath)
	if err != nil {
		t.Fatal(err)
	}
	// per repetition: old 2 rows x 2 hooks, new the same plus the forwarder's XDP row
	if n := strings.Count(string(csv), "\n"); n != 1+reps*(4+5) {
		t.Errorf("CSV has %d lines, want %d:\n%s", n, 1+reps*9, csv)
	}
	if !strings.Contains(string(csv), "new,3,ct_hit,xdp,165,3.5,12\n") {
		t.Errorf("CSV lacks new's third ct_hit XDP sample:\n%s", csv)
	}
	if err := compare(dir, []string{"old", "absent"}, "", &out); err == nil {
		t.Error("a build without runs compared without an error")
	}
}
