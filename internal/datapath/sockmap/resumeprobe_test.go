package sockmap

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/axonhq/axon/internal/bench"
	"github.com/axonhq/axon/internal/testutil"
)

// resumeProbe mirrors struct sockmap_resume_probe (bpf/sk_msg.c).
type resumeProbe struct {
	Peer, Switches, Entries, CaughtUp, SkbIdle, Idle, SendqEmpty, GapSum, GapMin uint64
	SeqSwitch, FirstEntry, FirstBytes, IdleTotMax                                uint64
}

// add adds the counts of o (not its minimum, first entry or per-writer
// fields) to p: one writer's into a round's, a round's into all rounds'.
func (p *resumeProbe) add(o resumeProbe) {
	p.Switches += o.Switches
	p.Entries += o.Entries
	p.CaughtUp += o.CaughtUp
	p.SkbIdle += o.SkbIdle
	p.Idle += o.Idle
	p.SendqEmpty += o.SendqEmpty
	p.GapSum += o.GapSum
}

// TestResumeDutyCycle counts how often a writer that back-pressure moved to
// the stack could resume the redirect without reordering: qperf tcp_bw
// (16 KiB by default) between two pod namespaces, with axon_sk_msg loaded
// with cfg_resume_probe set (bpf/sk_msg.c). From its back-pressure switch on,
// the writer stays in the map on the stack path (it never becomes quiet, as
// a resumable writer could not) and counts at each sendmsg entry whether its
// reader has read every byte it sent through TCP (R.copied_seq ==
// W.write_seq), with R's stream-verdict backlog empty (the condition with
// the stream verdict) and both psock queues empty (without it). A count,
// not a timing: it holds on a busy machine. Runs with
// AXON_SOCKMAP_RESUME_PROBE=1; _SIZE (bytes, default 16384), _SECONDS
// (qperf -t, default 2), _ROUNDS (default 3), _VERDICT=0 (no stream
// verdict), _CPUS (client,server, default 0,1).
func TestResumeDutyCycle(t *testing.T) {
	if os.Getenv("AXON_SOCKMAP_RESUME_PROBE") != "1" {
		t.Skip("measurement of the resume condition's duty cycle: runs with AXON_SOCKMAP_RESUME_PROBE=1")
	}
	requireLeave(t)
	size := testutil.EnvInt(t, "AXON_SOCKMAP_RESUME_PROBE_SIZE", 16384)
	secs := testutil.EnvInt(t, "AXON_SOCKMAP_RESUME_PROBE_SECONDS", 2)
	rounds := testutil.EnvInt(t, "AXON_SOCKMAP_RESUME_PROBE_ROUNDS", 3)
	verdict := os.Getenv("AXON_SOCKMAP_RESUME_PROBE_VERDICT") != "0"
	cpus := []string{"0", "1"}
	if v := os.Getenv("AXON_SOCKMAP_RESUME_PROBE_CPUS"); v != "" {
		if cpus = strings.Split(v, ","); len(cpus) != 2 {
			t.Fatalf("AXON_SOCKMAP_RESUME_PROBE_CPUS=%q: want client,server (e.g. 0,1)", v)
		}
	}
	qperf, err := lookTool("qperf", "nsenter", "taskset")
	if err != nil {
		t.Skip(err)
	}

	b, _, cg, _ := loadTest(t, Config{StreamVerdict: verdict})
	spec, err := loadSkMsg()
	if err != nil {
		t.Fatal(err)
	}
	if err := spec.Variables["cfg_resume_probe"].Set(uint32(1)); err != nil {
		t.Fatal(err)
	}
	spec.Maps["axon_sockmap_resume_probe"].MaxEntries = 64
	var probe skMsgObjects
	if err := loadOnMaps(&b.ops, spec, &probe); err != nil {
		t.Fatalf("load axon_sk_msg with cfg_resume_probe: %v", err)
	}
	t.Cleanup(func() { probe.Close() })
	if err := link.RawAttachProgram(link.RawAttachProgramOptions{
		Target: b.ops.AxonSockHash.FD(), Program: probe.AxonSkMsg, Attach: ebpf.AttachSkMsgVerdict,
	}); err != nil {
		t.Fatalf("attach the probing axon_sk_msg: %v", err)
	}
	if err := attachStreamVerdict(b.ops.AxonSockHash, probe.AxonSkSkbPass, verdict); err != nil {
		t.Fatal(err)
	}
	n := newPodNet(t)
	for ip, ns := range map[netip.Addr]uint64{n.podA: n.ca, n.podB: n.cb} {
		if err := b.SetPod(ip, ns); err != nil {
			t.Fatal(err)
		}
	}

	ctx := context.Background()
	startQperfServer(t, ctx, cg, qperf, n.b, cpus[1], "19766")

	var total resumeProbe
	var sb strings.Builder
	fmt.Fprintf(&sb, "\nqperf tcp_bw -m %d -t %d, stream verdict %v, CPUs %s\n"+
		"| round | load | Gb/s | backpressure | writer entries (stack, after the switch) | R caught up | + ingress_skb empty | + ingress_msg empty | W send queue acked | mean gap (bytes) | min gap | per writer: first entry where it held, TCP bytes written until then | bypassed / stack bytes (all sockets) |\n"+
		"|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|\n", size, secs, verdict, strings.Join(cpus, ","))
	for r := range rounds {
		load := loadavg()
		before := metrics(t, b)
		out, errOut, err := runQperf(ctx, cg, qperf, n.a, cpus[0], n.podB, "19766", secs, size, "tcp_bw")
		res, perr := bench.ParseQperf(append(out, errOut...))
		if perr != nil || len(res) != 1 {
			t.Fatalf("qperf tcp_bw %d: %v %v: %s%s", size, err, perr, out, errOut)
		}
		moved := metricsDelta(t, b, before)
		t.Logf("round %d counters: %v", r, moved)
		var sum resumeProbe
		sum.GapMin = ^uint64(0)
		var key uint64
		var p resumeProbe
		var keys []uint64
		var first []string
		for it := probe.AxonSockmapResumeProbe.Iterate(); it.Next(&key, &p); {
			keys = append(keys, key)
			first = append(first, fmt.Sprintf("%d of %d, %d B; R msg_tot_len where idle: max %d", p.FirstEntry, p.Entries, p.FirstBytes, p.IdleTotMax))
			sum.add(p)
			sum.GapMin = min(sum.GapMin, p.GapMin)
		}
		for _, k := range keys {
			_ = probe.AxonSockmapResumeProbe.Delete(k)
		}
		mean := 0.0
		if sum.Entries > 0 {
			mean = float64(sum.GapSum) / float64(sum.Entries)
		}
		fmt.Fprintf(&sb, "| %d | %s | %.2f | %d | %d | %d | %d | %d | %d | %.0f | %d | %s | %d / %d |\n", r, load, res[0].BytesPerSec*8/1e9,
			moved["backpressure"], sum.Entries, sum.CaughtUp, sum.SkbIdle, sum.Idle, sum.SendqEmpty, mean, sum.GapMin,
			strings.Join(first, "; "), moved["redirect_bytes"], moved["pass_bytes"])
		total.add(sum)
	}
	t.Log(sb.String())
	// the measurement measured something: a writer was switched by
	// back-pressure and wrote on the stack afterwards
	if total.Switches == 0 || total.Entries == 0 {
		t.Fatalf("no writer was switched by back-pressure and wrote on the stack afterwards (switches %d, entries %d): "+
			"nothing measured; a larger size or a longer run (AXON_SOCKMAP_RESUME_PROBE_SIZE, _SECONDS) reaches the bound", total.Switches, total.Entries)
	}
	t.Logf("all rounds: %d stack-mode entries after %d back-pressure switches; condition true at %d (%.3f %%) with the stream verdict's, %d (%.3f %%) without",
		total.Entries, total.Switches, total.SkbIdle, 100*float64(total.SkbIdle)/float64(total.Entries),
		total.Idle, 100*float64(total.Idle)/float64(total.Entries))
}
