package lab

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/lab/probe"
)

func TestSockmapNA(t *testing.T) {
	tests := []struct {
		name   string
		labOff bool
		st     *api.SockmapStatus
		pods   int
		want   string // substring; "" = applies
	}{
		{"lab without the bypass", true, nil, 2, "--sockmap on"},
		{"agent without the feature", false, nil, 2, "no same-node TCP bypass"},
		{"self-test failed", false, &api.SockmapStatus{Reason: "kernel self-test failed: splice: io.Copy moved 0 bytes"}, 2,
			"the agent keeps the bypass off: kernel self-test failed: splice"},
		{"off without reason", false, &api.SockmapStatus{}, 2, "no reason given"},
		{"one pod", false, &api.SockmapStatus{Enabled: true}, 1, "1 pods on the node"},
		{"applies", false, &api.SockmapStatus{Enabled: true}, 2, ""},
	}
	for _, tc := range tests {
		got := sockmapNA(tc.labOff, tc.st, tc.pods)
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestJudgeSockmap(t *testing.T) {
	ap := netip.MustParseAddrPort
	conn := probe.StreamResult{Local: ap("10.244.1.1:40000"), Remote: ap("10.244.1.2:5659"), Bytes: 1000, OK: true}
	client := api.SockmapConn{Local: conn.Local, Remote: conn.Remote, Mode: "bypass", RedirectedBytes: 1000}
	server := api.SockmapConn{Local: conn.Remote, Remote: conn.Local, Mode: "bypass", RedirectedBytes: 1000}
	other := api.SockmapConn{Local: ap("10.244.1.3:1"), Remote: ap("10.244.1.4:2"), Mode: "bypass"}
	// the same tuple as a loopback key of some pod's netns is not this connection
	loopback := api.SockmapConn{Local: conn.Local, Remote: conn.Remote, Netns: 7, Mode: "bypass", RedirectedBytes: 1000}
	tests := []struct {
		name  string
		conn  probe.StreamResult
		conns []api.SockmapConn
		delta uint64
		want  string // substring of the failure; "" = passes
	}{
		{"bypassed", conn, []api.SockmapConn{other, server, client}, 1000, ""},
		{"modes unknown (no iterator)", conn, []api.SockmapConn{{Local: conn.Local, Remote: conn.Remote}, {Local: conn.Remote, Remote: conn.Local}}, 5000, ""},
		{"connection failed", probe.StreamResult{Err: "connection refused"}, nil, 0, "the connection failed: connection refused"},
		{"server end missing", conn, []api.SockmapConn{client, other}, 1000, "server end not in the SOCKHASH (the agent lists 2 sockets)"},
		{"both missing, loopback key ignored", conn, []api.SockmapConn{loopback}, 1000, "client end and server end not in the SOCKHASH"},
		{"client on the stack", conn, []api.SockmapConn{{Local: conn.Local, Remote: conn.Remote, Mode: "stack", PassedBytes: 1000}, server}, 1000,
			"writes through TCP (mode stack, 1000 bytes passed)"},
		{"client redirected nothing", conn, []api.SockmapConn{{Local: conn.Local, Remote: conn.Remote, Mode: "undecided"}, server}, 1000, "redirected no bytes"},
		{"counter short", conn, []api.SockmapConn{client, server}, 999, "redirect_bytes moved by 999, less than the 1000 bytes sent"},
	}
	for _, tc := range tests {
		ends, got := judgeSockmap(tc.conn, tc.conns, tc.delta)
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
		if tc.name == "bypassed" && (ends[0] != client || ends[1] != server) {
			t.Errorf("%s: ends %+v", tc.name, ends)
		}
	}
}

func TestSockmapCheckPrint(t *testing.T) {
	r := &SockmapCheckResult{Checks: []SockmapCheck{
		{Node: "node1", NA: "the agent keeps the bypass off: kernel self-test failed: splice"},
		{Node: "node2", Client: "a", Server: "b", Err: "server end not in the SOCKHASH"},
	}}
	var b strings.Builder
	r.Print(&b)
	for _, w := range []string{"sockmap node1    n/a: the agent keeps the bypass off: kernel self-test failed: splice",
		"sockmap node2    FAIL a → b: server end not in the SOCKHASH", "0/1 same-node TCP bypass checks passed (1 n/a)"} {
		if !strings.Contains(b.String(), w) {
			t.Errorf("output lacks %q:\n%s", w, b.String())
		}
	}
	if f := r.Failed(); len(f) != 1 || f[0] != "node2: server end not in the SOCKHASH" {
		t.Errorf("Failed = %q", f)
	}
	b.Reset()
	(&SockmapCheckResult{}).Print(&b)
	if !strings.Contains(b.String(), "n/a: no node runs an axon-agent") {
		t.Errorf("no agents: %q", b.String())
	}
}
