package main

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/axonhq/axon/internal/api"
)

func TestPrintSockmap(t *testing.T) {
	ap := netip.MustParseAddrPort
	for _, tc := range []struct {
		name string
		rep  api.SockmapReply
		want []string // lines, in order
	}{
		{"empty", api.SockmapReply{Enabled: true}, []string{"LOCAL", "(no bypassed connection)"}},
		{"pod to pod and loopback", api.SockmapReply{Enabled: true, Conns: []api.SockmapConn{
			{Local: ap("10.244.1.10:40000"), Remote: ap("10.244.1.11:80"), LocalPod: "apps/a", RemotePod: "apps/b",
				Mode: "bypass", RedirectedMsgs: 3, RedirectedBytes: 4096},
			{Local: ap("127.0.0.1:15001"), Remote: ap("127.0.0.1:8080"), Netns: 4099, LocalPod: "apps/a", RemotePod: "apps/a",
				Mode: "stack", PassedBytes: 17},
			{Local: ap("10.244.1.12:1"), Remote: ap("10.244.1.13:2")},
			{Local: ap("127.0.0.1:15001"), Remote: ap("10.244.1.10:40001"), Netns: 4099, LocalPod: "apps/a", RemotePod: "apps/a",
				Mode: "bypass", Alias: true, RedirectedBytes: 9},
		}, Counters: map[string]uint64{"redirect_bytes": 512, "admit_pod": 2}}, []string{
			"LOCAL",
			"10.244.1.10:40000  10.244.1.11:80  apps/a  apps/b  -  bypass  4096  0",
			"127.0.0.1:15001  127.0.0.1:8080  apps/a  apps/a  4099  stack  0  17",
			"10.244.1.12:1  10.244.1.13:2  -  -  -  -  0  0",
			"127.0.0.1:15001  10.244.1.10:40001  apps/a  apps/a  4099  bypass(alias)  9  0",
			"counters: admit_pod=2 redirect_bytes=512",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b strings.Builder
			if err := printSockmap(&b, tc.rep); err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(strings.TrimSpace(b.String()), "\n")
			if len(lines) != len(tc.want) {
				t.Fatalf("%d lines, want %d:\n%s", len(lines), len(tc.want), b.String())
			}
			for i, w := range tc.want {
				if got := strings.Join(strings.Fields(lines[i]), "  "); !strings.HasPrefix(got, strings.Join(strings.Fields(w), "  ")) {
					t.Errorf("line %d: %q, want %q", i, lines[i], w)
				}
			}
		})
	}
}
