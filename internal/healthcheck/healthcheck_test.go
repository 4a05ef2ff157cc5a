package healthcheck

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/axonhq/axon/internal/lb"
)

var loopback = []netip.Addr{netip.MustParseAddr("127.0.0.1")}

// freePort returns a TCP port free on 127.0.0.1 right now.
func freePort(t *testing.T) uint16 {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return uint16(ln.Addr().(*net.TCPAddr).Port)
}

type answer struct {
	code   int
	weight string
	body   string
	reply  Reply
}

func get(t *testing.T, port uint16, path string) (answer, error) {
	t.Helper()
	c := &http.Client{Timeout: 3 * time.Second}
	resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d%s", port, path))
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{}, err
	}
	a := answer{code: resp.StatusCode, weight: resp.Header.Get("X-Load-Balancing-Endpoint-Weight"), body: string(b)}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q, want application/json", ct)
	}
	dec := json.NewDecoder(strings.NewReader(a.body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&a.reply); err != nil {
		t.Errorf("body %q is not kube-proxy's JSON: %v", a.body, err)
	}
	return a, nil
}

func mustGet(t *testing.T, port uint16, path string) answer {
	t.Helper()
	a, err := get(t, port, path)
	if err != nil {
		t.Fatalf("GET :%d%s: %v", port, path, err)
	}
	return a
}

func TestServeLikeKubeProxy(t *testing.T) {
	s := New(loopback, nil)
	t.Cleanup(s.Close)
	web, db := ServiceName{"default", "web"}, ServiceName{"prod", "db"}
	pw, pd := freePort(t), freePort(t)
	if err := s.Sync(map[ServiceName]Service{web: {Port: pw, LocalEndpoints: 2}, db: {Port: pd, LocalEndpoints: 0}}); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name   string
		do     func()
		port   uint16
		path   string
		code   int
		reply  Reply
		weight string
	}{
		{"local endpoints: 200", nil, pw, "/healthz", 200, Reply{web, 2, true}, "2"},
		{"any path answers (as kube-proxy)", nil, pw, "/", 200, Reply{web, 2, true}, "2"},
		{"no local endpoints: 503", nil, pd, "/healthz", 503, Reply{db, 0, true}, "0"},
		{"endpoints appear", func() {
			if err := s.Sync(map[ServiceName]Service{web: {Port: pw, LocalEndpoints: 2}, db: {Port: pd, LocalEndpoints: 1}}); err != nil {
				t.Fatal(err)
			}
		}, pd, "/healthz", 200, Reply{db, 1, true}, "1"},
		{"datapath unhealthy: 503", func() { s.SetHealthy(false) }, pw, "/healthz", 503, Reply{web, 2, false}, "2"},
		{"healthy again", func() { s.SetHealthy(true) }, pw, "/healthz", 200, Reply{web, 2, true}, "2"},
	}
	for _, st := range steps {
		if st.do != nil {
			st.do()
		}
		a := mustGet(t, st.port, st.path)
		if a.code != st.code || a.reply != st.reply || a.weight != st.weight {
			t.Errorf("%s: got %d %+v weight %q, want %d %+v weight %q", st.name, a.code, a.reply, a.weight, st.code, st.reply, st.weight)
		}
	}
	// The exact key names kube-proxy sends.
	a := mustGet(t, pw, "/healthz")
	for _, k := range []string{`"service":{"namespace":"default","name":"web"}`, `"localEndpoints":2`, `"serviceProxyHealthy":true`} {
		if !strings.Contains(a.body, k) {
			t.Errorf("body %s lacks %s", a.body, k)
		}
	}

	// Service removed: its port closes; the other stays.
	if err := s.Sync(map[ServiceName]Service{db: {Port: pd, LocalEndpoints: 1}}); err != nil {
		t.Fatal(err)
	}
	if _, err := get(t, pw, "/healthz"); err == nil {
		t.Errorf("port %d still answers after its Service was removed", pw)
	}
	if a := mustGet(t, pd, "/healthz"); a.code != 200 {
		t.Errorf("remaining service answered %d", a.code)
	}
	// Port change: the old port closes, the new one answers.
	pd2 := freePort(t)
	if err := s.Sync(map[ServiceName]Service{db: {Port: pd2, LocalEndpoints: 1}}); err != nil {
		t.Fatal(err)
	}
	if _, err := get(t, pd, "/"); err == nil {
		t.Errorf("old port %d still answers after the port changed", pd)
	}
	if a := mustGet(t, pd2, "/"); a.code != 200 {
		t.Errorf("new port answered %d", a.code)
	}
}

// TestPortInUse: a port taken by another process is reported, the other
// Services are served, and the next Sync after the port frees opens it.
func TestPortInUse(t *testing.T) {
	s := New(loopback, nil)
	t.Cleanup(s.Close)
	blocker, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	busy := uint16(blocker.Addr().(*net.TCPAddr).Port)
	ok := freePort(t)
	a, b := ServiceName{"ns", "a"}, ServiceName{"ns", "b"}
	want := map[ServiceName]Service{a: {Port: busy, LocalEndpoints: 1}, b: {Port: ok, LocalEndpoints: 1}}
	err = s.Sync(want)
	if err == nil || !strings.Contains(err.Error(), "ns/a") || !strings.Contains(err.Error(), fmt.Sprint(busy)) {
		t.Fatalf("Sync error = %v, want one naming ns/a and port %d", err, busy)
	}
	if ans := mustGet(t, ok, "/"); ans.code != 200 {
		t.Errorf("the other service answered %d", ans.code)
	}
	st := s.Statuses()
	if len(st) != 2 || st[0].Error == "" || st[1].Error != "" {
		t.Errorf("Statuses = %+v, want ns/a failed and ns/b served", st)
	}
	blocker.Close()
	if err := s.Sync(want); err != nil {
		t.Fatalf("Sync after the port was freed: %v", err)
	}
	if ans := mustGet(t, busy, "/"); ans.code != 200 || ans.reply.Service != a {
		t.Errorf("after retry: %d %+v", ans.code, ans.reply)
	}
}

func TestFromFrontends(t *testing.T) {
	be := func(addr, node string, st lb.BackendState) lb.Backend {
		return lb.Backend{Addr: netip.MustParseAddr(addr), Port: 80, NodeName: node, State: st}
	}
	fs := []lb.Frontend{
		{Service: "default/web", Kind: lb.KindLoadBalancer, LocalOnly: true, HealthCheckNodePort: 32000,
			Backends: []lb.Backend{be("10.244.1.5", "node1", lb.Active), be("10.244.1.6", "node1", lb.Terminating)}},
		{Service: "default/web", Kind: lb.KindNodePort, LocalOnly: true, HealthCheckNodePort: 32000,
			Backends: []lb.Backend{be("10.244.1.5", "node1", lb.Active)}},
		{Service: "default/empty", Kind: lb.KindNodePort, LocalOnly: true, HealthCheckNodePort: 32001},
		{Service: "default/cluster", Kind: lb.KindNodePort, Backends: []lb.Backend{be("10.244.1.9", "node1", lb.Active)}},
	}
	got := FromFrontends(fs, "node1")
	want := map[ServiceName]Service{
		{"default", "web"}:   {Port: 32000, LocalEndpoints: 1},
		{"default", "empty"}: {Port: 32001, LocalEndpoints: 0},
	}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: got %+v, want %+v", k, got[k], v)
		}
	}
}
