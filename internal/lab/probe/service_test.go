package probe

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestParseService(t *testing.T) {
	tests := []struct {
		in, want, wantErr string
	}{
		{"tcp/10.96.100.10:80", "tcp/10.96.100.10:80", ""},
		{"udp/[fd00:10:96::10]:80", "udp/[fd00:10:96::10]:80", ""},
		{"icmp/10.96.100.10:80", "", "want tcp/ADDR:PORT"},
		{"tcp/10.96.100.10", "", "probe \"tcp/10.96.100.10\""},
		{"10.96.100.10:80", "", "want tcp/ADDR:PORT"},
	}
	for _, tc := range tests {
		p, err := ParseService(tc.in)
		switch {
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%q: err %v, want %q", tc.in, err, tc.wantErr)
		case tc.wantErr == "" && (err != nil || p.String() != tc.want):
			t.Errorf("%q: %v %v, want %s", tc.in, p, err, tc.want)
		}
	}
}

// TestServiceProbesLoopback runs the prober against a local echo server:
// TCP and UDP pass when the peer is the address dialled; a closed port fails.
func TestServiceProbesLoopback(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	// a free port for the echo server on loopback
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	ready := &syncBuffer{}
	go func() { _ = ServeEcho(ctx, port, ready, nil) }()
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(ready.String(), "ready"); {
		if time.Now().After(deadline) {
			t.Fatal("echo server did not start")
		}
		time.Sleep(10 * time.Millisecond)
	}
	ap := func(s string, p int) netip.AddrPort { return netip.AddrPortFrom(netip.MustParseAddr(s), uint16(p)) }
	probes := []Service{
		{"tcp", ap("127.0.0.1", port)}, {"udp", ap("127.0.0.1", port)},
		{"tcp", ap("::1", port)}, {"udp", ap("::1", port)},
		{"tcp", ap("127.0.0.1", 1)},
	}
	var out bytes.Buffer
	if err := RunServices(ctx, probes, time.Second, &out); err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		for _, p := range probes {
			if strings.Contains(line, `"addr":"`+p.Addr.String()+`"`) && strings.Contains(line, `"proto":"`+p.Proto+`"`) {
				got[p.String()] = strings.Contains(line, `"ok":true`)
			}
		}
	}
	for i, p := range probes {
		if want := i < 4; got[p.String()] != want {
			t.Errorf("%s ok = %v, want %v\n%s", p, got[p.String()], want, out.String())
		}
	}
}

// syncBuffer is a bytes.Buffer safe for one writer and one reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
