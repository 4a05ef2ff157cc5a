package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeDP stands for a loaded pod datapath (Live only asks whether one is).
type fakeDP struct{ dataplane }

// TestLiveness: /livez fails exactly when a restart helps: the reconcile
// loop stopped finishing passes, or the loaded datapath's pins are gone.
func TestLiveness(t *testing.T) {
	pinned := t.TempDir()
	if err := os.WriteFile(filepath.Join(pinned, "axon_ep_v4"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		started  time.Duration // ago
		lastPass time.Duration // ago; 0 = no pass yet
		loaded   bool
		pinDir   string
		mode     string
		want     string // "" = live
	}{
		{name: "just started, no pass yet", started: time.Second},
		{name: "recent pass", started: time.Hour, lastPass: 10 * time.Second},
		{name: "no pass for longer than the limit", started: time.Hour, lastPass: 40 * time.Second, want: "reconcile loop has not finished a pass for 40s (limit 33s): it is stuck"},
		{name: "first pass never finished", started: 40 * time.Second, want: "it is stuck"},
		{name: "datapath loaded, pins in place", started: time.Hour, lastPass: time.Second, loaded: true, pinDir: pinned},
		{name: "datapath loaded, pins gone", started: time.Hour, lastPass: time.Second, loaded: true, pinDir: t.TempDir(), want: "the datapath's pinned maps are gone"},
		{name: "datapath not loaded yet: nothing to miss", started: time.Hour, lastPass: time.Second, pinDir: t.TempDir()},
		{name: "bypass-only has no pod datapath", started: time.Hour, lastPass: time.Second, loaded: true, pinDir: t.TempDir(), mode: ModeBypassOnly},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &Agent{cfg: Config{ReconcileInterval: time.Second, BPFRoot: tc.pinDir, Mode: tc.mode}, st: &nodeStatus{},
				pods: newPodDatapath(nil, nil, nil, nil, nil, discardLogger()), started: time.Now().Add(-tc.started)}
			if tc.lastPass > 0 {
				a.st.lastPass = time.Now().Add(-tc.lastPass)
			}
			if tc.loaded {
				var dp dataplane = fakeDP{}
				a.pods.view.Store(&dp)
			}
			err := a.Live()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Live() = %v, want live", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Live() = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
