package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestInstall runs the built plugin as the init container does: it copies
// itself, executable, over an older file, leaving no temporary file; bad
// arguments and a missing folder fail with what to do.
func TestInstall(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "axon-cni")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "axon-cni"), []byte("old"), 0o755); err != nil {
		t.Fatal(err)
	}
	// The init container runs as uid 0 with every capability dropped: the
	// owner's write bit on the root-owned folder is enough (as root only:
	// otherwise the folder is not root-owned).
	noCaps := []string{"setpriv", "--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all"}
	cases := []struct {
		name    string
		wrap    []string
		args    []string
		wantErr string
	}{
		{"installs", nil, []string{"install", dir}, ""},
		{"installs without capabilities", noCaps, []string{"install", dir}, ""},
		{"no folder", nil, []string{"install", filepath.Join(dir, "missing")}, "mount the host's CNI binary folder"},
		{"bad args", nil, []string{"copy", dir}, "usage: axon-cni install DIR"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.wrap != nil && os.Geteuid() != 0 {
				t.Skip("needs root: checks uid 0 without capabilities")
			}
			argv := append(append([]string{}, tc.wrap...), append([]string{bin}, tc.args...)...)
			if err := os.WriteFile(filepath.Join(dir, "axon-cni"), []byte("old"), 0o755); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(argv[0], argv[1:]...)
			cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
			out, err := cmd.CombinedOutput()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(string(out), tc.wantErr) {
					t.Fatalf("err %v, output %q: want a failure saying %q", err, out, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			want, _ := os.ReadFile(bin)
			got, err := os.ReadFile(filepath.Join(dir, "axon-cni"))
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("installed file differs from the binary (%d vs %d bytes, %v)", len(got), len(want), err)
			}
			st, _ := os.Stat(filepath.Join(dir, "axon-cni"))
			if st.Mode().Perm() != 0o755 {
				t.Errorf("mode %v, want 0755", st.Mode())
			}
			ents, _ := os.ReadDir(dir)
			if len(ents) != 1 {
				t.Errorf("folder holds %d entries, want only axon-cni", len(ents))
			}
		})
	}
}
