package main

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/output"
)

// TestMonitorPrinter: what `axon monitor` prints for the stream's
// messages, as text and as JSON lines, and --count stopping it.
func TestMonitorPrinter(t *testing.T) {
	ev := api.DropEvent{Time: time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC), Prog: "lb_tc", Reason: "drop_no_backend",
		Direction: "ingress", Ifindex: 2, Len: 49, Proto: "udp", Src: netip.MustParseAddr("198.18.0.250"), SrcPort: 40000,
		Dst: netip.MustParseAddr("192.0.2.50"), DstPort: 53, Pod: "default/web-0"}
	sock := api.DropEvent{Prog: "sock_lb", Reason: "drop_no_backend", Direction: "egress", Proto: "tcp",
		Dst: netip.MustParseAddr("10.96.0.77"), DstPort: 80}
	msgs := []api.MonitorMessage{{Lost: &api.MonitorLost{}}, {Event: &ev}, {Lost: &api.MonitorLost{Stream: 2, Ring: 1}}, {Event: &sock}}

	t.Run("text", func(t *testing.T) {
		var out, errw bytes.Buffer
		p := &monitorPrinter{w: &out, errw: &errw, done: func() {}}
		for _, m := range msgs {
			if err := p.print(m); err != nil {
				t.Fatal(err)
			}
		}
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		if len(lines) != 2 {
			t.Fatalf("%d lines, want 2:\n%s", len(lines), out.String())
		}
		for _, want := range []string{"drop_no_backend", "ingress", "lb_tc", "if=2", "udp", "198.18.0.250:40000 -> 192.0.2.50:53", "len=49", "pod=default/web-0"} {
			if !strings.Contains(lines[0], want) {
				t.Errorf("line %q lacks %q", lines[0], want)
			}
		}
		if !strings.Contains(lines[1], "? -> 10.96.0.77:80") || !strings.Contains(lines[1], "sock_lb") {
			t.Errorf("socket LB line %q", lines[1])
		}
		if e := errw.String(); !strings.Contains(e, "listening") || !strings.Contains(e, "lost events: 2 (this stream too slow), 1 (kernel ring buffer full)") {
			t.Errorf("stderr %q: want the listening note and the lost counts", e)
		}
	})
	t.Run("json", func(t *testing.T) {
		var out bytes.Buffer
		p := &monitorPrinter{w: &out, errw: &out, json: true, done: func() {}}
		for _, m := range msgs {
			if err := p.print(m); err != nil {
				t.Fatal(err)
			}
		}
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		if len(lines) != 3 {
			t.Fatalf("%d lines, want 3 (two events, one lost count):\n%s", len(lines), out.String())
		}
		var got api.DropEvent
		if err := json.Unmarshal([]byte(lines[0]), &got); err != nil || got != ev {
			t.Errorf("first line %s decodes to %+v (%v), want %+v", lines[0], got, err, ev)
		}
		if !strings.Contains(lines[1], `"lost":{"stream":2,"ring":1}`) {
			t.Errorf("lost line %s", lines[1])
		}
	})
	t.Run("yaml and jsonpath", func(t *testing.T) {
		for _, tc := range []struct{ o, want string }{
			{"yaml", "---\ndirection: ingress\n"},
			{"jsonpath={.reason} {.dst}", "drop_no_backend 192.0.2.50\ndrop_no_backend 10.96.0.77\n"},
		} {
			f, err := output.Parse(tc.o)
			if err != nil {
				t.Fatal(err)
			}
			var out, errw bytes.Buffer
			p := &monitorPrinter{w: &out, errw: &errw, write: eventWriter(&out, tc.o, f), done: func() {}}
			for _, m := range msgs {
				if err := p.print(m); err != nil {
					t.Fatal(err)
				}
			}
			if !strings.HasPrefix(out.String(), tc.want) || (tc.o == "yaml" && strings.Count(out.String(), "---\n") != 2) {
				t.Errorf("-o %s printed %q, want it to start with %q (one document per event)", tc.o, out.String(), tc.want)
			}
			if !strings.Contains(errw.String(), "lost events: 2") {
				t.Errorf("-o %s: lost counts %q not on stderr", tc.o, errw.String())
			}
		}
	})
	t.Run("count", func(t *testing.T) {
		stopped := 0
		p := &monitorPrinter{w: &bytes.Buffer{}, errw: &bytes.Buffer{}, count: 1, done: func() { stopped++ }}
		for _, m := range msgs {
			_ = p.print(m)
		}
		if stopped == 0 {
			t.Error("--count 1 did not stop the stream after one event")
		}
	})
}
