package lab

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Versions of the lab's external binaries. They mirror hack/versions.env (the source of truth
// for hack/deps.sh); TestVersionsMatchEnv keeps the two in agreement.
const (
	K8sVersion        = "v1.36.3"
	EtcdVersion       = "v3.6.16"
	CNIPluginsVersion = "v1.9.1"
	HelmVersion       = "v3.22.0"
)

// depDirs maps each artifact built by hack/deps.sh to its versioned directory in DepsDir.
var depDirs = map[string]string{
	"kube-apiserver": "k8s-" + K8sVersion,
	"kubectl":        "k8s-" + K8sVersion,
	"kube-proxy":     "k8s-" + K8sVersion,
	"etcd":           "etcd-" + EtcdVersion,
	"ptp":            "cni-plugins-" + CNIPluginsVersion,
	"host-local":     "cni-plugins-" + CNIPluginsVersion,
	"bandwidth":      "cni-plugins-" + CNIPluginsVersion,
	"portmap":        "cni-plugins-" + CNIPluginsVersion,
	"helm":           "helm-" + HelmVersion,
}

// DepNames lists every artifact hack/deps.sh builds, in a stable order.
func DepNames() []string {
	return []string{"kube-apiserver", "kubectl", "kube-proxy", "etcd", "ptp", "host-local", "bandwidth", "portmap", "helm"}
}

// DepsDir is the dependency cache: $AXON_CACHE, or ~/.cache/axon.
func DepsDir() string {
	if d := os.Getenv("AXON_CACHE"); d != "" {
		return d
	}
	home, err := os.UserHomeDir()
	if err != nil || home == "" {
		home = "/root"
	}
	return filepath.Join(home, ".cache", "axon")
}

// ErrDepMissing is wrapped by DepPath when the artifact is not built yet.
var ErrDepMissing = errors.New("dependency not built")

// DepPath resolves an artifact name such as "kube-apiserver" or "ptp" to its full path in the
// cache. It fails with ErrDepMissing (and says how to build it) when the file is absent.
func DepPath(name string) (string, error) {
	dir, ok := depDirs[name]
	if !ok {
		return "", fmt.Errorf("unknown dependency %q (known: %v)", name, DepNames())
	}
	p := filepath.Join(DepsDir(), dir, name)
	st, err := os.Stat(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "", fmt.Errorf("%s %s: %w at %s: run `make deps` (hack/deps.sh)", name, dir, ErrDepMissing, p)
	case err != nil:
		return "", fmt.Errorf("stat %s: %w", p, err)
	case st.IsDir() || st.Mode().Perm()&0o111 == 0:
		return "", fmt.Errorf("%s is not an executable file: %w; remove it and run `make deps` (hack/deps.sh)", p, ErrDepMissing)
	}
	return p, nil
}
