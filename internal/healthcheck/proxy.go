package healthcheck

// The node-wide proxy health check, compatible with kube-proxy's
// (k8s.io/kubernetes/pkg/proxy/healthcheck, its --healthz-bind-address,
// 10256 by default): cloud load balancers probe GET /healthz on every node
// to send externalTrafficPolicy: Cluster traffic only to nodes whose
// Service proxy is current, and the upstream conformance suite checks it.
//
//	200 {"lastUpdated":"…","currentTime":"…","nodeEligible":true,"healthy":true}
//
// 503 with the same body when the proxy is behind or the node is being
// removed. /livez is the same without the node's eligibility (kube-proxy's
// liveness: a node being drained keeps a live proxy).

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// ToBeDeletedTaint is the taint the cluster autoscaler puts on a node it is
// about to remove; kube-proxy's /healthz then fails so that load balancers
// drain the node first.
const ToBeDeletedTaint = "ToBeDeletedByClusterAutoscaler"

// ProxyHealth is /healthz's and /livez's body, field for field as
// kube-proxy writes it (without its per-family status: axon's Service sync
// serves both families at once).
type ProxyHealth struct {
	LastUpdated  time.Time `json:"lastUpdated"`
	CurrentTime  time.Time `json:"currentTime"`
	NodeEligible *bool     `json:"nodeEligible,omitempty"`
	Healthy      bool      `json:"healthy"`
}

// ProxyState is what the proxy's health is judged from.
type ProxyState struct {
	// Serving: the first whole Service table reached the datapath (before
	// that the node does not serve Services: unhealthy, NotServing says why).
	Serving    bool
	NotServing string
	// BehindSince is when the oldest Service or EndpointSlice change not
	// yet handled arrived; zero = caught up.
	BehindSince time.Time
	// FailingSince is when the oldest datapath write that still fails
	// first failed (it is retried); zero = none fails.
	FailingSince time.Time
	// LastUpdated is when the sync was last caught up with nothing failing.
	LastUpdated time.Time
	// Node is the node's own Node object; nil = not known (not eligible).
	Node *corev1.Node
}

// Health judges s at now: healthy while serving and neither behind nor
// failing for timeout or longer (kube-proxy: twice its sync period). why
// says what is wrong ("" when healthy).
func (s ProxyState) Health(now time.Time, timeout time.Duration) (h ProxyHealth, why string) {
	h = ProxyHealth{LastUpdated: s.LastUpdated, CurrentTime: now, Healthy: true}
	switch {
	case !s.Serving:
		why = "not serving Services yet"
		if s.NotServing != "" {
			why += ": " + s.NotServing
		}
	case !s.BehindSince.IsZero() && now.Sub(s.BehindSince) >= timeout:
		why = fmt.Sprintf("a Service change has waited %s (limit %s)", now.Sub(s.BehindSince).Round(time.Second), timeout)
	case !s.FailingSince.IsZero() && now.Sub(s.FailingSince) >= timeout:
		why = fmt.Sprintf("a Service datapath write has failed for %s (limit %s)", now.Sub(s.FailingSince).Round(time.Second), timeout)
	}
	if why != "" {
		h.Healthy = false
	} else {
		// kube-proxy's compatibility rule: a healthy proxy's lastUpdated is now
		h.LastUpdated = now
	}
	return h, why
}

// NodeEligible reports whether load balancers may send traffic to node: it
// is known, not being deleted and not tainted ToBeDeletedTaint.
func NodeEligible(node *corev1.Node) (bool, string) {
	switch {
	case node == nil:
		return false, "the node's Node object is not known"
	case node.DeletionTimestamp != nil:
		return false, "the Node is being deleted"
	}
	for _, t := range node.Spec.Taints {
		if t.Key == ToBeDeletedTaint {
			return false, "the Node is tainted " + ToBeDeletedTaint
		}
	}
	return true, ""
}

// ProxyHandler serves GET /healthz and /livez from state, judged with
// timeout.
func ProxyHandler(state func() ProxyState, timeout time.Duration) http.Handler {
	mux := http.NewServeMux()
	reply := func(w http.ResponseWriter, h ProxyHealth, ok bool) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		if ok {
			w.WriteHeader(http.StatusOK)
		} else {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(h)
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		s := state()
		h, _ := s.Health(time.Now(), timeout)
		eligible, _ := NodeEligible(s.Node)
		h.NodeEligible = &eligible
		if !eligible {
			h.LastUpdated = s.LastUpdated // "now" only in a 200, as kube-proxy
		}
		reply(w, h, h.Healthy && eligible)
	})
	mux.HandleFunc("GET /livez", func(w http.ResponseWriter, _ *http.Request) {
		h, _ := state().Health(time.Now(), timeout)
		reply(w, h, h.Healthy)
	})
	return mux
}
