package lab

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/lab/probe"
)

// The same-node TCP bypass part of `axon lab check`: on each node whose
// agent has the bypass on (its kernel self-test passed), one connection
// between two pods of the node, made by processes in the pods' cgroups:
// 256 KiB echoed intact, and both of its sockets in the SOCKHASH by the
// agent's connection list while it is open, the client's in bypass mode
// with bytes redirected. Where the agent keeps the bypass off the check is
// not applicable and says the agent's reason.

// sockmapCheckBytes is what the bypass check sends and checks.
const sockmapCheckBytes = 256 << 10

// SockmapCheck is the bypass check of one node.
type SockmapCheck struct {
	Node           string
	Client, Server string // pods
	NA             string // why not applicable ("" when it ran)
	Conn           probe.StreamResult
	// Ends are the connection's two sockets as the agent listed them (client
	// end first); missing ones are zero.
	Ends [2]api.SockmapConn
	// RedirectBytes is how far the bypass's redirect_bytes counter moved
	// during the connection.
	RedirectBytes uint64
	Err           string // failed: what went wrong
}

// OK reports whether the check ran and passed.
func (c SockmapCheck) OK() bool { return c.NA == "" && c.Err == "" }

// SockmapCheckResult is the bypass check of every node.
type SockmapCheckResult struct {
	Checks  []SockmapCheck
	Elapsed time.Duration
}

// Failed returns the failed checks as "node: what" lines.
func (r *SockmapCheckResult) Failed() []string {
	var out []string
	for _, c := range r.Checks {
		if c.NA == "" && c.Err != "" {
			out = append(out, c.Node+": "+c.Err)
		}
	}
	return out
}

// Print writes one line per node and a summary.
func (r *SockmapCheckResult) Print(w io.Writer) {
	if len(r.Checks) == 0 {
		fmt.Fprintln(w, "sockmap n/a: no node runs an axon-agent (a baseline lab runs them only with --sockmap on)")
		return
	}
	ran, ok := 0, 0
	for _, c := range r.Checks {
		switch {
		case c.NA != "":
			fmt.Fprintf(w, "sockmap %-8s n/a: %s\n", c.Node, c.NA)
		case c.Err != "":
			ran++
			fmt.Fprintf(w, "sockmap %-8s FAIL %s → %s: %s\n", c.Node, c.Client, c.Server, c.Err)
		default:
			ran++
			ok++
			fmt.Fprintf(w, "sockmap %-8s ok   %s → %s %s → %s: %d bytes echoed intact, both sockets in the SOCKHASH (client %s, %d bytes redirected; redirect_bytes +%d)\n",
				c.Node, c.Client, c.Server, c.Conn.Local, c.Conn.Remote, c.Conn.Bytes, orUnknown(c.Ends[0].Mode), c.Ends[0].RedirectedBytes, c.RedirectBytes)
		}
	}
	fmt.Fprintf(w, "%d/%d same-node TCP bypass checks passed (%d n/a) in %s\n", ok, ran, len(r.Checks)-ran, r.Elapsed.Round(time.Millisecond))
}

func orUnknown(mode string) string {
	if mode == "" {
		return "mode unknown"
	}
	return "mode " + mode
}

// sockmapNA says why the bypass check does not apply to a node ("" when it
// does): the lab's agents run without the bypass, the agent keeps it off
// (its reason: flag, kernel self-test, load error), or the node has fewer
// than two pods.
func sockmapNA(labOff bool, st *api.SockmapStatus, pods int) string {
	switch {
	case labOff:
		return "the lab's agents run without the bypass (axon lab up --sockmap on)"
	case st == nil:
		return "the agent has no same-node TCP bypass"
	case !st.Enabled:
		why := st.Reason
		if why == "" {
			why = "no reason given"
		}
		return "the agent keeps the bypass off: " + why
	case pods < 2:
		return fmt.Sprintf("%d pods on the node, the check needs two (axon lab up --pods-per-node 2)", pods)
	}
	return ""
}

// judgeSockmap checks one bypass connection: its bytes came back intact,
// both of its sockets are in the agent's list (client end: local → remote;
// server end: the reverse, pod to pod keys have netns 0), the client end
// (which wrote) is not on the stack and moved bytes through the bypass
// where the agent reports per-socket modes, and redirect_bytes moved by at
// least the bytes sent. It returns the two ends found and the failure
// ("" when it passed).
func judgeSockmap(conn probe.StreamResult, conns []api.SockmapConn, redirectDelta uint64) ([2]api.SockmapConn, string) {
	var ends [2]api.SockmapConn
	if !conn.OK {
		return ends, "the connection failed: " + conn.Err
	}
	found := [2]bool{}
	for _, c := range conns {
		if c.Netns != 0 {
			continue
		}
		if c.Local == conn.Local && c.Remote == conn.Remote {
			ends[0], found[0] = c, true
		}
		if c.Local == conn.Remote && c.Remote == conn.Local {
			ends[1], found[1] = c, true
		}
	}
	var missing []string
	for i, f := range found {
		if !f {
			missing = append(missing, [2]string{"client", "server"}[i]+" end")
		}
	}
	switch {
	case len(missing) > 0:
		return ends, fmt.Sprintf("%s not in the SOCKHASH (the agent lists %d sockets): not bypassed", strings.Join(missing, " and "), len(conns))
	case ends[0].Mode == "stack":
		return ends, fmt.Sprintf("the client end is in the SOCKHASH but writes through TCP (mode stack, %d bytes passed)", ends[0].PassedBytes)
	case ends[0].Mode != "" && ends[0].RedirectedBytes == 0:
		return ends, fmt.Sprintf("the client end redirected no bytes (mode %s)", ends[0].Mode)
	case redirectDelta < uint64(conn.Bytes):
		return ends, fmt.Sprintf("redirect_bytes moved by %d, less than the %d bytes sent", redirectDelta, conn.Bytes)
	}
	return ends, ""
}

// sockmapSettle bounds the wait for an agent's bypass to leave "pending"
// (the self-test and the load run at its first reconcile, a few seconds
// after a lab comes up).
const sockmapSettle = 30 * time.Second

// settledSockmap is the agent's bypass status once it is no longer pending
// (or still pending after wait: the check then says so).
func settledSockmap(ctx context.Context, agent *api.Client, wait time.Duration) (*api.SockmapStatus, error) {
	deadline := time.Now().Add(wait)
	for {
		s, err := agent.Status(ctx)
		if err != nil {
			return nil, fmt.Errorf("the agent's status: %w", err)
		}
		sm := s.Sockmap
		if sm == nil || sm.Enabled || !strings.HasPrefix(sm.Reason, "pending") || time.Now().After(deadline) {
			return sm, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// CheckSockmap runs the bypass check on every node that runs an agent.
// It returns an error only when the check itself could not run.
func (l *Lab) CheckSockmap(ctx context.Context, timeout time.Duration) (*SockmapCheckResult, error) {
	t0 := time.Now()
	st := l.State()
	res := &SockmapCheckResult{}
	self := filepath.Join(st.BinDir, "axon")
	var all []checkTarget
	if len(st.Pods) > 0 || st.DaemonSetAgents() {
		var err error
		if all, err = l.checkPods(ctx); err != nil {
			return res, err
		}
	}
	for _, n := range st.Nodes {
		if !st.RunsAgent(n) {
			continue
		}
		c := SockmapCheck{Node: n.Name}
		var pods []checkTarget
		for _, p := range all {
			if p.node == n.Name && hasFamily(p.ips, netip.IPv4Unspecified()) {
				pods = append(pods, p)
			}
		}
		agent, err := l.Agent(n.Name)
		if err != nil {
			return res, err
		}
		labOff := st.NoSockmap && !st.DaemonSetAgents() // --sockmap of `up` is not the chart's
		var sm *api.SockmapStatus
		if !labOff {
			if sm, err = settledSockmap(ctx, agent, sockmapSettle); err != nil {
				c.Err = err.Error()
				res.Checks = append(res.Checks, c)
				continue
			}
		}
		if c.NA = sockmapNA(labOff, sm, len(pods)); c.NA != "" {
			res.Checks = append(res.Checks, c)
			continue
		}
		c.Client, c.Server = pods[0].name, pods[1].name
		if err := l.checkSockmapPair(ctx, self, agent, pods[0], pods[1], timeout, &c); err != nil {
			c.Err = err.Error()
		}
		res.Checks = append(res.Checks, c)
	}
	res.Elapsed = time.Since(t0)
	return res, nil
}

// checkSockmapPair runs the echo server in server, the stream client in
// client (namespaces and cgroups of the pods), and judges the connection
// while the client holds it open.
func (l *Lab) checkSockmapPair(ctx context.Context, self string, agent *api.Client, client, server checkTarget, timeout time.Duration, c *SockmapCheck) error {
	var serverIP netip.Addr
	for _, ip := range server.ips {
		if ip.Is4() {
			serverIP = ip
			break
		}
	}
	stop, err := l.startServers(ctx, []string{server.name}, self, "lab", "_echo", "serve", "--port", strconv.Itoa(probe.StreamPort))
	if err != nil {
		return err
	}
	defer stop()
	before, err := agent.SockmapConns(ctx)
	if err != nil {
		return fmt.Errorf("the agent's bypass counters: %w", err)
	}
	cmd := l.Command(ctx, client.name, self, "lab", "_echo", "stream", "--bytes", strconv.Itoa(sockmapCheckBytes),
		"--timeout", timeout.String(), netip.AddrPortFrom(serverIP, probe.StreamPort).String())
	hold, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start the stream client in %s: %w", client.name, err)
	}
	defer func() {
		hold.Close()
		_ = cmd.Wait()
	}()
	line, err := bufio.NewReader(out).ReadBytes('\n')
	if err != nil {
		hold.Close()
		_ = cmd.Wait()
		return fmt.Errorf("the stream client in %s printed no result: %w: %s", client.name, err, strings.TrimSpace(stderr.String()))
	}
	if err := json.Unmarshal(line, &c.Conn); err != nil {
		return fmt.Errorf("the stream client's result %q: %w", line, err)
	}
	after, err := agent.SockmapConns(ctx)
	if err != nil {
		return fmt.Errorf("the agent's bypassed connections: %w", err)
	}
	if d := after.Counters["redirect_bytes"]; d >= before.Counters["redirect_bytes"] {
		c.RedirectBytes = d - before.Counters["redirect_bytes"]
	}
	var why string
	c.Ends, why = judgeSockmap(c.Conn, after.Conns, c.RedirectBytes)
	if why != "" {
		return errors.New(why)
	}
	return nil
}
