package datapath

import (
	"bytes"
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strings"

	"github.com/cilium/ebpf"
)

// Every object bpf2go generates into this package (one per bpf/*.c), so
// tools such as the verifier report cover new programs without a list to
// keep in sync.
//
//go:embed *_bpfel.o
var objectFS embed.FS

// Object is one compiled BPF object embedded in the binary.
type Object struct {
	Name string // bpf2go stem, e.g. "podegress" for podegress_bpfel.o
	Spec *ebpf.CollectionSpec
}

// Objects parses every embedded BPF object, sorted by name. The specs are
// fresh copies: callers may change them.
func Objects() ([]Object, error) {
	files, err := fs.Glob(objectFS, "*_bpfel.o")
	if err != nil {
		return nil, fmt.Errorf("list embedded BPF objects: %w", err)
	}
	sort.Strings(files)
	out := make([]Object, 0, len(files))
	for _, f := range files {
		b, err := objectFS.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("read embedded %s: %w", f, err)
		}
		spec, err := ebpf.LoadCollectionSpecFromReader(bytes.NewReader(b))
		if err != nil {
			return nil, fmt.Errorf("parse BPF object %s: %w", f, err)
		}
		out = append(out, Object{Name: strings.TrimSuffix(f, "_bpfel.o"), Spec: spec})
	}
	return out, nil
}
