package probe

import (
	"net/netip"
	"strings"
	"testing"
)

func TestParsePod(t *testing.T) {
	tests := []struct {
		in      string
		want    Pod
		wantErr string
	}{
		{in: "tcp/10.244.1.2", want: Pod{"tcp", netip.MustParseAddr("10.244.1.2")}},
		{in: "icmp/fd00:10:244:1::5", want: Pod{"icmp", netip.MustParseAddr("fd00:10:244:1::5")}},
		{in: "sctp/10.0.0.1", wantErr: "protocol must be"},
		{in: "10.0.0.1", wantErr: "want proto/address"},
		{in: "udp/not-an-ip", wantErr: "ParseAddr"},
	}
	for _, tc := range tests {
		got, err := ParsePod(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseProbe(%q) error = %v, want %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseProbe(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}
