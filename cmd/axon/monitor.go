package main

// `axon monitor`: the node's drops as they happen, streamed from the agent
// (GET /v1/monitor), like `cilium monitor --type drop`.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/output"
)

func newMonitorCmd() *cobra.Command {
	var f agentFlags
	var filter api.MonitorFilter
	var reasons []string
	var count int
	cmd := &cobra.Command{
		Use:   "monitor",
		Short: "Stream the node's packet drops with their reason",
		Long: "Stream every packet the node's BPF programs drop, and every connect the socket\n" +
			"LB refuses, with its reason, program, direction, device, addresses and ports,\n" +
			"until interrupted. The programs write drop events only while a monitor runs.\n" +
			"Filters: --pod namespace/name (its addresses or its device), --reason (repeat or\n" +
			"comma-separate; the reasons are listed in docs/operate.md), --protocol.\n" +
			"Events the stream missed (the agent's queue or the kernel's ring buffer was\n" +
			"full) are counted and shown. -o json prints one JSON object a line, -o yaml one\n" +
			"document per event, -o jsonpath='{...}' the template per event.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.client()
			if err != nil {
				return err
			}
			for _, r := range reasons {
				for _, x := range strings.Split(r, ",") {
					if x = strings.TrimSpace(x); x != "" {
						filter.Reasons = append(filter.Reasons, x)
					}
				}
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			ctx, cancel := context.WithCancel(ctx)
			defer cancel()
			p := &monitorPrinter{w: cmd.OutOrStdout(), errw: cmd.ErrOrStderr(), json: f.out.raw == "json", count: count, done: cancel}
			if f.out.structured() && !p.json {
				p.write = eventWriter(p.w, f.out.raw, f.out.format)
			}
			return c.Monitor(ctx, filter, p.print)
		},
	}
	f.register(cmd)
	cmd.Flags().StringVar(&filter.Pod, "pod", "", "only drops of this local pod (namespace/name)")
	cmd.Flags().StringSliceVar(&reasons, "reason", nil, "only these drop reasons (drop_no_backend, drop_spoof_src, ...)")
	cmd.Flags().StringVar(&filter.Protocol, "protocol", "", "only this protocol: "+strings.Join(api.MonitorProtocols, ", "))
	cmd.Flags().IntVarP(&count, "count", "c", 0, "stop after this many events (0: until interrupted)")
	return cmd
}

// eventWriter prints one event at a time in -o yaml (one document each) or
// -o jsonpath (the template each, one a line) through the shared helper.
func eventWriter(w io.Writer, raw string, format output.Format) func(v any) error {
	yaml := raw == "yaml"
	return func(v any) error {
		if yaml {
			fmt.Fprintln(w, "---")
		}
		if err := format.Write(w, v); err != nil {
			return err
		}
		if !yaml {
			fmt.Fprintln(w)
		}
		return nil
	}
}

// monitorPrinter writes the stream's messages as text or JSON lines.
type monitorPrinter struct {
	w, errw io.Writer
	json    bool              // JSON lines
	write   func(v any) error // -o yaml or jsonpath: each event through the shared output helper
	count   int               // events left to print, 0: no limit
	seen    int
	done    func()
	lost    api.MonitorLost
}

func (p *monitorPrinter) print(m api.MonitorMessage) error {
	switch {
	case m.Event != nil:
		if p.json {
			b, err := json.Marshal(m.Event)
			if err != nil {
				return err
			}
			fmt.Fprintf(p.w, "%s\n", b)
		} else if p.write != nil {
			if err := p.write(m.Event); err != nil {
				return err
			}
		} else {
			fmt.Fprintln(p.w, formatDropEvent(*m.Event))
		}
		p.seen++
		if p.count > 0 && p.seen >= p.count {
			p.done()
		}
	case m.Lost != nil && *m.Lost != p.lost:
		p.lost = *m.Lost
		if p.json {
			b, _ := json.Marshal(map[string]any{"lost": p.lost})
			fmt.Fprintf(p.w, "%s\n", b)
		} else {
			fmt.Fprintf(p.errw, "lost events: %d (this stream too slow), %d (kernel ring buffer full)\n", p.lost.Stream, p.lost.Ring)
		}
	case m.Lost != nil && !p.json && p.seen == 0:
		fmt.Fprintln(p.errw, "listening for drops (Ctrl-C to stop)")
	}
	return nil
}

func formatDropEvent(e api.DropEvent) string {
	ep := func(a netip.Addr, port uint16) string {
		if !a.IsValid() {
			return "?"
		}
		if port == 0 {
			return a.String()
		}
		return netip.AddrPortFrom(a, port).String()
	}
	s := fmt.Sprintf("%s %-18s %-7s %-14s if=%-3d %-6s %s -> %s len=%d",
		e.Time.Format("15:04:05.000000"), e.Reason, e.Direction, e.Prog, e.Ifindex, dash(e.Proto),
		ep(e.Src, e.SrcPort), ep(e.Dst, e.DstPort), e.Len)
	if e.Pod != "" {
		s += " pod=" + e.Pod
	}
	return s
}
