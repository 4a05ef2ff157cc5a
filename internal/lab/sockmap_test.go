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
		// baseline: the agents run only the bypass (they exist only with it on)
		{`{"datapath":"baseline","noSockmap":false}`, []string{"--mode=bypass-only", "--sockmap=enabled"}, "on"},
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

// A baseline lab runs agents only for the bypass; an axon lab always.
func TestRunsAgents(t *testing.T) {
	for _, tc := range []struct {
		datapath  string
		noSockmap bool
		want      bool
	}{
		{DatapathAxon, true, true},
		{DatapathAxon, false, true},
		{DatapathBaseline, true, false},
		{DatapathBaseline, false, true},
	} {
		if got := runsAgents(tc.datapath, tc.noSockmap); got != tc.want {
			t.Errorf("datapath %s, noSockmap %v: runs agents %v, want %v", tc.datapath, tc.noSockmap, got, tc.want)
		}
	}
}
