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
	// Real-kubelet lab nodes: containerd and Debian's runc package (it has seccomp).
	ContainerdVersion = "v2.4.2"
	RuncDebianVersion = "1.1.5+ds1-1+deb12u1"
)

// depPaths maps each artifact built by hack/deps.sh to its path in DepsDir (a versioned
// directory and the file name). "runc-debian" is Debian's runc, the lab's runc.
var depPaths = map[string]string{
	"kube-apiserver":          "k8s-" + K8sVersion + "/kube-apiserver",
	"kubectl":                 "k8s-" + K8sVersion + "/kubectl",
	"kube-proxy":              "k8s-" + K8sVersion + "/kube-proxy",
	"kubelet":                 "k8s-" + K8sVersion + "/kubelet",
	"kube-scheduler":          "k8s-" + K8sVersion + "/kube-scheduler",
	"kube-controller-manager": "k8s-" + K8sVersion + "/kube-controller-manager",
	"etcd":                    "etcd-" + EtcdVersion + "/etcd",
	"ptp":                     "cni-plugins-" + CNIPluginsVersion + "/ptp",
	"host-local":              "cni-plugins-" + CNIPluginsVersion + "/host-local",
	"bandwidth":               "cni-plugins-" + CNIPluginsVersion + "/bandwidth",
	"portmap":                 "cni-plugins-" + CNIPluginsVersion + "/portmap",
	"helm":                    "helm-" + HelmVersion + "/helm",
	"containerd":              "containerd-" + ContainerdVersion + "/containerd",
	"containerd-shim-runc-v2": "containerd-" + ContainerdVersion + "/containerd-shim-runc-v2",
	"ctr":                     "containerd-" + ContainerdVersion + "/ctr",
	"runc-debian":             "runc-debian-" + RuncDebianVersion + "/runc",
}

// DepNames lists every artifact hack/deps.sh builds, in a stable order.
func DepNames() []string {
	return []string{
		"kube-apiserver", "kubectl", "kube-proxy", "kubelet", "kube-scheduler", "kube-controller-manager",
		"etcd", "ptp", "host-local", "bandwidth", "portmap", "helm",
		"containerd", "containerd-shim-runc-v2", "ctr", "runc-debian",
	}
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

// DepPath resolves an artifact name such as "kube-apiserver", "ptp" or "runc-debian" to its full path in the
// cache. It fails with ErrDepMissing (and says how to build it) when the file is absent.
func DepPath(name string) (string, error) {
	rel, ok := depPaths[name]
	if !ok {
		return "", fmt.Errorf("unknown dependency %q (known: %v)", name, DepNames())
	}
	dir := filepath.Dir(rel)
	p := filepath.Join(DepsDir(), rel)
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
