package flagdir

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	flag "github.com/spf13/pflag"
)

type opts struct {
	health  string
	socket  bool
	ctMax   int
	timeout time.Duration
}

func newFlags(o *opts) *flag.FlagSet {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.StringVar(&o.health, "health-addr", "", "")
	fs.BoolVar(&o.socket, "socket-lb", true, "")
	fs.IntVar(&o.ctMax, "ct-max", 1024, "")
	fs.DurationVar(&o.timeout, "ct-tcp-timeout", time.Hour, "")
	fs.String("config-dir", "", "")
	return fs
}

// configMapDir lays files out as the kubelet does for a ConfigMap volume:
// the data in a timestamped directory, "..data" pointing at it, and each
// key a symlink through "..data".
func configMapDir(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	ts := "..2026_11_27_17_00_00.123456789"
	if err := os.Mkdir(filepath.Join(dir, ts), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(ts, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for k, v := range files {
		if err := os.WriteFile(filepath.Join(dir, ts, k), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join("..data", k), filepath.Join(dir, k)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestApply(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		files   map[string]string
		want    opts
		set     []string
		over    []string
		wantErr []string // substrings of the error, all required
		unknown bool     // the error wraps ErrUnknownKey
	}{{
		name:  "every kind of value, trimmed",
		files: map[string]string{"health-addr": "10.0.0.1:9876\n", "socket-lb": "false", "ct-max": " 4096 ", "ct-tcp-timeout": "2m"},
		want:  opts{health: "10.0.0.1:9876", socket: false, ctMax: 4096, timeout: 2 * time.Minute},
		set:   []string{"ct-max", "ct-tcp-timeout", "health-addr", "socket-lb"},
	}, {
		name:  "the command line wins over the directory",
		args:  []string{"--ct-max=2048", "--socket-lb=true"},
		files: map[string]string{"ct-max": "4096", "socket-lb": "false", "health-addr": "127.0.0.1:1"},
		want:  opts{health: "127.0.0.1:1", socket: true, ctMax: 2048, timeout: time.Hour},
		set:   []string{"health-addr"},
		over:  []string{"ct-max", "socket-lb"},
	}, {
		name:  "empty directory keeps the defaults",
		files: map[string]string{},
		want:  opts{socket: true, ctMax: 1024, timeout: time.Hour},
	}, {
		name:    "a typo names the nearest flag",
		files:   map[string]string{"heath-addr": "127.0.0.1:1"},
		wantErr: []string{`unknown option "heath-addr"`, `did you mean "health-addr"`},
		unknown: true,
	}, {
		name:    "a key far from every flag gets no guess",
		files:   map[string]string{"replicas": "3"},
		wantErr: []string{`unknown option "replicas"`, "axon-agent --help"},
		unknown: true,
	}, {
		name:    "the directory cannot name itself",
		files:   map[string]string{"config-dir": "/etc"},
		wantErr: []string{"--config-dir can be given on the command line only"},
		unknown: true,
	}, {
		name:    "a bad value fails like the flag",
		files:   map[string]string{"ct-max": "lots"},
		wantErr: []string{`invalid value "lots" for --ct-max`, "ct-max"},
	}, {
		name:    "a bad bool fails like the flag",
		files:   map[string]string{"socket-lb": "maybe"},
		wantErr: []string{`invalid value "maybe" for --socket-lb`},
	}, {
		name:    "an oversized file is refused",
		files:   map[string]string{"health-addr": strings.Repeat("x", MaxValueSize+1)},
		wantErr: []string{"more than 65536"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var o opts
			fs := newFlags(&o)
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			dir := configMapDir(t, tt.files)
			res, err := Apply(fs, dir, "config-dir")
			if len(tt.wantErr) > 0 {
				if err == nil {
					t.Fatalf("Apply succeeded (set %v), want an error with %q", res.Set, tt.wantErr)
				}
				for _, s := range tt.wantErr {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("error %q lacks %q", err, s)
					}
				}
				if errors.Is(err, ErrUnknownKey) != tt.unknown {
					t.Errorf("errors.Is(%v, ErrUnknownKey) = %v, want %v", err, !tt.unknown, tt.unknown)
				}
				return
			}
			if err != nil {
				t.Fatalf("Apply: %v", err)
			}
			if o != tt.want {
				t.Errorf("options %+v, want %+v", o, tt.want)
			}
			if !slices.Equal(res.Set, tt.set) || !slices.Equal(res.Overridden, tt.over) {
				t.Errorf("set %v overridden %v, want %v and %v", res.Set, res.Overridden, tt.set, tt.over)
			}
			for _, n := range tt.set {
				if !fs.Changed(n) {
					t.Errorf("--%s came from the directory but fs.Changed says no", n)
				}
			}
		})
	}
}

func TestApplyRefusesNonFiles(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "ct-max"), 0o755); err != nil {
		t.Fatal(err)
	}
	var o opts
	_, err := Apply(newFlags(&o), dir)
	if err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Fatalf("a directory named like an option: err = %v, want 'not a regular file'", err)
	}
	if _, err := Apply(newFlags(&o), filepath.Join(dir, "missing")); err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing directory: err = %v, want ErrNotExist", err)
	}
}

func TestNearest(t *testing.T) {
	names := []string{"health-addr", "socket-lb", "ct-max", "ct-tcp-timeout"}
	for _, tt := range []struct{ in, want string }{
		{"health-addr", "health-addr"},
		{"Health-Addr", "health-addr"},
		{"healthaddr", "health-addr"},
		{"ct-maxx", "ct-max"},
		{"socketlb", "socket-lb"},
		{"image", ""},
		{"", ""},
	} {
		if got := Nearest(tt.in, names); got != tt.want {
			t.Errorf("Nearest(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
