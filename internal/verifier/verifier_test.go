package verifier

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf/asm"
)

// Pure-logic tests: no root needed.

func TestFamily(t *testing.T) {
	cases := []struct{ release, want string }{
		{"6.18.0-axon", "6.18"},
		{"6.12.48+deb13-amd64", "6.12"},
		{"6.1.0-37-amd64", "6.1"},
		{"5.10.0", "5.10"},
	}
	for _, c := range cases {
		got, err := Family(c.release)
		if err != nil || got != c.want {
			t.Errorf("Family(%q) = %q, %v; want %q", c.release, got, err, c.want)
		}
	}
	for _, bad := range []string{"", "linux", "6"} {
		if got, err := Family(bad); err == nil {
			t.Errorf("Family(%q) = %q, want an error", bad, got)
		}
	}
}

func res(prog string, loads bool, insns uint32, status string) Result {
	return Result{Kernel: "6.12", Release: "6.12.48", Object: "obj", Program: prog, Type: "SchedCLS",
		Loads: loads, Insns: insns, Status: status}
}

func TestCompare(t *testing.T) {
	base := Baseline{"6.12": {"same": 1000, "grown": 1000, "edge": 1000, "shrunk": 1000}, "6.1": {"new": 5}}
	cases := []struct {
		desc       string
		r          Result
		wantStatus string
		wantDelta  string // formatted, "" for none
		fails      bool
	}{
		{"unchanged", res("same", true, 1000, ""), StatusOK, "+0.0", false},
		{"exactly at the limit", res("edge", true, 1100, ""), StatusOK, "+10.0", false},
		{"grown past the limit", res("grown", true, 1101, ""), StatusGrowth, "+10.1", true},
		{"shrunk", res("shrunk", true, 500, ""), StatusOK, "-50.0", false},
		{"no entry for the program on this kernel", res("new", true, 7, ""), StatusNoBaseline, "", false},
		{"rejected with the type supported", res("same", false, 0, StatusRejected), StatusRejected, "", true},
		{"type unsupported", res("same", false, 0, StatusUnsupported), StatusUnsupported, "", false},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			rep := Report{Kernel: "6.12", Release: "6.12.48", Results: []Result{c.r}}
			rep.Compare(base, DefaultMaxGrowth)
			r := rep.Results[0]
			if r.Status != c.wantStatus {
				t.Errorf("status %q, want %q", r.Status, c.wantStatus)
			}
			delta := ""
			if r.DeltaPct != nil {
				delta = strings.TrimSpace(strings.Split(rep.Markdown(), "\n")[2])
				delta = strings.TrimSpace(strings.Split(delta, "|")[6])
			}
			if delta != c.wantDelta {
				t.Errorf("delta %q, want %q", delta, c.wantDelta)
			}
			if (len(rep.Failures) > 0) != c.fails {
				t.Errorf("failures %q, want failing=%v", rep.Failures, c.fails)
			}
			if c.wantStatus == StatusGrowth && !strings.Contains(rep.Failures[0], "-update-baseline") {
				t.Errorf("growth message does not say how to accept it: %s", rep.Failures[0])
			}
		})
	}
	// A kernel without any baseline entry reports "no baseline", no failure.
	rep := Report{Kernel: "6.6", Results: []Result{res("same", true, 1000, "")}}
	rep.Compare(base, DefaultMaxGrowth)
	if rep.Results[0].Status != StatusNoBaseline || len(rep.Failures) != 0 ||
		!strings.Contains(rep.Markdown(), "no baseline") {
		t.Errorf("kernel without baseline: %+v %q\n%s", rep.Results[0], rep.Failures, rep.Markdown())
	}
}

func TestParseBaseline(t *testing.T) {
	good := `{"6.18": {"axon_pod_egress": 100}, "6.1": {}}`
	if b, err := ParseBaseline([]byte(good)); err != nil || b["6.18"]["axon_pod_egress"] != 100 {
		t.Fatalf("ParseBaseline(good) = %v, %v", b, err)
	}
	bad := []struct{ desc, in string }{
		{"not json", `{`},
		{"family with patch level", `{"6.18.1": {"p": 1}}`},
		{"not a kernel", `{"latest": {"p": 1}}`},
		{"zero count", `{"6.1": {"p": 0}}`},
		{"negative count", `{"6.1": {"p": -1}}`},
		{"list instead of object", `[1]`},
	}
	for _, c := range bad {
		if b, err := ParseBaseline([]byte(c.in)); err == nil {
			t.Errorf("%s: ParseBaseline accepted %s as %v", c.desc, c.in, b)
		}
	}
	if _, err := EmbeddedBaseline(); err != nil {
		t.Errorf("committed baseline: %v", err)
	}
}

func TestBaselineUpdate(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "baseline.json")
	b, err := ReadBaseline(path) // missing: empty
	if err != nil || len(b) != 0 {
		t.Fatalf("missing file: %v, %v", b, err)
	}
	b = Baseline{"6.1": {"old": 9}, "6.12": {"gone": 4}}
	rep := Report{Kernel: "6.12", Results: []Result{
		res("a", true, 10, ""), res("rejected", false, 0, StatusRejected),
	}}
	nb := b.With(rep)
	if err := WriteBaseline(path, nb); err != nil {
		t.Fatal(err)
	}
	got, err := ReadBaseline(path)
	if err != nil {
		t.Fatal(err)
	}
	if got["6.1"]["old"] != 9 || got["6.12"]["a"] != 10 || len(got["6.12"]) != 1 {
		t.Errorf("after update: %v", got)
	}
	if b["6.12"]["gone"] != 4 {
		t.Errorf("With modified its receiver: %v", b)
	}
	// A damaged file is reported and left alone.
	if err := os.WriteFile(path, []byte(`{"6.1": `), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadBaseline(path); err == nil || !strings.Contains(err.Error(), "not changed") {
		t.Errorf("damaged file: err = %v", err)
	}
	if data, _ := os.ReadFile(path); string(data) != `{"6.1": ` {
		t.Errorf("damaged file was rewritten: %q", data)
	}
}

func TestWriteResults(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "results")
	rep := Report{Kernel: "6.18", Release: "6.18.0", Results: []Result{res("p", true, 42, "")}}
	rep.Compare(Baseline{"6.18": {"p": 40}}, DefaultMaxGrowth)
	paths, err := WriteResults(dir, rep)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil || !strings.Contains(string(data), "42") {
			t.Errorf("%s: %q, %v", p, data, err)
		}
	}
}

func TestHelperName(t *testing.T) {
	for fn, want := range map[asm.BuiltinFunc]string{
		asm.FnSetRetval:      "bpf_set_retval",
		asm.FnRedirectPeer:   "bpf_redirect_peer",
		asm.FnMapLookupElem:  "bpf_map_lookup_elem",
		asm.FnGetNetnsCookie: "bpf_get_netns_cookie",
		asm.FnSkbSetTstamp:   "bpf_skb_set_tstamp",
		asm.FnKtimeGetBootNs: "bpf_ktime_get_boot_ns",
	} {
		if got := helperName(fn); got != want {
			t.Errorf("helperName(%v) = %q, want %q", fn, got, want)
		}
	}
}
