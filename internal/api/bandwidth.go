package api

import (
	"context"
	"net/http"
	"net/netip"
)

// The Bandwidth Manager. GET /v1/bpf/bandwidth returns the limits
// as programmed in the BPF maps (`axon bpf bandwidth list`); Status carries
// a BandwidthStatus summary (`axon status`).

// BandwidthStatus is the Bandwidth Manager part of Status.
type BandwidthStatus struct {
	Enabled bool   `json:"enabled"`
	Reason  string `json:"reason,omitempty"` // why disabled / not loaded
	Uplink  string `json:"uplink,omitempty"`
	// Qdisc is what the uplink has now ("fq", "mq+fq") and QdiscError why
	// fq could not be installed (egress then is not enforced).
	Qdisc      string `json:"qdisc,omitempty"`
	QdiscError string `json:"qdiscError,omitempty"`
	// QdiscRepairs counts how often the agent found fq missing and put it back.
	QdiscRepairs  int    `json:"qdiscRepairs"`
	LastRepair    string `json:"lastRepair,omitempty"` // what it found, e.g. "noqueue"
	HorizonMillis int64  `json:"horizonMillis"`
	BBR           string `json:"bbr,omitempty"` // "on (N pods)", "off", or why not
	LimitedPods   int    `json:"limitedPods"`
	// Problems lists rejected annotations (pod, annotation, value, why).
	Problems []string `json:"problems,omitempty"`
}

// BandwidthRow is one limit read back from the maps.
type BandwidthRow struct {
	Pod       string       `json:"pod,omitempty"` // namespace/name, "" when no endpoint owns the addresses
	ID        uint32       `json:"id"`
	Addrs     []netip.Addr `json:"addrs"`
	Direction string       `json:"direction"` // "egress" | "ingress"
	Bits      uint64       `json:"bitsPerSecond"`
	Rate      string       `json:"rate"`                 // e.g. "10M"
	Horizon   string       `json:"horizon,omitempty"`    // egress
	Burst     uint64       `json:"burstBytes,omitempty"` // ingress
	Drops     uint64       `json:"drops"`
}

// BandwidthReply is GET /v1/bpf/bandwidth.
type BandwidthReply struct {
	Enabled  bool              `json:"enabled"`
	Reason   string            `json:"reason,omitempty"`
	Rows     []BandwidthRow    `json:"rows"`
	Counters map[string]uint64 `json:"counters,omitempty"`
}

// BandwidthHandler is implemented by Handlers that serve the bandwidth
// route; others answer it with 501.
type BandwidthHandler interface {
	BandwidthMaps(ctx context.Context) (BandwidthReply, error)
}

// BandwidthMaps returns GET /v1/bpf/bandwidth.
func (c *Client) BandwidthMaps(ctx context.Context) (BandwidthReply, error) {
	var rep BandwidthReply
	err := c.do(ctx, http.MethodGet, "/v1/bpf/bandwidth", nil, &rep)
	return rep, err
}
