package main

import (
	"testing"

	clientfeatures "k8s.io/client-go/features"
)

// Bad flags must stop the agent before it touches anything (exit 2).
func TestRunRejectsBadFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want int
	}{
		{"help", []string{"--help"}, 0},
		{"version", []string{"--version"}, 0},
		{"unknown flag", []string{"--no-such-flag"}, 2},
		{"positional argument", []string{"--node-name", "n1", "extra"}, 2},
		{"bad attach mode", []string{"--node-name", "n1", "--attach-mode", "xdp"}, 2},
		{"bad host routing", []string{"--node-name", "n1", "--host-routing", "fast"}, 2},
		{"bad log level", []string{"--node-name", "n1", "--log-level", "loud"}, 2},
		{"bad log format", []string{"--node-name", "n1", "--log-format", "yaml"}, 2},
		{"bad health addr", []string{"--node-name", "n1", "--health-addr", "9876"}, 2},
		{"empty node name", []string{"--node-name", ""}, 2},
		{"cgroup root missing", []string{"--node-name", "n1", "--cgroup-root", "/nonexistent/axon-cg"}, 2},
		{"pprof not on loopback", []string{"--node-name", "n1", "--pprof-address", "0.0.0.0:6060"}, 2},
		{"bad memory limit", []string{"--node-name", "n1", "--memory-limit", "lots"}, 2},
		{"memory limit too small", []string{"--node-name", "n1", "--memory-limit", "1Mi"}, 2},
		{"bad mode", []string{"--node-name", "n1", "--mode", "accelerate-only"}, 2},
		{"bypass-only without the bypass", []string{"--node-name", "n1", "--mode", "bypass-only", "--sockmap", "disabled"}, 2},
		{"cgroup root not cgroup2", []string{"--node-name", "n1", "--cgroup-root", "/proc"}, 2},
		{"api server without port", []string{"--node-name", "n1", "--k8s-api-server", "10.0.0.10"}, 2},
		{"api server over http", []string{"--node-name", "n1", "--k8s-api-server", "http://10.0.0.10:6443"}, 2},
		{"relative cni conf dir", []string{"--node-name", "n1", "--cni-conf-dir", "net.d"}, 2},
		{"cni mtu too small", []string{"--node-name", "n1", "--cni-mtu", "576"}, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := run(tt.args); got != tt.want {
				t.Errorf("run(%q) = %d, want %d", tt.args, got, tt.want)
			}
		})
	}
}

// --kube-watch-list sets client-go's gate; without the flag an operator's
// $KUBE_FEATURE_WatchListClient is left to client-go.
func TestApplyWatchList(t *testing.T) {
	gates := clientfeatures.FeatureGates()
	was := gates.Enabled(clientfeatures.WatchListClient)
	t.Cleanup(func() { _ = applyWatchList(was, true) })
	for _, on := range []bool{false, true, false} {
		if err := applyWatchList(on, true); err != nil {
			t.Fatal(err)
		}
		if got := gates.Enabled(clientfeatures.WatchListClient); got != on {
			t.Fatalf("--kube-watch-list=%v: gate is %v", on, got)
		}
	}
	t.Setenv("KUBE_FEATURE_WatchListClient", "true")
	if err := applyWatchList(true, false); err != nil {
		t.Fatal(err)
	}
	if gates.Enabled(clientfeatures.WatchListClient) {
		t.Error("flag not given, env set: the agent overrode the gate anyway")
	}
}
