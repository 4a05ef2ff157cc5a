package cni

import (
	"strings"
	"testing"
)

func TestConfListRoundTrip(t *testing.T) {
	raw, err := ConfList("/run/axon/axon.sock", 1400)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := ParseConfList(raw)
	if err != nil {
		t.Fatalf("ParseConfList(ConfList) = %v\n%s", err, raw)
	}
	if nc.Socket != "/run/axon/axon.sock" || nc.MTU != 1400 || nc.Name != NetworkName || nc.Type != "axon-cni" || nc.CNIVersion != "1.1.0" {
		t.Errorf("parsed %+v", nc)
	}
	for _, tc := range []struct{ in, err string }{
		{`{"cniVersion":"1.1.0","name":"axon","plugins":[]}`, "0 plugins"},
		{`{"cniVersion":"1.1.0","name":"axon","plugins":[{"type":"ptp"}]}`, "want axon-cni"},
		{`{"cniVersion":"1.1.0","name":"axon","plugins":[{"type":"axon-cni","socket":"rel"}]}`, "absolute path"},
		{`not json`, "not valid JSON"},
	} {
		if _, err := ParseConfList([]byte(tc.in)); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("ParseConfList(%s) = %v, want %q", tc.in, err, tc.err)
		}
	}
	if _, err := ConfList("relative.sock", 1500); err == nil {
		t.Error("ConfList with a relative socket: no error")
	}
}
