// Package e2eref names the images the upstream e2e suite of Kubernetes v1.36.3 (and its
// kubelet's default sandbox) pulls, by the references test/utils/image/manifest.go of that
// module gives them, and the archive `make images` writes for each. The real-kubelet lab
// imports those archives into each node's containerd, so no registry is contacted;
// hack/images checks the references against the module before it builds anything. A leaf
// package: the lab needs the names, not the image builder.
package e2eref

import (
	"path/filepath"
	"strings"
)

// The references, as the pinned e2e suite pulls them.
const (
	Pause                = "registry.k8s.io/pause:3.10.2"
	Agnhost              = "registry.k8s.io/e2e-test-images/agnhost:2.63.0"
	GlibcDNSTesting      = "registry.k8s.io/e2e-test-images/glibc-dns-testing:2.0.0"
	BusyBox              = "registry.k8s.io/e2e-test-images/busybox:1.37.0-1"
	RegressionIssue74839 = "registry.k8s.io/e2e-test-images/regression-issue-74839:1.4"
	DistrolessIptables   = "registry.k8s.io/build-image/distroless-iptables:v0.9.6"
)

// Image is one image of the suite and where it is used.
type Image struct {
	Manifest string // its name in test/utils/image/manifest.go (configs[<Manifest>])
	Ref      string
	Required bool   // every lab node needs it (kubelet's sandbox, the lab's own pods)
	Used     string // who pulls it
}

// Images are the images `make images` builds, required ones first.
var Images = []Image{
	{"Pause", Pause, true, "kubelet's pod sandbox"},
	{"Agnhost", Agnhost, true, "most sig-network specs' servers and clients; the lab's own pods"},
	{"GlibcDnsTesting", GlibcDNSTesting, false, "the DNS conformance probers"},
	{"BusyBox", BusyBox, false, "Conntrack specs: an init container that delays a backend, the invalid-conntrack-state client"},
	{"RegressionIssue74839", RegressionIssue74839, false, "Conntrack: the invalid conntrack state spec's server (out-of-window segments)"},
	{"DistrolessIptables", DistrolessIptables, false, "KubeProxy CLOSE_WAIT spec: a hostNetwork pod reading the node's conntrack table"},
}

// Archive is the file `make images` writes for ref: "pause-3.10.2.tar" for
// registry.k8s.io/pause:3.10.2.
func Archive(ref string) string {
	repo, tag, _ := strings.Cut(ref, ":")
	return filepath.Base(repo) + "-" + tag + ".tar"
}
