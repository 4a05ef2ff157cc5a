// Command images builds the images of the e2e suite (deploy/image/e2eref) that real-kubelet
// lab nodes import into containerd (`make images`), without a registry or a container runtime:
// pause from build/pause/linux/pause.c of the pinned k8s.io/kubernetes module (gcc -Os
// -static); agnhost from its test/images/agnhost (static Go build, hack/k8s's module graph) and
// CoreDNS (hack/coredns) on a layer of Debian packages holding the shell and the tools the e2e
// tests run in it (curl, nc, dig, ...: image.ToolsSet, unpacked by internal/debroot from the
// machine's own apt configuration); glibc-dns-testing that same layer alone; busybox and
// distroless-iptables from their own Debian package sets; regression-issue-74839 from its
// test/images folder. Each is packed by deploy/image as a docker-archive tarball (`ctr -n
// k8s.io images import <tar>`) under the name the e2e suite of that version uses. Cached: an
// existing tarball is kept while what it was built from (its .inputs file: package versions,
// which must still be apt's candidates, and hack/coredns's pins) is unchanged.
//
//	go run ./hack/images [-out ~/.cache/axon/images-k8s-v1.36.3] [-debroot ~/.cache/axon/debroot] [-created 0]
package main

import (
	"bytes"
	"context"
	"crypto/sha256"
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
	"github.com/axonhq/axon/deploy/image/e2eref"
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
	inputs string // what the tarball was built from beyond this program and the k8s module, "" for nothing
	build  func(tmp string) (image.Contents, error)
	ref    string
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

	roots := map[string]root{}
	for _, set := range []image.PackageSet{image.ToolsSet, image.BusyBoxSet, image.DistrolessIptablesSet} {
		start := time.Now()
		r, err := RootLayer(context.Background(), debroots, set)
		if err != nil {
			return err
		}
		fmt.Printf("%-20s %s (%d packages, %s) in %s\n", set.Name, r.root.Dir, len(r.root.Packages),
			map[bool]string{true: "cached", false: "downloaded"}[r.root.Cached], time.Since(start).Round(time.Second))
		roots[set.Name] = r
	}
	tools := roots[image.ToolsSet.Name]
	corednsMod := filepath.Join(hackDir, "coredns")
	corednsInputs, err := moduleInputs(corednsMod)
	if err != nil {
		return err
	}
	// goBuild builds pkg of the module in dir as a static binary in tmp, for the Debian roots' arch.
	goBuild := func(tmp, dir, pkg, name, ldflags string) (string, string, error) {
		bin, err := filepath.Abs(filepath.Join(tmp, name))
		if err != nil {
			return "", "", err
		}
		if err := command(dir, []string{"CGO_ENABLED=0", "GOWORK=off", "GOFLAGS=-mod=readonly"}, "go", "build", "-trimpath",
			"-ldflags", "-s -w "+ldflags, "-o", bin, pkg); err != nil {
			return "", "", fmt.Errorf("build %s: %w", name, err)
		}
		arch, err := image.StaticELF(bin)
		if err != nil {
			return "", "", err
		}
		if arch != tools.arch {
			return "", "", fmt.Errorf("%s is %s, the Debian packages %s", name, arch, tools.arch)
		}
		return bin, arch, nil
	}
	rootImage := func(set image.PackageSet, cmd ...string) target {
		r := roots[set.Name]
		return target{inputs: r.inputs, build: func(string) (image.Contents, error) { return image.RootImage(r.layer, cmd, r.arch, created), nil }}
	}
	targets := map[string]target{
		e2eref.Pause: {build: func(tmp string) (image.Contents, error) {
			bin := filepath.Join(tmp, "pause")
			_, tag, _ := strings.Cut(e2eref.Pause, ":")
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
		e2eref.Agnhost: {inputs: tools.inputs + corednsInputs, build: func(tmp string) (image.Contents, error) {
			_, tag, _ := strings.Cut(e2eref.Agnhost, ":")
			agnhost, arch, err := goBuild(tmp, k8sMod, "k8s.io/kubernetes/test/images/agnhost", "agnhost", "-X main.Version="+tag)
			if err != nil {
				return image.Contents{}, err
			}
			coredns, _, err := goBuild(tmp, corednsMod, ".", "coredns", "")
			if err != nil {
				return image.Contents{}, err
			}
			return image.AgnhostImage(agnhost, coredns, filepath.Join(modDir, "test", "images", "agnhost", "porter"), tools.layer, arch, created)
		}},
		e2eref.GlibcDNSTesting:    rootImage(image.ToolsSet, "/bin/sh"),
		e2eref.BusyBox:            rootImage(image.BusyBoxSet, "sh"),
		e2eref.DistrolessIptables: rootImage(image.DistrolessIptablesSet, "/bin/sh"),
		e2eref.RegressionIssue74839: {build: func(tmp string) (image.Contents, error) {
			bin, arch, err := goBuild(tmp, k8sMod, "k8s.io/kubernetes/test/images/regression-issue-74839", "regression-issue-74839", "")
			if err != nil {
				return image.Contents{}, err
			}
			return image.RegressionIssue74839Image(bin, arch, created)
		}},
	}
	for _, img := range e2eref.Images {
		tg, ok := targets[img.Ref]
		if !ok {
			return fmt.Errorf("%s: e2eref lists it, this command does not build it", img.Ref)
		}
		tg.ref = img.Ref
		tarPath := filepath.Join(out, e2eref.Archive(tg.ref))
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

// root is an image layer of Debian packages: the tools under agnhost and glibc-dns-testing,
// busybox's, distroless-iptables'.
type root struct {
	root   debroot.Root
	layer  image.Layer
	arch   string
	inputs string // the package list, one "name version arch" a line
}

// RootLayer resolves set's closure in apt's lists, unpacks it (cached in debroots by the exact
// versions) and lists it as an image layer.
func RootLayer(ctx context.Context, debroots string, set image.PackageSet) (root, error) {
	for _, c := range []string{"apt-cache", "apt-get", "dpkg", "dpkg-deb"} {
		if _, err := exec.LookPath(c); err != nil {
			return root{}, fmt.Errorf("%s layer: %w: it is built from Debian packages with apt and dpkg (a Debian or Ubuntu host)", set.Name, err)
		}
	}
	pkgs, err := debroot.Resolve(ctx, set.Packages, set.Exclude)
	if err != nil {
		return root{}, fmt.Errorf("%s (deploy/image): %w", set.Name, err)
	}
	dr, err := debroot.Build(ctx, debroots, pkgs, set.Links, slog.Default())
	if err != nil {
		return root{}, fmt.Errorf("%s: %w", set.Name, err)
	}
	entries, err := image.TreeEntries(dr.Dir)
	if err != nil {
		return root{}, err
	}
	r := root{root: dr}
	var inputs, direct []string
	for _, p := range pkgs {
		inputs = append(inputs, p.Name+" "+p.Version+" "+p.Arch+"\n")
		if slices.Contains(set.Packages, p.Name) {
			direct = append(direct, p.String())
		}
		if p.Name == "libc6" {
			r.arch = p.Arch
		}
		if r.arch == "" && p.Arch != "all" && slices.Contains(set.Packages, p.Name) {
			r.arch = p.Arch // busybox-static alone has no libc6
		}
	}
	if r.arch == "" {
		return root{}, fmt.Errorf("%s: no architecture-specific package among %v", set.Name, set.Packages)
	}
	r.inputs = strings.Join(inputs, "")
	r.layer = image.Layer{Entries: entries, CreatedBy: fmt.Sprintf("deploy/image: Debian %s and %d dependencies (debroot %s)",
		strings.Join(direct, " "), len(pkgs)-len(direct), debroot.Key(pkgs, set.Links))}
	return r, nil
}

// moduleInputs is the cache input of a wrapper module's build (hack/coredns): a hash of its
// go.mod, go.sum and Go files, named by the folder's base name (the same from the repository's root
// and from hack/images' tests, which run one folder down).
func moduleInputs(dir string) (string, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return "", err
	}
	h := sha256.New()
	for _, f := range append([]string{filepath.Join(dir, "go.mod"), filepath.Join(dir, "go.sum")}, files...) {
		b, err := os.ReadFile(f)
		if err != nil {
			return "", fmt.Errorf("module %s: %w", dir, err)
		}
		fmt.Fprintf(h, "%s %d\n", filepath.Base(f), len(b))
		h.Write(b)
	}
	return fmt.Sprintf("%s %x\n", filepath.Base(dir), h.Sum(nil)[:12]), nil
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
	configRE   = regexp.MustCompile(`configs\[(\w+)\] = Config\{list\.(\w+), "([^"]+)", "([^"]+)"\}`)
	registryRE = regexp.MustCompile(`(?m)^\s*(\w+Registry):\s*"([^"]+)",`)
)

// checkRefs compares e2eref's references with the e2e image manifest of the pinned module, so
// a Kubernetes update that moves an image fails here, not in a pod stuck pulling.
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
	want := map[string]string{}
	for _, img := range e2eref.Images {
		want[img.Manifest] = img.Ref
	}
	found := 0
	for _, m := range configRE.FindAllSubmatch(b, -1) {
		ref, ok := want[string(m[1])]
		if !ok {
			continue
		}
		reg, ok := registries[string(m[2])]
		if !ok {
			return fmt.Errorf("%s: registry %s of %s not found", manifest, m[2], m[1])
		}
		got := reg + "/" + string(m[3]) + ":" + string(m[4])
		if got != ref {
			return fmt.Errorf("%s names %s %s, deploy/image/e2eref has %s: update it", manifest, m[1], got, ref)
		}
		found++
	}
	if found != len(want) {
		return fmt.Errorf("%s: found %d of the %d entries deploy/image/e2eref names: its format changed, check e2eref by hand", manifest, found, len(want))
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
