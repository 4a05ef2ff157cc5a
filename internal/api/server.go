package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/axonhq/axon/internal/unixsock"
)

// Handler implements the agent side of the local API. Methods may return a
// *StatusError to choose the HTTP status; any other error becomes a 500.
// A Handler that also implements ServicesHandler serves the Service routes
// (GET /v1/services, GET /v1/bpf/lb); others answer them with 501.
type Handler interface {
	// Healthy returns nil when the agent is ready; the error text is the 503 body.
	Healthy(ctx context.Context) error
	Status(ctx context.Context) (Status, error)
	Endpoints(ctx context.Context) ([]Endpoint, error)
	Allocate(ctx context.Context, r AllocateRequest) (AllocateResponse, error)
	Release(ctx context.Context, r ReleaseRequest) error
	PutEndpoint(ctx context.Context, ep Endpoint) error
	DeleteEndpoint(ctx context.Context, a Attachment) error
	GC(ctx context.Context, r GCRequest) (GCResponse, error)
}

// StatusError lets a Handler pick the HTTP status code of its error reply:
// 400 bad input, 404 not found, 409 conflict, 503 not ready.
type StatusError struct {
	Code    int
	Message string
}

func (e *StatusError) Error() string { return e.Message }

// Errorf builds a *StatusError with a formatted message.
func Errorf(code int, format string, args ...any) *StatusError {
	return &StatusError{Code: code, Message: fmt.Sprintf(format, args...)}
}

// maxBody bounds request bodies; GC lists are the largest (a few thousand attachments).
const maxBody = 4 << 20

// NewMux returns the HTTP handler serving the routes listed in docs/architecture.md.
func NewMux(h Handler, log *slog.Logger) http.Handler {
	if log == nil {
		log = slog.Default()
	}
	s := &server{h: h, log: log}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", s.healthz)
	mux.HandleFunc("GET /v1/status", s.status)
	mux.HandleFunc("GET /v1/endpoints", s.endpoints)
	mux.HandleFunc("POST /v1/ipam/allocate", s.allocate)
	mux.HandleFunc("POST /v1/ipam/release", s.release)
	mux.HandleFunc("PUT /v1/endpoints", s.putEndpoint)
	mux.HandleFunc("DELETE /v1/endpoints", s.deleteEndpoint)
	mux.HandleFunc("POST /v1/gc", s.gc)
	mux.HandleFunc("GET /v1/services", optionalRoute(s, "does not serve Services", ServicesHandler.ServiceList))
	mux.HandleFunc("GET /v1/bpf/lb", optionalRoute(s, "does not serve Services", ServicesHandler.LBMaps))
	// northsouth.go
	s.mountNorthSouth(mux)
	mux.HandleFunc("GET /v1/bpf/bandwidth", optionalRoute(s, "has no Bandwidth Manager", BandwidthHandler.BandwidthMaps))
	mux.HandleFunc("GET /v1/bpf/sockmap", optionalRoute(s, "has no same-node TCP bypass", SockmapHandler.SockmapConns))
	mux.HandleFunc("GET /v1/monitor", s.monitor) // monitor.go
	return mux
}

type server struct {
	h   Handler
	log *slog.Logger
}

func (s *server) healthz(w http.ResponseWriter, r *http.Request) {
	if err := s.h.Healthy(r.Context()); err != nil {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, err.Error())
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = io.WriteString(w, "ok")
}

func (s *server) status(w http.ResponseWriter, r *http.Request) {
	st, err := s.h.Status(r.Context())
	s.reply(w, r, st, err)
}

func (s *server) endpoints(w http.ResponseWriter, r *http.Request) {
	eps, err := s.h.Endpoints(r.Context())
	if eps == nil {
		eps = []Endpoint{}
	}
	s.reply(w, r, eps, err)
}

func (s *server) allocate(w http.ResponseWriter, r *http.Request) {
	var req AllocateRequest
	if !s.decodeAttached(w, r, &req) {
		return
	}
	resp, err := s.h.Allocate(r.Context(), req)
	s.reply(w, r, resp, err)
}

func (s *server) release(w http.ResponseWriter, r *http.Request) {
	var req ReleaseRequest
	if !s.decodeAttached(w, r, &req) {
		return
	}
	s.replyNoContent(w, r, s.h.Release(r.Context(), req))
}

func (s *server) putEndpoint(w http.ResponseWriter, r *http.Request) {
	var ep Endpoint
	if !s.decodeAttached(w, r, &ep) {
		return
	}
	var missing []string
	if ep.HostIfName == "" {
		missing = append(missing, "hostIfName")
	}
	if ep.HostIfIndex <= 0 {
		missing = append(missing, "hostIfIndex")
	}
	if len(ep.IPs) == 0 {
		missing = append(missing, "ips")
	}
	if len(missing) > 0 {
		writeError(w, http.StatusBadRequest, "endpoint is missing "+strings.Join(missing, ", "))
		return
	}
	s.replyNoContent(w, r, s.h.PutEndpoint(r.Context(), ep))
}

func (s *server) deleteEndpoint(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	a := Attachment{ContainerID: q.Get("containerID"), IfName: q.Get("ifname")}
	if msg := checkAttachment(a.ContainerID, a.IfName); msg != "" {
		writeError(w, http.StatusBadRequest, msg+" (query parameters containerID= and ifname=)")
		return
	}
	s.replyNoContent(w, r, s.h.DeleteEndpoint(r.Context(), a))
}

func (s *server) gc(w http.ResponseWriter, r *http.Request) {
	var req GCRequest
	if !s.decode(w, r, &req) {
		return
	}
	for i, a := range req.Valid {
		if msg := checkAttachment(a.ContainerID, a.IfName); msg != "" {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("valid[%d]: %s", i, msg))
			return
		}
	}
	resp, err := s.h.GC(r.Context(), req)
	if resp.Removed == nil {
		resp.Removed = []Attachment{}
	}
	s.reply(w, r, resp, err)
}

// optionalRoute serves the GET route of an optional Handler interface H: the
// reply of call, or 501 saying what this agent lacks ("does not serve Services").
func optionalRoute[H, R any](s *server, lacks string, call func(H, context.Context) (R, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		h, ok := s.h.(H)
		if !ok {
			writeError(w, http.StatusNotImplemented, fmt.Sprintf("%s %s: this agent %s: upgrade axon-agent", r.Method, r.URL.Path, lacks))
			return
		}
		rep, err := call(h, r.Context())
		s.reply(w, r, rep, err)
	}
}

// attached is a request body that names one pod attachment.
type attached interface {
	attachment() (containerID, ifName string)
}

func (r *AllocateRequest) attachment() (string, string) { return r.ContainerID, r.IfName }
func (r *ReleaseRequest) attachment() (string, string)  { return r.ContainerID, r.IfName }
func (ep *Endpoint) attachment() (string, string)       { return ep.ContainerID, ep.IfName }

// decodeAttached decodes a body naming a pod attachment, like decode, and
// answers 400 itself when the attachment is incomplete.
func (s *server) decodeAttached(w http.ResponseWriter, r *http.Request, v attached) bool {
	if !s.decode(w, r, v) {
		return false
	}
	if msg := checkAttachment(v.attachment()); msg != "" {
		writeError(w, http.StatusBadRequest, msg)
		return false
	}
	return true
}

func checkAttachment(containerID, ifName string) string {
	var missing []string
	if containerID == "" {
		missing = append(missing, "containerID")
	}
	if ifName == "" {
		missing = append(missing, "ifName")
	}
	if len(missing) == 0 {
		return ""
	}
	return "missing " + strings.Join(missing, " and ")
}

// decode reads a JSON body strictly (unknown fields and trailing data are
// rejected) and answers 400 itself when it fails.
func (s *server) decode(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		msg := fmt.Sprintf("bad request body for %s %s: %v", r.Method, r.URL.Path, err)
		if errors.Is(err, io.EOF) {
			msg = fmt.Sprintf("empty request body for %s %s: send a JSON object", r.Method, r.URL.Path)
		}
		writeError(w, http.StatusBadRequest, msg)
		return false
	}
	if dec.More() {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("bad request body for %s %s: trailing data after the JSON object", r.Method, r.URL.Path))
		return false
	}
	return true
}

func (s *server) reply(w http.ResponseWriter, r *http.Request, v any, err error) {
	if err != nil {
		s.fail(w, r, err)
		return
	}
	var buf bytes.Buffer
	if err := json.NewEncoder(&buf).Encode(v); err != nil {
		s.fail(w, r, fmt.Errorf("encode reply: %w", err))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(buf.Bytes())
}

func (s *server) replyNoContent(w http.ResponseWriter, r *http.Request, err error) {
	if err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *server) fail(w http.ResponseWriter, r *http.Request, err error) {
	code := http.StatusInternalServerError
	var se *StatusError
	if errors.As(err, &se) && se.Code >= 400 && se.Code <= 599 {
		code = se.Code
	}
	s.log.Warn("api request failed", "method", r.Method, "path", r.URL.Path, "code", code, "err", err)
	writeError(w, code, err.Error())
}

func writeError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(Error{Message: msg})
}

// CallerRefusedCounter is implemented by a Handler that counts callers
// refused by Serve's credentials check.
type CallerRefusedCounter interface{ CallerRefused() }

// Serve listens on socketPath and serves h until ctx is done. The socket
// file is made with access's mode and group (unixsock.Listen: a stale socket
// is replaced, anything else at the path is an error) and removed at the end
// if it is still the one Serve made. Every route but GET and HEAD is served
// only to callers access lets write (uid 0 and its WriterUIDs/WriterGIDs, by
// SO_PEERCRED); the others get 403.
func Serve(ctx context.Context, socketPath string, h Handler, log *slog.Logger, access unixsock.Options) error {
	if log == nil {
		log = slog.Default()
	}
	ln, err := Listen(socketPath, access)
	if err != nil {
		return err
	}
	var refused func()
	if c, ok := h.(CallerRefusedCounter); ok {
		refused = c.CallerRefused
	}
	srv := &http.Server{
		Handler:           unixsock.GuardWrites(NewMux(h, log), access, log, refused),
		ReadHeaderTimeout: 10 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return ctx },
		ConnContext:       unixsock.ConnContext,
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	log.Info("api listening", "socket", socketPath, "mode", fmt.Sprintf("%04o", access.Mode()), "group", access.Group,
		"writerUIDs", access.WriterUIDs, "writerGIDs", access.WriterGIDs)
	select {
	case err := <-errc:
		_ = ln.Close()
		return fmt.Errorf("serve api on %s: %w", socketPath, err)
	case <-ctx.Done():
	}
	shutCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	err = srv.Shutdown(shutCtx) // closes ln, which removes the socket if it is still ours
	<-errc
	if err != nil {
		return fmt.Errorf("shut down api on %s: %w", socketPath, err)
	}
	return nil
}

// Listen creates the unix socket listener used by Serve.
func Listen(socketPath string, access unixsock.Options) (*unixsock.Listener, error) {
	if socketPath == "" {
		return nil, errors.New("api socket path is empty: pass --socket")
	}
	ln, err := unixsock.Listen(socketPath, access)
	if err != nil {
		return nil, fmt.Errorf("agent api socket: %w", err)
	}
	return ln, nil
}
