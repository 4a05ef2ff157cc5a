package l4lb

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/axonhq/axon/internal/unixsock"
)

// Serve answers GET /v1/status (Status as JSON) and POST /v1/reload on the
// unix socket path until ctx is done. The socket is 0600: only root connects,
// and POST /v1/reload is refused (403) to any caller but uid 0 should the
// mode be loosened. A stale socket file is replaced; a live one (another axon
// lb) or a path that is not a socket is an error, and the path is left as it
// was. At the end the socket is removed only if it is still the one Serve
// made.
func (r *Runner) Serve(ctx context.Context, path string, log *slog.Logger) error {
	return r.serveMux(ctx, path, log, nil)
}

// socketAccess is root only, for connecting and for reloading.
func socketAccess() unixsock.Options { return unixsock.Options{Group: unixsock.NoGroup} }

func (r *Runner) serveMux(ctx context.Context, path string, log *slog.Logger, extra func(*http.ServeMux)) error {
	if log == nil {
		log = slog.Default()
	}
	ln, err := unixsock.Listen(path, socketAccess())
	if err != nil {
		return fmt.Errorf("axon lb status socket: %w (another axon lb? set `socket:` in the config)", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, r.Status())
	})
	mux.HandleFunc("POST /v1/reload", func(w http.ResponseWriter, _ *http.Request) {
		p, err := r.Reload()
		switch {
		case errors.Is(err, ErrUnchanged):
			writeJSON(w, http.StatusOK, map[string]string{"result": "unchanged"})
		case err != nil:
			writeJSON(w, http.StatusUnprocessableEntity, map[string]string{"message": err.Error()})
		default:
			writeJSON(w, http.StatusOK, map[string]string{"result": p.String()})
		}
	})
	if extra != nil {
		extra(mux)
	}
	srv := &http.Server{Handler: unixsock.GuardWrites(mux, socketAccess(), log, nil), ReadHeaderTimeout: 5 * time.Second,
		ConnContext: unixsock.ConnContext}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	log.Info("l4lb status socket listening", "socket", path)
	select {
	case err := <-errc:
		_ = ln.Close()
		return fmt.Errorf("serve %s: %w", path, err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx) // closes ln, which removes the socket if it is still ours
	<-errc
	return nil
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// Client talks to a running `axon lb` over its socket.
type Client struct{ http *http.Client }

// NewClient returns a client for the socket at path.
func NewClient(path string) *Client {
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{Timeout: 3 * time.Second}).DialContext(ctx, "unix", path)
	}}
	return &Client{http: &http.Client{Transport: tr, Timeout: 30 * time.Second}}
}

// Status returns the running load balancer's status.
func (c *Client) Status(ctx context.Context) (Status, error) {
	var st Status
	return st, c.do(ctx, http.MethodGet, "/v1/status", &st)
}

// Reload asks the running load balancer to reload its file now; the reply
// says what changed, or why the file was rejected.
func (c *Client) Reload(ctx context.Context) (string, error) {
	var rep map[string]string
	err := c.do(ctx, http.MethodPost, "/v1/reload", &rep)
	return rep["result"], err
}

func (c *Client) do(ctx context.Context, method, path string, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, "http://l4lb"+path, nil)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("axon lb not reachable (is `axon lb --config ...` running? check --socket): %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var e map[string]string
		_ = json.NewDecoder(resp.Body).Decode(&e)
		return fmt.Errorf("axon lb: %s (HTTP %d)", e["message"], resp.StatusCode)
	}
	return json.NewDecoder(resp.Body).Decode(out)
}
