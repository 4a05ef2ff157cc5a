//go:build tools

// Package tools pins the containerd commands that hack/deps.sh builds for real-kubelet lab
// nodes: the daemon, its runc shim and the ctr client.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
