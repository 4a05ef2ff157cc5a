// Package verifier builds the kernel-matrix verifier report: it loads every
// BPF program of every embedded object on the running kernel, records
// whether the verifier accepts it and how many instructions it processed,
// and compares the counts with a committed baseline per kernel family.
package verifier

import (
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/datapath"
)

// DefaultMaxGrowth is the instruction-count growth over the baseline, in
// percent, above which a program is flagged.
const DefaultMaxGrowth = 10.0

// Status values of a Result.
const (
	StatusOK          = "ok"
	StatusNoBaseline  = "no baseline"
	StatusGrowth      = "growth"      // loads, but grew more than allowed: fails
	StatusRejected    = "rejected"    // verifier rejected a supported program type: fails
	StatusUnsupported = "unsupported" // the kernel lacks the program type: not a failure
)

// Result is one program on one kernel.
type Result struct {
	Kernel   string   `json:"kernel"`  // release family, e.g. "6.12"
	Release  string   `json:"release"` // full uname release
	Object   string   `json:"object"`  // bpf2go object, e.g. "podegress"
	Program  string   `json:"program"` // ELF program name, e.g. "axon_pod_egress"
	Type     string   `json:"type"`
	Loads    bool     `json:"loads"`
	Insns    uint32   `json:"insns,omitempty"` // verifier processed instructions
	Baseline *uint32  `json:"baseline,omitempty"`
	DeltaPct *float64 `json:"delta_pct,omitempty"`
	Status   string   `json:"status"`
	Detail   string   `json:"detail,omitempty"` // load error, verifier log tail or probe reason
}

// Report is the verifier report of one kernel.
type Report struct {
	Kernel    string   `json:"kernel"`
	Release   string   `json:"release"`
	MaxGrowth float64  `json:"max_growth_pct"`
	Results   []Result `json:"results"`
	Failures  []string `json:"failures,omitempty"`
}

// KernelRelease returns the running kernel's release and its family
// ("6.12.48+deb13-amd64" -> "6.12").
func KernelRelease() (release, family string, err error) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "", "", fmt.Errorf("uname: %w", err)
	}
	release = unix.ByteSliceToString(u.Release[:])
	family, err = Family(release)
	return release, family, err
}

var familyRE = regexp.MustCompile(`^(\d+)\.(\d+)`)

// Family reduces a kernel release to major.minor.
func Family(release string) (string, error) {
	m := familyRE.FindStringSubmatch(release)
	if m == nil {
		return "", fmt.Errorf("kernel release %q does not start with major.minor", release)
	}
	return m[1] + "." + m[2], nil
}

// Measure loads each program of each object on the running kernel (needs
// root) and returns the results without baseline comparison. Maps are
// created fresh and unpinned; load-time constants keep their defaults from
// the object (every optional path enabled), the worst case for the verifier.
func Measure(objs []datapath.Object) (Report, error) {
	release, family, err := KernelRelease()
	if err != nil {
		return Report{}, err
	}
	rep := Report{Kernel: family, Release: release}
	for _, o := range objs {
		names := make([]string, 0, len(o.Spec.Programs))
		for n := range o.Spec.Programs {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, name := range names {
			r := measureOne(o, name)
			r.Kernel, r.Release = family, release
			rep.Results = append(rep.Results, r)
		}
	}
	if len(rep.Results) == 0 {
		return rep, errors.New("no BPF programs found in the embedded objects: run `make generate`")
	}
	return rep, nil
}

func measureOne(o datapath.Object, name string) Result {
	ps := o.Spec.Programs[name]
	r := Result{Object: o.Name, Program: name, Type: ps.Type.String()}
	if err := features.HaveProgramType(ps.Type); err != nil {
		r.Status, r.Detail = StatusUnsupported, fmt.Sprintf("program type %s: %v", ps.Type, err)
		// still try: a probe false negative must not hide a loadable program
	}
	spec := o.Spec.Copy()
	for n := range spec.Programs {
		if n != name {
			delete(spec.Programs, n)
		}
	}
	for _, m := range spec.Maps {
		m.Pinning = ebpf.PinNone
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{
		Programs: ebpf.ProgramOptions{LogLevel: ebpf.LogLevelStats},
	})
	if err != nil {
		switch gaps := missingHelpers(ps); {
		case r.Status == StatusUnsupported:
		case len(gaps) > 0:
			r.Status = StatusUnsupported
			r.Detail = fmt.Sprintf("helper %s not available to %s programs on this kernel", strings.Join(gaps, ", "), ps.Type)
		case errors.Is(err, ebpf.ErrNotSupported):
			// e.g. a kfunc or map type the kernel lacks, found by the loader before the verifier ran
			r.Status, r.Detail = StatusUnsupported, fmt.Sprintf("kernel feature missing: %v", err)
		default:
			r.Status, r.Detail = StatusRejected, loadErrorDetail(err)
		}
		return r
	}
	defer coll.Close()
	prog := coll.Programs[name]
	r.Loads = true
	r.Status, r.Detail = "", ""
	n, err := verifiedInsns(prog)
	if err != nil {
		r.Detail = err.Error()
	}
	r.Insns = n
	return r
}

// missingHelpers lists the helpers ps calls that the kernel does not offer to its program
// type (by cilium/ebpf's feature probe; a helper the probe cannot decide counts as present).
func missingHelpers(ps *ebpf.ProgramSpec) []string {
	seen := map[asm.BuiltinFunc]bool{}
	var out []string
	for _, ins := range ps.Instructions {
		if !ins.IsBuiltinCall() {
			continue
		}
		fn := asm.BuiltinFunc(ins.Constant)
		if seen[fn] {
			continue
		}
		seen[fn] = true
		if err := features.HaveProgramHelper(ps.Type, fn); errors.Is(err, ebpf.ErrNotSupported) {
			out = append(out, helperName(fn))
		}
	}
	sort.Strings(out)
	return out
}

// helperName turns asm.FnSetRetval into "bpf_set_retval".
func helperName(fn asm.BuiltinFunc) string {
	name := strings.TrimPrefix(fn.String(), "Fn")
	var sb strings.Builder
	sb.WriteString("bpf")
	for _, r := range name {
		if r >= 'A' && r <= 'Z' {
			sb.WriteByte('_')
			r += 'a' - 'A'
		}
		sb.WriteRune(r)
	}
	return sb.String()
}

var processedRE = regexp.MustCompile(`processed (\d+) insns`)

// verifiedInsns prefers the kernel's prog info (5.16+) and falls back to the
// "processed N insns" line of the stats log.
func verifiedInsns(p *ebpf.Program) (uint32, error) {
	if info, err := p.Info(); err == nil {
		if n, ok := info.VerifiedInstructions(); ok && n > 0 {
			return n, nil
		}
	}
	if m := processedRE.FindStringSubmatch(p.VerifierLog); m != nil {
		n, err := strconv.ParseUint(m[1], 10, 32)
		if err == nil {
			return uint32(n), nil
		}
	}
	return 0, errors.New("verified instruction count not reported (no prog info field, no stats log)")
}

// loadErrorDetail keeps the error and the last lines of the verifier log.
func loadErrorDetail(err error) string {
	var ve *ebpf.VerifierError
	if errors.As(err, &ve) {
		lines := ve.Log
		if len(lines) > 8 {
			lines = lines[len(lines)-8:]
		}
		return fmt.Sprintf("%v: %s", ve.Cause, strings.Join(lines, " | "))
	}
	return err.Error()
}

// Compare fills baseline and delta of every result from b (the entry of
// rep.Kernel), sets the statuses and collects the failures: a program
// rejected although its type is supported, or grown by more than maxGrowth
// percent.
func (rep *Report) Compare(b Baseline, maxGrowth float64) {
	rep.MaxGrowth = maxGrowth
	rep.Failures = nil
	base := b[rep.Kernel]
	for i := range rep.Results {
		r := &rep.Results[i]
		switch {
		case r.Status == StatusRejected:
			rep.Failures = append(rep.Failures, fmt.Sprintf("%s/%s rejected by the %s verifier although %s programs are supported: %s",
				r.Object, r.Program, r.Release, r.Type, r.Detail))
			continue
		case r.Status == StatusUnsupported:
			continue
		}
		old, ok := base[r.Program]
		if !ok || r.Insns == 0 {
			r.Status = StatusNoBaseline
			continue
		}
		r.Baseline = &old
		d := (float64(r.Insns) - float64(old)) / float64(old) * 100
		r.DeltaPct = &d
		r.Status = StatusOK
		if d > maxGrowth {
			r.Status = StatusGrowth
			rep.Failures = append(rep.Failures, fmt.Sprintf("%s: %d verifier instructions on %s, %+.1f%% over the baseline %d (limit %+.0f%%): "+
				"simplify the program, or accept the growth with `go run ./hack/verifier -update-baseline` and commit %s",
				r.Program, r.Insns, r.Kernel, d, old, maxGrowth, BaselineFile))
		}
	}
}

// Markdown renders the report as a table (one row per program).
func (rep Report) Markdown() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "| kernel | program | loads | insns | baseline | delta%% | status |\n")
	fmt.Fprintf(&sb, "|---|---|---|---:|---:|---:|---|\n")
	for _, r := range rep.Results {
		loads, insns, base, delta := "no", "-", "-", "-"
		if r.Loads {
			loads = "yes"
		}
		if r.Insns > 0 {
			insns = strconv.FormatUint(uint64(r.Insns), 10)
		}
		if r.Baseline != nil {
			base = strconv.FormatUint(uint64(*r.Baseline), 10)
		} else if r.Loads {
			base = "no baseline"
		}
		if r.DeltaPct != nil {
			delta = fmt.Sprintf("%+.1f", *r.DeltaPct)
		}
		status := r.Status
		if r.Detail != "" && !r.Loads {
			status += ": " + strings.ReplaceAll(r.Detail, "|", "/")
		}
		fmt.Fprintf(&sb, "| %s (%s) | %s/%s | %s | %s | %s | %s | %s |\n",
			r.Kernel, r.Release, r.Object, r.Program, loads, insns, base, delta, status)
	}
	return sb.String()
}
