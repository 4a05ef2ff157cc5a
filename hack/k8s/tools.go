//go:build tools

// Package tools pins the Kubernetes commands that hack/deps.sh builds: the lab's control plane
// and kube-proxy, and the kubelet, kube-scheduler and kube-controller-manager of real-kubelet
// lab nodes. The e2e test binary (make conformance-deps) is built from the same module graph.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/test/e2e"
	_ "k8s.io/kubernetes/test/images/agnhost"
)
