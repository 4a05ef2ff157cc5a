package atomicfile

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestWrite(t *testing.T) {
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	dir := t.TempDir()
	tests := []struct {
		name string
		pre  os.FileMode // 0: no file before
		data string
		perm os.FileMode
	}{
		{"new file, mode despite the umask", 0, "a\n", 0o644},
		{"replaces a file and its mode", 0o600, "bb\n", 0o644},
		{"private file", 0o644, "ccc\n", 0o600},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, "f"+string(rune('0'+i))+".json")
			if tc.pre != 0 {
				if err := os.WriteFile(path, []byte("old"), tc.pre); err != nil {
					t.Fatal(err)
				}
			}
			if err := Write(path, []byte(tc.data), tc.perm); err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(path)
			if err != nil || string(b) != tc.data {
				t.Fatalf("content %q, %v; want %q", b, err, tc.data)
			}
			st, err := os.Stat(path)
			if err != nil || st.Mode().Perm() != tc.perm {
				t.Fatalf("mode %v, %v; want %v", st.Mode().Perm(), err, tc.perm)
			}
		})
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			t.Errorf("temporary file left behind: %s", e.Name())
		}
	}
	if err := Write(filepath.Join(dir, "missing", "f"), nil, 0o644); err == nil || !strings.Contains(err.Error(), "missing/f") {
		t.Errorf("write into a missing directory: %v, want an error naming the path", err)
	}
}
