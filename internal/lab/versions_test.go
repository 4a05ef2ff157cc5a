package lab

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func readVersionsEnv(t *testing.T) map[string]string {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "..", "hack", "versions.env"))
	if err != nil {
		t.Fatalf("open hack/versions.env: %v", err)
	}
	defer f.Close()
	env := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("hack/versions.env: malformed line %q", line)
		}
		env[k] = strings.Trim(v, `"'`)
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("read hack/versions.env: %v", err)
	}
	return env
}

func TestVersionsMatchEnv(t *testing.T) {
	env := readVersionsEnv(t)
	for _, tc := range []struct{ key, goValue string }{
		{"K8S_VERSION", K8sVersion},
		{"ETCD_VERSION", EtcdVersion},
		{"CNI_PLUGINS_VERSION", CNIPluginsVersion},
		{"HELM_VERSION", HelmVersion},
		{"CONTAINERD_VERSION", ContainerdVersion},
		{"RUNC_DEBIAN_VERSION", RuncDebianVersion},
	} {
		if got := env[tc.key]; got != tc.goValue {
			t.Errorf("hack/versions.env %s=%q, internal/lab/versions.go has %q", tc.key, got, tc.goValue)
		}
	}
	if len(env) != 6 {
		t.Errorf("hack/versions.env has %d keys, versions.go mirrors 6: update both", len(env))
	}
}

func TestDepsDir(t *testing.T) {
	t.Setenv("AXON_CACHE", "/x/cache")
	if got := DepsDir(); got != "/x/cache" {
		t.Errorf("DepsDir with AXON_CACHE = %q, want /x/cache", got)
	}
	t.Setenv("AXON_CACHE", "")
	t.Setenv("HOME", "/home/someone")
	if got := DepsDir(); got != "/home/someone/.cache/axon" {
		t.Errorf("DepsDir without AXON_CACHE = %q", got)
	}
}

func TestDepPath(t *testing.T) {
	cache := t.TempDir()
	t.Setenv("AXON_CACHE", cache)
	write := func(rel string, mode os.FileMode) {
		p := filepath.Join(cache, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("#!/bin/true\n"), mode); err != nil {
			t.Fatal(err)
		}
	}
	write("k8s-"+K8sVersion+"/kube-apiserver", 0o755)
	write("cni-plugins-"+CNIPluginsVersion+"/ptp", 0o755)
	write("etcd-"+EtcdVersion+"/etcd", 0o644) // not executable: a broken cache entry

	for _, tc := range []struct {
		name    string
		want    string // path relative to cache when ok
		wantErr string
		missing bool
	}{
		{name: "kube-apiserver", want: "k8s-" + K8sVersion + "/kube-apiserver"},
		{name: "ptp", want: "cni-plugins-" + CNIPluginsVersion + "/ptp"},
		{name: "kubectl", wantErr: "make deps", missing: true},
		{name: "etcd", wantErr: "not an executable", missing: true},
		{name: "runc-debian", wantErr: "make deps", missing: true},
		{name: "kubeadm", wantErr: "unknown dependency"},
		// runc built without seccomp failed every kubelet sandbox: Debian's (runc-debian) is the only one
		{name: "runc", wantErr: "unknown dependency"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DepPath(tc.name)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("DepPath(%q) err = %v, want it to mention %q", tc.name, err, tc.wantErr)
				}
				if errors.Is(err, ErrDepMissing) != tc.missing {
					t.Fatalf("errors.Is(err, ErrDepMissing) = %v, want %v", !tc.missing, tc.missing)
				}
				return
			}
			if err != nil {
				t.Fatalf("DepPath(%q): %v", tc.name, err)
			}
			if want := filepath.Join(cache, tc.want); got != want {
				t.Errorf("DepPath(%q) = %q, want %q", tc.name, got, want)
			}
		})
	}
	for _, n := range DepNames() {
		if _, ok := depPaths[n]; !ok {
			t.Errorf("DepNames has %q but depPaths does not", n)
		}
	}
	if len(DepNames()) != len(depPaths) {
		t.Errorf("DepNames has %d names, depPaths %d", len(DepNames()), len(depPaths))
	}
}

// hack/deps.sh --check agrees with DepPath on what a complete cache is.
func TestDepsCheckScript(t *testing.T) {
	script := filepath.Join("..", "..", "hack", "deps.sh")
	cache := t.TempDir()
	run := func() (string, error) {
		cmd := exec.Command("bash", script, "--check")
		cmd.Env = append(os.Environ(), "AXON_CACHE="+cache)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := run()
	if err == nil {
		t.Fatalf("--check on an empty cache exited 0:\n%s", out)
	}
	for _, n := range DepNames() {
		if !strings.Contains(out, depPaths[n]) {
			t.Errorf("--check output does not list %s:\n%s", depPaths[n], out)
		}
	}
	if !strings.Contains(out, "make deps") {
		t.Errorf("--check output does not say how to fix it:\n%s", out)
	}
	t.Setenv("AXON_CACHE", cache)
	for _, n := range DepNames() {
		p := filepath.Join(cache, depPaths[n])
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, nil, 0o755); err != nil {
			t.Fatal(err)
		}
		if _, err := DepPath(n); err != nil {
			t.Errorf("DepPath(%s) on a complete cache: %v", n, err)
		}
	}
	if out, err := run(); err != nil {
		t.Errorf("--check on a complete cache: %v\n%s", err, out)
	}
}
