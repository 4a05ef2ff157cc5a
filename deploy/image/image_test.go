package image

import (
	"archive/tar"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/axonhq/axon/internal/testutil"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// repoBin is `make build`'s output folder (make test builds it first).
const repoBin = "../../bin"

// TestBinariesStatic: the binaries make build puts on every host (axon-cni
// into /opt/cni/bin) have no program interpreter and no dynamic section, so
// they run whatever libc the node has, or none (the image).
func TestBinariesStatic(t *testing.T) {
	for _, b := range Binaries {
		p := filepath.Join(repoBin, b)
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%v: run make build first", err)
		}
		arch, err := StaticELF(p)
		if err != nil {
			t.Error(err)
			continue
		}
		t.Logf("%s: static, %s", b, arch)
	}
}

// TestStaticELFRejectsDynamic: the check does find an interpreter, in the
// host's /bin/sh (a dynamically linked binary on every Debian/Ubuntu host).
func TestStaticELFRejectsDynamic(t *testing.T) {
	if _, err := StaticELF("/bin/sh"); err == nil {
		t.Fatal("StaticELF accepted /bin/sh, a dynamically linked binary")
	} else {
		t.Logf("as expected: %v", err)
	}
}

// TestImageReproducible builds the image twice from make build's binaries
// into two folders: the same digest, the same tarball bytes, and the layer
// holds exactly the three binaries, root-owned, 0755, at the given mtime.
func TestImageReproducible(t *testing.T) {
	spec := Spec{BinDir: repoBin, Name: "axon", Version: "test", Created: time.Unix(1700000000, 0)}
	a, err := Build(spec, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	// The second build in memory only (writing is ggcr's, hashing is ours to keep stable).
	img2, err := Image(spec)
	if err != nil {
		t.Fatal(err)
	}
	d2, err := img2.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if a.Digest != d2 {
		t.Fatalf("two builds of the same inputs: digests %s and %s", a.Digest, d2)
	}
	t.Logf("digest %s twice", a.Digest)

	// Read back the layout as a runtime would.
	idx, err := layout.ImageIndexFromPath(a.Layout)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 || im.Manifests[0].Digest != a.Digest {
		t.Fatalf("layout index %+v, want one manifest %s", im.Manifests, a.Digest)
	}
	img, err := idx.Image(a.Digest)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(cf.Config.Entrypoint, []string{"/usr/local/bin/axon-agent"}) || cf.OS != "linux" || cf.Architecture == "" {
		t.Errorf("config: entrypoint %v os %s arch %s", cf.Config.Entrypoint, cf.OS, cf.Architecture)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers %d, err %v: want 1", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var got []string
	for _, m := range testutil.TarMembers(t, rc) {
		h := m.Header
		if h.Uid != 0 || h.Gid != 0 || !h.ModTime.Equal(spec.Created) {
			t.Errorf("%s: uid %d gid %d mtime %s, want 0 0 %s", h.Name, h.Uid, h.Gid, h.ModTime, spec.Created)
		}
		if h.Typeflag == tar.TypeReg {
			if h.Mode != 0o755 {
				t.Errorf("%s: mode %o, want 755", h.Name, h.Mode)
			}
			want, _ := os.ReadFile(filepath.Join(repoBin, filepath.Base(h.Name)))
			if string(m.Data) != string(want) {
				t.Errorf("%s: content differs from %s", h.Name, filepath.Join(repoBin, filepath.Base(h.Name)))
			}
		}
		got = append(got, h.Name)
	}
	want := []string{"usr/", "usr/local/", "usr/local/bin/", "usr/local/bin/axon", "usr/local/bin/axon-agent", "usr/local/bin/axon-cni"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("layer files %v, want %v", got, want)
	}

	// The tarball (docker-archive: a Docker manifest, so another manifest
	// digest) holds the same layer and config.
	ti, err := tarball.ImageFromPath(a.Tarball, nil)
	if err != nil {
		t.Fatal(err)
	}
	tl, err := ti.Layers()
	if err != nil || len(tl) != 1 {
		t.Fatalf("tarball layers %d, err %v: want 1", len(tl), err)
	}
	ld, _ := layers[0].Digest()
	if d, _ := tl[0].Digest(); d != ld {
		t.Errorf("tarball layer %s, layout layer %s", d, ld)
	}
	cn, _ := img.ConfigName()
	if d, _ := ti.ConfigName(); d != cn {
		t.Errorf("tarball config %s, layout config %s", d, cn)
	}
}
