package healthcheck

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestProxyHealth(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	const timeout = 60 * time.Second
	last := now.Add(-5 * time.Minute)
	tests := []struct {
		name    string
		st      ProxyState
		healthy bool
		why     string
	}{
		{"caught up", ProxyState{Serving: true, LastUpdated: last}, true, ""},
		{"not serving yet", ProxyState{NotServing: "the Service watch has not synced"}, false, "not serving Services yet: the Service watch has not synced"},
		{"behind less than the timeout", ProxyState{Serving: true, BehindSince: now.Add(-59 * time.Second), LastUpdated: last}, true, ""},
		{"behind the timeout", ProxyState{Serving: true, BehindSince: now.Add(-timeout), LastUpdated: last}, false, "a Service change has waited 1m0s (limit 1m0s)"},
		{"a write failing less than the timeout", ProxyState{Serving: true, FailingSince: now.Add(-time.Second), LastUpdated: last}, true, ""},
		{"a write failing for the timeout", ProxyState{Serving: true, FailingSince: now.Add(-90 * time.Second), LastUpdated: last}, false, "a Service datapath write has failed for 1m30s (limit 1m0s)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, why := tt.st.Health(now, timeout)
			if h.Healthy != tt.healthy || why != tt.why {
				t.Fatalf("healthy %v (%q), want %v (%q)", h.Healthy, why, tt.healthy, tt.why)
			}
			if !h.CurrentTime.Equal(now) {
				t.Errorf("currentTime %s, want %s", h.CurrentTime, now)
			}
			// kube-proxy's rule: a healthy proxy reports lastUpdated = now,
			// an unhealthy one when it last was current
			want := tt.st.LastUpdated
			if tt.healthy {
				want = now
			}
			if !h.LastUpdated.Equal(want) {
				t.Errorf("lastUpdated %s, want %s", h.LastUpdated, want)
			}
		})
	}
}

func TestNodeEligible(t *testing.T) {
	del := metav1.Now()
	tests := []struct {
		name string
		node *corev1.Node
		ok   bool
		why  string
	}{
		{"unknown", nil, false, "the node's Node object is not known"},
		{"plain", &corev1.Node{}, true, ""},
		{"other taints", &corev1.Node{Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: "node.kubernetes.io/unschedulable", Effect: corev1.TaintEffectNoSchedule}}}}, true, ""},
		{"being deleted", &corev1.Node{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &del}}, false, "the Node is being deleted"},
		{"autoscaler removes it", &corev1.Node{Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: ToBeDeletedTaint, Effect: corev1.TaintEffectNoSchedule}}}}, false, "the Node is tainted ToBeDeletedByClusterAutoscaler"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ok, why := NodeEligible(tt.node)
			if ok != tt.ok || why != tt.why {
				t.Fatalf("got %v %q, want %v %q", ok, why, tt.ok, tt.why)
			}
		})
	}
}

// TestProxyHandler serves the handler on loopback and reads it the way the
// upstream conformance spec and a load balancer do: status code, JSON body
// with lastUpdated, kube-proxy's headers.
func TestProxyHandler(t *testing.T) {
	var st ProxyState
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: ProxyHandler(func() ProxyState { return st }, time.Minute), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	get := func(path string) (int, map[string]any) {
		t.Helper()
		resp, err := (&http.Client{Timeout: 3 * time.Second}).Get("http://" + ln.Addr().String() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		if ct, nosniff := resp.Header.Get("Content-Type"), resp.Header.Get("X-Content-Type-Options"); ct != "application/json" || nosniff != "nosniff" {
			t.Errorf("%s: Content-Type %q, X-Content-Type-Options %q", path, ct, nosniff)
		}
		var body map[string]any
		if err := json.Unmarshal(b, &body); err != nil {
			t.Fatalf("%s: body %q: %v", path, b, err)
		}
		if !strings.Contains(string(b), `"lastUpdated":`) || !strings.Contains(string(b), `"currentTime":`) {
			t.Errorf("%s: body %s lacks lastUpdated or currentTime", path, b)
		}
		return resp.StatusCode, body
	}
	tainted := &corev1.Node{Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: ToBeDeletedTaint}}}}
	steps := []struct {
		name           string
		st             ProxyState
		healthz, livez int
		eligible       bool
	}{
		{"starting", ProxyState{Node: &corev1.Node{}}, 503, 503, true},
		{"serving", ProxyState{Serving: true, Node: &corev1.Node{}}, 200, 200, true},
		{"serving, Node unknown", ProxyState{Serving: true}, 503, 200, false},
		{"serving, Node to be deleted", ProxyState{Serving: true, Node: tainted}, 503, 200, false},
		{"behind", ProxyState{Serving: true, BehindSince: time.Now().Add(-2 * time.Minute), Node: &corev1.Node{}}, 503, 503, true},
	}
	for _, s := range steps {
		st = s.st
		code, body := get("/healthz")
		if code != s.healthz || body["nodeEligible"] != s.eligible || body["healthy"] != (s.livez == 200) {
			t.Errorf("%s: /healthz %d %v, want %d nodeEligible %v healthy %v", s.name, code, body, s.healthz, s.eligible, s.livez == 200)
		}
		code, body = get("/livez")
		if _, has := body["nodeEligible"]; code != s.livez || has {
			t.Errorf("%s: /livez %d %v, want %d without nodeEligible", s.name, code, body, s.livez)
		}
	}
	resp, err := http.Post("http://"+ln.Addr().String()+"/healthz", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /healthz: %d, want 405", resp.StatusCode)
	}
}
