// Package atomicfile replaces a file so that a reader, and the file
// system after a crash, sees either the old content or the new one, never
// a part of it: github.com/google/renameio writes a temporary file in the
// same directory (named "." + the file's name + digits, so a directory
// watcher that loads *.json or *.conflist never picks it up), fsyncs and
// renames it; Write then fsyncs the directory so that the rename survives
// a crash too.
//
// WriteJSON and ReadJSON are the state files' pair: indented JSON written
// that way, and read back.
package atomicfile

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/google/renameio/v2"
)

// Write replaces path with data, mode perm exactly (the umask and an
// existing file's mode do not apply).
func Write(path string, data []byte, perm os.FileMode) error {
	// not renameio.WriteFile: it keeps an existing file's mode
	f, err := renameio.NewPendingFile(path, renameio.WithStaticPermissions(perm))
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer f.Cleanup()
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.CloseAtomicallyReplace(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return fmt.Errorf("write %s: sync its directory: %w", path, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("write %s: sync its directory: %w", path, err)
	}
	return nil
}

// WriteJSON replaces path (Write) with v as indented JSON and a final
// newline.
func WriteJSON(path string, v any, perm os.FileMode) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("write %s: encode: %w", path, err)
	}
	return Write(path, append(b, '\n'), perm)
}

// ReadJSON decodes the JSON file at path into v. A missing file is an error
// that wraps fs.ErrNotExist (v is then unchanged); the errors name path.
func ReadJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err // *fs.PathError: "open <path>: ..."
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("parse %s: %w", path, err)
	}
	return nil
}
