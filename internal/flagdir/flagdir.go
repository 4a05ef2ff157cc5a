// Package flagdir loads command-line options from a directory holding one
// file per option, as a Kubernetes ConfigMap volume presents its keys: the
// file name is the flag name (without "--"), the content its value. Every
// value goes through the flag's own Set, so a file is validated exactly like
// the same option on the command line.
package flagdir

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	flag "github.com/spf13/pflag"
)

// MaxValueSize bounds one option file: no flag value comes near it, and a
// larger file is a mistake (or hostile), not an option.
const MaxValueSize = 64 << 10

// Source says where an option's value came from.
type Source string

const (
	SourceDefault     Source = "default"
	SourceConfigDir   Source = "config-dir"
	SourceCommandLine Source = "command-line"
)

// Result records which options a directory set and which it left to the
// command line.
type Result struct {
	// Set lists the options whose value came from the directory.
	Set []string
	// Overridden lists the options present in the directory that the
	// command line also gave: the command line wins.
	Overridden []string
}

// Apply reads every option file in dir and sets the flag of the same name in
// fs, which must already hold the parsed command line. Options given on the
// command line (fs.Changed) keep their command-line value. Names in refused
// (e.g. the flag naming the directory itself) cannot come from a file.
//
// ConfigMap volumes keep their data in "..data" and timestamped "..*"
// directories and show each key as a symlink into them: entries whose name
// starts with ".." are skipped and symlinks are followed. Anything else that
// is not a regular file is refused. Files are handled in name order and the
// first error stops the load: nothing is half-applied silently.
func Apply(fs *flag.FlagSet, dir string, refused ...string) (Result, error) {
	var res Result
	entries, err := os.ReadDir(dir)
	if err != nil {
		return res, fmt.Errorf("read option directory: %w", err)
	}
	for _, e := range entries { // os.ReadDir sorts by name
		name := e.Name()
		if strings.HasPrefix(name, "..") {
			continue
		}
		f := fs.Lookup(name)
		if f == nil || slices.Contains(refused, name) {
			return res, unknownKey(fs, dir, name, refused)
		}
		value, err := readValue(filepath.Join(dir, name))
		if err != nil {
			return res, err
		}
		if f.Changed {
			res.Overridden = append(res.Overridden, name)
			continue
		}
		if err := fs.Set(name, value); err != nil {
			return res, fmt.Errorf("%s: invalid value %q for --%s: %w", filepath.Join(dir, name), value, name, err)
		}
		res.Set = append(res.Set, name)
	}
	return res, nil
}

// readValue returns a file's content without surrounding white space (a
// trailing newline from an editor or a YAML block scalar is not part of the
// value).
func readValue(path string) (string, error) {
	st, err := os.Stat(path) // follows the ConfigMap's symlink
	if err != nil {
		return "", fmt.Errorf("option file: %w", err)
	}
	if !st.Mode().IsRegular() {
		return "", fmt.Errorf("option file %s is not a regular file (%s): the directory may hold only one file per option", path, st.Mode().Type())
	}
	if st.Size() > MaxValueSize {
		return "", fmt.Errorf("option file %s is %d bytes, more than %d: not an option value", path, st.Size(), MaxValueSize)
	}
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("option file: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxValueSize+1))
	if err != nil {
		return "", fmt.Errorf("read option file %s: %w", path, err)
	}
	if len(b) > MaxValueSize {
		return "", fmt.Errorf("option file %s grew past %d bytes while read: not an option value", path, MaxValueSize)
	}
	return strings.TrimSpace(string(b)), nil
}

// ErrUnknownKey is wrapped by Apply's error for a file that names no option.
var ErrUnknownKey = errors.New("unknown option")

func unknownKey(fs *flag.FlagSet, dir, name string, refused []string) error {
	if slices.Contains(refused, name) {
		return fmt.Errorf("%s: %w %q: --%s can be given on the command line only; remove the key", filepath.Join(dir, name), ErrUnknownKey, name, name)
	}
	var names []string
	fs.VisitAll(func(f *flag.Flag) {
		if !slices.Contains(refused, f.Name) {
			names = append(names, f.Name)
		}
	})
	hint := "; see axon-agent --help for the options"
	if n := Nearest(name, names); n != "" {
		hint = fmt.Sprintf("; did you mean %q (--%s)?", n, n)
	}
	return fmt.Errorf("%s: %w %q: no flag --%s%s", filepath.Join(dir, name), ErrUnknownKey, name, name, hint)
}

// Nearest returns the name in names closest to s by edit distance, or ""
// when none is close enough to be a likely typo (more than a third of the
// longer name differs).
func Nearest(s string, names []string) string {
	best, bestD := "", -1
	for _, n := range names {
		d := distance(strings.ToLower(s), n)
		if bestD < 0 || d < bestD || (d == bestD && n < best) {
			best, bestD = n, d
		}
	}
	if bestD < 0 || bestD*3 > max(len(s), len(best)) {
		return ""
	}
	return best
}

// distance is the Levenshtein distance between a and b.
func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
