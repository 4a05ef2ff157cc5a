// Command images builds the pause and agnhost images that real-kubelet lab nodes import into
// containerd (`make images`), without a registry or a container runtime: pause from
// build/pause/linux/pause.c of the pinned k8s.io/kubernetes module (gcc -Os -static), agnhost
// from its test/images/agnhost (static Go build, hack/k8s's module graph), each packed by
// deploy/image as a docker-archive tarball (`ctr -n k8s.io images import <tar>`) under the
// name the e2e suite of that version uses. Cached: an existing tarball is kept.
//
//	go run ./hack/images [-out ~/.cache/axon/images-k8s-v1.36.3] [-created 0]
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/axonhq/axon/deploy/image"
	"github.com/axonhq/axon/internal/lab"
)

func main() {
	out := flag.String("out", filepath.Join(lab.DepsDir(), "images-k8s-"+lab.K8sVersion), "folder for <name>-<tag>.tar")
	hackDir := flag.String("hack", "hack", "the repository's hack/ folder (hack/k8s pins k8s.io/kubernetes)")
	created := flag.Int64("created", 0, "creation time and file mtimes, Unix seconds (fixed: the same sources give the same digest)")
	flag.Parse()
	if err := run(*out, *hackDir, time.Unix(*created, 0)); err != nil {
		slog.Error("make images", "err", err)
		os.Exit(1)
	}
}

type target struct {
	ref   string
	build func(tmp string) (image.Contents, error)
}

func run(out, hackDir string, created time.Time) error {
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

	targets := []target{
		{image.PauseRef, func(tmp string) (image.Contents, error) {
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
		{image.AgnhostRef, func(tmp string) (image.Contents, error) {
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
			return image.AgnhostImage(bin, filepath.Join(modDir, "test", "images", "agnhost", "porter"), arch, created)
		}},
	}
	for _, tg := range targets {
		tarPath := filepath.Join(out, TarballName(tg.ref))
		if _, err := os.Stat(tarPath); err == nil {
			fmt.Printf("cached  %s (%s)\n", tarPath, tg.ref)
			continue
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
		fmt.Printf("built   %s (%s %s) in %s\n", tarPath, tg.ref, dig, time.Since(start).Round(time.Second))
	}
	fmt.Printf("images: ready in %s (%s); import with ctr -n k8s.io images import <tar>\n", out, time.Since(t0).Round(time.Second))
	return nil
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
	configRE   = regexp.MustCompile(`configs\[(Pause|Agnhost)\] = Config\{list\.(\w+), "([^"]+)", "([^"]+)"\}`)
	registryRE = regexp.MustCompile(`(?m)^\s*(\w+Registry):\s*"([^"]+)",`)
)

// checkRefs compares PauseRef and AgnhostRef with the e2e image manifest of the pinned module,
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
	want := map[string]string{"Pause": image.PauseRef, "Agnhost": image.AgnhostRef}
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
		return fmt.Errorf("%s: found %d of the Pause and Agnhost entries: its format changed, check deploy/image/e2e.go by hand", manifest, found)
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
