package vmguest

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestGuestSwitchUnderTraffic switches the bypass on and off under a ping stream from
// the ordinary pod to the real guest (300 at 100 per second): bridge, bypass (attached
// after 0.7 s), bridge again (detached mid-stream once 20 frames crossed the bypass each
// way). Not one ping may be lost beyond the switch-overs: the bridge takes the guest's
// frames back at once (the bypass's counters moved in between, so the stream did cross it).
func TestGuestSwitchUnderTraffic(t *testing.T) {
	l := newVMLab(t)
	const (
		interval = 10 * time.Millisecond
		count    = 300
	)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "nsenter", "--net="+l.peerPath, "ping", "-n", "-i", fmt.Sprint(interval.Seconds()),
		"-c", fmt.Sprint(count), "-W", "2", guestAddr.Addr().String())
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(700 * time.Millisecond)
	attachAt := time.Since(start)
	l.setBypass(true)
	// Detach once the stream has crossed the bypass both ways for a while (20 frames: about
	// 0.2 s of pings on a quiet host; a loaded one sends them slower).
	var mid map[string]uint64
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		mid = l.counters()
		if mid["pod_frames"] >= 20 && mid["tap_frames"] >= 20 || time.Now().After(deadline) {
			break
		}
	}
	detachAt := time.Since(start)
	l.setBypass(false)
	err := cmd.Wait()

	seen := map[int]bool{}
	var sent, recv int
	for _, line := range strings.Split(out.String(), "\n") {
		if i := strings.Index(line, "icmp_seq="); i >= 0 {
			var seq int
			fmt.Sscanf(line[i:], "icmp_seq=%d", &seq)
			seen[seq] = true
		}
		if strings.Contains(line, "packets transmitted") {
			fmt.Sscanf(line, "%d packets transmitted, %d received", &sent, &recv)
		}
	}
	var lost []int
	for seq := 1; seq <= sent; seq++ {
		if !seen[seq] {
			lost = append(lost, seq)
		}
	}
	t.Logf("%d pings sent, %d answered in %s; bypass attached at %s, detached at %s; it redirected %d frames to the guest and %d from it",
		sent, recv, time.Since(start).Round(time.Millisecond), attachAt.Round(time.Millisecond), detachAt.Round(time.Millisecond),
		mid["pod_frames"], mid["tap_frames"])
	if sent != count {
		t.Fatalf("ping sent %d of %d (%v):\n%s", sent, count, err, tail(out.String(), 5))
	}
	if mid["pod_frames"] < 20 || mid["tap_frames"] < 20 {
		t.Fatalf("the bypass carried %d/%d frames in 20 s of pings: the stream did not cross it", mid["pod_frames"], mid["tap_frames"])
	}
	if len(lost) > 0 {
		t.Fatalf("%d pings lost (icmp_seq %v) across the switch-overs", len(lost), lost)
	}
}
