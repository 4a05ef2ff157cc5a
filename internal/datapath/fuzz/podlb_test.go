package fuzz

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/axonhq/axon/internal/datapath/podlb"
	"github.com/axonhq/axon/internal/datapath/socklb"
	"github.com/axonhq/axon/internal/lb"
	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/testutil"
)

// The pod LB of pod A (bpf/pod_lb.c): the socket LB loaded on an empty cgroup
// of its own as the writer of the Service maps it reads, and pod A's pod LB
// attached on podA with a small flow table (its evictions run too).
var (
	svc4, svc6     = netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd00:10:96::10")
	svcNone4       = netip.MustParseAddr("10.96.0.11") // a frontend without backends
	podLBID        = "fuzz-pod-a"
	podLBFlowPorts = []uint16{41000, 41001, 41002, 41003}
)

func (n *node) loadPodLB(t testing.TB) {
	t.Helper()
	log := dptest.Logger(t)
	cg, _ := testutil.NewCgroup(t, "axt-fuzz-")
	s, err := socklb.Load(n.pin, cg, log)
	if err != nil {
		t.Fatal(err)
	}
	n.sock = s
	t.Cleanup(func() { // before the cgroup goes
		n.plbEgress.Close()
		n.plbReplies.Close()
		if err := podlb.Uninstall(n.pin, []string{netnsutil.Path(n.ns)}); err != nil {
			t.Errorf("pod LB uninstall: %v", err)
		}
		s.Close()
		if err := socklb.Uninstall(n.pin, cg); err != nil {
			t.Errorf("socket LB uninstall: %v", err)
		}
	})
	fe := func(a netip.Addr, port uint16, proto lb.Proto, bes ...netip.AddrPort) lb.Frontend {
		f := lb.Frontend{Key: lb.FrontendKey{Addr: a, Port: port, Proto: proto, Scope: lb.ScopeCluster}}
		for _, b := range bes {
			f.Backends = append(f.Backends, lb.Backend{Addr: b.Addr(), Port: b.Port(), State: lb.Active})
		}
		return f
	}
	for _, f := range []lb.Frontend{
		fe(svc4, 80, lb.TCP, ap(podB4, 80), ap(remote4, 8080)),
		fe(svc4, 53, lb.UDP, ap(podB4, 53)),
		fe(svc6, 80, lb.TCP, ap(podB6, 80)),
		fe(svcNone4, 80, lb.TCP),
	} {
		if err := s.UpsertFrontend(f); err != nil {
			t.Fatal(err)
		}
	}
	plb, err := podlb.New(podlb.Config{PinDir: n.pin, CTSize: 64, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	if err := plb.Attach(podLBID, netnsutil.Path(n.ns), podlb.Target{Ifname: "podA"}); err != nil {
		t.Fatal(err)
	}
	n.plb = plb
	if n.plbEgress, n.plbReplies, err = plb.Programs(podLBID); err != nil {
		t.Fatal(err)
	}
}

// podLBSeeds: what pod A sends to Services (new flows, later segments, a
// frontend without backends, IPv6) and directly.
func (n *node) podLBSeeds() [][]byte {
	a4, a6 := ap(podA4, podLBFlowPorts[0]), ap(podA6, podLBFlowPorts[0])
	return [][]byte{
		n.fromPod(tcpPkt(a4, ap(svc4, 80), SYN, MSS(1460), nil)),
		n.fromPod(tcpPkt(a4, ap(svc4, 80), ACK|PSH, nil, payload(1400))),
		bigTCP4(n.fromPod(tcpPkt(a4, ap(svc4, 80), ACK|PSH, nil, payload(2800)))),
		n.fromPod(udpPkt(a4, ap(svc4, 53), payload(40))),
		n.fromPod(tcpPkt(a6, ap(svc6, 80), SYN, MSS(1440), nil)),
		n.fromPod(tcpPkt(a6, ap(svc6, 80), FIN|ACK, nil, nil)),
		n.fromPod(tcpPkt(a4, ap(svcNone4, 80), SYN, MSS(1460), nil)),
		n.fromPod(tcpPkt(a4, ap(podB4, 80), SYN, MSS(1460), nil)),
		n.fromPod(udpPkt(a6, ap(podB6, 53), payload(20))),
		n.fromPod(echo(podA4, svc4, 1)),
	}
}

// podLBFlows open pod A's flows to the Services, so replies find entries.
func (n *node) podLBFlows() [][]byte {
	var out [][]byte
	for _, p := range podLBFlowPorts {
		out = append(out,
			n.fromPod(tcpPkt(ap(podA4, p), ap(svc4, 80), SYN, MSS(1460), nil)),
			n.fromPod(udpPkt(ap(podA4, p), ap(svc4, 53), payload(8))),
			n.fromPod(tcpPkt(ap(podA6, p), ap(svc6, 80), SYN, MSS(1440), nil)))
	}
	return out
}

// podLBReplySeeds: the backends' replies to those flows, and strangers.
func (n *node) podLBReplySeeds() [][]byte {
	to := func(ip []byte) []byte { // toward pod A on its interface
		et := uint16(EtherIPv4)
		if ip[0]>>4 == 6 {
			et = EtherIPv6
		}
		return Eth(n.podAMAC, n.hostAMAC, et, ip)
	}
	p := podLBFlowPorts[1]
	return [][]byte{ // the TCP flow's backend is either of two: a reply from each
		to(tcpPkt(ap(podB4, 80), ap(podA4, p), SYN|ACK, MSS(1460), nil)),
		to(tcpPkt(ap(remote4, 8080), ap(podA4, p), ACK|PSH, nil, payload(1400))),
		to(udpPkt(ap(podB4, 53), ap(podA4, p), payload(60))),
		to(tcpPkt(ap(podB6, 80), ap(podA6, p), SYN|ACK, MSS(1440), nil)),
		to(tcpPkt(ap(remote4, 9), ap(podA4, p), ACK, nil, nil)),
	}
}

// openPodLBFlows runs podLBFlows through the egress program.
func (n *node) openPodLBFlows() error {
	for _, pkt := range n.podLBFlows() {
		if _, err := RunOne(&Target{Name: "pod_lb_egress", Prog: n.plbEgress, Ifindex: n.podAIf, Verdicts: tcVerdicts}, pkt, false); err != nil {
			return fmt.Errorf("pod LB flow %x: %w", pkt, err)
		}
	}
	return nil
}

// podLBCounters: pod A's pod LB counters, "podlb.<name>".
func (n *node) podLBCounters(out map[string]uint64) error {
	c, err := n.plb.Counters(podLBID)
	if err != nil {
		return err
	}
	for k, v := range c {
		out["podlb."+k] = v
	}
	return nil
}
