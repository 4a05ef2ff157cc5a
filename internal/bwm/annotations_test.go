package bwm

import (
	"strings"
	"testing"
)

func TestParseAnnotations(t *testing.T) {
	for _, c := range []struct {
		desc     string
		ann      map[string]string
		want     Limits
		problems []string // substrings, one per expected problem
	}{
		{"none", nil, Limits{}, nil},
		{"egress 10M", map[string]string{EgressAnnotation: "10M"}, Limits{Egress: 10_000_000}, nil},
		{"both", map[string]string{EgressAnnotation: "1G", IngressAnnotation: "500k"}, Limits{Egress: 1e9, Ingress: 500_000}, nil},
		{"binary suffix", map[string]string{EgressAnnotation: "1Mi"}, Limits{Egress: 1 << 20}, nil},
		{"fraction rounds up", map[string]string{EgressAnnotation: "1.5M"}, Limits{Egress: 1_500_000}, nil},
		{"plain number", map[string]string{IngressAnnotation: "2000000"}, Limits{Ingress: 2_000_000}, nil},
		{"upper bound", map[string]string{EgressAnnotation: "1P"}, Limits{Egress: 1e15}, nil},
		{"abc", map[string]string{EgressAnnotation: "abc"}, Limits{}, []string{"not a Kubernetes quantity"}},
		{"-5M", map[string]string{EgressAnnotation: "-5M"}, Limits{}, []string{"must be positive"}},
		{"100P", map[string]string{EgressAnnotation: "100P"}, Limits{}, []string{"unreasonably large"}},
		{"zero", map[string]string{EgressAnnotation: "0"}, Limits{}, []string{"must be positive"}},
		{"too small", map[string]string{EgressAnnotation: "10"}, Limits{}, []string{"unreasonably small"}},
		{"empty", map[string]string{IngressAnnotation: ""}, Limits{}, []string{"not a Kubernetes quantity"}},
		{"one bad, one good", map[string]string{EgressAnnotation: "abc", IngressAnnotation: "20M"}, Limits{Ingress: 20_000_000}, []string{"egress-bandwidth"}},
		{"unrelated annotation", map[string]string{"kubernetes.io/bandwidth": "10M"}, Limits{}, nil},
	} {
		t.Run(c.desc, func(t *testing.T) {
			got, probs := ParseAnnotations(c.ann)
			if got != c.want {
				t.Errorf("limits %+v, want %+v", got, c.want)
			}
			if len(probs) != len(c.problems) {
				t.Fatalf("problems %v, want %d", probs, len(c.problems))
			}
			for i, p := range probs {
				if !strings.Contains(p.Error(), c.problems[i]) || !strings.Contains(p.Error(), "stays unlimited") {
					t.Errorf("problem %q does not say %q and what happens", p.Error(), c.problems[i])
				}
			}
		})
	}
}

func TestFormatBits(t *testing.T) {
	for bits, want := range map[uint64]string{10_000_000: "10M", 1e9: "1G", 1_500_000: "1.5M", 999: "999", 1 << 20: "1.049M", 500_000: "500k"} {
		if got := FormatBits(bits); got != want {
			t.Errorf("FormatBits(%d) = %q, want %q", bits, got, want)
		}
	}
}
