package api

import (
	"context"
	"net/http"
)

// The Service table, as the agent wants it (GET /v1/services) and as
// it is programmed in the socket LB maps (GET /v1/bpf/lb). Both texts use the
// format of lb.Render, so the two can be diffed line by line.

// ServicesReply is GET /v1/services: the agent's desired Service table.
type ServicesReply struct {
	// Text is the desired table rendered with lb.Render ("" when empty).
	Text        string   `json:"text"`
	Synced      bool     `json:"synced"` // the Service/EndpointSlice caches have synced
	Writer      bool     `json:"writer"` // a datapath writer is attached (else watch only)
	Services    int      `json:"services"`
	Frontends   int      `json:"frontends"`
	Backends    int      `json:"backends"`
	Problems    []string `json:"problems,omitempty"`    // Service entries ignored and why
	WriteErrors []string `json:"writeErrors,omitempty"` // frontends the writer failed to program
	Conflicts   []string `json:"conflicts,omitempty"`   // frontends claimed by two Services
	WatchError  string   `json:"watchError,omitempty"`  // last watch failure, "" when healthy
	// NorthSouth: the writer includes the north-south LB (tc/XDP on the
	// uplink), so Programmed covers its maps too.
	NorthSouth bool `json:"northSouth,omitempty"`
	// Programmed is the agent's write acknowledgement: per Service
	// ("namespace/name"), the resourceVersions of the Service and of its
	// EndpointSlices whose translation is fully written to the datapath
	// (every frontend written without error, none waiting). A Service with
	// a pending or failed write, or one that does not fit the maps, is
	// absent. A test (or an operator) that changed a Service waits until
	// the versions its change returned appear here instead of sleeping.
	Programmed map[string]ServiceVersions `json:"programmed,omitempty"`
}

// ServiceVersions are the resourceVersions the agent translated a Service
// from.
type ServiceVersions struct {
	Service string            `json:"service"`
	Slices  map[string]string `json:"slices,omitempty"` // EndpointSlice name → resourceVersion
}

// LBMapsReply is GET /v1/bpf/lb: what is actually in the socket LB's BPF maps.
type LBMapsReply struct {
	// Text is the maps' content rendered with lb.Render; "" when disabled or empty.
	Text      string `json:"text"`
	Frontends int    `json:"frontends"`
	Backends  int    `json:"backends"`
	Enabled   bool   `json:"enabled"`
	// Reason says why the socket LB is disabled ("" when enabled).
	Reason string `json:"reason,omitempty"`
}

// ServicesHandler is implemented by Handlers that serve the Service routes.
// It is optional (checked with a type assertion) so test agents that only
// speak IPAM/endpoints keep compiling.
type ServicesHandler interface {
	// ServiceList is GET /v1/services. (Not "Services": the agent already
	// has a Services() method returning its watch status.)
	ServiceList(ctx context.Context) (ServicesReply, error)
	LBMaps(ctx context.Context) (LBMapsReply, error)
}

// Services returns GET /v1/services: the desired Service table.
func (c *Client) Services(ctx context.Context) (ServicesReply, error) {
	var rep ServicesReply
	err := c.do(ctx, http.MethodGet, "/v1/services", nil, &rep)
	return rep, err
}

// LBMaps returns GET /v1/bpf/lb: the frontends programmed in the BPF maps.
func (c *Client) LBMaps(ctx context.Context) (LBMapsReply, error) {
	var rep LBMapsReply
	err := c.do(ctx, http.MethodGet, "/v1/bpf/lb", nil, &rep)
	return rep, err
}
