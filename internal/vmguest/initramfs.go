package vmguest

import (
	"bytes"
	"compress/gzip"
	"context"
	_ "embed"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"

	"github.com/axonhq/axon/internal/vmtest"
)

//go:embed init.sh
var initScript []byte

//go:embed udhcpc.sh
var udhcpcScript []byte

// QperfPath is Debian's qperf (package qperf), copied into the guest with its libraries.
const QperfPath = "/usr/bin/qperf"

// Modules are what the guest loads at boot: its NIC (virtio_net, with net_failover and
// failover from modules.dep; virtio_pci is a module on 6.1, built in on 6.12).
func Modules() []string { return []string{"virtio_pci?", "virtio_net"} }

// Initramfs is a guest's whole userspace: busybox-static (sh, ip, udhcpc, ping), the
// NIC's modules (vmtest.Initramfs.AddModules: the same module packing as the kernel
// matrix's VMs), the binaries in Binaries with the shared libraries ldd finds for them
// at their host paths, the init script and udhcpc's event script. No 9p share, no root
// filesystem: the guest sees nothing of the host.
type Initramfs struct {
	Kernel   *vmtest.Kernel
	Binaries []string // host paths, e.g. QperfPath; default: QperfPath
}

// Build writes the gzip-compressed newc archive to path.
func (ir Initramfs) Build(ctx context.Context, path string) error {
	bb, err := os.ReadFile(vmtest.BusyboxPath)
	if err != nil {
		return fmt.Errorf("read %s (install busybox-static: hack/install-packages.sh vm): %w", vmtest.BusyboxPath, err)
	}
	bins := ir.Binaries
	if len(bins) == 0 {
		bins = []string{QperfPath}
	}
	files := map[string]bool{}
	for _, b := range bins {
		libs, err := sharedLibs(ctx, b)
		if err != nil {
			return err
		}
		files[b] = true
		for _, l := range libs {
			files[l] = true
		}
	}

	var raw bytes.Buffer
	cw := vmtest.NewCPIOWriter(&raw)
	made := map[string]bool{}
	mkdirAll := func(dir string) {
		var parts []string
		for d := dir; d != "." && d != "/" && d != ""; d = filepath.Dir(d) {
			parts = append(parts, d)
		}
		sort.Strings(parts)
		for _, d := range parts {
			if !made[d] {
				made[d] = true
				cw.Dir(d, 0o755)
			}
		}
	}
	for _, d := range []string{"bin", "dev", "etc/axon-vm", "proc", "sys", "tmp", "lib/modules", "usr/bin"} {
		mkdirAll(d)
	}
	cw.CharDev("dev/console", 0o600, 5, 1)
	cw.CharDev("dev/null", 0o666, 1, 3)
	cw.File("bin/busybox", 0o755, bb)
	for _, applet := range []string{"sh", "ip", "ping", "ping6", "udhcpc", "ifconfig", "route", "cat", "echo", "sleep", "usleep", "kill", "ps", "awk", "tr", "tail", "cut", "stty", "insmod", "modprobe"} {
		cw.Symlink("bin/"+applet, "busybox")
	}
	cw.File("init", 0o755, initScript)
	cw.File("etc/udhcpc.sh", 0o755, udhcpcScript)
	if _, err := (vmtest.Initramfs{Kernel: ir.Kernel, Modules: Modules()}).AddModules(ctx, cw); err != nil {
		return err
	}
	var paths []string
	for p := range files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		data, err := os.ReadFile(p) // follows the libraries' version symlinks
		if err != nil {
			return fmt.Errorf("guest initramfs: %w", err)
		}
		rel := p[1:]
		mkdirAll(filepath.Dir(rel))
		cw.File(rel, 0o755, data)
	}
	if err := cw.Close(); err != nil {
		return fmt.Errorf("write guest initramfs: %w", err)
	}
	var gz bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&gz, gzip.BestSpeed)
	if _, err := zw.Write(raw.Bytes()); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	if err := os.WriteFile(path, gz.Bytes(), 0o644); err != nil {
		return fmt.Errorf("write guest initramfs %s: %w", path, err)
	}
	return nil
}

// ldd prints "name => /path (addr)" for libraries and "/path (addr)" for the loader.
var lddPath = regexp.MustCompile(`(?m)(?:=>\s+|^\s+)(/\S+)\s+\(0x`)

// sharedLibs returns the absolute paths of bin's shared libraries and its loader.
func sharedLibs(ctx context.Context, bin string) ([]string, error) {
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("guest binary %s: %w (install it: apt-get install qperf)", bin, err)
	}
	out, err := exec.CommandContext(ctx, "ldd", bin).CombinedOutput()
	if err != nil {
		if bytes.Contains(out, []byte("not a dynamic executable")) {
			return nil, nil
		}
		return nil, fmt.Errorf("ldd %s: %w: %s", bin, err, out)
	}
	if bytes.Contains(out, []byte("not found")) {
		return nil, fmt.Errorf("ldd %s: a library is missing on this host:\n%s", bin, out)
	}
	return parseLdd(out), nil
}

func parseLdd(out []byte) []string {
	var libs []string
	for _, m := range lddPath.FindAllSubmatch(out, -1) {
		libs = append(libs, string(m[1]))
	}
	return libs
}
