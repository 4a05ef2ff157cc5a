package api

import (
	"context"
	"net/http"
	"strings"
	"testing"
)

// svcFake adds the Service routes to fakeHandler.
type svcFake struct {
	*fakeHandler
	svc    ServicesReply
	maps   LBMapsReply
	mapErr error
}

func (f *svcFake) ServiceList(context.Context) (ServicesReply, error) { return f.svc, nil }
func (f *svcFake) LBMaps(context.Context) (LBMapsReply, error)        { return f.maps, f.mapErr }

const svcText = "10.96.0.50:80/TCP  ClusterIP  default/web:http  affinity=none\n  -> 10.244.2.1:8080  active  node2\n"

func TestServiceRoutes(t *testing.T) {
	tests := []struct {
		name       string
		h          Handler
		path       string
		code       int
		want       []string
		unexpected string
	}{
		{"services", &svcFake{fakeHandler: newFake(), svc: ServicesReply{Text: svcText, Synced: true, Writer: true, Services: 1, Frontends: 1, Backends: 1}},
			"/v1/services", 200, []string{`"text":"10.96.0.50:80/TCP`, `"frontends":1`, `"synced":true`}, "problems"},
		{"services with problems", &svcFake{fakeHandler: newFake(), svc: ServicesReply{Problems: []string{"default/x: bad port"}, WatchError: "watch Service: refused"}},
			"/v1/services", 200, []string{`"problems":["default/x: bad port"]`, `"watchError":"watch Service: refused"`}, ""},
		{"lb enabled", &svcFake{fakeHandler: newFake(), maps: LBMapsReply{Text: svcText, Frontends: 1, Backends: 1, Enabled: true}},
			"/v1/bpf/lb", 200, []string{`"enabled":true`, `10.244.2.1:8080`}, "reason"},
		{"lb disabled", &svcFake{fakeHandler: newFake(), maps: LBMapsReply{Reason: "--socket-lb=false"}},
			"/v1/bpf/lb", 200, []string{`"enabled":false`, `"reason":"--socket-lb=false"`, `"text":""`}, ""},
		{"lb read error is 500", &svcFake{fakeHandler: newFake(), mapErr: Errorf(http.StatusInternalServerError, "read axon_lb_svc: boom")},
			"/v1/bpf/lb", 500, []string{"read axon_lb_svc: boom"}, ""},
		{"services not implemented", newFake(), "/v1/services", 501, []string{"upgrade axon-agent"}, ""},
		{"lb not implemented", newFake(), "/v1/bpf/lb", 501, []string{"does not serve Services"}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sock, _ := unixServer(t, tc.h)
			code, body := rawRequest(t, sock, "GET", tc.path, "")
			if code != tc.code {
				t.Fatalf("code = %d, want %d (body %q)", code, tc.code, body)
			}
			for _, w := range tc.want {
				if !strings.Contains(body, w) {
					t.Errorf("body %q does not contain %q", body, w)
				}
			}
			if tc.unexpected != "" && strings.Contains(body, tc.unexpected) {
				t.Errorf("body %q contains %q", body, tc.unexpected)
			}
			if code, _ := rawRequest(t, sock, "POST", tc.path, "{}"); code != http.StatusMethodNotAllowed {
				t.Errorf("POST %s: code = %d, want 405", tc.path, code)
			}
		})
	}
}

func TestServiceClient(t *testing.T) {
	f := &svcFake{fakeHandler: newFake(),
		svc:  ServicesReply{Text: svcText, Synced: true, Services: 1, Frontends: 1, Backends: 1, Problems: []string{"p"}},
		maps: LBMapsReply{Text: svcText, Frontends: 1, Backends: 1, Enabled: true}}
	_, c := unixServer(t, f)
	ctx := context.Background()
	sr, err := c.Services(ctx)
	if err != nil || sr.Text != svcText || sr.Frontends != 1 || !sr.Synced || len(sr.Problems) != 1 {
		t.Fatalf("Services = %+v, %v", sr, err)
	}
	mr, err := c.LBMaps(ctx)
	if err != nil || mr.Text != svcText || !mr.Enabled || mr.Frontends != 1 {
		t.Fatalf("LBMaps = %+v, %v", mr, err)
	}

	_, old := unixServer(t, newFake())
	if _, err := old.LBMaps(ctx); !IsStatus(err, http.StatusNotImplemented) {
		t.Fatalf("LBMaps on an agent without Services: got %v, want HTTP 501", err)
	}
	f.mapErr = Errorf(http.StatusServiceUnavailable, "not loaded")
	if _, err := c.LBMaps(ctx); !IsStatus(err, 503) || !strings.Contains(err.Error(), "not loaded") {
		t.Fatalf("LBMaps error: got %v", err)
	}
}
