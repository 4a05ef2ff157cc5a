package fuzz

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/axonhq/axon/internal/datapath/nodeport"
	"github.com/axonhq/axon/internal/datapath/podpath"
)

// Environment of TestFuzzDatapath (make fuzz sets the first two).
const (
	envPackets = "AXON_FUZZ_PACKETS" // packets per program (default defaultPackets, divided by AXON_TEST_SLOWDOWN)
	envSeed    = "AXON_FUZZ_SEED"    // the random source (default 1)
	envOnly    = "AXON_FUZZ_ONLY"    // comma-separated program names: only these
	envReplay  = "AXON_FUZZ_REPLAY"  // <program>:<hex>: run this one packet and nothing else
)

// defaultPackets is the short pass of make test: a few seconds in all.
const defaultPackets = 20000

var (
	tcVerdicts  = map[uint32]string{TCActUnspec: "next", TCActOK: "ok", TCActShot: "shot", TCActRedirect: "redirect"}
	xdpVerdicts = map[uint32]string{XDPDrop: "drop", XDPPass: "pass", XDPTX: "tx", XDPRedirect: "redirect"}
)

func pick(m map[uint32]string, keys ...uint32) map[uint32]string {
	out := map[uint32]string{}
	for _, k := range keys {
		out[k] = m[k]
	}
	return out
}

// targets are the node's tc and XDP programs with their documented
// verdicts, seeds and rules. Call in the node's netns after the seed flows.
func (n *node) targets(t testing.TB) []*Target {
	t.Helper()
	ingress := n.ingressSeeds(t)
	common := func(tg *Target) *Target {
		tg.Counters = n.counters
		tg.Invariants = n.invariants
		tg.Maintain = n.maintain
		tg.MaintainEvery = 5
		return tg
	}
	return []*Target{
		common(&Target{
			Name: "pod_egress", Prog: n.dp.Program(podpath.ProgPodEgress), Ifindex: n.podAIf,
			Verdicts: pick(tcVerdicts, TCActOK, TCActShot, TCActRedirect), Drops: []uint32{TCActShot},
			Seeds: n.podSeeds(), Check: forwardTTL,
		}),
		common(&Target{
			Name: "uplink_ingress", Prog: n.dp.Program(podpath.ProgUplinkIngress), Ifindex: n.upIf,
			Verdicts: pick(tcVerdicts, TCActOK, TCActShot, TCActRedirect), Drops: []uint32{TCActShot},
			Seeds: ingress, Check: forwardTTL,
		}),
		common(&Target{
			Name: "uplink_egress", Prog: n.bw.Program(), Ifindex: n.upIf,
			Verdicts: pick(tcVerdicts, TCActOK, TCActShot), Drops: []uint32{TCActShot},
			Seeds: n.edtSeeds(), Check: n.edtCheck,
		}),
		common(&Target{
			Name: "lb_ingress", Prog: n.lb.Program(nodeport.HookTC), Ifindex: n.upIf,
			Verdicts: tcVerdicts, Drops: []uint32{TCActShot}, Seeds: ingress, Check: n.lbForward(TCActRedirect),
		}),
		common(&Target{
			Name: "lb_xdp", XDP: true, Prog: n.lb.Program(nodeport.HookXDP), Ifindex: n.upIf,
			Verdicts: xdpVerdicts, Drops: []uint32{XDPDrop}, Seeds: ingress, Check: n.lbForward(XDPTX, XDPRedirect),
		}),
		common(&Target{
			Name: "lb_egress", Prog: n.lb.Program(nodeport.HookEgress), Ifindex: n.upIf,
			Verdicts: pick(tcVerdicts, TCActUnspec, TCActShot), Drops: []uint32{TCActShot},
			Seeds: n.egressSeeds(t),
		}),
		common(&Target{
			Name: "lb_decap", Prog: n.lb.Program(nodeport.HookDecap), Ifindex: n.upIf,
			Verdicts: pick(tcVerdicts, TCActUnspec), Seeds: n.decapSeeds(), Check: decapCheck,
		}),
		podLB(common(&Target{
			Name: "pod_lb_egress", Prog: n.plbEgress, Ifindex: n.podAIf,
			Verdicts: pick(tcVerdicts, TCActOK, TCActShot), Drops: []uint32{TCActShot}, Seeds: n.podLBSeeds(),
		}), n),
		podLB(common(&Target{
			Name: "pod_lb_replies", Prog: n.plbReplies, Ifindex: n.podAIf,
			Verdicts: pick(tcVerdicts, TCActOK, TCActShot), Drops: []uint32{TCActShot}, Seeds: n.podLBReplySeeds(),
		}), n),
	}
}

// podLB: the pod LB's programs open pod A's Service flows first and again with
// the node's own maintenance (their flow table is an LRU of 64: the fuzzer
// evicts them).
func podLB(tg *Target, n *node) *Target {
	tg.Setup = n.openPodLBFlows
	tg.Maintain = func() error {
		if err := n.maintain(); err != nil {
			return err
		}
		return n.openPodLBFlows()
	}
	return tg
}

// counterPrefixes: the counters each program can move, for the report.
// Left out as out of reach of a test run here: bw.egress_delivery_time and
// bw.egress_pod_paced (a pod's own delivery time: BPF_PROG_TEST_RUN takes no
// skb->tstamp_type), bw.egress_clock_reset (a departure time beyond the
// horizon, only after the clock or the state went back), lb.*.ct_insert_fail
// (axon_np_ct is an LRU: a full table evicts), lb.*.drop_no_snat_addr (the
// node has an address of each family), the pod programs' redirect_failed
// (the redirect helpers do not fail on a device that exists).
var counterPrefixes = map[string][]string{
	"pod_egress": {"pod.pod_egress.redirect_peer_local", "pod.pod_egress.redirect_fib", "pod.pod_egress.redirect_neigh",
		"pod.pod_egress.pass_host_bound", "pod.pod_egress.pass_arp_non_ip", "pod.pod_egress.pass_no_route",
		"pod.pod_egress.pass_malformed", "pod.pod_egress.pass_ttl", "pod.pod_egress.redirect_arp_reply", "bw.ingress"},
	"uplink_ingress": {"pod.uplink_ingress.redirect_peer_local", "pod.uplink_ingress.pass_arp_non_ip",
		"pod.uplink_ingress.pass_malformed", "pod.uplink_ingress.pass_ttl", "pod.uplink_ingress.pass_not_local", "bw.ingress"},
	"uplink_egress": {"bw.egress_paced", "bw.egress_drop_horizon", "bw.egress_unlimited", "bw.egress_with_socket", "bw.egress_small_bypass"},
	"lb_ingress":    append(lbReasons("tc", "xdp_punt"), "pod.uplink_ingress.redirect_peer_local", "bw.ingress"),
	"lb_xdp":        lbReasons("xdp", "dsr_decap"),
	"lb_egress":     {"lb.egress.egress_rev", "lb.egress.frag_tracked", "lb.egress.frag_not_found", "lb.egress.rewrite_fail"},
	"lb_decap":      {"lb.egress.dsr_decap"},
	// podlb.ct_fail (an LRU evicts) and podlb.reselect (no backend leaves
	// during a pass) are out of reach; podlb.rewrite_fail counts segments cut
	// short behind their ports (dropped, as the north-south LB does).
	"pod_lb_egress":  {"podlb.new", "podlb.hit", "podlb.no_backend", "podlb.untracked", "podlb.fragment", "podlb.stale_rev", "podlb.rewrite_fail", "podlb.rev_restored"},
	"pod_lb_replies": {"podlb.reply"},
}

// lbReasons: the LB's counters of hook the ingress path moves, but those
// named in not (not at this hook).
func lbReasons(hook string, not ...string) []string {
	var out []string
	for _, r := range nodeport.ReasonNames() {
		if r != "egress_rev" && r != "ct_insert_fail" && r != "drop_no_snat_addr" && !slices.Contains(not, r) {
			out = append(out, "lb."+hook+"."+r)
		}
	}
	return out
}

// maintain is what the agent does between packets: conntrack GC (here with
// every timeout at its minimum), then the seed flows open again.
func (n *node) maintain() error {
	if err := n.gc(); err != nil {
		return err
	}
	return n.openFlows()
}

// openFlows runs the flow seeds through axon_lb_ingress.
func (n *node) openFlows() error {
	p := n.lb.Program(nodeport.HookTC)
	for _, pkt := range n.flowSeeds() {
		if _, err := RunOne(&Target{Name: "lb_ingress", Prog: p, Ifindex: n.upIf, Verdicts: tcVerdicts}, pkt, false); err != nil {
			return fmt.Errorf("seed flow %x: %w", pkt, err)
		}
	}
	return nil
}

// forwardTTL: a packet the pod programs redirect had a TTL / hop limit
// above 1 and leaves with one less (they forward; the stack answers expiry).
// The one non-IP frame they redirect is pod_egress's answer to an ARP
// request for the gateway (CheckRewrite says it is exactly that).
func forwardTTL(r *Run) error {
	if r.Verdict != TCActRedirect || isARPAnswer(r.In, r.Out) {
		return nil
	}
	in, out := ttlOf(r.In), ttlOf(r.Out)
	if in <= 1 || out != in-1 {
		return fmt.Errorf("redirected with TTL %d, it arrived with %d", out, in)
	}
	return nil
}

// lbForward: a packet the LB sends on (the forwarding verdicts fwd) is one
// of: an ICMP "too big" answer to its sender (MACs swapped); a DSR request,
// encapsulated with the client's packet unchanged inside (TTL above 1); a
// translated packet or one delivered to a local pod (tc), its TTL / hop
// limit one less than it arrived with. Its MACs are the uplink's and a
// neighbour's (bpf_redirect, XDP_TX), a local pod's and its host device's
// (tc, bpf_redirect_peer), or, for bpf_redirect_neigh (tc), as they came
// (the kernel fills them in later).
func (n *node) lbForward(fwd ...uint32) func(r *Run) error {
	return func(r *Run) error {
		if !slices.Contains(fwd, r.Verdict) {
			return nil
		}
		ioff, _ := l3Start(r.In)
		ooff, _ := l3Start(r.Out)
		i, o := parseIP(r.In[ioff:], 0, r.GSO), parseIP(r.Out[ooff:], 0, r.GSO)
		if i == nil || o == nil {
			return fmt.Errorf("forwarded a packet that is not IP")
		}
		inTTL, outTTL := ttlOf(r.In), ttlOf(r.Out)
		switch {
		case (o.proto == ProtoICMP || o.proto == ProtoICMPv6) && i.proto != o.proto:
			if !bytes.Equal(r.Out[0:6], r.In[6:12]) || !bytes.Equal(r.Out[6:12], r.In[0:6]) {
				return fmt.Errorf("an ICMP answer leaves with MACs %x -> %x; the packet came %x -> %x", r.Out[6:12], r.Out[0:6], r.In[6:12], r.In[0:6])
			}
			return nil
		case (o.proto == ProtoIPIP || o.proto == ProtoIPv6) && i.proto != o.proto:
			if inner := ttlOf(append(append([]byte{}, r.Out[:ooff]...), r.Out[ooff+o.hlen:]...)); inner != inTTL || inTTL <= 1 {
				return fmt.Errorf("encapsulated with inner TTL %d, the packet arrived with %d", inner, inTTL)
			}
		default:
			if inTTL <= 1 || outTTL != inTTL-1 {
				return fmt.Errorf("forwarded with TTL %d, it arrived with %d", outTTL, inTTL)
			}
		}
		macsKept := bytes.Equal(r.Out[:12], r.In[:12])
		neigh := bytes.Equal(r.Out[0:6], n.gwMAC) || bytes.Equal(r.Out[0:6], n.cliMAC)
		pod := (bytes.Equal(r.Out[0:6], n.podAMAC) && bytes.Equal(r.Out[6:12], n.hostAMAC)) ||
			(bytes.Equal(r.Out[0:6], n.podBMAC) && bytes.Equal(r.Out[6:12], n.hostBMAC))
		if !(bytes.Equal(r.Out[6:12], n.upMAC) && neigh) && !(macsKept && r.Verdict == TCActRedirect) && !(pod && r.Verdict == TCActRedirect) {
			return fmt.Errorf("forwarded with MACs %x -> %x: neither the uplink's to a neighbour's, a local pod's (tc), nor (bpf_redirect_neigh) as it came", r.Out[6:12], r.Out[0:6])
		}
		return nil
	}
}

// edtCheck: the EDT program never changes a packet, and a departure time it
// sets lies between the run and the horizon.
func (n *node) edtCheck(r *Run) error {
	if !bytes.Equal(r.In, r.Out) {
		return fmt.Errorf("the packet was changed:\n in  %x\n out %x", r.In, r.Out)
	}
	if r.Tstamp != 0 && (r.Tstamp < r.Before || r.Tstamp > r.After+uint64(n.horizon)) {
		return fmt.Errorf("departure time %d outside [%d, %d + horizon %s]", r.Tstamp, r.Before, r.After, n.horizon)
	}
	return nil
}

// decapCheck: axon_lb_decap leaves a packet alone or removes exactly the
// outer IPv4 (20 bytes) or IPv6 (40 bytes) header, Ethernet header kept.
func decapCheck(r *Run) error {
	if bytes.Equal(r.In, r.Out) {
		return nil
	}
	for _, hl := range []int{20, 40} {
		if len(r.In) == len(r.Out)+hl && bytes.Equal(r.In[:14], r.Out[:14]) && bytes.Equal(r.In[14+hl:], r.Out[14:]) {
			return nil
		}
	}
	return fmt.Errorf("the output is neither the input nor the input without its outer header:\n out %x", r.Out)
}

func envInt(t testing.TB, name string, def uint64) uint64 {
	t.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		t.Fatalf("%s=%q: want a whole number", name, s)
	}
	return v
}

// stream is the target's random stream: from its name, so a pass of one
// program (AXON_FUZZ_ONLY) makes the same packets as in the full pass.
func stream(name string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	return h.Sum64()
}

// TestFuzzDatapath runs every tc and XDP program of the node through
// BPF_PROG_TEST_RUN with random and mutated packets (make test: 20 000 per
// program; make fuzz: 1 000 000), checking every run and, after every
// batch, the counters and the maps. AXON_FUZZ_REPLAY=<program>:<hex>[:gso]
// runs one packet a failure printed, on a fresh node.
func TestFuzzDatapath(t *testing.T) {
	n := newNode(t)
	var targets []*Target
	if err := n.inNetns(t, func() error {
		if err := n.openFlows(); err != nil {
			return err
		}
		if err := n.openPodLBFlows(); err != nil {
			return err
		}
		targets = n.targets(t)
		return n.invariants()
	}); err != nil {
		t.Fatal(err)
	}
	if r := os.Getenv(envReplay); r != "" {
		replay(t, n, targets, r)
		return
	}
	packets := int(envInt(t, envPackets, 0))
	if packets == 0 {
		packets = defaultPackets / int(envInt(t, "AXON_TEST_SLOWDOWN", 1)) // the kernel matrix's VMs under TCG
	}
	seed := envInt(t, envSeed, 1)
	only := onlyTargets()
	t.Logf("seed %d, %d packets per program (%s, %s)", seed, packets, envSeed, envPackets)
	for _, tg := range targets {
		if len(only) > 0 && !only[tg.Name] {
			continue
		}
		t.Run(tg.Name, func(t *testing.T) {
			var st *Stats
			n.checked = invStats{}
			defer func() {
				t.Logf("map invariants: %d runs over %d SNAT and %d local CT entries, %d NAT entries", n.checked.runs, n.checked.snat, n.checked.local, n.checked.nat)
			}()
			err := n.inNetns(t, func() error {
				var err error
				st, err = Execute(tg, Config{Packets: packets, Seed: seed, Stream: stream(tg.Name)})
				return err
			})
			if st != nil {
				t.Log(st.Report(n.counterNames(t, counterPrefixes[tg.Name]...)))
			}
			if err != nil {
				t.Fatal(err)
			}
			if st.Rewritten == 0 && tg.Name != "uplink_egress" {
				t.Errorf("no packet came out rewritten: the fuzzer never reached the program's rewriting paths")
			}
		})
	}
}

// onlyTargets: the programs AXON_FUZZ_ONLY names (empty: all).
func onlyTargets() map[string]bool {
	only := map[string]bool{}
	for _, s := range strings.Split(os.Getenv(envOnly), ",") {
		if s != "" {
			only[s] = true
		}
	}
	return only
}

func replay(t *testing.T, n *node, targets []*Target, spec string) {
	name, hx, ok := strings.Cut(spec, ":")
	hx, gsoFlag, _ := strings.Cut(hx, ":")
	pkt, err := hex.DecodeString(hx)
	if !ok || err != nil || (gsoFlag != "" && gsoFlag != "gso") {
		t.Fatalf("%s=%q: want <program>:<hex packet>[:gso]", envReplay, spec)
	}
	for _, tg := range targets {
		if tg.Name != name {
			continue
		}
		var run *Run
		err := n.inNetns(t, func() error {
			var err error
			run, err = RunOne(tg, pkt, gsoFlag == "gso")
			if err == nil {
				err = n.invariants()
			}
			return err
		})
		if run != nil {
			t.Logf("%s: verdict %s, output %x", name, tg.Verdicts[run.Verdict], run.Out)
		}
		if err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatalf("%s: no program %q", envReplay, name)
}

// FuzzDatapath is the go test -fuzz target over every program: an input
// is the program (its index in the node's list; AXON_FUZZ_ONLY keeps the
// named ones), a frame and whether it runs as a GSO skb; every run gets the
// per-packet rules and the map invariants. The corpus is every program's
// seeds. Without -fuzz it runs the corpus as a test. Build the test binary
// once (go test -c: -fuzz instruments every dependency, minutes of
// compiling) and run it in the package dir:
//
//	go test -c -o /tmp/fuzz.test ./internal/datapath/fuzz
//	cd internal/datapath/fuzz && /tmp/fuzz.test -test.run '^$' -test.fuzz FuzzDatapath -test.fuzztime 60s -test.parallel 1
func FuzzDatapath(f *testing.F) {
	n := newNode(f)
	var targets []*Target
	if err := n.inNetns(f, func() error {
		if err := n.openFlows(); err != nil {
			return err
		}
		targets = n.targets(f)
		return nil
	}); err != nil {
		f.Fatal(err)
	}
	only := onlyTargets()
	for i, tg := range targets {
		for j, s := range tg.Seeds {
			f.Add(uint8(i), s, j%8 == 0)
		}
	}
	f.Fuzz(func(t *testing.T, prog uint8, pkt []byte, gso bool) {
		tg := targets[int(prog)%len(targets)]
		if len(pkt) < minFrame || (len(only) > 0 && !only[tg.Name]) {
			return // BPF_PROG_TEST_RUN refuses frames without an Ethernet header
		}
		err := n.inNetns(t, func() error {
			_, err := RunOne(tg, pkt, gso)
			if err == nil {
				err = n.invariants()
			}
			return err
		})
		if errors.Is(err, errRefused) {
			return // a frame the kernel's test run does not take (refusable)
		}
		if err != nil {
			t.Fatal(&Failure{Target: tg.Name, Packet: pkt, GSO: gso, Err: err})
		}
	})
}
