package northsouth_test

// The north-south benchmark end to end, tiny: axon at XDP, the trivial XDP
// forwarder and kube-proxy iptables, one repetition of 1 s per metric, on
// the real kernel with a real apiserver and kube-proxy. The forwarding rate
// must be measured in all three, with the entry node's receive thread busy;
// the forwarder's sample has no connection samples.

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/axonhq/axon/internal/bench/benchtest"
	"github.com/axonhq/axon/internal/bench/northsouth"
)

func TestNorthSouthBenchTiny(t *testing.T) {
	bin := benchtest.LabSetup(t)
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	out := t.TempDir()
	var progress strings.Builder
	t0 := time.Now()
	rep, err := northsouth.Run(ctx, northsouth.Config{Configs: []string{northsouth.XDP, northsouth.Floor, northsouth.Reference}, Reps: 1,
		Duration: time.Second, BinDir: bin, OutDir: out, Progress: &progress})
	t.Logf("progress (%s):\n%s", time.Since(t0).Round(time.Millisecond), progress.String())
	if err != nil {
		t.Fatalf("northsouth.Run: %v", err)
	}
	if len(rep.Samples) != 3 {
		t.Fatalf("%d samples, want 3", len(rep.Samples))
	}
	ns := map[string]float64{}
	for _, s := range rep.Samples {
		if s.Skipped != "" || s.Err != "" {
			t.Errorf("%s: skipped %q, error %q", s.Config, s.Skipped, s.Err)
			continue
		}
		// measured, and every connection answered (how fast is the
		// benchmark's to show, not this test's: it runs on a shared machine)
		if s.Config == northsouth.Floor {
			if s.Conns != 0 || len(s.Commands) != 1 {
				t.Errorf("%s: %d connections, commands %q: want the forwarding rate alone", s.Config, s.Conns, s.Commands)
			}
		} else if !(s.ConnRate > 0) || s.ConnErrs != 0 || !(s.Throughput > 0) {
			t.Errorf("%s: %.0f conn/s with %d errors, %.2f Gbit/s", s.Config, s.ConnRate, s.ConnErrs, s.Throughput/1e9)
		}
		if !(s.FwdPPS > 0) || !(s.FwdNsPerPacket > 0) || !(s.FwdBusy > 0 && s.FwdBusy < 1.1) ||
			s.FwdPPS > s.FwdOfferedPPS || s.FwdPPS > s.FwdRxPPS*1.001 {
			t.Errorf("%s: forwarded %.3f Mpps of %.3f offered and %.3f taken, %.0f ns/packet, receive thread %.0f%% busy",
				s.Config, s.FwdPPS/1e6, s.FwdOfferedPPS/1e6, s.FwdRxPPS/1e6, s.FwdNsPerPacket, 100*s.FwdBusy)
		}
		ns[s.Config] = s.FwdNsPerPacket
	}
	// both forwarding paths measured; which is cheaper is the run of
	// record's to say (docs/north-south-lb.md), not one repetition's
	if x, fw, ipt := ns[northsouth.XDP], ns[northsouth.Floor], ns[northsouth.Reference]; !(x > 0) || !(fw > 0) || !(ipt > 0) {
		t.Errorf("XDP forwards at %.0f ns/packet, the trivial forwarder at %.0f, kube-proxy iptables at %.0f: want all measured", x, fw, ipt)
	}
	md, err := os.ReadFile(filepath.Join(out, "results.md"))
	if err != nil || !strings.Contains(string(md), "## Forwarding rate") || !strings.Contains(string(md), "| axon-xdp | ") ||
		!strings.Contains(string(md), "| xdp-forwarder | ") || !strings.Contains(string(md), "axon-xdp against xdp-forwarder, paired by repetition") {
		t.Errorf("results.md (%v):\n%s", err, md)
	}
	if ents, _ := filepath.Glob("/run/netns/axonlab-*"); len(ents) > 0 {
		t.Errorf("namespaces left after the benchmark: %v", ents)
	}
}
