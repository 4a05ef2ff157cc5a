package lab

import (
	"encoding/json"
	"slices"
	"testing"
)

func TestSockmapAgentArgs(t *testing.T) {
	tests := []struct {
		lab  string // lab.json
		want []string
		mode string
	}{
		{`{}`, []string{"--sockmap=enabled"}, "on"}, // a lab.json from before the switch
		{`{"noSockmap":false}`, []string{"--sockmap=enabled"}, "on"},
		{`{"noSockmap":true}`, []string{"--sockmap=disabled"}, "off"},
	}
	for _, tc := range tests {
		var st State
		if err := json.Unmarshal([]byte(tc.lab), &st); err != nil {
			t.Fatal(err)
		}
		if got := sockmapAgentArgs(&st); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.lab, got, tc.want)
		}
		if got := st.SockmapMode(); got != tc.mode {
			t.Errorf("%s: mode %q, want %q", tc.lab, got, tc.mode)
		}
	}
}
