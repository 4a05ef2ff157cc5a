// Package image builds container images without a container runtime: axon's
// own image, an OCI image from scratch (no base image) holding the three static
// binaries of `make build`, written as an OCI layout directory and as a
// `docker load` / `podman load` / `ctr images import` tarball; and, with the
// same assembly (Assemble: base layers, then one of the image's own), the
// pause, agnhost and glibc-dns-testing images the real-kubelet lab and the e2e
// suite use (e2e.go). The same files and the same creation time give the same
// digest: file order, modes, owners and mtimes in each layer are fixed and the
// gzip header carries no time or name.
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
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
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
	// Name is the image's repository, e.g. "ghcr.io/axonhq/axon" (the Helm
	// chart's image.repository, ChartImage); with Version it is the reference
	// in the OCI layout and the tarball.
	Name    string
	Version string
	// Tags are more tags of Name the tarball carries, e.g. the chart's
	// appVersion, the tag deploy/kubernetes/axon.yaml uses.
	Tags []string
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
	refs := []string{spec.Name + ":" + spec.Version}
	for _, t := range spec.Tags {
		if r := spec.Name + ":" + t; !slices.Contains(refs, r) {
			refs = append(refs, r)
		}
	}
	res := Result{Layout: filepath.Join(outDir, "oci"), Tarball: filepath.Join(outDir, "axon-image.tar")}
	res.Digest, err = Write(img, refs, res.Layout, res.Tarball)
	return res, err
}

// Write writes img as an OCI layout in layoutDir (replaced; "" for none), its
// ref.name annotation the first reference's tag, and as a docker-archive
// tarball carrying every reference in refs (full names, e.g.
// registry.k8s.io/pause:3.10.2; a name without a registry host stays without
// one). It returns the image manifest's digest.
func Write(img v1.Image, refs []string, layoutDir, tarPath string) (v1.Hash, error) {
	dig, err := img.Digest()
	if err != nil {
		return v1.Hash{}, fmt.Errorf("image digest: %w", err)
	}
	if len(refs) == 0 {
		return v1.Hash{}, fmt.Errorf("image %s: no reference to write it under", dig)
	}
	tags := map[name.Tag]v1.Image{}
	var first name.Tag
	for i, r := range refs {
		t, err := name.NewTag(r, name.WithDefaultRegistry(""))
		if err != nil {
			return v1.Hash{}, fmt.Errorf("image reference %q: %w (want [registry/]path:tag, the tag [A-Za-z0-9_.-])", r, err)
		}
		if i == 0 {
			first = t
		}
		tags[t] = img
	}
	if layoutDir != "" {
		if err := os.RemoveAll(layoutDir); err != nil {
			return v1.Hash{}, err
		}
		p, err := layout.Write(layoutDir, empty.Index)
		if err != nil {
			return v1.Hash{}, fmt.Errorf("create OCI layout %s: %w", layoutDir, err)
		}
		if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{
			"org.opencontainers.image.ref.name": first.TagStr(),
		})); err != nil {
			return v1.Hash{}, fmt.Errorf("write image into %s: %w", layoutDir, err)
		}
	}
	// Into a temporary file first: an interrupted write never leaves a tarball that looks complete.
	tmp := tarPath + ".tmp"
	if err := tarball.MultiWriteToFile(tmp, tags); err != nil {
		os.Remove(tmp)
		return v1.Hash{}, fmt.Errorf("write %s: %w", tarPath, err)
	}
	if err := os.Rename(tmp, tarPath); err != nil {
		return v1.Hash{}, fmt.Errorf("write %s: %w", tarPath, err)
	}
	return dig, nil
}

// Entry is one member of a single-layer image.
type Entry struct {
	Path string // absolute path in the image, e.g. /usr/local/bin/axon-agent
	Src  string // a regular file: copied from this host path
	Mode int64  // of a regular file or directory (0: 0755)
	Link string // a symbolic link to this target (Src empty)
	Dir  bool   // a directory (parents of files are added without asking)
}

// Layer is one layer of an image: its members and its history entry.
type Layer struct {
	Entries   []Entry // in layer order, after their parent directories
	CreatedBy string
}

// Contents is everything an image from scratch is made of: the Base layers,
// bottom first (none for a single-layer image), then one layer of Entries.
type Contents struct {
	Base       []Layer
	Entries    []Entry // in layer order, after their parent directories
	Entrypoint []string
	Cmd        []string
	Env        []string
	User       string // e.g. "0:0" or "65535:65535"
	Labels     map[string]string
	Arch       string // GOARCH terms, e.g. amd64
	CreatedBy  string // the layer's history entry
	Created    time.Time
}

// Image assembles the image of spec in memory.
func Image(spec Spec) (v1.Image, error) {
	arch, err := binariesArch(spec.BinDir)
	if err != nil {
		return nil, err
	}
	c := Contents{
		Entrypoint: []string{path.Join(BinDir, "axon-agent")},
		Env:        []string{"PATH=" + BinDir},
		// uid 0: the agent needs its capabilities (BPF, NET_ADMIN, ...) as
		// effective capabilities, which Kubernetes grants only to uid 0, and the
		// CNI installer writes into the host's root-owned /opt/cni/bin. The
		// manifests drop every capability either does not need.
		User: "0:0",
		Labels: map[string]string{
			"org.opencontainers.image.title":   "axon",
			"org.opencontainers.image.version": spec.Version,
		},
		Arch:      arch,
		CreatedBy: "deploy/image: " + path.Join(BinDir, "{axon,axon-agent,axon-cni}"),
		Created:   spec.Created,
	}
	for _, b := range Binaries {
		c.Entries = append(c.Entries, Entry{Path: path.Join(BinDir, b), Src: filepath.Join(spec.BinDir, b)})
	}
	return Assemble(c)
}

// Assemble builds the image of c from scratch: c.Base's layers, then the layer
// of c.Entries. A layer's digest depends only on its entries and c.Created, so
// images sharing a base share that layer.
func Assemble(c Contents) (v1.Image, error) {
	created := c.Created.UTC()
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	for i, l := range append(slices.Clone(c.Base), Layer{Entries: c.Entries, CreatedBy: c.CreatedBy}) {
		layerTar, err := buildLayer(l.Entries, created)
		if err != nil {
			return nil, err
		}
		layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(layerTar)), nil
		}, tarball.WithMediaType(types.OCILayer))
		if err != nil {
			return nil, fmt.Errorf("image layer %d (%s): %w", i, l.CreatedBy, err)
		}
		img, err = mutate.Append(img, mutate.Addendum{
			Layer:     layer,
			MediaType: types.OCILayer,
			History:   v1.History{Created: v1.Time{Time: created}, CreatedBy: l.CreatedBy},
		})
		if err != nil {
			return nil, fmt.Errorf("append layer %d (%s): %w", i, l.CreatedBy, err)
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Created = v1.Time{Time: created}
	cf.OS, cf.Architecture = "linux", c.Arch
	cf.Config.Entrypoint = c.Entrypoint
	cf.Config.Cmd = c.Cmd
	cf.Config.Env = c.Env
	cf.Config.User = c.User
	cf.Config.Labels = c.Labels
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("image config: %w", err)
	}
	return img, nil
}

// TreeEntries lists the folder root as layer entries, in lexical order (a
// folder before what it holds): folders, regular files (copied when the layer
// is built) and symbolic links, with their permission bits (setuid, setgid and
// sticky included). Owners are not kept: everything in a layer is root's.
// Anything else (a device, a socket, a pipe) is refused.
func TreeEntries(root string) ([]Entry, error) {
	var out []Entry
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil || rel == "." {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		e := Entry{Path: "/" + filepath.ToSlash(rel), Mode: tarMode(fi.Mode())}
		switch m := fi.Mode(); {
		case m.IsDir():
			e.Dir = true
		case m.IsRegular():
			e.Src = p
		case m&fs.ModeSymlink != 0:
			if e.Link, err = os.Readlink(p); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%s: %s is neither a file, a folder nor a symbolic link: an image layer holds only those", root, p)
		}
		out = append(out, e)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", root, err)
	}
	return out, nil
}

// tarMode is m's permission bits in tar's (and chmod's) numbering.
func tarMode(m fs.FileMode) int64 {
	mode := int64(m.Perm())
	if m&fs.ModeSetuid != 0 {
		mode |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		mode |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		mode |= 0o1000
	}
	return mode
}

// buildLayer is the gzip'd tar of entries: each file's missing parent
// directories first, then the entry; root-owned, every mtime created.
func buildLayer(entries []Entry, created time.Time) ([]byte, error) {
	var buf bytes.Buffer
	gz, err := gzip.NewWriterLevel(&buf, gzip.DefaultCompression)
	if err != nil {
		return nil, err
	}
	tw := tar.NewWriter(gz)
	seen := map[string]bool{}
	dir := func(d string, mode int64) error {
		if seen[d] {
			return nil
		}
		seen[d] = true
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d[1:] + "/", Mode: mode, ModTime: created, Format: tar.FormatPAX})
	}
	for _, e := range entries {
		if !path.IsAbs(e.Path) || path.Clean(e.Path) != e.Path || e.Path == "/" {
			return nil, fmt.Errorf("image entry %q: want a clean absolute path below /", e.Path)
		}
		var parents []string
		for d := path.Dir(e.Path); d != "/"; d = path.Dir(d) {
			parents = append([]string{d}, parents...)
		}
		for _, d := range parents {
			if err := dir(d, 0o755); err != nil {
				return nil, err
			}
		}
		mode := e.Mode
		if mode == 0 {
			mode = 0o755
		}
		switch {
		case e.Dir:
			if err := dir(e.Path, mode); err != nil {
				return nil, err
			}
		case e.Link != "":
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: e.Path[1:], Linkname: e.Link, Mode: 0o777, ModTime: created, Format: tar.FormatPAX}); err != nil {
				return nil, err
			}
		default:
			data, err := os.ReadFile(e.Src)
			if err != nil {
				return nil, fmt.Errorf("read %s: %w (build it first: make build, make images)", e.Src, err)
			}
			hdr := &tar.Header{Typeflag: tar.TypeReg, Name: e.Path[1:], Mode: mode, Size: int64(len(data)), ModTime: created, Format: tar.FormatPAX}
			if err := tw.WriteHeader(hdr); err != nil {
				return nil, err
			}
			if _, err := tw.Write(data); err != nil {
				return nil, err
			}
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
