package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/axonhq/axon/internal/output"
)

// commandsWithOutput walks the CLI and returns every command with -o.
func commandsWithOutput(c *cobra.Command, path []string, found map[string]*cobra.Command) {
	p := append(path, c.Name())
	if f := c.Flags().Lookup("output"); f != nil {
		found[strings.Join(p[1:], " ")] = c
	}
	for _, sub := range c.Commands() {
		commandsWithOutput(sub, p, found)
	}
}

// TestEveryOutputFlagShared: every -o of the CLI is the shared one (its help
// names yaml and jsonpath), validates before contacting anything, and passes
// yaml and jsonpath on to the command (which then fails dialling a missing
// socket, not parsing -o).
func TestEveryOutputFlagShared(t *testing.T) {
	found := map[string]*cobra.Command{}
	commandsWithOutput(newRootCmd(), nil, found)
	args := map[string][]string{ // commands with positional arguments
		"lb explain":        {"tcp", "10.0.0.1:1", "10.0.0.2:80"},
		"bpf lb maglev get": {"default/svc"},
	}
	for _, want := range []string{"status", "endpoint list", "service list", "bpf lb list", "lb status", "lab list"} {
		if found[want] == nil {
			t.Errorf("command %q has no -o flag", want)
		}
	}
	sock := filepath.Join(t.TempDir(), "missing.sock")
	for name, c := range found {
		t.Run(name, func(t *testing.T) {
			if u := c.Flags().Lookup("output").Usage; !strings.Contains(u, output.Formats) {
				t.Errorf("-o usage %q does not list %s", u, output.Formats)
			}
			if strings.HasPrefix(name, "lab ") {
				return // needs a lab; its -o parsing is the same helper
			}
			if name == "uninstall" {
				testUninstallOutput(t, sock)
				return
			}
			for _, tc := range []struct{ o, want string }{
				{"xml", `unknown output format "xml"`},
				{"yaml", "missing.sock"},
				{"jsonpath={.x}", "missing.sock"},
			} {
				root := newRootCmd()
				var out bytes.Buffer
				root.SetOut(&out)
				root.SetErr(&out)
				argv := append(strings.Fields(name), args[name]...)
				argv = append(argv, "-o", tc.o, "--socket", sock)
				root.SetArgs(argv)
				err := root.Execute()
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("axon %s: err %v, want one containing %q", strings.Join(argv, " "), err, tc.want)
				}
			}
		})
	}
}

// testUninstallOutput: axon uninstall talks to no agent; its -o is checked
// on a dry run over empty temporary paths (it changes nothing anywhere).
func testUninstallOutput(t *testing.T, sock string) {
	dir := t.TempDir()
	// --bpf-root must be on bpffs: an empty directory of our own there
	bpfRoot, err := os.MkdirTemp("/sys/fs/bpf", "axon-outputflag-")
	if err != nil {
		t.Skipf("uninstall -o: needs an empty directory on bpffs at /sys/fs/bpf (root): %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(bpfRoot) })
	for _, tc := range []struct{ o, want, wantErr string }{
		{"xml", "", `unknown output format "xml"`},
		{"yaml", "dryRun: true\nitems:\n- kind: dir\n  what: " + bpfRoot + "\n", ""}, // the empty --bpf-root itself
		{"jsonpath={.dryRun}", "true", ""},
	} {
		root := newRootCmd()
		var out, errOut bytes.Buffer
		root.SetOut(&out)
		root.SetErr(&errOut)
		argv := []string{"uninstall", "--dry-run", "-o", tc.o, "--socket", sock,
			"--bpf-root", bpfRoot, "--state-dir", filepath.Join(dir, "state"),
			"--cgroup-root", filepath.Join(dir, "cgroup"), "--cni-conf-dir", filepath.Join(dir, "net.d"),
			"--cni-bin-dir", filepath.Join(dir, "bin")}
		root.SetArgs(argv)
		err := root.Execute()
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("axon %s: err %v, want one containing %q", strings.Join(argv, " "), err, tc.wantErr)
			}
			continue
		}
		if err != nil || !strings.HasPrefix(out.String(), tc.want) {
			t.Errorf("axon %s: err %v, output %q, want %q (stderr %s)", strings.Join(argv, " "), err, out.String(), tc.want, errOut.String())
		}
	}
	if _, err := os.Stat(bpfRoot); err != nil {
		t.Errorf("a dry run removed --bpf-root: %v", err)
	}
}
