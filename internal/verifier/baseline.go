package verifier

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/axonhq/axon/internal/atomicfile"
)

// BaselineFile is the committed baseline, relative to the repository root.
// It is embedded so test binaries copied into a VM carry it.
const BaselineFile = "internal/verifier/baseline.json"

//go:embed baseline.json
var embeddedBaseline []byte

// Baseline maps kernel family ("6.18") to program name to the verifier's
// processed-instruction count.
type Baseline map[string]map[string]uint32

// EmbeddedBaseline returns the baseline compiled into the binary.
func EmbeddedBaseline() (Baseline, error) {
	b, err := ParseBaseline(embeddedBaseline)
	if err != nil {
		return nil, fmt.Errorf("embedded %s: %w", BaselineFile, err)
	}
	return b, nil
}

// ReadBaseline reads a baseline file; a missing file is an empty baseline.
func ReadBaseline(path string) (Baseline, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return Baseline{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read baseline: %w", err)
	}
	b, err := ParseBaseline(data)
	if err != nil {
		return nil, fmt.Errorf("baseline %s: %w (fix or delete the file; it was not changed)", path, err)
	}
	return b, nil
}

// ParseBaseline parses and validates baseline JSON.
func ParseBaseline(data []byte) (Baseline, error) {
	var b Baseline
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil {
		return nil, fmt.Errorf("parse: %w", err)
	}
	if b == nil {
		b = Baseline{}
	}
	for fam, progs := range b {
		if f, err := Family(fam); err != nil || f != fam {
			return nil, fmt.Errorf("key %q is not a kernel family such as \"6.12\"", fam)
		}
		for prog, n := range progs {
			if prog == "" || n == 0 {
				return nil, fmt.Errorf("kernel %s: program %q has count %d, want a name and a count > 0", fam, prog, n)
			}
		}
	}
	return b, nil
}

// With returns a copy of b whose entry for rep.Kernel holds the counts of
// the programs that loaded in rep (other kernels are kept as they were).
func (b Baseline) With(rep Report) Baseline {
	out := make(Baseline, len(b)+1)
	for fam, progs := range b {
		cp := make(map[string]uint32, len(progs))
		for p, n := range progs {
			cp[p] = n
		}
		out[fam] = cp
	}
	cur := map[string]uint32{}
	for _, r := range rep.Results {
		if r.Loads && r.Insns > 0 {
			cur[r.Program] = r.Insns
		}
	}
	out[rep.Kernel] = cur
	return out
}

// WriteBaseline writes b to path atomically (indented, sorted keys).
func WriteBaseline(path string, b Baseline) error {
	data, err := json.MarshalIndent(b, "", "  ")
	if err != nil {
		return fmt.Errorf("encode baseline: %w", err)
	}
	return atomicfile.Write(path, append(data, '\n'), 0o644)
}

// WriteResults writes verifier-<kernel>.md and verifier-<kernel>.json into
// dir (created if missing) and returns their paths.
func WriteResults(dir string, rep Report) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("results dir: %w", err)
	}
	js, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode report: %w", err)
	}
	md := filepath.Join(dir, "verifier-"+rep.Kernel+".md")
	jf := filepath.Join(dir, "verifier-"+rep.Kernel+".json")
	if err := atomicfile.Write(md, []byte(rep.Markdown()), 0o644); err != nil {
		return nil, err
	}
	if err := atomicfile.Write(jf, append(js, '\n'), 0o644); err != nil {
		return nil, err
	}
	return []string{md, jf}, nil
}
