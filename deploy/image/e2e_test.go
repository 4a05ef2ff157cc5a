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

	"github.com/axonhq/axon/deploy/image/e2eref"
	"github.com/axonhq/axon/internal/testutil"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// TestE2EImagesLayout: pause and regression-issue-74839 are one layer, agnhost a tools layer (here a small tree standing for
// the Debian packages: TreeEntries keeps folders, files with their setuid and sticky bits, and
// links) under its own, glibc-dns-testing that same tools layer alone (the same digest, so a
// node stores it once); the files are where upstream's are, the entrypoint, command, user and
// PATH upstream's, the tarball carries exactly the reference the e2e suite pulls, and the same
// inputs give the same digest (a different creation time gives another: the digest does depend
// on its inputs). A static binary of make build stands in for pause, agnhost, coredns and
// regression-issue-74839 (hack/images compiles the real ones).
func TestE2EImagesLayout(t *testing.T) {
	bin := filepath.Join(repoBin, "axon-cni")
	porter := t.TempDir()
	for _, f := range []string{"localhost.crt", "localhost.key"} {
		if err := os.WriteFile(filepath.Join(porter, f), []byte(f), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tree := t.TempDir()
	for _, d := range []string{"bin", "tmp", "usr/bin"} {
		if err := os.MkdirAll(filepath.Join(tree, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(tree, "tmp"), 0o1777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tree, "bin", "busybox"), []byte("busybox"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(tree, "bin", "busybox"), 0o755|os.ModeSetuid); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/bin/busybox", filepath.Join(tree, "bin", "sh")); err != nil {
		t.Fatal(err)
	}
	toolEntries, err := TreeEntries(tree)
	if err != nil {
		t.Fatal(err)
	}
	tools := Layer{Entries: toolEntries, CreatedBy: "tools"}
	toolFiles := []string{"bin/", "bin/busybox", "bin/sh", "tmp/", "usr/", "usr/bin/"}
	wantModes := map[string]int64{"bin/busybox": 0o4755, "tmp/": 0o1777, "usr/bin/": 0o755}
	path := []string{E2EToolsPath}
	created := time.Unix(1700000000, 0)
	var toolsLayer []v1.Hash // the tools layer's digest in each image that has it
	for _, tc := range []struct {
		ref        string
		contents   func(time.Time) (Contents, error)
		entrypoint []string
		cmd        []string
		user       string
		env        []string
		layers     [][]string // each layer's files, bottom first
	}{
		{e2eref.Pause, func(c time.Time) (Contents, error) { return PauseImage(bin, "amd64", c) },
			[]string{"/pause"}, nil, "65535:65535", nil, [][]string{{"pause"}}},
		{e2eref.Agnhost, func(c time.Time) (Contents, error) { return AgnhostImage(bin, bin, porter, tools, "amd64", c) },
			[]string{"/agnhost"}, []string{"pause"}, "", path,
			[][]string{toolFiles, {"agnhost", "agnhost-2", "coredns", "localhost.crt", "localhost.key", "uploads/"}}},
		{e2eref.GlibcDNSTesting, func(c time.Time) (Contents, error) { return RootImage(tools, []string{"/bin/sh"}, "amd64", c), nil },
			nil, []string{"/bin/sh"}, "", path, [][]string{toolFiles}},
		{e2eref.RegressionIssue74839, func(c time.Time) (Contents, error) { return RegressionIssue74839Image(bin, "amd64", c) },
			[]string{"/regression-issue-74839"}, nil, "", nil, [][]string{{"regression-issue-74839"}}},
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
				cf.Config.User != tc.user || !reflect.DeepEqual(cf.Config.Env, tc.env) || cf.OS != "linux" || cf.Architecture != "amd64" {
				t.Errorf("config: entrypoint %v cmd %v user %q env %v os %s arch %s", cf.Config.Entrypoint, cf.Config.Cmd, cf.Config.User, cf.Config.Env, cf.OS, cf.Architecture)
			}
			layers, err := ti.Layers()
			if err != nil || len(layers) != len(tc.layers) {
				t.Fatalf("layers %d, err %v: want %d", len(layers), err, len(tc.layers))
			}
			if len(cf.History) != len(tc.layers) {
				t.Errorf("history %+v: want one entry per layer", cf.History)
			}
			for i, l := range layers {
				rc, err := l.Uncompressed()
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
					if h.Name == "bin/sh" && (h.Typeflag != tar.TypeSymlink || h.Linkname != "/bin/busybox") {
						t.Errorf("bin/sh: type %c link %q, want a symlink to /bin/busybox", h.Typeflag, h.Linkname)
					}
					if slices.Contains([]string{"pause", "agnhost", "coredns", "regression-issue-74839"}, h.Name) && h.Mode != 0o755 {
						t.Errorf("%s: mode %o, want 755", h.Name, h.Mode)
					}
					if m, ok := wantModes[h.Name]; ok && h.Mode != m {
						t.Errorf("%s: mode %o, want %o", h.Name, h.Mode, m)
					}
				}
				if !reflect.DeepEqual(got, tc.layers[i]) {
					t.Errorf("layer %d files %v, want %v", i, got, tc.layers[i])
				}
				if reflect.DeepEqual(tc.layers[i], toolFiles) {
					d, err := l.Digest()
					if err != nil {
						t.Fatal(err)
					}
					toolsLayer = append(toolsLayer, d)
				}
			}
		})
	}
	if len(toolsLayer) != 2 || toolsLayer[0] != toolsLayer[1] {
		t.Errorf("tools layer digests %v: want agnhost's and glibc-dns-testing's, equal", toolsLayer)
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
