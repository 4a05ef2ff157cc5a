package vmtest

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"os/exec"
)

// bzImage setup header offsets (Documentation/arch/x86/boot.rst).
const (
	offSetupSects    = 0x1f1
	offHeaderMagic   = 0x202 // "HdrS"
	offVersion       = 0x206
	offPayloadOffset = 0x248
	offPayloadLength = 0x24c
)

// Payload locates the compressed kernel inside a bzImage using the boot protocol's
// payload_offset/payload_length fields (protocol 2.08+), and names its compression.
func Payload(bz []byte) (data []byte, format string, err error) {
	if len(bz) < offPayloadLength+4 || string(bz[offHeaderMagic:offHeaderMagic+4]) != "HdrS" {
		return nil, "", fmt.Errorf("not a bzImage (no HdrS setup header)")
	}
	if v := binary.LittleEndian.Uint16(bz[offVersion:]); v < 0x208 {
		return nil, "", fmt.Errorf("boot protocol %#x has no payload fields (need 2.08+)", v)
	}
	setupSects := int(bz[offSetupSects])
	if setupSects == 0 {
		setupSects = 4
	}
	start := (setupSects+1)*512 + int(binary.LittleEndian.Uint32(bz[offPayloadOffset:]))
	n := int(binary.LittleEndian.Uint32(bz[offPayloadLength:]))
	if start < 0 || n <= 0 || start+n > len(bz) {
		return nil, "", fmt.Errorf("payload [%d,+%d) outside the %d-byte image", start, n, len(bz))
	}
	data = bz[start : start+n]
	switch {
	case bytes.HasPrefix(data, []byte{0x1f, 0x8b}):
		return data, "gzip", nil
	case bytes.HasPrefix(data, []byte{0xfd, '7', 'z', 'X', 'Z', 0x00}):
		return data, "xz", nil
	case bytes.HasPrefix(data, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		return data, "zstd", nil
	case bytes.HasPrefix(data, []byte{0x7f, 'E', 'L', 'F'}):
		return data, "none", nil
	}
	return nil, "", fmt.Errorf("unknown payload compression (first bytes % x): rebuild the kernel with gzip, xz or zstd", data[:min(6, len(data))])
}

// ExtractVmlinux returns the uncompressed ELF vmlinux inside a bzImage (what
// scripts/extract-vmlinux does), for PVH boot with qboot. xz and zstd use the host tools.
func ExtractVmlinux(ctx context.Context, bz []byte) ([]byte, error) {
	data, format, err := Payload(bz)
	if err != nil {
		return nil, err
	}
	var out []byte
	switch format {
	case "none":
		out = data
	case "gzip":
		zr, err := gzip.NewReader(bytes.NewReader(data))
		if err != nil {
			return nil, fmt.Errorf("gzip payload: %w", err)
		}
		zr.Multistream(false)
		if out, err = io.ReadAll(zr); err != nil {
			return nil, fmt.Errorf("gzip payload: %w", err)
		}
	case "xz", "zstd":
		// The kernel build appends the 4-byte uncompressed size after these streams.
		stream := data[:len(data)-4]
		args := []string{"-dc", "--single-stream"}
		if format == "zstd" {
			args = []string{"-dc", "-q"}
		}
		cmd := exec.CommandContext(ctx, format, args...)
		cmd.Stdin = bytes.NewReader(stream)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if out, err = cmd.Output(); err != nil {
			return nil, fmt.Errorf("%s -d payload (install xz-utils/zstd: hack/install-packages.sh vm): %w: %s", format, err, stderr.String())
		}
	}
	if !bytes.HasPrefix(out, []byte{0x7f, 'E', 'L', 'F'}) {
		return nil, fmt.Errorf("decompressed %s payload is not an ELF file", format)
	}
	return out, nil
}
