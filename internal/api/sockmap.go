package api

import (
	"context"
	"net/http"
	"net/netip"
)

// The same-node TCP bypass (sockmap). GET /v1/bpf/sockmap returns the
// connections in the bypass's SOCKHASH with the pods that own them (`axon bpf
// sockmap list`); Status carries a SockmapStatus summary (`axon status`).

// SockmapStatus is the same-node TCP bypass part of Status.
type SockmapStatus struct {
	Enabled bool   `json:"enabled"`
	Reason  string `json:"reason,omitempty"` // why off (flag, self-test, load error), or "pending"
	Cgroup  string `json:"cgroup,omitempty"` // where the sock_ops program is attached
	// PodsAdmitted counts the local pods whose connections may be bypassed.
	PodsAdmitted int `json:"podsAdmitted"`
	// NotAdmitted lists the local pods that are not, "namespace/name: why"
	// (opted out, bandwidth limit, invalid annotation), sorted.
	NotAdmitted []string `json:"notAdmitted,omitempty"`
	// Connections counts the sockets in the SOCKHASH (two per bypassed
	// pod-to-pod or loopback connection); -1 when it could not be read.
	Connections int `json:"connections"`
	// SelfTest is the kernel self-test's verdict ("" until it ran) and
	// SelfTestChecks its checks, "name: ok|FAILED: what was measured".
	SelfTest       string   `json:"selfTest,omitempty"`
	SelfTestChecks []string `json:"selfTestChecks,omitempty"`
}

// SockmapConn is one socket in the SOCKHASH.
type SockmapConn struct {
	Local  netip.AddrPort `json:"local"`
	Remote netip.AddrPort `json:"remote"`
	// Netns is the netns cookie for loopback connections inside a pod, 0 for
	// pod-to-pod connections.
	Netns uint64 `json:"netns,omitempty"`
	// LocalPod and RemotePod are the owning pods (namespace/name) from the
	// endpoint registry, "" when no endpoint owns the address or netns.
	LocalPod  string `json:"localPod,omitempty"`
	RemotePod string `json:"remotePod,omitempty"`
	// Mode is the local socket's: "bypass" (its writes go to the peer
	// socket), "stack" (they take TCP, for good), "undecided" (nothing
	// written yet), "" unknown (a kernel without the connection iterator).
	Mode string `json:"mode,omitempty"`
	// Alias: the socket found its peer by its connection's client endpoint
	// (a sidecar's netfilter REDIRECT rewrote the tuple), not by the
	// reversed tuple.
	Alias bool `json:"alias,omitempty"`
	// Counters of the local socket's writes (0 where Mode is ""):
	// redirected into the peer, and passed to TCP.
	RedirectedMsgs  uint64 `json:"redirectedMsgs"`
	RedirectedBytes uint64 `json:"redirectedBytes"`
	PassedBytes     uint64 `json:"passedBytes"`
}

// SockmapReply is GET /v1/bpf/sockmap.
type SockmapReply struct {
	Enabled bool          `json:"enabled"`
	Reason  string        `json:"reason,omitempty"` // why off
	Conns   []SockmapConn `json:"conns"`
	// Counters are the bypass's BPF counters, summed over CPUs.
	Counters map[string]uint64 `json:"counters,omitempty"`
}

// SockmapHandler is implemented by Handlers that serve the sockmap route;
// others answer it with 501.
type SockmapHandler interface {
	SockmapConns(ctx context.Context) (SockmapReply, error)
}

// SockmapConns returns GET /v1/bpf/sockmap.
func (c *Client) SockmapConns(ctx context.Context) (SockmapReply, error) {
	var rep SockmapReply
	err := c.do(ctx, http.MethodGet, "/v1/bpf/sockmap", nil, &rep)
	return rep, err
}
