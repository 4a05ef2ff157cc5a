package api

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"regexp"
	"strings"
	"time"
)

// Drop events (`axon monitor`). GET /v1/monitor streams the drops of the
// node's BPF programs as NDJSON, one MonitorMessage a line, until the
// client goes away. A read-only route: any caller the socket lets in may
// stream (the agent caps concurrent streams, MaxMonitorStreams). The
// programs write events only while at least one stream is open.

// MaxMonitorStreams bounds concurrent GET /v1/monitor streams (503 beyond).
const MaxMonitorStreams = 8

// MonitorFilter selects drop events; empty fields select everything.
type MonitorFilter struct {
	// Pod is "namespace/name": events whose source or destination is one of
	// the pod's addresses, or that its host-side device saw.
	Pod string
	// Reasons are drop reason names (drop_no_backend, drop_spoof_src, ...).
	Reasons []string
	// Protocol is tcp, udp, sctp, icmp, icmpv6 or arp.
	Protocol string
}

// MonitorProtocols are the protocols MonitorFilter.Protocol accepts.
var MonitorProtocols = []string{"tcp", "udp", "sctp", "icmp", "icmpv6", "arp"}

// dns1123 is a Kubernetes namespace or pod name (lower-case DNS subdomain).
var dns1123 = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`)

// Validate checks the filter's syntax (reason names are the agent's to
// check: it knows the vocabulary).
func (f MonitorFilter) Validate() error {
	if f.Pod != "" {
		ns, name, ok := strings.Cut(f.Pod, "/")
		if !ok || len(ns) > 63 || len(name) > 253 || !dns1123.MatchString(ns) || !dns1123.MatchString(name) {
			return fmt.Errorf("pod %q: want namespace/name (lower-case DNS names)", f.Pod)
		}
	}
	if f.Protocol != "" {
		ok := false
		for _, p := range MonitorProtocols {
			ok = ok || p == f.Protocol
		}
		if !ok {
			return fmt.Errorf("protocol %q: want one of %s", f.Protocol, strings.Join(MonitorProtocols, ", "))
		}
	}
	if len(f.Reasons) > 64 {
		return fmt.Errorf("%d reasons: at most 64", len(f.Reasons))
	}
	return nil
}

func (f MonitorFilter) query() string {
	q := url.Values{}
	if f.Pod != "" {
		q.Set("pod", f.Pod)
	}
	if len(f.Reasons) > 0 {
		q.Set("reason", strings.Join(f.Reasons, ","))
	}
	if f.Protocol != "" {
		q.Set("protocol", f.Protocol)
	}
	if len(q) == 0 {
		return ""
	}
	return "?" + q.Encode()
}

func parseMonitorFilter(q url.Values) MonitorFilter {
	f := MonitorFilter{Pod: q.Get("pod"), Protocol: q.Get("protocol")}
	for _, r := range strings.Split(q.Get("reason"), ",") {
		if r = strings.TrimSpace(r); r != "" {
			f.Reasons = append(f.Reasons, r)
		}
	}
	return f
}

// DropEvent is one drop.
type DropEvent struct {
	Time      time.Time  `json:"time"`
	Prog      string     `json:"prog"`      // pod_egress, uplink_ingress, lb_tc, lb_xdp, lb_egress, uplink_egress, sock_lb
	Reason    string     `json:"reason"`    // drop_<why>, docs/operate.md
	Direction string     `json:"direction"` // ingress | egress (of the hook)
	Ifindex   uint32     `json:"ifindex,omitempty"`
	Len       uint32     `json:"len"`
	Proto     string     `json:"proto,omitempty"`
	Src       netip.Addr `json:"src,omitzero"`
	Dst       netip.Addr `json:"dst,omitzero"`
	SrcPort   uint16     `json:"sport,omitempty"`
	DstPort   uint16     `json:"dport,omitempty"`
	Pod       string     `json:"pod,omitempty"` // namespace/name of the local pod involved, when one is
}

// MonitorLost counts events a stream did not get, since it started.
type MonitorLost struct {
	Stream uint64 `json:"stream"` // this stream read too slowly: the agent dropped them
	Ring   uint64 `json:"ring"`   // the kernel's ring buffer was full (every stream missed them)
}

// MonitorMessage is one line of the stream: an event, or the lost counts
// (sent when they change, at most once a second).
type MonitorMessage struct {
	Event *DropEvent   `json:"event,omitempty"`
	Lost  *MonitorLost `json:"lost,omitempty"`
}

// MonitorHandler is implemented by a Handler that streams drop events.
// Monitor calls send for every message until ctx is done or send fails;
// a *StatusError returned before the first send becomes the reply.
type MonitorHandler interface {
	Monitor(ctx context.Context, f MonitorFilter, send func(MonitorMessage) error) error
}

func (s *server) monitor(w http.ResponseWriter, r *http.Request) {
	mh, ok := s.h.(MonitorHandler)
	if !ok {
		writeError(w, http.StatusNotImplemented, "this agent does not stream drop events")
		return
	}
	f := parseMonitorFilter(r.URL.Query())
	if err := f.Validate(); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	fl, _ := w.(http.Flusher)
	enc := json.NewEncoder(w)
	started := false
	err := mh.Monitor(r.Context(), f, func(m MonitorMessage) error {
		if !started {
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.WriteHeader(http.StatusOK)
			started = true
		}
		if err := enc.Encode(m); err != nil {
			return err
		}
		if fl != nil {
			fl.Flush()
		}
		return nil
	})
	if !started {
		if err == nil {
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.WriteHeader(http.StatusOK)
			return
		}
		s.fail(w, r, err)
		return
	}
	if err != nil && r.Context().Err() == nil {
		s.log.Debug("monitor stream ended", "err", err)
	}
}

// Monitor streams drop events matching f, calling fn for each message,
// until ctx is done (returns nil), fn fails or the agent ends the stream.
func (c *Client) Monitor(ctx context.Context, f MonitorFilter, fn func(MonitorMessage) error) error {
	if err := f.Validate(); err != nil {
		return err
	}
	// the stream has no overall timeout (c.http has one)
	hc := &http.Client{Transport: c.http.Transport}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://axon-agent/v1/monitor"+f.query(), nil)
	if err != nil {
		return fmt.Errorf("build monitor request: %w", err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("%w at %s: is the agent running? (%v)", ErrUnreachable, c.socket, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		var e Error
		if json.Unmarshal(data, &e) != nil || e.Message == "" {
			e.Message = strings.TrimSpace(string(data))
		}
		return &RemoteError{Code: resp.StatusCode, Message: e.Message}
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var m MonitorMessage
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			return fmt.Errorf("decode monitor line from axon-agent at %s: %w", c.socket, err)
		}
		if err := fn(m); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil && ctx.Err() == nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("read monitor stream from axon-agent at %s: %w", c.socket, err)
	}
	return nil
}
