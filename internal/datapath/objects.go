package datapath

import (
	"bytes"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strings"

	"github.com/cilium/ebpf"
)

// Every object bpf2go generates into the object packages under this one (one
// per bpf/*.c), so tools such as the verifier report and the probes that
// load an object cover new programs without a list to keep in sync.
//
//go:embed */*_bpfel.o
var objectFS embed.FS

// Object is one compiled BPF object embedded in the binary.
type Object struct {
	Name string // bpf2go stem, e.g. "podegress" for podegress_bpfel.o
	Spec *ebpf.CollectionSpec
}

// Objects parses every embedded BPF object, sorted by name. The specs are
// fresh copies: callers may change them.
func Objects() ([]Object, error) {
	files, err := fs.Glob(objectFS, "*/*_bpfel.o")
	if err != nil {
		return nil, fmt.Errorf("list embedded BPF objects: %w", err)
	}
	sort.Slice(files, func(i, j int) bool { return path.Base(files[i]) < path.Base(files[j]) })
	out := make([]Object, 0, len(files))
	for _, f := range files {
		spec, err := objectSpec(f)
		if err != nil {
			return nil, err
		}
		out = append(out, Object{Name: strings.TrimSuffix(path.Base(f), "_bpfel.o"), Spec: spec})
	}
	return out, nil
}

// objectSpec parses the embedded object file f.
func objectSpec(f string) (*ebpf.CollectionSpec, error) {
	b, err := objectFS.ReadFile(f)
	if err != nil {
		return nil, fmt.Errorf("read embedded %s: %w", f, err)
	}
	spec, err := ebpf.LoadCollectionSpecFromReader(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("parse BPF object %s: %w", f, err)
	}
	return spec, nil
}

// objectByName parses the embedded object of bpf2go stem name.
func objectByName(name string) (*ebpf.CollectionSpec, error) {
	if m, _ := fs.Glob(objectFS, "*/"+name+"_bpfel.o"); len(m) == 1 {
		return objectSpec(m[0])
	}
	return nil, fmt.Errorf("BPF object %s is not embedded", name)
}
