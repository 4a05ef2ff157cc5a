package northsouth

// The forwarding-rate part of the north-south benchmark: the measurement
// behind Cilium's "XDP ≈ 5× kube-proxy iptables" (a pktgen hairpin test:
// inbound pps to a NodePort whose backend is on another node, and
// the forwarding node's CPU per packet), made on the lab's veth wire.
//
//	generator (wire netns, CPU 0) ──XDP frames──▶ w-node2 ─▶ node2 eth0 ring
//	    node2's receive NAPI thread, alone on CPU 1: XDP LB + XDP_TX,
//	    or tc LB, or iptables/nftables DNAT+SNAT and IP forwarding
//	node2 eth0 transmit ──▶ w-node2 ring ─▶ sink (counts + drops, CPU 0)
//
// The generator (internal/pktgen) writes 64-byte UDP frames from the
// external client's addresses to node2's NodePort straight into node2's
// receive ring, as a NIC's DMA would, and the sink counts what node2
// forwarded toward the backend (the DNAT'd destination port) at the wire
// port, before it goes further. node2's receive processing runs in threaded
// NAPI pinned to CPU 1, so its CPU time is exactly the cost of forwarding:
// nothing else of the benchmark runs there. The sink's thread runs with
// SCHED_FIFO on CPU 0, next to the generator, so node2's transmit ring
// never fills (a full ring would be forwarding work that the count misses).
//
// Equal conditions for every configuration: node2's eth0 gets GRO on (a
// veth needs GRO or an XDP program for a NAPI ring; NICs run GRO by default)
// and TSO off (veth hands a transmit from a TSO-capable device to the
// peer's per-CPU backlog instead of its ring, which would run the sink's and
// node1's work on CPU 1 too). It is done after the connection and iperf3
// samples, which see the lab as `up` made it.
//
// The floor (Config.Floor): the trivial XDP forwarder (pktgen.Forwarder) in
// place of any LB on node2's eth0, offered what the LB sends on (the
// backend's address and port, from the same client addresses) and sending it
// to the LB's next hop (node1's eth0: the lab routes node1's podCIDR via
// node1): what an XDP program that forwards without any lookup costs on this
// wire, so the LB's row reads against the limit, not only against iptables.

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/axonhq/axon/internal/bench"
	"github.com/axonhq/axon/internal/ethtool"
	labpkg "github.com/axonhq/axon/internal/lab"
	"github.com/axonhq/axon/internal/lab/kubeproxy"
	"github.com/axonhq/axon/internal/pktgen"
)

// Ports of the forwarding measurement: UDP FwdNodePort → nsFwdPort.
const (
	nsFwdPort   = 7001
	FwdNodePort = 30092
	nsFwdFlows  = 16 // client source ports 40000…
	nsFwdWarmup = 300 * time.Millisecond
	// CPUs: the entry node's receive thread alone on one, the rest on the other.
	nsFwdEntryCPU = 1
	nsFwdOtherCPU = 0
)

// nsFwd is one forwarding-rate sample.
type nsFwd struct {
	OfferedPPS   float64 // frames the generator offered per second
	RxPPS        float64 // frames the entry node took from its ring per second
	PPS          float64 // packets forwarded toward the backend per second
	NsPerPacket  float64 // entry node CPU (its receive threads) per forwarded packet
	Busy         float64 // entry node receive threads' CPU over the wall time (1 = one CPU)
	Entry, Other []int   // NAPI thread PIDs: entry node eth0, wire port
}

// measureForwarding sets the lab up for the forwarding measurement (see the
// file comment) and measures for d.
func measureForwarding(ctx context.Context, st labpkg.State, entry labpkg.Node, backend labpkg.Pod, floor bool, d time.Duration) (nsFwd, error) {
	var r nsFwd
	port := labpkg.WirePort(entry.Name)
	var entryLink, extLink, nextHop netlink.Link
	if err := ns.WithNetNSPath("/run/netns/"+entry.Netns, func(ns.NetNS) error {
		for _, f := range []struct {
			feature ethtool.Feature
			on      bool
		}{{ethtool.GRO, true}, {ethtool.TSO, false}} {
			// Only what differs: a veth whose peer runs XDP has TSO off and
			// fixed (setting it fails with EOPNOTSUPP).
			if on, err := ethtool.Get(labpkg.Uplink, f.feature); err != nil || on == f.on {
				if err != nil {
					return err
				}
				continue
			}
			if err := ethtool.Set(labpkg.Uplink, f.feature, f.on); err != nil {
				return err
			}
		}
		var err error
		entryLink, err = netlink.LinkByName(labpkg.Uplink)
		return err
	}); err != nil {
		return r, fmt.Errorf("prepare %s's %s: %w", entry.Name, labpkg.Uplink, err)
	}
	if err := ns.WithNetNSPath("/run/netns/"+st.External.Netns, func(ns.NetNS) (err error) {
		extLink, err = netlink.LinkByName(labpkg.Uplink)
		return err
	}); err != nil {
		return r, fmt.Errorf("find the external client's %s: %w", labpkg.Uplink, err)
	}
	dst := netip.AddrPortFrom(entry.IP, FwdNodePort)
	if floor {
		dst = netip.AddrPortFrom(backend.IP, nsFwdPort)
		hop, ok := st.Node(backend.Node)
		if !ok {
			return r, fmt.Errorf("no lab node %q (the backend's)", backend.Node)
		}
		if err := ns.WithNetNSPath("/run/netns/"+hop.Netns, func(ns.NetNS) (err error) {
			nextHop, err = netlink.LinkByName(labpkg.Uplink)
			return err
		}); err != nil {
			return r, fmt.Errorf("find the next hop %s's %s: %w", hop.Name, labpkg.Uplink, err)
		}
		fw, err := pktgen.AttachForwarder(entry.Netns, labpkg.Uplink, nextHop.Attrs().HardwareAddr, entryLink.Attrs().HardwareAddr)
		if err != nil {
			return r, err
		}
		defer fw.Close()
	}

	sink, err := pktgen.AttachSink(labpkg.WireNetns, port, nsFwdPort)
	if err != nil {
		return r, err
	}
	defer sink.Close()
	if r.Entry, err = pktgen.ThreadedNAPI(entry.Netns, labpkg.Uplink); err != nil {
		return r, err
	}
	if r.Other, err = pktgen.ThreadedNAPI(labpkg.WireNetns, port); err != nil {
		return r, err
	}
	for _, pid := range r.Entry {
		if err := pktgen.Pin(pid, nsFwdEntryCPU); err != nil {
			return r, err
		}
	}
	for _, pid := range r.Other {
		if err := pktgen.Pin(pid, nsFwdOtherCPU); err != nil {
			return r, err
		}
		if err := pktgen.SetFIFO(pid, 1); err != nil {
			return r, err
		}
		defer func() { _ = pktgen.SetFIFO(pid, 0) }() // the thread goes with the lab anyway
	}

	var frames [][]byte
	for i := range nsFwdFlows {
		f, err := pktgen.UDP4{SrcMAC: extLink.Attrs().HardwareAddr, DstMAC: entryLink.Attrs().HardwareAddr,
			Src: netip.AddrPortFrom(st.External.IP, uint16(40000+i)), Dst: dst}.Frame()
		if err != nil {
			return r, err
		}
		frames = append(frames, f)
	}
	gen, err := pktgen.NewGenerator(labpkg.WireNetns, port)
	if err != nil {
		return r, err
	}
	defer gen.Close()
	// Warm-up: conntrack entries, the entry node's neighbour entry for node1.
	if _, err := gen.Run(ctx, frames, nsFwdWarmup, nsFwdOtherCPU); err != nil {
		return r, err
	}
	time.Sleep(50 * time.Millisecond)

	type snap struct {
		fwd, rx uint64
		cpu     time.Duration
	}
	read := func() (snap, error) {
		var s snap
		var err error
		if s.fwd, err = sink.Count(); err != nil {
			return s, err
		}
		for _, pid := range r.Entry {
			c, err := pktgen.CPUTime(pid)
			if err != nil {
				return s, err
			}
			s.cpu += c
		}
		err = ns.WithNetNSPath("/run/netns/"+entry.Netns, func(ns.NetNS) error {
			l, err := netlink.LinkByName(labpkg.Uplink)
			if err == nil {
				s.rx = l.Attrs().Statistics.RxPackets
			}
			return err
		})
		return s, err
	}
	s0, err := read()
	if err != nil {
		return r, err
	}
	t0 := time.Now()
	res, err := gen.Run(ctx, frames, d, nsFwdOtherCPU)
	if err != nil {
		return r, err
	}
	time.Sleep(20 * time.Millisecond) // the rings drain; nothing is offered any more
	wall := time.Since(t0)
	s1, err := read()
	if err != nil {
		return r, err
	}
	fwd := float64(s1.fwd - s0.fwd)
	if fwd == 0 {
		// what reached the entry node at all, so the error tells the
		// generator's and the wire's part from the LB's
		seen := fmt.Sprintf("%d frames offered, %d received by %s's %s", res.Sent, s1.rx-s0.rx, entry.Name, labpkg.Uplink)
		if floor {
			return r, fmt.Errorf("the XDP forwarder forwarded no packet (%s)", seen)
		}
		return r, fmt.Errorf("no packet was forwarded to the backend (is the UDP NodePort programmed?; %s); %s's LB: %s",
			seen, entry.Name, lbVerdicts(ctx, entry))
	}
	secs := res.Elapsed.Seconds()
	r.OfferedPPS = res.PPS()
	r.RxPPS = float64(s1.rx-s0.rx) / secs
	r.PPS = fwd / secs
	r.NsPerPacket = float64(s1.cpu-s0.cpu) / fwd
	r.Busy = float64(s1.cpu-s0.cpu) / float64(wall)
	return r, nil
}

// lbVerdicts lists what the axon agent's north-south LB on node did with
// the packets it saw since its lab came up (axon_nodeport_packets_total by
// hook and reason, the non-zero ones), for a failed measurement's error;
// the reason it could not be read otherwise.
func lbVerdicts(ctx context.Context, node labpkg.Node) string {
	body, err := kubeproxy.HTTPGetOK(ctx, "/run/netns/"+node.Netns, labpkg.AgentMetricsAddr, "/metrics")
	if err != nil {
		return "counters not read: " + err.Error()
	}
	fams, err := bench.MetricFamilies(bytes.NewReader(body))
	if err != nil {
		return "counters not read: " + err.Error()
	}
	var out []string
	for _, m := range fams["axon_nodeport_packets_total"].GetMetric() {
		if v := bench.MetricValue(m); v > 0 {
			var hook, reason string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "hook":
					hook = l.GetValue()
				case "reason":
					reason = l.GetValue()
				}
			}
			out = append(out, fmt.Sprintf("%s/%s %.0f", hook, reason, v))
		}
	}
	if len(out) == 0 {
		return "no packet counted (axon_nodeport_packets_total all 0)"
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}
