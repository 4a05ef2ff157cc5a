package atomicfile

import (
	"errors"
	"io/fs"
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

func TestJSON(t *testing.T) {
	type state struct {
		Name  string `json:"name"`
		Procs []int  `json:"procs,omitempty"`
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	want := state{Name: "node1", Procs: []int{1, 2}}
	if err := WriteJSON(path, want, 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil || string(b) != "{\n  \"name\": \"node1\",\n  \"procs\": [\n    1,\n    2\n  ]\n}\n" {
		t.Fatalf("written %q, %v: want indented JSON and a newline", b, err)
	}
	tests := []struct {
		name    string
		path    string
		content string // "" with no file
		want    state
		notExst bool   // the error wraps fs.ErrNotExist
		errHas  string // the error names this
	}{
		{"round trip", path, "", want, false, ""},
		{"missing file: fs.ErrNotExist, v unchanged", filepath.Join(dir, "none.json"), "", state{Name: "before"}, true, "none.json"},
		{"not JSON: parse error naming the file", filepath.Join(dir, "bad.json"), "{name", state{Name: "before"}, false, "parse " + filepath.Join(dir, "bad.json")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.content != "" {
				if err := os.WriteFile(tc.path, []byte(tc.content), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			got := state{Name: "before"}
			err := ReadJSON(tc.path, &got)
			if errors.Is(err, fs.ErrNotExist) != tc.notExst || (tc.errHas == "") != (err == nil) ||
				(err != nil && !strings.Contains(err.Error(), tc.errHas)) {
				t.Fatalf("ReadJSON: %v; want not-exist %v, an error naming %q", err, tc.notExst, tc.errHas)
			}
			if got.Name != tc.want.Name || len(got.Procs) != len(tc.want.Procs) {
				t.Errorf("read %+v, want %+v", got, tc.want)
			}
		})
	}
	if err := WriteJSON(path, func() {}, 0o600); err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("WriteJSON of a func: %v, want an encoding error naming the path", err)
	}
}
