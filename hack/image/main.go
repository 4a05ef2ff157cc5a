// Command image builds axon's container image from bin/ without a container
// runtime (deploy/image): `make image` runs it. The image is named after the
// Helm chart (deploy/helm/axon: image.repository) and tagged with -version and
// the chart's appVersion, so the tarball holds the very reference
// deploy/kubernetes/axon.yaml runs (ghcr.io/axonhq/axon:<appVersion>).
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
	chart := flag.String("chart", image.ChartDir, "Helm chart whose image.repository names the image and whose appVersion is a second tag")
	flag.StringVar(&spec.Name, "name", "", "image repository instead of the chart's (e.g. registry.example.com/axon); then -version is its only tag")
	flag.StringVar(&spec.Version, "version", "dev", "image tag")
	flag.Int64Var(&created, "created", 0, "creation time and file mtimes, Unix seconds (the Makefile passes the commit time)")
	flag.Parse()
	spec.Created = time.Unix(created, 0)
	if spec.Name == "" {
		repo, tag, err := image.ChartImage(*chart)
		if err != nil {
			slog.Error("make image: the image name comes from the chart", "err", err)
			os.Exit(1)
		}
		spec.Name, spec.Tags = repo, []string{tag}
	}
	res, err := image.Build(spec, *out)
	if err != nil {
		slog.Error("make image", "err", err)
		os.Exit(1)
	}
	refs := spec.Name + ":" + spec.Version
	for _, t := range spec.Tags {
		refs += ", " + spec.Name + ":" + t
	}
	fmt.Printf("%s\nreferences: %s\nOCI layout: %s\ntarball:    %s (docker load / podman load / ctr -n k8s.io images import)\n", res.Digest, refs, res.Layout, res.Tarball)
}
