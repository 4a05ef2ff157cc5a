// Package debroot assembles a root filesystem from Debian packages without installing them, for
// container image layers: Resolve finds a package list's dependency closure in apt's lists (the
// machine's own package configuration: no mirror is named here), Build downloads that closure
// with `apt-get download`, unpacks every package with `dpkg-deb -x` into one folder and caches the
// result keyed by the exact package versions. Nothing is installed on the host and no
// maintainer script runs, so what a postinst would create is done here (see Build).
package debroot

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// Package is one Debian binary package at the version apt's lists offer (its candidate).
type Package struct {
	Name, Version, Arch string
}

func (p Package) String() string { return p.Name + "=" + p.Version }

// stanza is the part of a package's apt-cache record Resolve reads.
type stanza struct {
	pkg     Package
	depends string // Depends and Pre-Depends, comma-separated groups of alternatives
}

// Resolve returns the packages of want and everything they depend on (Depends and Pre-Depends,
// not Recommends or Suggests), sorted by name, each at its candidate version. Of the
// alternatives "a | b" the first already chosen wins, else the first apt has a candidate for
// (a virtual package has none). A dependency group naming a package of exclude is dropped: those
// are packages only maintainer scripts need (debconf, perl-base), which never run here. A
// dependency on a virtual package alone is an error that says which package to list instead.
func Resolve(ctx context.Context, want, exclude []string) ([]Package, error) {
	arch, err := output(ctx, "dpkg", "--print-architecture")
	if err != nil {
		return nil, err
	}
	arch = strings.TrimSpace(arch)
	known := map[string]*stanza{} // nil: apt has no candidate of that architecture
	query := func(names []string) error {
		var ask []string
		for _, n := range names {
			if _, ok := known[n]; !ok && !slices.Contains(ask, n) {
				ask = append(ask, n)
			}
		}
		if len(ask) == 0 {
			return nil
		}
		out, err := aptShow(ctx, ask)
		if err != nil {
			return err
		}
		for _, s := range parseStanzas(out) {
			if s.pkg.Arch != arch && s.pkg.Arch != "all" {
				continue
			}
			if _, dup := known[s.pkg.Name]; !dup {
				known[s.pkg.Name] = s
			}
		}
		for _, n := range ask {
			if _, ok := known[n]; !ok {
				known[n] = nil
			}
		}
		return nil
	}
	if err := query(want); err != nil {
		return nil, err
	}
	chosen := map[string]*stanza{}
	var frontier []string
	for _, w := range want {
		if known[w] == nil {
			return nil, fmt.Errorf("package %s: apt has no %s candidate for it (apt-cache policy %s; run apt-get update if the lists are old)", w, arch, w)
		}
		chosen[w] = known[w]
		frontier = append(frontier, w)
	}
	for len(frontier) > 0 {
		var names []string
		for _, p := range frontier {
			for _, g := range depGroups(chosen[p].depends) {
				names = append(names, g...)
			}
		}
		if err := query(names); err != nil {
			return nil, err
		}
		var next []string
		for _, p := range frontier {
		groups:
			for _, g := range depGroups(chosen[p].depends) {
				pick := ""
				for _, alt := range g {
					if slices.Contains(exclude, alt) {
						continue groups
					}
					if pick == "" && chosen[alt] != nil {
						pick = alt
					}
				}
				for _, alt := range g {
					if pick == "" && known[alt] != nil {
						pick = alt
					}
				}
				if pick == "" {
					return nil, fmt.Errorf("%s depends on %s: none of it is a real %s package in apt's lists (a virtual package: list a package that provides it)", p, strings.Join(g, " | "), arch)
				}
				if chosen[pick] == nil {
					chosen[pick] = known[pick]
					next = append(next, pick)
				}
			}
		}
		frontier = next
	}
	var out []Package
	for _, s := range chosen {
		out = append(out, s.pkg)
	}
	slices.SortFunc(out, func(a, b Package) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// aptShow is `apt-cache show` of the candidates of names; a name apt does not know (or a virtual
// package) has no record. apt-cache fails only when it knows none of them.
func aptShow(ctx context.Context, names []string) (string, error) {
	cmd := exec.CommandContext(ctx, "apt-cache", append([]string{"show", "--no-all-versions", "--"}, names...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if strings.TrimSpace(stderr.String()) == "E: No packages found" {
			return "", nil
		}
		return "", fmt.Errorf("apt-cache show %s: %w\n%s", strings.Join(names, " "), err, stderr.Bytes())
	}
	return stdout.String(), nil
}

// depGroups splits a Depends field into its groups of alternatives, names only (no version, no
// architecture qualifier such as ":any").
func depGroups(field string) [][]string {
	var out [][]string
	for _, g := range strings.Split(field, ",") {
		var alts []string
		for _, a := range strings.Split(g, "|") {
			f := strings.Fields(a)
			if len(f) == 0 {
				continue
			}
			name, _, _ := strings.Cut(f[0], ":")
			alts = append(alts, name)
		}
		if len(alts) > 0 {
			out = append(out, alts)
		}
	}
	return out
}

// parseStanzas reads apt-cache show's records (continuation lines start with a space).
func parseStanzas(out string) []*stanza {
	var all []*stanza
	var cur *stanza
	var deps []string
	flush := func() {
		if cur != nil && cur.pkg.Name != "" {
			cur.depends = strings.Join(deps, ",")
			all = append(all, cur)
		}
		cur, deps = nil, nil
	}
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			flush()
			continue
		}
		if line[0] == ' ' || line[0] == '\t' {
			continue
		}
		if cur == nil {
			cur = &stanza{}
		}
		k, v, _ := strings.Cut(line, ":")
		v = strings.TrimSpace(v)
		switch k {
		case "Package":
			cur.pkg.Name = v
		case "Version":
			cur.pkg.Version = v
		case "Architecture":
			cur.pkg.Arch = v
		case "Depends", "Pre-Depends":
			deps = append(deps, v)
		}
	}
	flush()
	return all
}

// recipe names what Build does to the unpacked packages; change it when that changes, so
// cached roots built the old way are not reused.
const recipe = "debroot/1: dpkg-deb -x, alternatives links, busybox applet links where no package has the command, nsswitch.conf, docs pruned (copyright kept), /proc /sys /dev /tmp"

// Key is the cache key of pkgs and links: a hash of the recipe, every name, version and
// architecture, and every link.
func Key(pkgs []Package, links map[string]string) string {
	h := sha256.New()
	fmt.Fprintln(h, recipe)
	for _, p := range pkgs {
		fmt.Fprintf(h, "%s=%s:%s\n", p.Name, p.Version, p.Arch)
	}
	for _, l := range slices.Sorted(maps.Keys(links)) {
		fmt.Fprintf(h, "link %s -> %s\n", l, links[l])
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// Root is a built root filesystem.
type Root struct {
	Dir      string // the root folder
	Packages []Package
	Cached   bool // found in the cache, nothing downloaded
}

// Build returns the root filesystem of pkgs (a closure from Resolve) from cacheDir/<Key>/root,
// building it first when missing: `apt-get download` of the exact versions, `dpkg-deb -x` of
// each package in name order, then what the packages' maintainer scripts or a system image
// would provide and this root needs:
//   - links (absolute path in the root -> target), what postinst scripts make with
//     update-alternatives, e.g. /bin/nc -> nc.openbsd for netcat-openbsd; an existing file
//     there is an error;
//   - busybox's applets as symbolic links to /bin/busybox where no package has a command of that
//     name in a PATH folder (with busybox-static in pkgs: the shell and the small tools of a
//     busybox image);
//   - /etc/nsswitch.conf from libc-bin's template (libc-bin's postinst writes it; glibc without
//     it asks DNS before /etc/hosts);
//   - /usr/share/{doc,man,info,locale,lintian,bug} removed, except each package's copyright;
//   - empty /proc, /sys, /dev and /tmp (1777), the mount points a runtime or a chroot fills.
//
// The folder is written beside its final place and renamed into it, so a half-built root is
// never found in the cache.
func Build(ctx context.Context, cacheDir string, pkgs []Package, links map[string]string, log *slog.Logger) (Root, error) {
	if len(pkgs) == 0 {
		return Root{}, errors.New("debroot: no packages")
	}
	final := filepath.Join(cacheDir, Key(pkgs, links))
	res := Root{Dir: filepath.Join(final, "root"), Packages: pkgs}
	if _, err := os.Stat(filepath.Join(final, "packages.txt")); err == nil {
		res.Cached = true
		return res, nil
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return Root{}, fmt.Errorf("create %s: %w", cacheDir, err)
	}
	tmp, err := os.MkdirTemp(cacheDir, ".tmp-")
	if err != nil {
		return Root{}, err
	}
	defer os.RemoveAll(tmp)
	debs := filepath.Join(tmp, "debs")
	root := filepath.Join(tmp, "root")
	if err := os.Mkdir(debs, 0o755); err != nil {
		return Root{}, err
	}
	args := []string{"download", "-qq"}
	for _, p := range pkgs {
		args = append(args, p.Name+":"+p.Arch+"="+p.Version)
	}
	log.Info("downloading Debian packages", "count", len(pkgs), "into", debs)
	// apt downloads as root here (its _apt user cannot write into the cache): it warns so, expected.
	if _, err := outputIn(ctx, debs, "apt-get", args...); err != nil {
		return Root{}, fmt.Errorf("%w (run apt-get update if a version is gone from the lists)", err)
	}
	for _, p := range pkgs {
		deb, err := debFile(ctx, debs, p)
		if err != nil {
			return Root{}, err
		}
		if _, err := output(ctx, "dpkg-deb", "-x", deb, root); err != nil {
			return Root{}, err
		}
	}
	for _, l := range slices.Sorted(maps.Keys(links)) {
		p, err := inRoot(root, l)
		if err != nil {
			return Root{}, fmt.Errorf("link %s: %w", l, err)
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return Root{}, err
		}
		if err := os.Symlink(links[l], p); err != nil {
			return Root{}, fmt.Errorf("link %s -> %s (alternatives): %w", l, links[l], err)
		}
	}
	if err := busyboxLinks(ctx, root); err != nil {
		return Root{}, err
	}
	if err := nsswitch(root); err != nil {
		return Root{}, err
	}
	if err := pruneDocs(root); err != nil {
		return Root{}, err
	}
	for d, mode := range map[string]fs.FileMode{"proc": 0o555, "sys": 0o555, "dev": 0o755, "tmp": 0o777 | fs.ModeSticky} {
		p := filepath.Join(root, d)
		if err := os.MkdirAll(p, 0o755); err != nil {
			return Root{}, err
		}
		if err := os.Chmod(p, mode); err != nil {
			return Root{}, err
		}
	}
	if err := os.RemoveAll(debs); err != nil {
		return Root{}, err
	}
	var list bytes.Buffer
	for _, p := range pkgs {
		fmt.Fprintf(&list, "%s %s %s\n", p.Name, p.Version, p.Arch)
	}
	if err := os.WriteFile(filepath.Join(tmp, "packages.txt"), list.Bytes(), 0o644); err != nil {
		return Root{}, err
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return Root{}, err
	}
	if err := os.Rename(tmp, final); err != nil {
		if _, serr := os.Stat(filepath.Join(final, "packages.txt")); serr == nil {
			return res, nil // built by another run meanwhile
		}
		return Root{}, fmt.Errorf("move %s into the cache: %w", final, err)
	}
	return res, nil
}

// debFile is the file apt-get download wrote for p, <name>_<version>_<arch>.deb with the
// version's ':' written %3a, checked against the package's own control fields.
func debFile(ctx context.Context, dir string, p Package) (string, error) {
	f := filepath.Join(dir, p.Name+"_"+strings.ReplaceAll(p.Version, ":", "%3a")+"_"+p.Arch+".deb")
	if _, err := os.Stat(f); err != nil {
		return "", fmt.Errorf("apt-get download gave no %s: %w", filepath.Base(f), err)
	}
	got, err := output(ctx, "dpkg-deb", "-f", f, "Package", "Version", "Architecture")
	if err != nil {
		return "", err
	}
	if want := fmt.Sprintf("Package: %s\nVersion: %s\nArchitecture: %s\n", p.Name, p.Version, p.Arch); got != want {
		return "", fmt.Errorf("%s holds %q, want %q", f, got, want)
	}
	return f, nil
}

// pathDirs are the folders of a container's PATH, where a package's command shadows busybox's.
var pathDirs = []string{"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"}

// busyboxLinks links every applet of root's /bin/busybox (if any) whose name no package put
// into a folder of pathDirs: a package's command (or an alternatives link) wins wherever it
// lives, e.g. /bin/nc of netcat-openbsd over busybox's /usr/bin/nc.
func busyboxLinks(ctx context.Context, root string) error {
	bb := filepath.Join(root, "bin", "busybox")
	if _, err := os.Stat(bb); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	commands := map[string]bool{}
	for _, d := range pathDirs {
		entries, err := os.ReadDir(filepath.Join(root, d))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		for _, e := range entries {
			commands[e.Name()] = true
		}
	}
	// busybox-static: static, so the host runs it as the image will.
	list, err := output(ctx, bb, "--list-full")
	if err != nil {
		return err
	}
	for _, a := range strings.Fields(list) {
		p, err := inRoot(root, "/"+a)
		if err != nil {
			return fmt.Errorf("busybox --list-full: %w", err)
		}
		if commands[filepath.Base(p)] {
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.Symlink("/bin/busybox", p); err != nil {
			return err
		}
	}
	return nil
}

// inRoot is the host path of the clean absolute path p inside root.
func inRoot(root, p string) (string, error) {
	if !filepath.IsAbs(p) || filepath.Clean(p) != p || p == "/" {
		return "", fmt.Errorf("%q: want a clean absolute path below /", p)
	}
	return filepath.Join(root, p), nil
}

// nsswitch writes /etc/nsswitch.conf from libc-bin's template, as its postinst does.
func nsswitch(root string) error {
	tmpl := filepath.Join(root, "usr", "share", "libc-bin", "nsswitch.conf")
	dst := filepath.Join(root, "etc", "nsswitch.conf")
	b, err := os.ReadFile(tmpl)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	if _, err := os.Lstat(dst); err == nil {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o644)
}

// pruneDocs removes documentation a container never reads, keeping every copyright file.
func pruneDocs(root string) error {
	share := filepath.Join(root, "usr", "share")
	for _, d := range []string{"man", "info", "locale", "lintian", "bug", "doc-base"} {
		if err := os.RemoveAll(filepath.Join(share, d)); err != nil {
			return err
		}
	}
	docs := filepath.Join(share, "doc")
	entries, err := os.ReadDir(docs)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	for _, e := range entries {
		pkg := filepath.Join(docs, e.Name())
		inner, err := os.ReadDir(pkg)
		if err != nil {
			if err := os.RemoveAll(pkg); err != nil { // a link to another package's folder
				return err
			}
			continue
		}
		for _, f := range inner {
			if f.Name() != "copyright" {
				if err := os.RemoveAll(filepath.Join(pkg, f.Name())); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func output(ctx context.Context, name string, args ...string) (string, error) {
	return outputIn(ctx, "", name, args...)
}

func outputIn(ctx context.Context, dir, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, stderr.Bytes())
	}
	return stdout.String(), nil
}
