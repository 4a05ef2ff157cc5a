package vmtest

import (
	"bytes"
	"compress/gzip"
	"context"
	_ "embed"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

//go:embed init.sh
var initScript []byte

// BusyboxPath is where Debian's busybox-static installs its binary.
const BusyboxPath = "/bin/busybox"

// CPIOWriter writes a "newc" cpio archive, the format the kernel unpacks as initramfs.
type CPIOWriter struct {
	w   io.Writer
	ino uint32
	err error
}

// NewCPIOWriter returns a writer; call Close to write the trailer.
func NewCPIOWriter(w io.Writer) *CPIOWriter { return &CPIOWriter{w: w, ino: 1} }

const (
	modeDir  = 0o040000
	modeFile = 0o100000
	modeLink = 0o120000
	modeChr  = 0o020000
)

func (c *CPIOWriter) entry(name string, mode uint32, rdevMajor, rdevMinor uint32, data []byte) {
	if c.err != nil {
		return
	}
	name = strings.TrimPrefix(name, "/")
	nlink := uint32(1)
	if mode&0o170000 == modeDir {
		nlink = 2
	}
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, nlink, 0, len(data), 0, 0, rdevMajor, rdevMinor, len(name)+1, 0)
	c.ino++
	var buf bytes.Buffer
	buf.WriteString(hdr)
	buf.WriteString(name)
	buf.WriteByte(0)
	pad4(&buf)
	buf.Write(data)
	pad4(&buf)
	_, c.err = c.w.Write(buf.Bytes())
}

func pad4(b *bytes.Buffer) {
	for b.Len()%4 != 0 {
		b.WriteByte(0)
	}
}

// Dir adds a directory.
func (c *CPIOWriter) Dir(name string, perm uint32) { c.entry(name, modeDir|perm, 0, 0, nil) }

// File adds a regular file.
func (c *CPIOWriter) File(name string, perm uint32, data []byte) {
	c.entry(name, modeFile|perm, 0, 0, data)
}

// Symlink adds a symbolic link name → target.
func (c *CPIOWriter) Symlink(name, target string) {
	c.entry(name, modeLink|0o777, 0, 0, []byte(target))
}

// CharDev adds a character device node.
func (c *CPIOWriter) CharDev(name string, perm, major, minor uint32) {
	c.entry(name, modeChr|perm, major, minor, nil)
}

// Close writes the trailer and returns the first error.
func (c *CPIOWriter) Close() error {
	c.entry("TRAILER!!!", 0, 0, 0, nil)
	return c.err
}

// Initramfs describes the initramfs of a VM run.
type Initramfs struct {
	Kernel  *Kernel
	Modules []string // wanted module names (see DefaultModules)
}

// InitramfsInfo tells what went in.
type InitramfsInfo struct {
	Loaded  []string // modules loaded at boot, in order
	Missing []string // optional modules this kernel lacks
	Size    int
}

// Build writes a gzip-compressed newc initramfs to path: busybox-static, the modules (and
// their dependencies, decompressed) with depmod's index files, and the init script.
func (ir Initramfs) Build(ctx context.Context, path string) (InitramfsInfo, error) {
	var info InitramfsInfo
	bb, err := os.ReadFile(BusyboxPath)
	if err != nil {
		return info, fmt.Errorf("read %s (install busybox-static: hack/install-packages.sh vm): %w", BusyboxPath, err)
	}

	var raw bytes.Buffer
	cw := NewCPIOWriter(&raw)
	for _, d := range []string{"bin", "dev", "etc", "etc/axon-vm", "lib", "lib/modules", "proc", "sys", "newroot", "tmp"} {
		cw.Dir(d, 0o755)
	}
	cw.CharDev("dev/console", 0o600, 5, 1)
	cw.CharDev("dev/null", 0o666, 1, 3)
	cw.File("bin/busybox", 0o755, bb)
	for _, applet := range []string{"sh", "modprobe", "insmod"} {
		cw.Symlink("bin/"+applet, "busybox")
	}
	cw.File("init", 0o755, initScript)
	if info, err = ir.AddModules(ctx, cw); err != nil {
		return info, err
	}
	if err := cw.Close(); err != nil {
		return info, fmt.Errorf("write initramfs: %w", err)
	}

	var gz bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&gz, gzip.BestSpeed)
	if _, err := zw.Write(raw.Bytes()); err != nil {
		return info, err
	}
	if err := zw.Close(); err != nil {
		return info, err
	}
	info.Size = gz.Len()
	if err := os.WriteFile(path, gz.Bytes(), 0o644); err != nil {
		return info, fmt.Errorf("write initramfs %s: %w", path, err)
	}
	return info, nil
}

// AddModules writes the modules (and their dependencies, decompressed) into cw under
// lib/modules/<release>/, with depmod's index files for busybox modprobe, and the load
// order as etc/axon-vm/modules (the caller adds the etc/axon-vm directory). Build uses it;
// so does any other initramfs that boots these kernels (internal/vmguest).
func (ir Initramfs) AddModules(ctx context.Context, cw *CPIOWriter) (InitramfsInfo, error) {
	var info InitramfsInfo
	idx, err := ParseModules(ir.Kernel.ModulesDir)
	if err != nil {
		return info, err
	}
	order, missing, err := idx.Resolve(ir.Modules)
	if err != nil {
		return info, fmt.Errorf("kernel %s: %w", ir.Kernel.Release, err)
	}
	info.Missing = missing

	modRoot := "lib/modules/" + ir.Kernel.Release
	made := map[string]bool{}
	mkdirs := func(p string) {
		var parts []string
		for d := filepath.Dir(p); d != "." && d != "/"; d = filepath.Dir(d) {
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
	var loadList bytes.Buffer
	for _, name := range order {
		rel, _ := idx.Path(name)
		data, err := readModule(ctx, filepath.Join(ir.Kernel.ModulesDir, rel))
		if err != nil {
			return info, err
		}
		plain := stripCompression(rel)
		mkdirs(modRoot + "/" + plain)
		cw.File(modRoot+"/"+plain, 0o644, data)
		fmt.Fprintln(&loadList, plain)
		info.Loaded = append(info.Loaded, name)
	}
	// Index files for busybox modprobe; paths rewritten to the decompressed names.
	for _, f := range []string{"modules.dep", "modules.alias", "modules.builtin", "modules.symbols"} {
		b, err := os.ReadFile(filepath.Join(ir.Kernel.ModulesDir, f))
		if err != nil {
			continue
		}
		if f == "modules.dep" {
			b = []byte(strings.NewReplacer(".ko.xz", ".ko", ".ko.zst", ".ko", ".ko.gz", ".ko").Replace(string(b)))
		}
		mkdirs(modRoot + "/" + f)
		cw.File(modRoot+"/"+f, 0o644, b)
	}
	cw.File("etc/axon-vm/modules", 0o644, loadList.Bytes())
	return info, nil
}

func stripCompression(p string) string {
	for _, ext := range []string{".xz", ".zst", ".gz"} {
		if s, ok := strings.CutSuffix(p, ext); ok {
			return s
		}
	}
	return p
}

// readModule returns a module file decompressed (busybox insmod takes plain .ko only).
func readModule(ctx context.Context, path string) ([]byte, error) {
	var tool string
	switch {
	case strings.HasSuffix(path, ".xz"):
		tool = "xz"
	case strings.HasSuffix(path, ".zst"):
		tool = "zstd"
	case strings.HasSuffix(path, ".gz"):
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		zr, err := gzip.NewReader(f)
		if err != nil {
			return nil, fmt.Errorf("module %s: %w", path, err)
		}
		return io.ReadAll(zr)
	default:
		return os.ReadFile(path)
	}
	out, err := exec.CommandContext(ctx, tool, "-dc", path).Output()
	if err != nil {
		return nil, fmt.Errorf("decompress module %s with %s: %w", path, tool, err)
	}
	return out, nil
}
