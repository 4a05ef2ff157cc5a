package lab

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/lab/probe"
)

// explainRecorder is a north-south API that answers Explain and records
// what it was asked.
type explainRecorder struct {
	mu    sync.Mutex
	asked []string
}

func (e *explainRecorder) CT(context.Context) (api.CTReply, error)   { return api.CTReply{}, nil }
func (e *explainRecorder) NAT(context.Context) (api.NATReply, error) { return api.NATReply{}, nil }
func (e *explainRecorder) Maglev(context.Context, string, string, bool) (api.MaglevReply, error) {
	return api.MaglevReply{}, nil
}

func (e *explainRecorder) Explain(_ context.Context, proto, src, dst string) (api.ExplainReply, error) {
	e.mu.Lock()
	e.asked = append(e.asked, proto+" "+src+" "+dst)
	e.mu.Unlock()
	if strings.Contains(dst, "30900") {
		return api.ExplainReply{}, errors.New("no HostPort here")
	}
	return api.ExplainReply{Verdict: "ct_new", Steps: []string{"frontend " + dst + " matched (id 7)", "verdict ct_new"}}, nil
}

// serveNorthSouth serves h's north-south routes on socket until the test ends.
func serveNorthSouth(t *testing.T, socket string, h api.NorthSouthHandler) {
	t.Helper()
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	api.MountNorthSouth(mux, h, nil)
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
}

// TestExplainFailures: only failed probes to another node's NodePort or
// HostPort are explained, by the node that owns the address, from the
// source's address of the same family; an explain error is said, not lost.
func TestExplainFailures(t *testing.T) {
	st := testState(DatapathAxon, "")
	recs := make([]*explainRecorder, len(st.Nodes))
	for i := range st.Nodes {
		st.Nodes[i].Socket = filepath.Join(t.TempDir(), "axon.sock")
		recs[i] = &explainRecorder{}
		serveNorthSouth(t, st.Nodes[i].Socket, recs[i])
	}
	n1, n2 := st.Nodes[0], st.Nodes[1]
	svc := func(proto string, a netip.Addr, port uint16) probe.Service {
		return probe.Service{Proto: proto, Addr: netip.AddrPortFrom(a, port)}
	}
	res := &ServiceCheckResult{Sources: []string{"node1-pod1", "node1"}, Types: svcTypes, Cells: map[[2]string][]probe.ServiceResult{
		{"node1-pod1", SvcTypeNodePort}: {
			{Service: svc("tcp", n2.IPs[0], DemoNodePortPort), Err: "connection refused"}, // explained by node2, from the pod's IPv4
			{Service: svc("tcp", n2.IPs[1], DemoNodePortPort), Err: "connection refused"}, // ... and IPv6
			{Service: svc("udp", n2.IPs[0], DemoNodePortPort), OK: true},                  // passed: not asked
			{Service: svc("tcp", n1.IPs[0], DemoNodePortPort), Err: "refused"},            // own node: its socket LB, not asked
		},
		{"node1", SvcTypeHostPort}: {
			{Service: svc("tcp", n2.IPs[0], DemoHostPort), Err: "refused"}, // from the node's own address; the API fails
		},
		{"node1-pod1", SvcTypeClusterIP}: {
			{Service: svc("tcp", netip.MustParseAddr("10.96.0.10"), DemoPort), Err: "refused"}, // not a node address
		},
	}}
	got := explainFailures(t.Context(), st, res)
	wantAsked := []string{
		"tcp 10.244.1.2:40000 " + netip.AddrPortFrom(n2.IPs[0], DemoNodePortPort).String(),
		"tcp [fd00:10:244:1::2]:40000 " + netip.AddrPortFrom(n2.IPs[1], DemoNodePortPort).String(),
		"tcp " + netip.AddrPortFrom(n1.IPs[0], 40000).String() + " " + netip.AddrPortFrom(n2.IPs[0], DemoHostPort).String(),
	}
	if len(recs[0].asked) != 0 || !slices.Equal(recs[1].asked, wantAsked) {
		t.Errorf("node1 asked %q, node2 asked %q; want nothing and %q", recs[0].asked, recs[1].asked, wantAsked)
	}
	if len(got) != 3 || !strings.Contains(got[0], "node2's north-south LB now, for tcp 10.244.1.2:40000 → ") ||
		!strings.Contains(got[0], "matched (id 7); verdict ct_new") || !strings.Contains(got[2], "explain failed: ") || !strings.Contains(got[2], "no HostPort here") {
		t.Errorf("explanations:\n%s", strings.Join(got, "\n"))
	}
}
