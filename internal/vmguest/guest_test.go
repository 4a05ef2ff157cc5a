package vmguest

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/axonhq/axon/internal/bench"
)

// TestGuestBridgeAndBypass boots a real guest in a KubeVirt-style virt-launcher pod and
// checks it from an ordinary pod behind the node: ping and qperf over the bridge (no
// bypass), over the bypass with the bridge unable to forward (its ports isolated: the
// bypass's counters moved by at least the pings), and, as the negative check, neither
// (the pings leave the node toward the pod and go unanswered), then the bridge again.
// The guest also pings the peer pod and, over IPv6, the node's link-local address
// (neighbour discovery, then ICMPv6), and reaches a ClusterIP backed by the peer pod through
// the VM pod's pod LB (busybox nc in the guest), in both arms.
func TestGuestBridgeAndBypass(t *testing.T) {
	l := newVMLab(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	ll := l.nodeLinkLocal()
	clusterIP := l.serviceToPeer()
	guestPings := func(arm string) {
		t.Helper()
		// IPv4 to the peer pod through the node; IPv6 (neighbour discovery, then ICMPv6) to the
		// node's link-local address on the VM pod's link.
		for _, cmd := range []string{"ping -c 2 -w 15 " + peerAddr.String(), "ping6 -c 2 -w 15 -I eth0 " + ll} {
			if out, rc, err := l.guest.Run(cmd, 20*time.Second); err != nil || rc != 0 {
				t.Fatalf("%s: the guest's %q: rc %d, %v:\n%s", arm, cmd, rc, err, out)
			}
		}
		// A ClusterIP whose backend is the peer pod, through the VM pod's pod LB.
		before := l.podLBCounters()
		cmd := "nc -w 10 " + clusterIP.Addr().String() + " " + strconv.Itoa(int(clusterIP.Port())) + " </dev/null"
		if out, rc, err := l.guest.Run(cmd, 20*time.Second); err != nil || rc != 0 || !strings.Contains(out, peerAnswer) {
			t.Fatalf("%s: the guest's %q: rc %d, %v, output %q, want %q", arm, cmd, rc, err, out, peerAnswer)
		}
		after := l.podLBCounters()
		if after["new"] != before["new"]+1 || after["reply"] <= before["reply"] {
			t.Errorf("%s: pod LB counters %v -> %v: want the guest's flow translated both ways", arm, before, after)
		}
		t.Logf("%s: ClusterIP %s from the guest answered by the peer pod; pod LB new +%d, hit +%d, reply +%d", arm, clusterIP,
			after["new"]-before["new"], after["hit"]-before["hit"], after["reply"]-before["reply"])
	}
	qperfOK := func(arm string) {
		t.Helper()
		out, err := l.qperf(ctx, "-t", "1", "-m", "64", "udp_lat", "tcp_lat")
		if err != nil {
			t.Fatalf("%s: %v", arm, err)
		}
		res, err := bench.ParseQperf([]byte(out))
		if err != nil || len(res) != 2 || res[0].LatencyNs <= 0 || res[1].LatencyNs <= 0 {
			t.Fatalf("%s: qperf: %v: %s", arm, err, out)
		}
		t.Logf("%s: udp_lat %.1f µs, tcp_lat %.1f µs", arm, res[0].LatencyNs/1e3, res[1].LatencyNs/1e3)
	}

	// The bridge path: no bypass.
	if got := l.ping(5, true); got != 5 {
		t.Fatalf("bridge: %d of 5 pings answered", got)
	}
	guestPings("bridge")
	qperfOK("bridge")
	if _, err := l.b.Stats(l.id, l.launcherPath); err == nil {
		t.Fatal("Stats of a bypass never attached did not fail")
	}

	// The bypass, with the bridge unable to forward between its ports.
	l.isolate(true)
	l.setBypass(true)
	before := l.counters()
	if got := l.ping(5, true); got != 5 {
		t.Fatalf("bypass: %d of 5 pings answered", got)
	}
	guestPings("bypass")
	qperfOK("bypass")
	after := l.counters()
	for _, c := range []string{"tap_frames", "pod_frames"} {
		if d := after[c] - before[c]; d < 9 { // 5 pings one way + 2 + 2 (IPv6) the other, each answered
			t.Errorf("bypass counter %s moved by %d, want at least 9", c, d)
		}
	}
	t.Logf("bypass counters moved: tap_frames +%d, pod_frames +%d", after["tap_frames"]-before["tap_frames"], after["pod_frames"]-before["pod_frames"])

	// Neither: the node sends the pings into the pod, nothing carries them to the guest.
	l.setBypass(false)
	tx := linkTx(t, l.node, "vmhost")
	if got := l.ping(3, false); got != 0 {
		t.Fatalf("isolated bridge without the bypass: %d of 3 pings answered, want none", got)
	}
	if d := linkTx(t, l.node, "vmhost") - tx; d < 3 {
		t.Fatalf("the node sent %d frames toward the VM pod, want at least the 3 pings", d)
	}

	// The bridge again.
	l.isolate(false)
	if got := l.ping(3, true); got != 3 {
		t.Fatalf("bridge after the bypass: %d of 3 pings answered", got)
	}
	qperfOK("bridge again")
}
