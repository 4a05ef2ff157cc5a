package lab

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

func TestPodBandwidthFromAnnotations(t *testing.T) {
	tests := []struct {
		name    string
		ann     map[string]string
		want    *PodBandwidth
		wantErr string
	}{
		{"none", nil, nil, ""},
		{"egress", map[string]string{egressBandwidthAnnotation: "10M"}, &PodBandwidth{EgressRate: 10_000_000, EgressBurst: 64 << 10 * 8}, ""},
		{"both", map[string]string{egressBandwidthAnnotation: "1G", ingressBandwidthAnnotation: "50M"},
			&PodBandwidth{EgressRate: 1_000_000_000, EgressBurst: 10_000_000, IngressRate: 50_000_000, IngressBurst: 64 << 10 * 8}, ""},
		{"abc", map[string]string{egressBandwidthAnnotation: "abc"}, nil, "not a Kubernetes quantity"},
		{"negative", map[string]string{ingressBandwidthAnnotation: "-5M"}, nil, "want 1k..1P"},
		{"huge", map[string]string{egressBandwidthAnnotation: "100P"}, nil, "want 1k..1P"},
		{"tiny", map[string]string{egressBandwidthAnnotation: "10"}, nil, "want 1k..1P"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := PodBandwidthFromAnnotations(tc.ann)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (got == nil) != (tc.want == nil) || (got != nil && *got != *tc.want) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestBandwidthModeArgs(t *testing.T) {
	for mode, want := range map[string][]string{
		"": nil, BandwidthOff: nil, BandwidthOn: {"--bandwidth-manager"}, BandwidthCNIPlugin: {"--host-routing=legacy"},
	} {
		if got := bandwidthAgentArgs(&State{BandwidthManager: mode}); !slices.Equal(got, want) {
			t.Errorf("mode %q: %v, want %v", mode, got, want)
		}
	}
	if err := validateBandwidthMode("tbf"); err == nil || !strings.Contains(err.Error(), "want on, off or cni-plugin") {
		t.Errorf("bad mode: %v", err)
	}
	for _, m := range []string{"", BandwidthOff, BandwidthOn} {
		if err := validateBandwidthMode(m); err != nil {
			t.Errorf("mode %q: %v", m, err)
		}
	}
}

// The chained config carries what libcni passes: capabilities, the
// runtime's bandwidth as runtimeConfig, the previous result.
func TestBandwidthPluginConfig(t *testing.T) {
	b, err := bandwidthPluginConfig(&PodBandwidth{EgressRate: 10_000_000, EgressBurst: 524288}, map[string]any{"cniVersion": "1.1.0"})
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Type          string
		Name          string
		Capabilities  map[string]bool
		RuntimeConfig struct{ Bandwidth map[string]uint64 }
		PrevResult    map[string]any
	}
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	if c.Type != "bandwidth" || c.Name != "axon" || !c.Capabilities["bandwidth"] || c.PrevResult == nil ||
		c.RuntimeConfig.Bandwidth["egressRate"] != 10_000_000 || c.RuntimeConfig.Bandwidth["egressBurst"] != 524288 {
		t.Fatalf("config %s", b)
	}
	if _, ok := c.RuntimeConfig.Bandwidth["ingressRate"]; ok {
		t.Fatalf("unset direction present: %s", b)
	}
}
