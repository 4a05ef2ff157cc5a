package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
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
			if got := run(tt.args, io.Discard, io.Discard); got != tt.want {
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

// --config-dir loads one option per file through the flags' own Set, the
// command line wins over a file, and --check-config reports each value with
// its source and exits before the agent starts.
func TestRunConfigDir(t *testing.T) {
	tests := []struct {
		name    string
		files   map[string]string
		args    []string
		want    int
		lines   []string // lines of --check-config's output that must appear
		wantErr string   // substring of stderr
	}{{
		name:  "options from files",
		files: map[string]string{"health-addr": "127.0.0.1:9876\n", "ct-max": "65536", "socket-lb": "false"},
		lines: []string{"health-addr\t127.0.0.1:9876\tconfig-dir", "ct-max\t65536\tconfig-dir", "socket-lb\tfalse\tconfig-dir", "log-level\tinfo\tdefault"},
	}, {
		name:  "the command line wins",
		files: map[string]string{"health-addr": "127.0.0.1:9876", "log-level": "debug"},
		args:  []string{"--health-addr=127.0.0.1:9999"},
		lines: []string{"health-addr\t127.0.0.1:9999\tcommand-line", "log-level\tdebug\tconfig-dir"},
	}, {
		name:  "bypass-only from a file turns the bypass on",
		files: map[string]string{"mode": "bypass-only"},
		lines: []string{"mode\tbypass-only\tconfig-dir", "sockmap\tenabled\tdefault"},
	}, {
		name:    "unknown key names the nearest flag",
		files:   map[string]string{"health-address": "127.0.0.1:9876"},
		want:    2,
		wantErr: `did you mean "health-addr"`,
	}, {
		name:    "a value the flag rejects",
		files:   map[string]string{"bandwidth-horizon": "soon"},
		want:    2,
		wantErr: `invalid value "soon" for --bandwidth-horizon`,
	}, {
		name:    "a value the agent's validation rejects",
		files:   map[string]string{"attach-mode": "xdp"},
		want:    2,
		wantErr: "--attach-mode",
	}, {
		name:    "a bad memory limit is caught by the check",
		files:   map[string]string{"memory-limit": "lots"},
		want:    2,
		wantErr: "--memory-limit",
	}, {
		name:    "the directory cannot name another directory",
		files:   map[string]string{"config-dir": "/etc"},
		want:    2,
		wantErr: "command line only",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			for k, v := range tt.files {
				if err := os.WriteFile(filepath.Join(dir, k), []byte(v), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			var stdout, stderr bytes.Buffer
			args := append([]string{"--node-name=n1", "--config-dir", dir, "--check-config"}, tt.args...)
			if got := run(args, &stdout, &stderr); got != tt.want {
				t.Fatalf("run(%q) = %d, want %d\nstdout:\n%s\nstderr:\n%s", args, got, tt.want, &stdout, &stderr)
			}
			if tt.wantErr != "" && !strings.Contains(stderr.String(), tt.wantErr) {
				t.Errorf("stderr lacks %q:\n%s", tt.wantErr, &stderr)
			}
			out := strings.Split(stdout.String(), "\n")
			for _, l := range tt.lines {
				if !slices.Contains(out, l) {
					t.Errorf("--check-config output lacks %q:\n%s", l, &stdout)
				}
			}
			if tt.want == 0 && !slices.Contains(out, "node-name\tn1\tcommand-line") {
				t.Errorf("--check-config output lacks the command line's --node-name:\n%s", &stdout)
			}
		})
	}
}
