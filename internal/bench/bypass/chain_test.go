package bypass

import (
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/lab"
)

func TestSidecarConfig(t *testing.T) {
	tests := []struct {
		outbound bool
		want     []string // lines the HAProxy configuration must have
		rules    [][]string
	}{
		{outbound: true,
			want: []string{"    bind 127.0.0.1:15001", "    server dst 0.0.0.0:0", "    nosplice", "    uid 1337", "    gid 1337", "    mode tcp"},
			rules: [][]string{
				{"-A", "OUTPUT", "-p", "tcp", "-m", "owner", "--uid-owner", "1337", "-j", "RETURN"},
				{"-A", "OUTPUT", "-p", "tcp", "-d", "127.0.0.0/8", "-j", "RETURN"},
				{"-A", "OUTPUT", "-p", "tcp", "-j", "REDIRECT", "--to-ports", "15001"},
			}},
		{outbound: false,
			want:  []string{"    bind 0.0.0.0:15006", "    server dst 127.0.0.1:0", "    nosplice", "    uid 1337", "    mode tcp"},
			rules: [][]string{{"-A", "PREROUTING", "-p", "tcp", "-j", "REDIRECT", "--to-ports", "15006"}}},
	}
	for _, tc := range tests {
		cfg := haproxyConfig(tc.outbound)
		lines := strings.Split(cfg, "\n")
		for _, w := range tc.want {
			if !slices.Contains(lines, w) {
				t.Errorf("outbound=%v: configuration lacks %q:\n%s", tc.outbound, w, cfg)
			}
		}
		if got := iptablesRules(tc.outbound); !slices.EqualFunc(got, tc.rules, slices.Equal) {
			t.Errorf("outbound=%v: rules %q, want %q", tc.outbound, got, tc.rules)
		}
	}
	// The owner exemption must come before the REDIRECT, or the client proxy's
	// own connections loop back into it.
	r := iptablesRules(true)
	if !slices.Contains(r[0], "--uid-owner") || !slices.Contains(r[len(r)-1], "REDIRECT") {
		t.Errorf("outbound rules out of order: %q", r)
	}
}

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

func TestHopOf(t *testing.T) {
	tests := []struct {
		name   string
		client bool
		s      diagSocket
		want   string
	}{
		{"client app's connection", true, diagSocket{ap("10.0.0.1:40000"), ap("10.0.0.2:19765"), 0}, HopAppProxy},
		{"client proxy's accepted end", true, diagSocket{ap("127.0.0.1:15001"), ap("10.0.0.1:40000"), ProxyUID}, HopAppProxy},
		{"client proxy's outbound connection", true, diagSocket{ap("10.0.0.1:40002"), ap("10.0.0.2:19765"), ProxyUID}, HopProxyProxy},
		{"server proxy's accepted end", false, diagSocket{ap("10.0.0.2:15006"), ap("10.0.0.1:40002"), ProxyUID}, HopProxyProxy},
		{"server proxy's connection to the app", false, diagSocket{ap("127.0.0.1:50000"), ap("127.0.0.1:19765"), ProxyUID}, HopProxyApp},
		{"server app's accepted end", false, diagSocket{ap("127.0.0.1:19765"), ap("127.0.0.1:50000"), 0}, HopProxyApp},
		// a port that happens to be 15001 on the server side is no sidecar's
		{"server app on 15001", false, diagSocket{ap("127.0.0.1:15001"), ap("127.0.0.1:50001"), 0}, HopProxyApp},
	}
	for _, tc := range tests {
		if got := hopOf(tc.client, tc.s); got != tc.want {
			t.Errorf("%s: hop %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestClassify(t *testing.T) {
	client := chainPod{lab.Pod{Name: "c"}, 11}
	server := chainPod{lab.Pod{Name: "s"}, 22}
	cs := []diagSocket{
		{ap("10.0.0.1:40000"), ap("10.0.0.2:19765"), 0},
		{ap("127.0.0.1:15001"), ap("10.0.0.1:40000"), ProxyUID},
		{ap("10.0.0.1:40002"), ap("10.0.0.2:19765"), ProxyUID},
	}
	ss := []diagSocket{
		{ap("10.0.0.2:15006"), ap("10.0.0.1:40002"), ProxyUID},
		{ap("127.0.0.1:50000"), ap("127.0.0.1:19765"), ProxyUID},
		{ap("127.0.0.1:19765"), ap("127.0.0.1:50000"), 0},
	}
	conns := []api.SockmapConn{
		{Local: ap("10.0.0.1:40000"), Remote: ap("10.0.0.2:19765"), Mode: "stack", PassedBytes: 100},
		{Local: ap("10.0.0.1:40002"), Remote: ap("10.0.0.2:19765"), Mode: "stack", PassedBytes: 90},
		{Local: ap("10.0.0.2:15006"), Remote: ap("10.0.0.1:40002"), Mode: "undecided"},
		// loopback keys carry the netns cookie; the same tuple in the client
		// pod's netns (cookie 11) must not match the server pod's socket
		{Local: ap("127.0.0.1:50000"), Remote: ap("127.0.0.1:19765"), Netns: 11, Mode: "stack", PassedBytes: 1},
		{Local: ap("127.0.0.1:50000"), Remote: ap("127.0.0.1:19765"), Netns: 22, Mode: "bypass", RedirectedBytes: 80},
		// a v4-mapped address in the map matches the socket's plain one
		{Local: netip.AddrPortFrom(netip.MustParseAddr("::ffff:127.0.0.1"), 19765), Remote: ap("127.0.0.1:50000"), Netns: 22, Mode: "undecided"},
	}
	got := classify(client, server, cs, ss, conns)
	if len(got) != 6 {
		t.Fatalf("%d sockets, want 6: %+v", len(got), got)
	}
	want := []struct {
		hop, pod, mode string
		proxy, inMap   bool
		redir, passed  uint64
	}{
		{HopAppProxy, "c", "stack", false, true, 0, 100},
		{HopAppProxy, "c", "", true, false, 0, 0},
		{HopProxyProxy, "c", "stack", true, true, 0, 90},
		{HopProxyProxy, "s", "undecided", true, true, 0, 0},
		{HopProxyApp, "s", "bypass", true, true, 80, 0},
		{HopProxyApp, "s", "undecided", false, true, 0, 0},
	}
	for i, w := range want {
		g := got[i]
		if g.Hop != w.hop || g.Pod != w.pod || g.Mode != w.mode || g.Proxy != w.proxy || g.InMap != w.inMap || g.RedirectedBytes != w.redir || g.PassedBytes != w.passed {
			t.Errorf("socket %d (%s → %s): %+v, want %+v", i, g.Local, g.Remote, g, w)
		}
	}

	// The report: hop 3 bypassed (the receiver undecided), hop 2 not, hop 1
	// not (the proxy's end not in the map); the stack arm's sockets counted
	// apart.
	r := &Report{Reps: 1, Tests: []string{TestLat}, Sizes: []int{1}, Chain: &ChainInfo{OrigDst: []OrigDstCheck{
		{Dial: ap("10.0.0.2:19801"), Reply: "port 19801", Peer: ap("127.0.0.1:5000")}}}, Samples: []Sample{
		{Rep: 1, Test: TestLat, Size: 1, Arm: ArmBypass, Hops: got},
		{Rep: 1, Test: TestLat, Size: 1, Arm: ArmStack, Hops: []HopSocket{{Hop: HopProxyApp}, {Hop: HopProxyApp, InMap: true}}},
	}}
	rows := r.HopRows()
	verdicts := []string{"not bypassed", "not bypassed", "bypassed"}
	for i, row := range rows {
		if row.Hop != Hops[i] || row.Verdict() != verdicts[i] || row.Snapshots != 1 || row.Sockets != 2 {
			t.Errorf("hop row %d: %+v, verdict %q; want %s, %q, 1 snapshot, 2 sockets", i, row, row.Verdict(), Hops[i], verdicts[i])
		}
	}
	if h := rows[2]; h.StackArmSockets != 2 || h.StackArmInMap != 1 || h.Redirected != 80 || h.Bypass != 1 || h.Undecided != 1 {
		t.Errorf("hop 3: %+v", h)
	}
	if h := rows[0]; h.InMap != 1 || h.Stack != 1 || h.Passed != 100 {
		t.Errorf("hop 1: %+v", h)
	}
	for _, v := range []struct {
		row  HopRow
		want string
	}{
		{HopRow{}, "n/a (not seen)"},
		{HopRow{Sockets: 4, InMap: 4, Bypass: 3, Undecided: 1}, "bypassed"},
		{HopRow{Sockets: 4, InMap: 4, Bypass: 2, Stack: 2}, "partly"},
		{HopRow{Sockets: 4, InMap: 3, Bypass: 3}, "partly"},
		{HopRow{Sockets: 4, InMap: 4, Stack: 4}, "not bypassed"},
	} {
		if got := v.row.Verdict(); got != v.want {
			t.Errorf("Verdict(%+v) = %q, want %q", v.row, got, v.want)
		}
	}
	md := r.Markdown()
	for _, w := range []string{
		"# Same-node TCP bypass benchmark: sidecar chain",
		"| 3 server proxy → app | 1 | 2 | 2 | 1 | 0 | 1 | 80 | 0 | bypassed | 1 of 2 |",
		"| 1 app → client proxy | c | proxy | 127.0.0.1:15001 | 10.0.0.1:40000 | no | — | 0 | 0 |",
	} {
		if !strings.Contains(md, w) {
			t.Errorf("results.md lacks %q:\n%s", w, md)
		}
	}
	// results.json keeps the chain: the report renders the same from it
	dir := t.TempDir()
	if err := r.WriteFiles(dir); err != nil {
		t.Fatal(err)
	}
	back, err := ReadReport(filepath.Join(dir, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	if got := back.Markdown(); got != md {
		t.Errorf("results.md rendered from results.json differs:\n%s\nwant:\n%s", got, md)
	}
}

func TestChainPlan(t *testing.T) {
	tests := []struct {
		name      string
		cfg       Config
		sizes, bw []int
		wantErr   string
	}{
		{"chain defaults", Config{Chain: true}, DefaultChainSizes, DefaultChainBWSizes, ""},
		{"direct defaults", Config{}, DefaultSizes, DefaultSizes, ""},
		{"chain with sizes: tcp_bw at all of them", Config{Chain: true, Sizes: []int{64, 4096}}, []int{64, 4096}, []int{64, 4096}, ""},
		{"bw sizes a subset", Config{Sizes: []int{1, 64}, BWSizes: []int{64}}, []int{1, 64}, []int{64}, ""},
		{"bw size not measured", Config{Sizes: []int{1, 64}, BWSizes: []int{128}}, nil, nil, "throughput size 128 is not one of the message sizes"},
	}
	for _, tc := range tests {
		got := tc.cfg
		err := got.sizeDefaults()
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%s: error %v, want %q", tc.name, err, tc.wantErr)
			}
			continue
		}
		if err != nil || !slices.Equal(got.Sizes, tc.sizes) || !slices.Equal(got.BWSizes, tc.bw) {
			t.Errorf("%s: sizes %v, bw %v, %v; want %v, %v", tc.name, got.Sizes, got.BWSizes, err, tc.sizes, tc.bw)
		}
	}

	// Rows: tcp_bw only at BWSizes; chain targets (latency ≤ 0.6×, no
	// throughput target, which never counts as missed).
	r := &Report{Reps: 1, Tests: []string{TestLat, TestBW}, Sizes: []int{1, 64}, BWSizes: []int{64}, Chain: &ChainInfo{}}
	for _, s := range []Sample{
		{Rep: 1, Test: TestLat, Size: 1, Arm: ArmStack, Value: 10}, {Rep: 1, Test: TestLat, Size: 1, Arm: ArmBypass, Value: 7},
		{Rep: 1, Test: TestLat, Size: 64, Arm: ArmStack, Value: 10}, {Rep: 1, Test: TestLat, Size: 64, Arm: ArmBypass, Value: 5},
		{Rep: 1, Test: TestBW, Size: 64, Arm: ArmStack, Value: 1e9}, {Rep: 1, Test: TestBW, Size: 64, Arm: ArmBypass, Value: 0.5e9},
	} {
		r.Samples = append(r.Samples, s)
	}
	rows := r.Rows()
	if len(rows) != 3 || rows[2].Test != TestBW || rows[2].Size != 64 {
		t.Fatalf("rows %+v, want tcp_lat 1, 64 and tcp_bw 64", rows)
	}
	if rows[0].Target.String() != "≤ 0.6×" || !rows[2].Target.None() || rows[2].Target.Verdict(rows[2].Ratio) != "—" {
		t.Errorf("chain targets: %s, %s (%s)", rows[0].Target, rows[2].Target, rows[2].Target.Verdict(rows[2].Ratio))
	}
	if m := r.Missed(); len(m) != 1 || m[0] != "tcp_lat 1 B (0.70×, want ≤ 0.6×)" {
		t.Errorf("Missed = %q", m)
	}
	if !strings.Contains(r.Table(), "| size | chain, stack | chain, bypass |") {
		t.Errorf("table:\n%s", r.Table())
	}
}

func TestOrigDstCheck(t *testing.T) {
	tests := []struct {
		c    OrigDstCheck
		want bool
	}{
		{OrigDstCheck{Dial: ap("10.0.0.2:19801"), Reply: "port 19801", Peer: ap("127.0.0.1:5000")}, true},
		{OrigDstCheck{Dial: ap("10.0.0.2:19801"), Reply: "port 19802", Peer: ap("127.0.0.1:5000")}, false}, // wrong port
		{OrigDstCheck{Dial: ap("10.0.0.2:19801"), Reply: "port 19801", Peer: ap("10.0.0.1:5000")}, false},  // not via the server proxy
		{OrigDstCheck{Dial: ap("10.0.0.2:19801"), Reply: "port 19801", Peer: ap("127.0.0.1:5000"), Err: "reset"}, false},
	}
	for _, tc := range tests {
		if got := tc.c.OK(); got != tc.want {
			t.Errorf("%+v: OK = %v, want %v", tc.c, got, tc.want)
		}
	}
}
