package api

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/axonhq/axon/internal/unixsock"
)

// fakeHandler records calls; it stands in for the agent in these pure
// transport tests.
type fakeHandler struct {
	mu      sync.Mutex
	health  error
	eps     map[Attachment]Endpoint
	failPut error
}

func newFake() *fakeHandler { return &fakeHandler{eps: map[Attachment]Endpoint{}} }

func (f *fakeHandler) Healthy(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.health
}
func (f *fakeHandler) Status(context.Context) (Status, error) {
	return Status{Node: "node1", Ready: true, PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}}, nil
}
func (f *fakeHandler) Endpoints(context.Context) ([]Endpoint, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []Endpoint
	for _, ep := range f.eps {
		out = append(out, ep)
	}
	return out, nil
}
func (f *fakeHandler) Allocate(_ context.Context, r AllocateRequest) (AllocateResponse, error) {
	if r.ContainerID == "full" {
		return AllocateResponse{}, Errorf(http.StatusServiceUnavailable, "pool 10.244.1.0/24 exhausted (254 addresses in use)")
	}
	if r.ContainerID == "boom" {
		return AllocateResponse{}, errors.New("disk on fire")
	}
	return AllocateResponse{Addresses: []Address{{IP: netip.MustParseAddr("10.244.1.7"), Prefix: netip.MustParsePrefix("10.244.1.0/24")}}}, nil
}
func (f *fakeHandler) Release(context.Context, ReleaseRequest) error { return nil }
func (f *fakeHandler) PutEndpoint(_ context.Context, ep Endpoint) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failPut != nil {
		return f.failPut
	}
	f.eps[Attachment{ep.ContainerID, ep.IfName}] = ep
	return nil
}
func (f *fakeHandler) DeleteEndpoint(_ context.Context, a Attachment) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.eps, a)
	return nil
}
func (f *fakeHandler) GC(_ context.Context, r GCRequest) (GCResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	valid := map[Attachment]bool{}
	for _, a := range r.Valid {
		valid[a] = true
	}
	var resp GCResponse
	for a := range f.eps {
		if !valid[a] {
			delete(f.eps, a)
			resp.Removed = append(resp.Removed, a)
		}
	}
	return resp, nil
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// unixServer serves NewMux with httptest over a real unix socket.
func unixServer(t *testing.T, h Handler) (string, *Client) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "axon.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(NewMux(h, quietLog()))
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	return sock, NewClient(sock)
}

func rawRequest(t *testing.T, sock, method, path, body string) (int, string) {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	req, err := http.NewRequest(method, "http://x"+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestMuxValidation(t *testing.T) {
	sock, _ := unixServer(t, newFake())
	tests := []struct {
		name, method, path, body string
		code                     int
		want                     string
	}{
		{"healthz ok", "GET", "/healthz", "", 200, "ok"},
		{"allocate ok", "POST", "/v1/ipam/allocate", `{"containerID":"c1","ifName":"eth0"}`, 200, `"10.244.1.7"`},
		{"allocate unknown field", "POST", "/v1/ipam/allocate", `{"containerID":"c1","ifName":"eth0","color":"red"}`, 400, `unknown field \"color\"`},
		{"allocate missing containerID", "POST", "/v1/ipam/allocate", `{"ifName":"eth0"}`, 400, "missing containerID"},
		{"allocate missing both", "POST", "/v1/ipam/allocate", `{}`, 400, "missing containerID and ifName"},
		{"allocate malformed", "POST", "/v1/ipam/allocate", `{"containerID":`, 400, "bad request body"},
		{"allocate empty", "POST", "/v1/ipam/allocate", ``, 400, "empty request body"},
		{"allocate trailing", "POST", "/v1/ipam/allocate", `{"containerID":"c","ifName":"e"} {}`, 400, "trailing data"},
		{"allocate exhausted is 503", "POST", "/v1/ipam/allocate", `{"containerID":"full","ifName":"eth0"}`, 503, "exhausted"},
		{"allocate internal is 500", "POST", "/v1/ipam/allocate", `{"containerID":"boom","ifName":"eth0"}`, 500, "disk on fire"},
		{"release missing ifName", "POST", "/v1/ipam/release", `{"containerID":"c1"}`, 400, "missing ifName"},
		{"release ok", "POST", "/v1/ipam/release", `{"containerID":"c1","ifName":"eth0"}`, 204, ""},
		{"put endpoint incomplete", "PUT", "/v1/endpoints", `{"containerID":"c1","ifName":"eth0"}`, 400, "missing hostIfName, hostIfIndex, ips"},
		{"delete without query", "DELETE", "/v1/endpoints", ``, 400, "missing containerID and ifName"},
		{"delete ok", "DELETE", "/v1/endpoints?containerID=c1&ifname=eth0", ``, 204, ""},
		{"gc bad entry", "POST", "/v1/gc", `{"valid":[{"containerID":"c1"}]}`, 400, "valid[0]: missing ifName"},
		{"gc ok", "POST", "/v1/gc", `{"valid":[]}`, 200, `"removed":[]`},
		{"wrong method", "GET", "/v1/ipam/allocate", ``, 405, ""},
		{"unknown route", "GET", "/v2/nope", ``, 404, "not found"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, body := rawRequest(t, sock, tc.method, tc.path, tc.body)
			if code != tc.code {
				t.Fatalf("code = %d, want %d (body %q)", code, tc.code, body)
			}
			if !strings.Contains(body, tc.want) {
				t.Fatalf("body %q does not contain %q", body, tc.want)
			}
		})
	}
}

func TestClientRoundTrip(t *testing.T) {
	f := newFake()
	_, c := unixServer(t, f)
	ctx := context.Background()
	if err := c.Healthy(ctx); err != nil {
		t.Fatalf("Healthy: %v", err)
	}
	st, err := c.Status(ctx)
	if err != nil || st.Node != "node1" || len(st.PodCIDRs) != 1 {
		t.Fatalf("Status = %+v, %v", st, err)
	}
	ar, err := c.Allocate(ctx, AllocateRequest{ContainerID: "c1", IfName: "eth0"})
	if err != nil || len(ar.Addresses) != 1 || ar.Addresses[0].IP != netip.MustParseAddr("10.244.1.7") {
		t.Fatalf("Allocate = %+v, %v", ar, err)
	}
	ep := Endpoint{ContainerID: "c1", IfName: "eth0", HostIfName: "lxc0", HostIfIndex: 7,
		IPs: []netip.Addr{netip.MustParseAddr("10.244.1.7")}, HostMAC: []byte{2, 0, 0, 0, 0, 1}}
	if err := c.PutEndpoint(ctx, ep); err != nil {
		t.Fatalf("PutEndpoint: %v", err)
	}
	eps, err := c.Endpoints(ctx)
	if err != nil || len(eps) != 1 || eps[0].HostMAC.String() != "02:00:00:00:00:01" {
		t.Fatalf("Endpoints = %+v, %v", eps, err)
	}
	gc, err := c.GC(ctx, GCRequest{Valid: []Attachment{{"other", "eth0"}}})
	if err != nil || len(gc.Removed) != 1 || gc.Removed[0] != (Attachment{"c1", "eth0"}) {
		t.Fatalf("GC = %+v, %v", gc, err)
	}
	if err := c.DeleteEndpoint(ctx, Attachment{"c1", "eth0"}); err != nil {
		t.Fatalf("DeleteEndpoint: %v", err)
	}
	if err := c.Release(ctx, ReleaseRequest{ContainerID: "c1", IfName: "eth0"}); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

func TestClientErrors(t *testing.T) {
	f := newFake()
	_, c := unixServer(t, f)
	ctx := context.Background()

	_, err := c.Allocate(ctx, AllocateRequest{ContainerID: "full", IfName: "eth0"})
	if !IsStatus(err, 503) || !strings.Contains(err.Error(), "pool 10.244.1.0/24 exhausted") {
		t.Fatalf("exhausted: got %v", err)
	}
	_, err = c.Allocate(ctx, AllocateRequest{IfName: "eth0"})
	if !IsStatus(err, 400) || !strings.Contains(err.Error(), "missing containerID") {
		t.Fatalf("missing id: got %v", err)
	}
	f.mu.Lock()
	f.health = errors.New("podCIDR not assigned yet")
	f.mu.Unlock()
	if err := c.Healthy(ctx); !IsStatus(err, 503) || !strings.Contains(err.Error(), "podCIDR not assigned yet") {
		t.Fatalf("unhealthy: got %v", err)
	}

	down := NewClient(filepath.Join(t.TempDir(), "nobody.sock"))
	err = down.Healthy(ctx)
	if !errors.Is(err, ErrUnreachable) || !strings.Contains(err.Error(), "is the agent running?") || !strings.Contains(err.Error(), "nobody.sock") {
		t.Fatalf("unreachable: got %v", err)
	}
}

func TestServeLifecycle(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "sub", "axon.sock")

	// A stale socket file nobody answers on is replaced.
	if err := os.MkdirAll(filepath.Dir(sock), 0o755); err != nil {
		t.Fatal(err)
	}
	stale, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close()

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, sock, newFake(), quietLog(), unixsock.Options{Group: 0}) }()
	c := NewClient(sock)
	waitHealthy(t, c)

	fi, err := os.Stat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o660 {
		t.Errorf("socket mode = %v, want 0660", fi.Mode().Perm())
	}

	// A second server on a live socket refuses instead of stealing it.
	err = Serve(context.Background(), sock, newFake(), quietLog(), unixsock.Options{Group: 0})
	if err == nil || !strings.Contains(err.Error(), "is listening on") {
		t.Fatalf("second Serve: got %v", err)
	}
	if err := c.Healthy(context.Background()); err != nil {
		t.Fatalf("first server hurt by second Serve: %v", err)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve returned %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not stop on context cancel")
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Errorf("socket left behind after shutdown: %v", err)
	}
}

func waitHealthy(t *testing.T, c *Client) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := c.Healthy(context.Background())
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("server never became healthy: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
