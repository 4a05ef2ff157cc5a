// Command image builds axon's container image from bin/ without a container
// runtime (deploy/image): `make image` runs it.
//
//	go run ./hack/image -bin bin -out bin/image -version v0.1 -created 1700000000
package main

import (
	"flag"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/axonhq/axon/deploy/image"
)

func main() {
	var spec image.Spec
	var created int64
	out := flag.String("out", "bin/image", "output folder: <out>/oci (OCI layout) and <out>/axon-image.tar")
	flag.StringVar(&spec.BinDir, "bin", "bin", "folder with the static axon, axon-agent and axon-cni")
	flag.StringVar(&spec.Name, "name", "axon", "image name in the layout and the tarball (no registry host)")
	flag.StringVar(&spec.Version, "version", "dev", "image tag")
	flag.Int64Var(&created, "created", 0, "creation time and file mtimes, Unix seconds (the Makefile passes the commit time)")
	flag.Parse()
	spec.Created = time.Unix(created, 0)
	res, err := image.Build(spec, *out)
	if err != nil {
		slog.Error("make image", "err", err)
		os.Exit(1)
	}
	fmt.Printf("%s\nOCI layout: %s\ntarball:    %s (docker load / podman load)\n", res.Digest, res.Layout, res.Tarball)
}
