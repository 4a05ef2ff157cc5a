package image

import (
	"archive/tar"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/axonhq/axon/internal/testutil"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// TestE2EImagesLayout: the pause and agnhost images are one layer with the files where
// upstream's are, the entrypoint and user upstream's have, the tarball carries exactly the
// reference the e2e suite pulls, and the same inputs give the same digest (a different creation
// time gives another: the digest does depend on its inputs). A static binary of make build
// stands in for pause and agnhost (hack/images compiles the real ones).
func TestE2EImagesLayout(t *testing.T) {
	bin := filepath.Join(repoBin, "axon-cni")
	porter := t.TempDir()
	for _, f := range []string{"localhost.crt", "localhost.key"} {
		if err := os.WriteFile(filepath.Join(porter, f), []byte(f), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	created := time.Unix(1700000000, 0)
	for _, tc := range []struct {
		ref        string
		contents   func(time.Time) (Contents, error)
		entrypoint []string
		cmd        []string
		user       string
		files      []string
	}{
		{PauseRef, func(c time.Time) (Contents, error) { return PauseImage(bin, "amd64", c) },
			[]string{"/pause"}, nil, "65535:65535", []string{"pause"}},
		{AgnhostRef, func(c time.Time) (Contents, error) { return AgnhostImage(bin, porter, "amd64", c) },
			[]string{"/agnhost"}, []string{"pause"}, "", []string{"agnhost", "agnhost-2", "localhost.crt", "localhost.key", "uploads/"}},
	} {
		t.Run(filepath.Base(tc.ref), func(t *testing.T) {
			digest := func(c time.Time) (v1.Image, v1.Hash) {
				t.Helper()
				cont, err := tc.contents(c)
				if err != nil {
					t.Fatal(err)
				}
				img, err := Assemble(cont)
				if err != nil {
					t.Fatal(err)
				}
				d, err := img.Digest()
				if err != nil {
					t.Fatal(err)
				}
				return img, d
			}
			img, d1 := digest(created)
			if _, d2 := digest(created); d1 != d2 {
				t.Fatalf("two assemblies of the same inputs: %s and %s", d1, d2)
			}
			if _, d3 := digest(created.Add(time.Second)); d3 == d1 {
				t.Fatalf("another creation time gave the same digest %s", d1)
			}
			tarPath := filepath.Join(t.TempDir(), "img.tar")
			if d, err := Write(img, []string{tc.ref}, "", tarPath); err != nil || d != d1 {
				t.Fatalf("Write: digest %s err %v, want %s", d, err, d1)
			}
			m, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(tarPath) })
			if err != nil {
				t.Fatal(err)
			}
			if len(m) != 1 || !reflect.DeepEqual(m[0].RepoTags, []string{tc.ref}) {
				t.Fatalf("tarball manifest %+v, want one image tagged %s", m, tc.ref)
			}
			ti, err := tarball.ImageFromPath(tarPath, nil)
			if err != nil {
				t.Fatal(err)
			}
			cf, err := ti.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(cf.Config.Entrypoint, tc.entrypoint) || !reflect.DeepEqual(cf.Config.Cmd, tc.cmd) ||
				cf.Config.User != tc.user || cf.OS != "linux" || cf.Architecture != "amd64" {
				t.Errorf("config: entrypoint %v cmd %v user %q os %s arch %s", cf.Config.Entrypoint, cf.Config.Cmd, cf.Config.User, cf.OS, cf.Architecture)
			}
			layers, err := ti.Layers()
			if err != nil || len(layers) != 1 {
				t.Fatalf("layers %d, err %v: want 1", len(layers), err)
			}
			rc, err := layers[0].Uncompressed()
			if err != nil {
				t.Fatal(err)
			}
			defer rc.Close()
			var got []string
			for _, mem := range testutil.TarMembers(t, rc) {
				h := mem.Header
				got = append(got, h.Name)
				if h.Uid != 0 || h.Gid != 0 || !h.ModTime.Equal(created) {
					t.Errorf("%s: uid %d gid %d mtime %s", h.Name, h.Uid, h.Gid, h.ModTime)
				}
				if h.Name == "agnhost-2" && (h.Typeflag != tar.TypeSymlink || h.Linkname != "agnhost") {
					t.Errorf("agnhost-2: type %c link %q, want a symlink to agnhost", h.Typeflag, h.Linkname)
				}
				if (h.Name == "pause" || h.Name == "agnhost") && h.Mode != 0o755 {
					t.Errorf("%s: mode %o, want 755", h.Name, h.Mode)
				}
			}
			if !reflect.DeepEqual(got, tc.files) {
				t.Errorf("layer files %v, want %v", got, tc.files)
			}
		})
	}
}

// TestImageNameMatchesManifest: the chart's values name the image; make image (hack/image,
// which takes its name from ChartImage) writes a tarball carrying that reference, and every
// container of the committed deploy/kubernetes/axon.yaml (rendered from the chart; go test
// ./deploy keeps it current) runs exactly it. So importing bin/image/axon-image.tar into a
// node's containerd gives the manifest its image without a registry.
func TestImageNameMatchesManifest(t *testing.T) {
	repo, tag, err := ChartImage(filepath.Join("..", "helm", "axon"))
	if err != nil {
		t.Fatal(err)
	}
	want := repo + ":" + tag
	manifest, err := os.ReadFile(filepath.Join("..", "kubernetes", "axon.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	images := regexp.MustCompile(`(?m)^\s*image:\s*"?([^"\s]+)"?\s*$`).FindAllSubmatch(manifest, -1)
	if len(images) == 0 {
		t.Fatal("deploy/kubernetes/axon.yaml has no image: line")
	}
	for _, m := range images {
		if string(m[1]) != want {
			t.Errorf("deploy/kubernetes/axon.yaml runs %s, the chart's values say %s", m[1], want)
		}
	}
	res, err := Build(Spec{BinDir: repoBin, Name: repo, Version: "v0.0.0-test", Tags: []string{tag}, Created: time.Unix(1700000000, 0)}, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	m, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(res.Tarball) })
	if err != nil {
		t.Fatal(err)
	}
	if len(m) != 1 || !slices.Contains(m[0].RepoTags, want) || !slices.Contains(m[0].RepoTags, repo+":v0.0.0-test") {
		t.Fatalf("tarball tags %+v, want %s and %s:v0.0.0-test", m, want, repo)
	}
	t.Logf("manifest and image agree on %s (%d containers); tarball tags %v", want, len(images), m[0].RepoTags)
}
