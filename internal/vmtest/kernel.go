// Package vmtest runs axon's test binaries inside QEMU virtual machines booted with Debian
// distribution kernels, so the same tests cover kernels other than the host's.
//
// The pieces: Fetch gets a Debian kernel package through a private apt configuration on the
// machine's own Debian mirror and caches it keyed by version; BuildInitramfs packs
// busybox-static, the needed modules and an init script; VM.Run boots QEMU with the host's
// root shared read-only over 9p and a writable run share for the results; ParseTestOutput and
// Matrix turn `go test -v` output into the per-kernel report.
package vmtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/axonhq/axon/internal/atomicfile"
)

// KernelSpec names a kernel of the matrix and where it comes from.
type KernelSpec struct {
	Name  string // e.g. debian-6.12
	Suite string // Debian suite whose linux-image-amd64 metapackage is followed
}

// KnownKernels returns the VM kernels of the matrix, oldest last.
func KnownKernels() []KernelSpec {
	return []KernelSpec{
		{Name: "debian-6.12", Suite: "trixie"},
		{Name: "debian-6.1", Suite: "bookworm"},
	}
}

// LookupKernel returns the spec for name or an error listing the known names.
func LookupKernel(name string) (KernelSpec, error) {
	var names []string
	for _, k := range KnownKernels() {
		if k.Name == name {
			return k, nil
		}
		names = append(names, k.Name)
	}
	return KernelSpec{}, fmt.Errorf("unknown kernel %q: use one of %s (or host)", name, strings.Join(names, ", "))
}

// Kernel is an unpacked kernel package in the cache.
type Kernel struct {
	Spec       KernelSpec
	Package    string // binary package, e.g. linux-image-6.12.117+deb13-amd64
	PkgVersion string // e.g. 6.12.117-1
	Release    string // uname -r, e.g. 6.12.117+deb13-amd64
	Dir        string // $cache/kernels/<suite>-<pkgversion>
	Vmlinuz    string // bzImage
	Vmlinux    string // uncompressed ELF (PVH entry)
	ModulesDir string // .../lib/modules/<release>, depmod'ed
	Config     string // the kernel's config file
}

// keyringPath is the machine's Debian archive keyring, used as signed-by of the private sources.
const keyringPath = "/usr/share/keyrings/debian-archive-keyring.gpg"

// resolvedMaxAge is how long a resolved metapackage version is trusted before apt is asked
// again. A warm cache therefore needs no network at all.
const resolvedMaxAge = 7 * 24 * time.Hour

// resolved records the last resolution of the metapackage for a suite.
type resolved struct {
	Package    string    `json:"package"`
	PkgVersion string    `json:"pkgVersion"`
	Resolved   time.Time `json:"resolved"`
}

// Fetcher downloads and caches kernels under CacheRoot/kernels.
type Fetcher struct {
	CacheRoot string // $AXON_CACHE
	Refresh   bool   // ask apt even when a recent resolution is recorded
	Log       *slog.Logger
}

func (f *Fetcher) kernelsDir() string { return filepath.Join(f.CacheRoot, "kernels") }

// Fetch returns the cached kernel for spec, downloading and unpacking it when missing.
func (f *Fetcher) Fetch(ctx context.Context, spec KernelSpec) (*Kernel, error) {
	if err := os.MkdirAll(f.kernelsDir(), 0o755); err != nil {
		return nil, fmt.Errorf("kernel cache: %w", err)
	}
	// One fetch at a time per cache: the private apt state is shared and runs without apt's lock.
	unlock, err := lockFile(filepath.Join(f.kernelsDir(), ".lock"))
	if err != nil {
		return nil, err
	}
	defer unlock()
	res, err := f.resolve(ctx, spec)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(f.kernelsDir(), spec.Suite+"-"+res.PkgVersion)
	if k, err := loadKernel(spec, res, dir); err == nil {
		return k, nil
	}
	f.Log.Info("fetching kernel", "kernel", spec.Name, "package", res.Package, "version", res.PkgVersion)
	start := time.Now()
	if err := f.unpack(ctx, spec, res, dir); err != nil {
		return nil, err
	}
	k, err := loadKernel(spec, res, dir)
	if err != nil {
		return nil, err
	}
	f.Log.Info("kernel ready", "kernel", spec.Name, "release", k.Release, "took", time.Since(start).Round(time.Millisecond))
	return k, nil
}

// Cached returns the kernel for spec only if it is already in the cache (no network).
func (f *Fetcher) Cached(spec KernelSpec) (*Kernel, error) {
	res, err := readResolved(filepath.Join(f.kernelsDir(), spec.Suite+".json"))
	if err != nil {
		return nil, fmt.Errorf("kernel %s not cached (run `make test-vm KERNEL=%s`): %w", spec.Name, spec.Name, err)
	}
	return loadKernel(spec, res, filepath.Join(f.kernelsDir(), spec.Suite+"-"+res.PkgVersion))
}

func readResolved(path string) (resolved, error) {
	var r resolved
	b, err := os.ReadFile(path)
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("parse %s: %w", path, err)
	}
	if r.Package == "" || r.PkgVersion == "" {
		return r, fmt.Errorf("%s: empty package or version", path)
	}
	return r, nil
}

// resolve follows linux-image-amd64 of the suite to a concrete package and version.
func (f *Fetcher) resolve(ctx context.Context, spec KernelSpec) (resolved, error) {
	recordPath := filepath.Join(f.kernelsDir(), spec.Suite+".json")
	if !f.Refresh {
		if r, err := readResolved(recordPath); err == nil && time.Since(r.Resolved) < resolvedMaxAge {
			return r, nil
		}
	}
	apt, err := f.aptFor(ctx, spec)
	if err == nil {
		_, err = apt.run(ctx, "apt-get", "update")
	}
	if err != nil {
		// Offline (or no Debian mirror to ask) but something cached: use it rather than fail.
		if r, rerr := readResolved(recordPath); rerr == nil {
			f.Log.Warn("apt update failed; using the cached kernel resolution", "suite", spec.Suite, "err", err)
			return r, nil
		}
		return resolved{}, err
	}
	out, err := apt.run(ctx, "apt-cache", "depends", "linux-image-amd64")
	if err != nil {
		return resolved{}, err
	}
	pkg, err := parseDepends(out)
	if err != nil {
		return resolved{}, fmt.Errorf("resolve linux-image-amd64 of %s: %w", spec.Suite, err)
	}
	out, err = apt.run(ctx, "apt-cache", "show", "--no-all-versions", pkg)
	if err != nil {
		return resolved{}, err
	}
	ver := fieldValue(out, "Version")
	if ver == "" {
		return resolved{}, fmt.Errorf("apt-cache show %s: no Version field", pkg)
	}
	r := resolved{Package: pkg, PkgVersion: ver, Resolved: time.Now().UTC()}
	b, _ := json.MarshalIndent(r, "", "  ")
	if err := atomicfile.Write(recordPath, append(b, '\n'), 0o644); err != nil {
		return resolved{}, err
	}
	return r, nil
}

var dependsRe = regexp.MustCompile(`(?m)^\s*Depends:\s*(linux-image-\S+)`)

// parseDepends picks the linux-image-* dependency out of `apt-cache depends` output.
func parseDepends(out []byte) (string, error) {
	m := dependsRe.FindSubmatch(out)
	if m == nil {
		return "", fmt.Errorf("no linux-image-* dependency in %q", strings.TrimSpace(string(out)))
	}
	return string(m[1]), nil
}

// fieldValue returns the first "Name: value" of a deb822 paragraph.
func fieldValue(out []byte, name string) string {
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// unpack downloads the package and lays out dir atomically (built in dir.tmp, then renamed).
func (f *Fetcher) unpack(ctx context.Context, spec KernelSpec, res resolved, dir string) error {
	tmp, err := os.MkdirTemp(filepath.Dir(dir), filepath.Base(dir)+".tmp-")
	if err != nil {
		return fmt.Errorf("kernel cache: %w", err)
	}
	defer os.RemoveAll(tmp) // left only on failure: renamed away on success
	apt, err := f.aptFor(ctx, spec)
	if err != nil {
		return err
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return err
	}
	dl := exec.CommandContext(ctx, "apt-get", append(apt.opts(), "download", res.Package+"="+res.PkgVersion)...)
	dl.Dir = tmp
	if out, err := dl.CombinedOutput(); err != nil {
		return fmt.Errorf("apt-get download %s=%s: %w\n%s", res.Package, res.PkgVersion, err, out)
	}
	debs, _ := filepath.Glob(filepath.Join(tmp, "*.deb"))
	if len(debs) != 1 {
		return fmt.Errorf("apt-get download %s: expected one .deb in %s, found %d", res.Package, tmp, len(debs))
	}
	root := filepath.Join(tmp, "root")
	if out, err := exec.CommandContext(ctx, "dpkg-deb", "-x", debs[0], root).CombinedOutput(); err != nil {
		return fmt.Errorf("dpkg-deb -x %s: %w\n%s", debs[0], err, out)
	}
	// trixie ships /usr/lib/modules, bookworm /lib/modules; depmod -b wants <base>/lib/modules.
	if _, err := os.Stat(filepath.Join(root, "lib")); os.IsNotExist(err) {
		if err := os.Symlink("usr/lib", filepath.Join(root, "lib")); err != nil {
			return err
		}
	}
	release, err := releaseOf(root)
	if err != nil {
		return err
	}
	if out, err := exec.CommandContext(ctx, "depmod", "-b", root, release).CombinedOutput(); err != nil {
		return fmt.Errorf("depmod -b %s %s: %w\n%s", root, release, err, out)
	}
	bz, err := os.ReadFile(filepath.Join(root, "boot", "vmlinuz-"+release))
	if err != nil {
		return fmt.Errorf("read vmlinuz: %w", err)
	}
	elf, err := ExtractVmlinux(ctx, bz)
	if err != nil {
		return fmt.Errorf("extract vmlinux from vmlinuz-%s: %w", release, err)
	}
	if err := os.WriteFile(filepath.Join(tmp, "vmlinux"), elf, 0o644); err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return fmt.Errorf("install %s: %w", dir, err)
	}
	return nil
}

// releaseOf returns the single kernel release found under root/lib/modules.
func releaseOf(root string) (string, error) {
	ents, err := os.ReadDir(filepath.Join(root, "lib", "modules"))
	if err != nil {
		return "", fmt.Errorf("kernel package has no modules dir: %w", err)
	}
	if len(ents) != 1 {
		return "", fmt.Errorf("expected one release under lib/modules, found %d", len(ents))
	}
	return ents[0].Name(), nil
}

func loadKernel(spec KernelSpec, res resolved, dir string) (*Kernel, error) {
	root := filepath.Join(dir, "root")
	release, err := releaseOf(root)
	if err != nil {
		return nil, err
	}
	k := &Kernel{
		Spec: spec, Package: res.Package, PkgVersion: res.PkgVersion, Release: release, Dir: dir,
		Vmlinuz:    filepath.Join(root, "boot", "vmlinuz-"+release),
		Vmlinux:    filepath.Join(dir, "vmlinux"),
		ModulesDir: filepath.Join(root, "lib", "modules", release),
		Config:     filepath.Join(root, "boot", "config-"+release),
	}
	for _, p := range []string{k.Vmlinuz, k.Vmlinux, k.Config, filepath.Join(k.ModulesDir, "modules.dep")} {
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("incomplete kernel cache %s: %w", dir, err)
		}
	}
	return k, nil
}

// privateApt is an apt configuration of its own for one suite: sources list, preferences,
// state, package lists and downloads under dir, so the machine's apt state is never read or
// written and its pinning does not apply. The rest of the machine's apt configuration is used
// as it is, read only: apt reads its apt.conf and apt.conf.d before any -o option (proxy and
// Acquire settings), mirror logins come from its auth.conf.d, and the sources are written on
// the Debian archives of the machine's own sources (machineArchives). So the kernels come
// through whatever mirror and proxy the machine's apt-get uses.
type privateApt struct{ dir string }

// aptFor sets up the private apt configuration of spec's suite under the kernel cache.
func (f *Fetcher) aptFor(ctx context.Context, spec KernelSpec) (*privateApt, error) {
	dir := filepath.Join(f.kernelsDir(), "apt-"+spec.Suite)
	for _, d := range []string{"etc/preferences.d", "etc/sources.list.d", "state/lists/partial", "cache/archives/partial"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return nil, fmt.Errorf("private apt dir: %w", err)
		}
	}
	if _, err := os.Stat(keyringPath); err != nil {
		return nil, fmt.Errorf("need the Debian archive keyring %s (apt-get install debian-archive-keyring): %w", keyringPath, err)
	}
	a := &privateApt{dir: dir}
	archives, err := machineArchives(ctx, a.stateDir(), a.cacheDir())
	if err != nil {
		return nil, err
	}
	if archives.Security == "" {
		f.Log.Warn("the machine's apt sources have no Debian security archive; kernels come from the main archive only",
			"suite", spec.Suite, "archive", archives.Main)
	}
	if err := os.WriteFile(filepath.Join(dir, "etc", "sources.list"), []byte(archives.sourcesList(spec.Suite, keyringPath)), 0o644); err != nil {
		return nil, err
	}
	status := filepath.Join(a.stateDir(), "status")
	if _, err := os.Stat(status); os.IsNotExist(err) {
		if err := os.WriteFile(status, nil, 0o644); err != nil {
			return nil, err
		}
	}
	return a, nil
}

func (a *privateApt) stateDir() string { return filepath.Join(a.dir, "state") }
func (a *privateApt) cacheDir() string { return filepath.Join(a.dir, "cache") }

func (a *privateApt) opts() []string {
	etc := filepath.Join(a.dir, "etc")
	return []string{
		"-o", "Dir::Etc::SourceList=" + filepath.Join(etc, "sources.list"),
		"-o", "Dir::Etc::SourceParts=" + filepath.Join(etc, "sources.list.d"),
		"-o", "Dir::Etc::Preferences=" + filepath.Join(etc, "preferences"),
		"-o", "Dir::Etc::PreferencesParts=" + filepath.Join(etc, "preferences.d"),
		"-o", "Dir::State=" + a.stateDir(),
		"-o", "Dir::State::status=" + filepath.Join(a.stateDir(), "status"),
		"-o", "Dir::Cache=" + a.cacheDir(),
		"-o", "APT::Architecture=amd64",
		"-o", "APT::Sandbox::User=root",
		"-o", "Debug::NoLocking=1",
		"-o", "Acquire::Languages=none",
		"-q",
	}
}

func (a *privateApt) run(ctx context.Context, tool string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, tool, append(a.opts(), args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s %s (private apt config in %s): %w\n%s", tool, strings.Join(args, " "), a.dir, err, stderr.String())
	}
	return out, nil
}

// lockFile takes an exclusive flock on path (created if needed) and returns its release.
func lockFile(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("kernel cache lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("kernel cache lock %s: %w", path, err)
	}
	return func() { f.Close() }, nil
}
