package api

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
)

// The north-south load balancer's state, read from its BPF maps by
// the process that loaded it (axon-agent, or the standalone `axon lb`):
// conntrack (GET /v1/bpf/ct), reverse NAT (GET /v1/bpf/nat), Maglev tables
// (GET /v1/bpf/maglev) and the "which backend would this packet hit"
// simulator (GET /v1/lb/explain). The standalone load balancer serves the
// same routes on its own socket (MountNorthSouth).

// CTEntry is one tracked flow.
type CTEntry struct {
	Proto    string `json:"proto"`    // tcp, udp
	Client   string `json:"client"`   // addr:port as the client sent it
	Frontend string `json:"frontend"` // addr:port the client addressed
	Backend  string `json:"backend"`  // addr:port the flow goes to
	NATPort  uint16 `json:"natPort,omitempty"`
	Mode     string `json:"mode"` // local, snat, dsr
	Closing  bool   `json:"closing,omitempty"`
	// Unreplied: not established yet (its backend has not answered, or
	// the client's ACK is awaited); GC removes it after the short
	// unreplied timeout.
	Unreplied bool    `json:"unreplied,omitempty"`
	AgeSec    float64 `json:"ageSeconds"`
	IdleSec   float64 `json:"idleSeconds"`
	// NextHop is the next hop kept in the entry ("<MAC> on ifindex <N>")
	// while valid under the LB's neighbour generation; empty otherwise.
	NextHop string `json:"nextHop,omitempty"`
}

// CTReply is GET /v1/bpf/ct.
type CTReply struct {
	Enabled bool      `json:"enabled"`
	Reason  string    `json:"reason,omitempty"` // why disabled
	Entries []CTEntry `json:"entries"`
	Max     int       `json:"max"` // table size
}

// NATEntry is one reverse translation.
type NATEntry struct {
	Proto    string  `json:"proto"`
	ReplySrc string  `json:"replySrc"` // a reply as seen on the wire
	ReplyDst string  `json:"replyDst"`
	NewSrc   string  `json:"newSrc"` // rewritten to
	NewDst   string  `json:"newDst"`
	Kind     string  `json:"kind"` // snat, local, local-dsr (a local backend reached by another node's DSR)
	IdleSec  float64 `json:"idleSeconds"`
}

// NATReply is GET /v1/bpf/nat.
type NATReply struct {
	Enabled bool       `json:"enabled"`
	Reason  string     `json:"reason,omitempty"`
	Entries []NATEntry `json:"entries"`
}

// MaglevShare is how many slots of a table one backend holds.
type MaglevShare struct {
	Backend string `json:"backend"`
	Slots   int    `json:"slots"`
}

// MaglevTable is one frontend's programmed Maglev table.
type MaglevTable struct {
	Frontend string        `json:"frontend"` // addr:port/PROTO
	Service  string        `json:"service,omitempty"`
	Size     int           `json:"size"`
	Random   bool          `json:"random,omitempty"` // the frontend picks at random: no table
	Backends []MaglevShare `json:"backends"`
	Slots    []string      `json:"slots,omitempty"` // slot → backend, with ?slots=true
}

// MaglevReply is GET /v1/bpf/maglev?service=ns/name|frontend=addr:port/proto[&slots=true].
type MaglevReply struct {
	Tables []MaglevTable `json:"tables"`
}

// ExplainReply is GET /v1/lb/explain?proto=&src=&dst=: what the load balancer
// would do with the first packet of that flow, from the live maps, without
// changing them.
type ExplainReply struct {
	Flow     string   `json:"flow"`               // "tcp 203.0.113.7:40000 -> 198.18.0.11:30080"
	Verdict  string   `json:"verdict"`            // datapath reason, e.g. ct_new, ct_hit, not_service, drop_no_backend
	Frontend string   `json:"frontend,omitempty"` // matched frontend
	Service  string   `json:"service,omitempty"`
	Backend  string   `json:"backend,omitempty"` // chosen backend
	Mode     string   `json:"mode,omitempty"`    // local, snat, dsr
	Steps    []string `json:"steps,omitempty"`   // how it got there, one line each
}

// NorthSouthHandler serves the north-south load balancer's routes; optional for a Handler.
type NorthSouthHandler interface {
	CT(ctx context.Context) (CTReply, error)
	NAT(ctx context.Context) (NATReply, error)
	// Maglev selects by service (namespace/name, or a VIP name) or frontend (addr:port/proto).
	Maglev(ctx context.Context, service, frontend string, slots bool) (MaglevReply, error)
	Explain(ctx context.Context, proto, src, dst string) (ExplainReply, error)
}

// MountNorthSouth registers the north-south load balancer's routes of h on mux.
func MountNorthSouth(mux *http.ServeMux, h NorthSouthHandler, log *slog.Logger) {
	if log == nil {
		log = slog.Default()
	}
	s := &server{log: log}
	mux.HandleFunc("GET /v1/bpf/ct", func(w http.ResponseWriter, r *http.Request) {
		rep, err := h.CT(r.Context())
		if rep.Entries == nil {
			rep.Entries = []CTEntry{}
		}
		s.reply(w, r, rep, err)
	})
	mux.HandleFunc("GET /v1/bpf/nat", func(w http.ResponseWriter, r *http.Request) {
		rep, err := h.NAT(r.Context())
		if rep.Entries == nil {
			rep.Entries = []NATEntry{}
		}
		s.reply(w, r, rep, err)
	})
	mux.HandleFunc("GET /v1/bpf/maglev", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if (q.Get("service") == "") == (q.Get("frontend") == "") {
			writeError(w, http.StatusBadRequest, "give exactly one of service=namespace/name and frontend=addr:port/proto")
			return
		}
		rep, err := h.Maglev(r.Context(), q.Get("service"), q.Get("frontend"), q.Get("slots") == "true")
		s.reply(w, r, rep, err)
	})
	mux.HandleFunc("GET /v1/lb/explain", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		rep, err := h.Explain(r.Context(), q.Get("proto"), q.Get("src"), q.Get("dst"))
		s.reply(w, r, rep, err)
	})
}

// mountNorthSouth registers the north-south load balancer's routes: h's, or 501 for a Handler without them.
func (s *server) mountNorthSouth(mux *http.ServeMux) {
	if h, ok := s.h.(NorthSouthHandler); ok {
		MountNorthSouth(mux, h, s.log)
		return
	}
	for _, p := range []string{"/v1/bpf/ct", "/v1/bpf/nat", "/v1/bpf/maglev", "/v1/lb/explain"} {
		mux.HandleFunc("GET "+p, func(w http.ResponseWriter, r *http.Request) {
			writeError(w, http.StatusNotImplemented, fmt.Sprintf("GET %s: this agent has no north-south load balancer API: upgrade axon-agent", r.URL.Path))
		})
	}
}

// CT returns GET /v1/bpf/ct.
func (c *Client) CT(ctx context.Context) (CTReply, error) {
	var rep CTReply
	return rep, c.do(ctx, http.MethodGet, "/v1/bpf/ct", nil, &rep)
}

// NAT returns GET /v1/bpf/nat.
func (c *Client) NAT(ctx context.Context) (NATReply, error) {
	var rep NATReply
	return rep, c.do(ctx, http.MethodGet, "/v1/bpf/nat", nil, &rep)
}

// Maglev returns GET /v1/bpf/maglev for a service or a frontend.
func (c *Client) Maglev(ctx context.Context, service, frontend string, slots bool) (MaglevReply, error) {
	q := url.Values{}
	if service != "" {
		q.Set("service", service)
	}
	if frontend != "" {
		q.Set("frontend", frontend)
	}
	if slots {
		q.Set("slots", "true")
	}
	var rep MaglevReply
	return rep, c.do(ctx, http.MethodGet, "/v1/bpf/maglev?"+q.Encode(), nil, &rep)
}

// Explain returns GET /v1/lb/explain.
func (c *Client) Explain(ctx context.Context, proto, src, dst string) (ExplainReply, error) {
	q := url.Values{"proto": {proto}, "src": {src}, "dst": {dst}}
	var rep ExplainReply
	return rep, c.do(ctx, http.MethodGet, "/v1/lb/explain?"+q.Encode(), nil, &rep)
}
