package controlplane

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	"sigs.k8s.io/yaml"

	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/testutil"
)

func TestEgressSelectorConfig(t *testing.T) {
	var cfg struct {
		APIVersion       string `json:"apiVersion"`
		Kind             string `json:"kind"`
		EgressSelections []struct {
			Name       string `json:"name"`
			Connection struct {
				ProxyProtocol string `json:"proxyProtocol"`
				Transport     struct {
					UDS struct {
						UDSName string `json:"udsName"`
					} `json:"uds"`
				} `json:"transport"`
			} `json:"connection"`
		} `json:"egressSelections"`
	}
	const sock = `/run/axon lab/"egress".sock` // quoting survives
	if err := yaml.UnmarshalStrict([]byte(egressSelectorConfig(sock)), &cfg); err != nil {
		t.Fatalf("egress selector config: %v\n%s", err, egressSelectorConfig(sock))
	}
	if cfg.APIVersion != "apiserver.k8s.io/v1beta1" || cfg.Kind != "EgressSelectorConfiguration" || len(cfg.EgressSelections) != 1 {
		t.Fatalf("egress selector config %+v: want one selection of apiserver.k8s.io/v1beta1 EgressSelectorConfiguration", cfg)
	}
	s := cfg.EgressSelections[0]
	if s.Name != "cluster" || s.Connection.ProxyProtocol != "HTTPConnect" || s.Connection.Transport.UDS.UDSName != sock {
		t.Errorf("selection %+v: want cluster, HTTPConnect over uds %q", s, sock)
	}
}

// connectVia sends a CONNECT for authority (or another method) on the proxy's socket and
// returns the response and the connection (a tunnel when the status is 200).
func connectVia(t *testing.T, socket, method, authority string) (*http.Response, net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, method+" "+authority+" HTTP/1.1\r\nHost: "+authority+"\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: method})
	if err != nil {
		t.Fatalf("%s %s: read response: %v", method, authority, err)
	}
	return resp, c, br
}

// TestConnectProxyDialsInItsNetns: a CONNECT to 127.0.0.1:<port> reaches the echo server
// listening on that address inside the proxy's netns only (the root netns has nothing there),
// the tunnel carries bytes both ways; targets outside the allowed prefixes, names instead of
// IPs and other methods are refused, and a closed port answers 502.
func TestConnectProxyDialsInItsNetns(t *testing.T) {
	testutil.RequireRoot(t, "creates a network namespace")
	path := testNetns(t, "eg")
	h, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := ensureLoopbackUp(h); err != nil {
		t.Fatal(err)
	}
	h.Close()
	var l net.Listener
	if err := netnsutil.DoAt(path, func() (err error) { l, err = net.Listen("tcp", "127.0.0.1:0"); return err }); err != nil {
		t.Fatal(err)
	}
	target := serveEcho(t, l)
	if c, err := net.DialTimeout("tcp", target, time.Second); err == nil {
		c.Close()
		t.Fatalf("%s answers in the root netns too: the test could not tell where the proxy dials", target)
	}

	socket := filepath.Join(t.TempDir(), "egress.sock")
	p, err := ListenConnectProxy(socket, path, []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})

	resp, c, br := connectVia(t, socket, http.MethodConnect, target)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("CONNECT %s: %s", target, resp.Status)
	}
	msg := strings.Repeat("axon egress ", 10000)
	go func() { _, _ = io.WriteString(c, msg); _ = c.(*net.UnixConn).CloseWrite() }()
	got, err := io.ReadAll(br)
	if err != nil || string(got) != msg {
		t.Fatalf("echo through the tunnel: %d of %d bytes back, err %v", len(got), len(msg), err)
	}

	ln := netip.MustParseAddrPort(target)
	closed := netip.AddrPortFrom(ln.Addr(), ln.Port()+1).String() // nothing listens there in the netns
	for _, tc := range []struct {
		method, authority string
		want              int
	}{
		{http.MethodConnect, "10.0.0.1:10250", http.StatusForbidden},            // outside the allowed prefixes
		{http.MethodConnect, "node1:10250", http.StatusForbidden},               // a name, not IP:port
		{http.MethodConnect, "127.0.0.1", http.StatusForbidden},                 // no port
		{http.MethodGet, "http://" + target + "/", http.StatusMethodNotAllowed}, // not CONNECT
		{http.MethodConnect, closed, http.StatusBadGateway},                     // refused in the netns
	} {
		resp, _, br := connectVia(t, socket, tc.method, tc.authority)
		body, _ := io.ReadAll(br)
		if resp.StatusCode != tc.want {
			t.Errorf("%s %s: %s (%s), want %d", tc.method, tc.authority, resp.Status, strings.TrimSpace(string(body)), tc.want)
		} else {
			t.Logf("%s %s: %s: %s", tc.method, tc.authority, resp.Status, strings.TrimSpace(string(body)))
		}
	}
}
