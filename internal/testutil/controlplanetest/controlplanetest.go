// Package controlplanetest runs etcd and kube-apiserver (the binaries built
// by make deps) for a test.
package controlplanetest

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/axonhq/axon/internal/lab"
	"github.com/axonhq/axon/internal/lab/controlplane"
)

// Start runs etcd and kube-apiserver with cfg in a temporary directory and
// stops them when the test ends. It fills in cfg's directory and binaries,
// and a logger that discards when cfg.Logger is nil. It skips the test only
// when the binaries are not built.
func Start(t testing.TB, cfg controlplane.Config) *controlplane.ControlPlane {
	t.Helper()
	etcd, err := lab.DepPath("etcd")
	var apiserver string
	if err == nil {
		apiserver, err = lab.DepPath("kube-apiserver")
	}
	if errors.Is(err, lab.ErrDepMissing) {
		t.Skipf("kube-apiserver/etcd not built: run make deps (%v)", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	t.Cleanup(func() {
		if err := controlplane.Stop(dir); err != nil {
			t.Errorf("stop control plane: %v", err)
		}
	})
	cfg.Dir, cfg.EtcdBinary, cfg.APIServerBinary = dir, etcd, apiserver
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	cp, err := controlplane.Start(ctx, cfg)
	if err != nil {
		t.Fatalf("start control plane: %v", err)
	}
	return cp
}
