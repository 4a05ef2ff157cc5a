package lab

import (
	"context"
	"net/http"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/axonhq/axon/internal/api"
	"github.com/axonhq/axon/internal/unixsock"
)

// statusSeq answers the agent API's status route with one nodeport_lb value
// per call from values (the last one repeats); the other routes are unused.
type statusSeq struct {
	api.Handler
	values []string
	calls  atomic.Int32
}

func (s *statusSeq) Status(context.Context) (api.Status, error) {
	i := int(s.calls.Add(1)) - 1
	v := s.values[min(i, len(s.values)-1)]
	return api.Status{Datapath: []api.Decision{{Name: "datapath", Value: "tcx"}, {Name: "nodeport_lb", Value: v, Reason: "why " + v}}}, nil
}

// serveAPI serves h on a unix socket with the agent's listener and mux until
// the test ends (not api.Serve: it blocks, and in a goroutine it might not
// listen yet when the first request comes).
func serveAPI(t *testing.T, h api.Handler) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := api.Listen(sock, unixsock.Options{Group: unixsock.NoGroup})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: api.NewMux(h, nil)}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return sock
}

func TestNodePortDecision(t *testing.T) {
	for _, tc := range []struct {
		desc        string
		values      []string
		wait        time.Duration
		want        string
		calls       int32 // status calls; 0: at least two
		maxDuration time.Duration
	}{
		{desc: "attached at once", values: []string{"xdp"}, wait: 5 * time.Second, want: "xdp", calls: 1, maxDuration: 2 * time.Second},
		{desc: "disabled is an answer", values: []string{"disabled"}, wait: 5 * time.Second, want: "disabled", calls: 1, maxDuration: 2 * time.Second},
		{desc: "pending, then attached", values: []string{"pending", "pending", "tc"}, wait: 5 * time.Second, want: "tc", calls: 3, maxDuration: 4 * time.Second},
		{desc: "pending past the wait", values: []string{"pending"}, wait: 600 * time.Millisecond, want: "pending", maxDuration: 3 * time.Second},
		{desc: "no time left: one question", values: []string{"pending", "xdp"}, wait: 0, want: "pending", calls: 1, maxDuration: 2 * time.Second},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			h := &statusSeq{values: tc.values}
			sock := serveAPI(t, h)
			t0 := time.Now()
			v, reason, err := NodePortDecision(t.Context(), sock, tc.wait)
			took := time.Since(t0)
			if err != nil || v != tc.want || reason != "why "+tc.want {
				t.Errorf("got %q, %q, %v; want %q, %q, no error", v, reason, err, tc.want, "why "+tc.want)
			}
			if n := h.calls.Load(); tc.calls > 0 && n != tc.calls || tc.calls == 0 && n < 2 {
				t.Errorf("%d status calls, want %d (0: at least two)", n, tc.calls)
			}
			if took > tc.maxDuration {
				t.Errorf("took %s, want at most %s", took, tc.maxDuration)
			}
		})
	}
	t.Run("agent not answering", func(t *testing.T) {
		t0 := time.Now()
		v, _, err := NodePortDecision(t.Context(), filepath.Join(t.TempDir(), "none.sock"), 600*time.Millisecond)
		if err == nil || v != "" {
			t.Errorf("got %q, %v; want no value and an error", v, err)
		}
		if took := time.Since(t0); took < 600*time.Millisecond || took > 5*time.Second {
			t.Errorf("gave up after %s, want after the 600ms wait", took)
		}
	})
}
