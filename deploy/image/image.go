// Package image builds axon's container image without a container runtime:
// an OCI image from scratch (no base image) holding the three static binaries
// of `make build`, written as an OCI layout directory and as a `docker load` /
// `podman load` tarball. The same binaries and the same creation time give the
// same digest: file order, modes, owners and mtimes in the layer are fixed and
// the gzip header carries no time or name.
//
// No base image: the agent and axon-cni run no external tools (neither imports
// os/exec), the agent reaches the kube-apiserver with the service account's CA
// file, and numeric users need no /etc/passwd.
package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Binaries are the files of bin/ the image holds, in layer order, installed
// into BinDir.
var Binaries = []string{"axon", "axon-agent", "axon-cni"}

// BinDir is where the binaries are in the image (the manifests' commands).
const BinDir = "/usr/local/bin"

// Spec is everything the image is made of: nothing else goes into it.
type Spec struct {
	// BinDir is the folder holding the built binaries (bin/).
	BinDir string
	// Name is the image's name without a registry host, e.g. "axon"; with
	// Version it is the reference in the OCI layout and the tarball.
	Name    string
	Version string
	// Created is the image's creation time and every file's mtime
	// (SOURCE_DATE_EPOCH in the Makefile: the commit's time).
	Created time.Time
}

// Result names what Build wrote.
type Result struct {
	Layout  string  // OCI image layout directory
	Tarball string  // docker-archive tarball
	Digest  v1.Hash // the image manifest's digest
}

// Build writes the image of spec into outDir/oci (an OCI layout) and
// outDir/axon-image.tar. outDir's previous layout is replaced.
func Build(spec Spec, outDir string) (Result, error) {
	img, err := Image(spec)
	if err != nil {
		return Result{}, err
	}
	dig, err := img.Digest()
	if err != nil {
		return Result{}, fmt.Errorf("image digest: %w", err)
	}
	ref, err := name.NewTag(spec.Name+":"+spec.Version, name.WithDefaultRegistry(""))
	if err != nil {
		return Result{}, fmt.Errorf("image reference %q: %w (use -name without a registry host and -version with [A-Za-z0-9_.-])", spec.Name+":"+spec.Version, err)
	}
	res := Result{Layout: filepath.Join(outDir, "oci"), Tarball: filepath.Join(outDir, "axon-image.tar"), Digest: dig}
	if err := os.RemoveAll(res.Layout); err != nil {
		return Result{}, err
	}
	p, err := layout.Write(res.Layout, empty.Index)
	if err != nil {
		return Result{}, fmt.Errorf("create OCI layout %s: %w", res.Layout, err)
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": spec.Version,
	})); err != nil {
		return Result{}, fmt.Errorf("write image into %s: %w", res.Layout, err)
	}
	if err := tarball.WriteToFile(res.Tarball, ref, img); err != nil {
		return Result{}, fmt.Errorf("write %s: %w", res.Tarball, err)
	}
	return res, nil
}

// Image assembles the image of spec in memory.
func Image(spec Spec) (v1.Image, error) {
	created := spec.Created.UTC()
	arch, err := binariesArch(spec.BinDir)
	if err != nil {
		return nil, err
	}
	layerTar, err := binariesLayer(spec.BinDir, created)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("image layer: %w", err)
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History:   v1.History{Created: v1.Time{Time: created}, CreatedBy: "deploy/image: " + path.Join(BinDir, "{axon,axon-agent,axon-cni}")},
	})
	if err != nil {
		return nil, fmt.Errorf("append layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Created = v1.Time{Time: created}
	cf.OS, cf.Architecture = "linux", arch
	cf.Config.Entrypoint = []string{path.Join(BinDir, "axon-agent")}
	cf.Config.Env = []string{"PATH=" + BinDir}
	// uid 0: the agent needs its capabilities (BPF, NET_ADMIN, ...) as
	// effective capabilities, which Kubernetes grants only to uid 0, and the
	// CNI installer writes into the host's root-owned /opt/cni/bin. The
	// manifests drop every capability either does not need.
	cf.Config.User = "0:0"
	cf.Config.Labels = map[string]string{
		"org.opencontainers.image.title":   "axon",
		"org.opencontainers.image.version": spec.Version,
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("image config: %w", err)
	}
	return img, nil
}

// binariesLayer is the gzip'd tar of the binaries below BinDir: directories
// first, then the files in Binaries order, root-owned, every mtime created.
func binariesLayer(binDir string, created time.Time) ([]byte, error) {
	var buf bytes.Buffer
	gz, err := gzip.NewWriterLevel(&buf, gzip.DefaultCompression)
	if err != nil {
		return nil, err
	}
	tw := tar.NewWriter(gz)
	dirs := []string{"usr/", "usr/local/", "usr/local/bin/"}
	for _, d := range dirs {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: created, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
	}
	for _, b := range Binaries {
		src := filepath.Join(binDir, b)
		data, err := os.ReadFile(src)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w (run make build first)", src, err)
		}
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: path.Join(BinDir, b)[1:], Mode: 0o755, Size: int64(len(data)), ModTime: created, Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := gz.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// binariesArch is the image architecture, read from the binaries themselves
// (all must agree and be static: the image has no libc).
func binariesArch(binDir string) (string, error) {
	arch := ""
	for _, b := range Binaries {
		p := filepath.Join(binDir, b)
		a, err := StaticELF(p)
		if err != nil {
			return "", err
		}
		if arch != "" && a != arch {
			return "", fmt.Errorf("%s is %s, the other binaries %s: build all with the same GOARCH", p, a, arch)
		}
		arch = a
	}
	return arch, nil
}

// StaticELF checks that the ELF file at p is statically linked (no program
// interpreter, no dynamic section) and returns its architecture in GOARCH
// terms.
func StaticELF(p string) (string, error) {
	f, err := elf.Open(p)
	if err != nil {
		return "", fmt.Errorf("read %s: %w (run make build first)", p, err)
	}
	defer f.Close()
	for _, prog := range f.Progs {
		switch prog.Type {
		case elf.PT_INTERP:
			return "", fmt.Errorf("%s is dynamically linked (it has a program interpreter): build it with CGO_ENABLED=0 (make build)", p)
		case elf.PT_DYNAMIC:
			return "", fmt.Errorf("%s has a dynamic section: build it with CGO_ENABLED=0 (make build)", p)
		}
	}
	if s := f.Section(".dynamic"); s != nil {
		return "", fmt.Errorf("%s has a .dynamic section: build it with CGO_ENABLED=0 (make build)", p)
	}
	switch f.Machine {
	case elf.EM_X86_64:
		return "amd64", nil
	case elf.EM_AARCH64:
		return "arm64", nil
	default:
		return "", fmt.Errorf("%s: unsupported machine %s", p, f.Machine)
	}
}
