package nodeportapi

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/axonhq/axon/internal/datapath/nodeport"
	"github.com/axonhq/axon/internal/lb"
)

func TestParseFrontend(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want lb.FrontendKey
		err  string
	}{
		{in: "198.18.0.100:80/tcp", want: lb.FrontendKey{Addr: netip.MustParseAddr("198.18.0.100"), Port: 80, Proto: lb.TCP}},
		{in: "198.18.0.100:53/UDP", want: lb.FrontendKey{Addr: netip.MustParseAddr("198.18.0.100"), Port: 53, Proto: lb.UDP}},
		{in: "[2001:db8::1]:443", want: lb.FrontendKey{Addr: netip.MustParseAddr("2001:db8::1"), Port: 443, Proto: lb.TCP}},
		{in: "0.0.0.0:30080/tcp", want: lb.FrontendKey{Addr: netip.IPv4Unspecified(), Port: 30080, Proto: lb.TCP, Scope: lb.ScopeNodePort}},
		{in: "web", err: "write addr:port/proto"},
		{in: "1.2.3.4:80/sctp", err: "not tcp or udp"},
	} {
		got, err := ParseFrontend(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseFrontend(%q) error = %v, want %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseFrontend(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}

func TestReply(t *testing.T) {
	ex := nodeport.Explanation{
		Flow:    nodeport.Tuple{Proto: lb.TCP, Src: netip.MustParseAddrPort("192.0.2.7:40000"), Dst: netip.MustParseAddrPort("198.18.0.11:30080")},
		Verdict: "snat_fwd", Mode: "snat", Existing: true, NATPort: 61234,
		Frontend: lb.FrontendKey{Addr: netip.IPv4Unspecified(), Port: 30080, Proto: lb.TCP, Scope: lb.ScopeNodePort},
		Backend:  netip.MustParseAddrPort("10.244.2.7:8080"), FrontendID: 3, BackendID: 9,
	}
	r := Reply(ex)
	if r.Backend != "10.244.2.7:8080" || r.Frontend != "0.0.0.0:30080/TCP" || r.Verdict != "snat_fwd" {
		t.Errorf("reply %+v", r)
	}
	steps := strings.Join(r.Steps, "\n")
	for _, want := range []string{"established flow", "SNAT source port 61234", "verdict snat_fwd"} {
		if !strings.Contains(steps, want) {
			t.Errorf("steps lack %q:\n%s", want, steps)
		}
	}
	none := Reply(nodeport.Explanation{Flow: ex.Flow, Verdict: "not_service"})
	if none.Backend != "" || !strings.Contains(strings.Join(none.Steps, "\n"), "no frontend matches") {
		t.Errorf("not a service: %+v", none)
	}
}
