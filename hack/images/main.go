// Command images builds the pause, agnhost and glibc-dns-testing images that real-kubelet lab
// nodes import into containerd (`make images`), without a registry or a container runtime:
// pause from build/pause/linux/pause.c of the pinned k8s.io/kubernetes module (gcc -Os
// -static); agnhost from its test/images/agnhost (static Go build, hack/k8s's module graph) on
// a layer of Debian packages holding the shell and the tools the e2e tests run in it (curl, nc,
// dig, ...: image.E2EToolsPackages, unpacked by internal/debroot from the machine's own apt
// configuration); glibc-dns-testing that same layer alone. Each is packed by deploy/image as a
// docker-archive tarball (`ctr -n k8s.io images import <tar>`) under the name the e2e suite of
// that version uses. Cached: an existing tarball is kept while the package versions it was
// built from (its .inputs file) are still apt's candidates.
//
//	go run ./hack/images [-out ~/.cache/axon/images-k8s-v1.36.3] [-debroot ~/.cache/axon/debroot] [-created 0]
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/axonhq/axon/deploy/image"
	"github.com/axonhq/axon/internal/debroot"
	"github.com/axonhq/axon/internal/lab"
)

func main() {
	out := flag.String("out", filepath.Join(lab.DepsDir(), "images-k8s-"+lab.K8sVersion), "folder for <name>-<tag>.tar")
	hackDir := flag.String("hack", "hack", "the repository's hack/ folder (hack/k8s pins k8s.io/kubernetes)")
	debroots := flag.String("debroot", filepath.Join(lab.DepsDir(), "debroot"), "cache of unpacked Debian package sets (internal/debroot)")
	created := flag.Int64("created", 0, "creation time and file mtimes, Unix seconds (fixed: the same sources give the same digest)")
	flag.Parse()
	if err := run(*out, *hackDir, *debroots, time.Unix(*created, 0)); err != nil {
		slog.Error("make images", "err", err)
		os.Exit(1)
	}
}

type target struct {
	ref    string
	inputs string // what the tarball was built from beyond this program, "" for nothing
	build  func(tmp string) (image.Contents, error)
}

func run(out, hackDir, debroots string, created time.Time) error {
	t0 := time.Now()
	k8sMod := filepath.Join(hackDir, "k8s")
	modDir, err := moduleDir(k8sMod)
	if err != nil {
		return err
	}
	if err := checkRefs(filepath.Join(modDir, "test", "utils", "image", "manifest.go")); err != nil {
		return err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", out, err)
	}
	tmp, err := os.MkdirTemp(out, ".tmp.")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)

	start := time.Now()
	tools, err := ToolsLayer(context.Background(), debroots)
	if err != nil {
		return err
	}
	fmt.Printf("tools   %s (%d packages, %s) in %s\n", tools.root.Dir, len(tools.root.Packages),
		map[bool]string{true: "cached", false: "downloaded"}[tools.root.Cached], time.Since(start).Round(time.Second))

	targets := []target{
		{image.PauseRef, "", func(tmp string) (image.Contents, error) {
			bin := filepath.Join(tmp, "pause")
			_, tag, _ := strings.Cut(image.PauseRef, ":")
			if err := command("", nil, "gcc", "-Os", "-Wall", "-Werror", "-static", "-s",
				"-DVERSION=v"+tag+"-"+lab.K8sVersion, "-o", bin, filepath.Join(modDir, "build", "pause", "linux", "pause.c")); err != nil {
				return image.Contents{}, fmt.Errorf("compile pause.c (needs gcc and libc6-dev's static libc: make packages): %w", err)
			}
			arch, err := image.StaticELF(bin)
			if err != nil {
				return image.Contents{}, err
			}
			return image.PauseImage(bin, arch, created)
		}},
		{image.AgnhostRef, tools.inputs, func(tmp string) (image.Contents, error) {
			bin, err := filepath.Abs(filepath.Join(tmp, "agnhost"))
			if err != nil {
				return image.Contents{}, err
			}
			_, tag, _ := strings.Cut(image.AgnhostRef, ":")
			if err := command(k8sMod, []string{"CGO_ENABLED=0", "GOWORK=off", "GOFLAGS=-mod=readonly"}, "go", "build", "-trimpath",
				"-ldflags", "-s -w -X main.Version="+tag, "-o", bin, "k8s.io/kubernetes/test/images/agnhost"); err != nil {
				return image.Contents{}, fmt.Errorf("build agnhost: %w", err)
			}
			arch, err := image.StaticELF(bin)
			if err != nil {
				return image.Contents{}, err
			}
			if arch != tools.arch {
				return image.Contents{}, fmt.Errorf("agnhost is %s, the Debian packages %s", arch, tools.arch)
			}
			return image.AgnhostImage(bin, filepath.Join(modDir, "test", "images", "agnhost", "porter"), tools.layer, arch, created)
		}},
		{image.GlibcDNSTestingRef, tools.inputs, func(string) (image.Contents, error) {
			return image.GlibcDNSTestingImage(tools.layer, tools.arch, created), nil
		}},
	}
	for _, tg := range targets {
		tarPath := filepath.Join(out, TarballName(tg.ref))
		inputsPath := tarPath + ".inputs"
		if _, err := os.Stat(tarPath); err == nil {
			had, _ := os.ReadFile(inputsPath)
			if string(had) == tg.inputs {
				fmt.Printf("cached  %s (%s)\n", tarPath, tg.ref)
				continue
			}
			fmt.Printf("stale   %s (%s): built from other inputs than %s\n", tarPath, tg.ref, inputsPath)
		} else if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		start := time.Now()
		c, err := tg.build(tmp)
		if err != nil {
			return fmt.Errorf("%s: %w", tg.ref, err)
		}
		img, err := image.Assemble(c)
		if err != nil {
			return fmt.Errorf("%s: %w", tg.ref, err)
		}
		dig, err := image.Write(img, []string{tg.ref}, "", tarPath)
		if err != nil {
			return fmt.Errorf("%s: %w", tg.ref, err)
		}
		if tg.inputs == "" {
			err = os.Remove(inputsPath)
			if errors.Is(err, fs.ErrNotExist) {
				err = nil
			}
		} else {
			err = os.WriteFile(inputsPath, []byte(tg.inputs), 0o644)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", tg.ref, err)
		}
		fmt.Printf("built   %s (%s %s) in %s\n", tarPath, tg.ref, dig, time.Since(start).Round(time.Second))
	}
	fmt.Printf("images: ready in %s (%s); import with ctr -n k8s.io images import <tar>\n", out, time.Since(t0).Round(time.Second))
	return nil
}

// tools is the layer of Debian packages under agnhost and glibc-dns-testing.
type tools struct {
	root   debroot.Root
	layer  image.Layer
	arch   string
	inputs string // the package list, one "name version arch" a line
}

// ToolsLayer resolves image.E2EToolsPackages' closure in apt's lists, unpacks it (cached in
// debroots by the exact versions) and lists it as an image layer.
func ToolsLayer(ctx context.Context, debroots string) (tools, error) {
	for _, c := range []string{"apt-cache", "apt-get", "dpkg", "dpkg-deb"} {
		if _, err := exec.LookPath(c); err != nil {
			return tools{}, fmt.Errorf("e2e tools layer: %w: it is built from Debian packages with apt and dpkg (a Debian or Ubuntu host)", err)
		}
	}
	pkgs, err := debroot.Resolve(ctx, image.E2EToolsPackages, image.E2EToolsExclude)
	if err != nil {
		return tools{}, fmt.Errorf("e2e tools (image.E2EToolsPackages): %w", err)
	}
	root, err := debroot.Build(ctx, debroots, pkgs, image.E2EToolsLinks, slog.Default())
	if err != nil {
		return tools{}, fmt.Errorf("e2e tools: %w", err)
	}
	entries, err := image.TreeEntries(root.Dir)
	if err != nil {
		return tools{}, err
	}
	t := tools{root: root}
	var inputs, direct []string
	for _, p := range pkgs {
		inputs = append(inputs, p.Name+" "+p.Version+" "+p.Arch+"\n")
		if slices.Contains(image.E2EToolsPackages, p.Name) {
			direct = append(direct, p.String())
		}
		if p.Name == "libc6" {
			t.arch = p.Arch
		}
	}
	if t.arch == "" {
		return tools{}, errors.New("e2e tools: no libc6 among the packages")
	}
	t.inputs = strings.Join(inputs, "")
	t.layer = image.Layer{Entries: entries, CreatedBy: fmt.Sprintf("deploy/image: Debian %s and %d dependencies (debroot %s)",
		strings.Join(direct, " "), len(pkgs)-len(direct), debroot.Key(pkgs, image.E2EToolsLinks))}
	return t, nil
}

// TarballName is the cache file of an image reference: "pause-3.10.2.tar" for
// registry.k8s.io/pause:3.10.2.
func TarballName(ref string) string {
	repo, tag, _ := strings.Cut(ref, ":")
	return filepath.Base(repo) + "-" + tag + ".tar"
}

// moduleDir is k8s.io/kubernetes's folder in the module cache, downloaded when missing.
func moduleDir(k8sMod string) (string, error) {
	env := []string{"GOWORK=off", "GOFLAGS=-mod=readonly"}
	if err := command(k8sMod, env, "go", "mod", "download", "k8s.io/kubernetes"); err != nil {
		return "", fmt.Errorf("download k8s.io/kubernetes (pinned in %s): %w", k8sMod, err)
	}
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "k8s.io/kubernetes")
	cmd.Dir, cmd.Env = k8sMod, append(os.Environ(), env...)
	b, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("locate k8s.io/kubernetes from %s: %w", k8sMod, err)
	}
	dir := strings.TrimSpace(string(b))
	if dir == "" {
		return "", fmt.Errorf("go list -m k8s.io/kubernetes in %s: no module folder", k8sMod)
	}
	return dir, nil
}

var (
	configRE   = regexp.MustCompile(`configs\[(Pause|Agnhost|GlibcDnsTesting)\] = Config\{list\.(\w+), "([^"]+)", "([^"]+)"\}`)
	registryRE = regexp.MustCompile(`(?m)^\s*(\w+Registry):\s*"([^"]+)",`)
)

// checkRefs compares PauseRef, AgnhostRef and GlibcDNSTestingRef with the e2e image manifest of the pinned module,
// so a Kubernetes update that moves an image fails here, not in a pod stuck pulling.
func checkRefs(manifest string) error {
	b, err := os.ReadFile(manifest)
	if err != nil {
		return fmt.Errorf("e2e image manifest: %w", err)
	}
	registries := map[string]string{}
	for _, m := range registryRE.FindAllSubmatch(b, -1) {
		if _, ok := registries[string(m[1])]; !ok { // the defaults come first in the file
			registries[string(m[1])] = string(m[2])
		}
	}
	want := map[string]string{"Pause": image.PauseRef, "Agnhost": image.AgnhostRef, "GlibcDnsTesting": image.GlibcDNSTestingRef}
	found := 0
	for _, m := range configRE.FindAllSubmatch(b, -1) {
		reg, ok := registries[string(m[2])]
		if !ok {
			return fmt.Errorf("%s: registry %s of %s not found", manifest, m[2], m[1])
		}
		got := reg + "/" + string(m[3]) + ":" + string(m[4])
		if got != want[string(m[1])] {
			return fmt.Errorf("%s names %s %s, deploy/image/e2e.go has %s: update it", manifest, m[1], got, want[string(m[1])])
		}
		found++
	}
	if found != len(want) {
		return fmt.Errorf("%s: found %d of the Pause, Agnhost and GlibcDnsTesting entries: its format changed, check deploy/image/e2e.go by hand", manifest, found)
	}
	return nil
}

func command(dir string, env []string, name string, args ...string) error {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, stderr.Bytes())
	}
	return nil
}
