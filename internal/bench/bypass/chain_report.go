package bypass

import (
	"fmt"
	"slices"
	"strings"
)

// chainIntro is the sidecar chain's paragraph of results.md: the path a
// request takes and the original-destination check.
func (r *Report) chainIntro() string {
	var b strings.Builder
	fmt.Fprintf(&b, "Each pod has an HAProxy sidecar (%s) wired as a service mesh wires its proxy: the client pod's outgoing TCP is redirected "+
		"(nat OUTPUT REDIRECT, the proxy's uid %d exempt) to its proxy on 127.0.0.1:%d, which connects to the original destination "+
		"(SO_ORIGINAL_DST); TCP arriving at the server pod is redirected (nat PREROUTING REDIRECT) to its proxy on port %d, which "+
		"connects to the same port on 127.0.0.1. qperf's control and data connections both take the chain:\n\n"+
		"```\n%s (app) ─1─▶ proxy :%d ─2─▶ proxy :%d (%s) ─3─▶ 127.0.0.1 (app)\n```\n\n",
		r.Chain.Proxy, ProxyUID, OutboundPort, InboundPort, r.Client.Name, OutboundPort, InboundPort, r.Server.Name)
	var checks []string
	ok := true
	for _, c := range r.Chain.OrigDst {
		checks = append(checks, fmt.Sprintf("%s → %q from %s", c.Dial, c.Reply, c.Peer))
		ok = ok && c.OK()
	}
	verdict := "passed"
	if !ok {
		verdict = "FAILED"
	}
	fmt.Fprintf(&b, "Original destination kept (checked before measuring, %s): %s.\n\n"+
		"The arms: **chain, bypass** (the pods admitted to the bypass) and **chain, stack** (withdrawn: every hop takes TCP). "+
		"Target: request/response latency ≤ 0.6× the chain without the bypass; throughput has no target (CPU per GB below).\n\n",
		verdict, strings.Join(checks, "; "))
	return b.String()
}

// HopRow summarises one hop of the chain over the measurements' snapshots.
type HopRow struct {
	Hop string
	// Snapshots of the bypass arm that saw sockets of this hop, and over
	// them: sockets seen, in the SOCKHASH, and by mode.
	Snapshots, Sockets, InMap, Bypass, Stack, Undecided int
	// Redirected and Passed are the bytes of the hop's sockets in the map
	// at the snapshots (written through the bypass, through TCP).
	Redirected, Passed uint64
	// StackArmSockets and StackArmInMap: the same for the stack arm (in the
	// map: should be 0).
	StackArmSockets, StackArmInMap int
}

// Verdict is "bypassed" when every socket of the hop the bypass arm saw was
// in the map and none wrote through TCP (a socket that only reads stays
// undecided), "not bypassed" when none wrote through the bypass, else
// "partly".
func (h HopRow) Verdict() string {
	switch {
	case h.Sockets == 0:
		return "n/a (not seen)"
	case h.Bypass == 0:
		return "not bypassed"
	case h.InMap == h.Sockets && h.Stack == 0:
		return "bypassed"
	}
	return "partly"
}

// HopRows summarises the chain's hops, in order.
func (r *Report) HopRows() []HopRow {
	rows := make([]HopRow, len(Hops))
	for i, h := range Hops {
		rows[i].Hop = h
	}
	for _, s := range r.Samples {
		seen := make([]bool, len(Hops))
		for _, h := range s.Hops {
			i := slices.Index(Hops, h.Hop)
			if i < 0 {
				continue
			}
			row := &rows[i]
			if s.Arm == ArmStack {
				row.StackArmSockets++
				if h.InMap {
					row.StackArmInMap++
				}
				continue
			}
			seen[i] = true
			row.Sockets++
			if h.InMap {
				row.InMap++
				row.Redirected += h.RedirectedBytes
				row.Passed += h.PassedBytes
			}
			switch {
			case h.InMap && h.Mode == "bypass":
				row.Bypass++
			case h.InMap && h.Mode == "stack":
				row.Stack++
			case h.InMap && h.Mode == "undecided":
				row.Undecided++
			}
		}
		for i, v := range seen {
			if v {
				rows[i].Snapshots++
			}
		}
	}
	return rows
}

// hopsMarkdown is results.md's section on which hops were bypassed: the
// per-hop summary and one bypass-arm snapshot in full.
func (r *Report) hopsMarkdown() string {
	var b strings.Builder
	b.WriteString("## Which hops were bypassed\n\n")
	b.WriteString("Halfway through every measurement the bench lists the two pods' established TCP sockets (sock_diag: addresses and owner; " +
		"the proxies run as uid " + fmt.Sprint(ProxyUID) + ") and looks each up in the SOCKHASH (its mode and bytes). " +
		"Summed over the bypass arm's snapshots; mode \"stack\": in the map, but its writes take TCP for good " +
		"(its first write found no peer socket in the map, or its peer fell behind: back-pressure); \"(by alias)\": it found its peer by its " +
		"connection's client endpoint, the pairing across a REDIRECT; \"undecided\": it wrote nothing yet (a receiver). " +
		"A hop is bypassed when all its sockets are in the map and none writes through TCP.\n\n")
	b.WriteString("| hop | snapshots | sockets | in SOCKHASH | bypass | stack | undecided | bytes redirected | bytes through TCP | verdict | stack arm: in SOCKHASH |\n" +
		"|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|\n")
	for _, h := range r.HopRows() {
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %d | %d | %d | %d | %s | %d of %d |\n", h.Hop, h.Snapshots, h.Sockets, h.InMap,
			h.Bypass, h.Stack, h.Undecided, h.Redirected, h.Passed, h.Verdict(), h.StackArmInMap, h.StackArmSockets)
	}
	b.WriteString("\n")
	var last *Sample
	var missing []string
	for i := range r.Samples {
		s := &r.Samples[i]
		if s.HopsErr != "" {
			missing = append(missing, fmt.Sprintf("rep %d %s %s %s: %s", s.Rep, s.Test, sizeLabel(s.Size), s.Arm, s.HopsErr))
		}
		if s.Arm == ArmBypass && len(s.Hops) > 0 {
			last = s
		}
	}
	if last != nil {
		fmt.Fprintf(&b, "The last bypass-arm snapshot (rep %d, %s %s):\n\n", last.Rep, last.Test, sizeLabel(last.Size))
		b.WriteString("| hop | pod | owner | local | remote | in SOCKHASH | mode | bytes redirected | bytes through TCP |\n|---|---|---|---|---|---|---|---:|---:|\n")
		hops := slices.Clone(last.Hops)
		slices.SortStableFunc(hops, func(x, y HopSocket) int { return strings.Compare(x.Hop, y.Hop) })
		for _, h := range hops {
			owner := "app"
			if h.Proxy {
				owner = "proxy"
			}
			mode := h.Mode
			if !h.InMap {
				mode = "—"
			} else if h.Alias {
				mode += " (by alias)"
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %d | %d |\n", h.Hop, h.Pod, owner, h.Local, h.Remote, yesNo(h.InMap), mode,
				h.RedirectedBytes, h.PassedBytes)
		}
		b.WriteString("\n")
	}
	if len(missing) > 0 {
		b.WriteString("Snapshots missing: " + strings.Join(missing, "; ") + ".\n\n")
	}
	return b.String()
}

func yesNo(v bool) string {
	if v {
		return "yes"
	}
	return "no"
}

// chainSetup is results.md's record of the sidecars: nat rules, HAProxy
// configurations and command lines.
func (r *Report) chainSetup() string {
	c := r.Chain
	var b strings.Builder
	b.WriteString("\n## Sidecars\n\n")
	fmt.Fprintf(&b, "Client pod %s, nat rules:\n\n```sh\n%s\n```\n\n", r.Client.Name, strings.Join(c.ClientRules, "\n"))
	fmt.Fprintf(&b, "Server pod %s, nat rules:\n\n```sh\n%s\n```\n\n", r.Server.Name, strings.Join(c.ServerRules, "\n"))
	fmt.Fprintf(&b, "Client proxy, in pod %s's cgroup:\n\n```sh\n%s\n```\n\n```\n%s```\n\n", r.Client.Name, c.ClientCmd, c.ClientConfig)
	fmt.Fprintf(&b, "Server proxy, in pod %s's cgroup:\n\n```sh\n%s\n```\n\n```\n%s```\n", r.Server.Name, c.ServerCmd, c.ServerConfig)
	return b.String()
}
