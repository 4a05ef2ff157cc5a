//go:build tools

// Package tools pins runc, the OCI runtime that containerd-shim-runc-v2 execs on real-kubelet
// lab nodes. hack/deps.sh builds it with cgo (runc's nsexec is C) and without the seccomp
// build tag (no libseccomp needed).
package tools

import _ "github.com/opencontainers/runc"
