package debroot

import (
	"context"
	"os/exec"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func TestDepGroups(t *testing.T) {
	for _, tc := range []struct {
		field string
		want  [][]string
	}{
		{"", nil},
		{"libc6 (>= 2.34)", [][]string{{"libc6"}}},
		{"libc6 (>= 2.34), libcurl4 (= 7.88.1-10+deb12u15), zlib1g (>= 1:1.1.4)", [][]string{{"libc6"}, {"libcurl4"}, {"zlib1g"}}},
		{"debconf (>= 0.5) | debconf-2.0, python3:any", [][]string{{"debconf", "debconf-2.0"}, {"python3"}}},
		{"libc6:amd64 (>= 2.36) |  libc6.1 ,", [][]string{{"libc6", "libc6.1"}}},
	} {
		if got := depGroups(tc.field); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("depGroups(%q) = %q, want %q", tc.field, got, tc.want)
		}
	}
}

func TestParseStanzas(t *testing.T) {
	out := "Package: curl\nVersion: 7.88.1-10\nArchitecture: amd64\nDepends: libc6 (>= 2.34), libcurl4\nDescription: a\n more text: Depends: nothing\n\n" +
		"Package: bash\nPre-Depends: libc6, libtinfo6\nVersion: 5.2\nArchitecture: amd64\nDepends: base-files\n"
	got := parseStanzas(out)
	if len(got) != 2 {
		t.Fatalf("%d stanzas, want 2", len(got))
	}
	if got[0].pkg != (Package{"curl", "7.88.1-10", "amd64"}) || got[0].depends != "libc6 (>= 2.34), libcurl4" {
		t.Errorf("curl: %+v", *got[0])
	}
	if got[1].pkg != (Package{"bash", "5.2", "amd64"}) || got[1].depends != "libc6, libtinfo6,base-files" {
		t.Errorf("bash: %+v", *got[1])
	}
}

// TestResolveFromApt resolves against the machine's apt lists: zlib1g's closure is zlib1g and
// libc6's (every one a real package whose own dependencies are in the set), the packages given
// are in it, a package of exclude and what only it needs are not, and an unknown package is
// refused with a message that says what to run.
func TestResolveFromApt(t *testing.T) {
	if _, err := exec.LookPath("apt-cache"); err != nil {
		t.Skip("no apt-cache: debroot needs a Debian or Ubuntu host")
	}
	ctx := context.Background()
	pkgs, err := Resolve(ctx, []string{"zlib1g"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	names := func(ps []Package) []string {
		var n []string
		for _, p := range ps {
			if p.Version == "" || p.Arch == "" {
				t.Errorf("%s: no version or architecture", p.Name)
			}
			n = append(n, p.Name)
		}
		return n
	}
	got := names(pkgs)
	t.Logf("zlib1g's closure: %v", pkgs)
	if !slices.Contains(got, "zlib1g") || !slices.Contains(got, "libc6") || !slices.IsSorted(got) {
		t.Errorf("closure %v: want zlib1g and libc6, sorted by name", got)
	}
	// Every package's dependencies are in the set: read them again from apt.
	out, err := exec.Command("apt-cache", append([]string{"show", "--no-all-versions"}, got...)...).Output()
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, s := range parseStanzas(string(out)) {
		if !slices.Contains(pkgs, s.pkg) {
			continue // another architecture's record
		}
		seen++
		for _, g := range depGroups(s.depends) {
			if !slices.ContainsFunc(g, func(a string) bool { return slices.Contains(got, a) }) {
				t.Errorf("%s depends on %s: not in the closure %v", s.pkg.Name, strings.Join(g, " | "), got)
			}
		}
	}
	if seen != len(pkgs) {
		t.Errorf("apt-cache show gave %d of the %d packages' records", seen, len(pkgs))
	}
	// Excluding libc6 drops it and what only libc6 pulled in (libgcc-s1 on Debian 12).
	without, err := Resolve(ctx, []string{"zlib1g"}, []string{"libc6"})
	if err != nil {
		t.Fatal(err)
	}
	if w := names(without); !reflect.DeepEqual(w, []string{"zlib1g"}) {
		t.Errorf("zlib1g without libc6: %v, want [zlib1g]", w)
	}
	_, err = Resolve(ctx, []string{"no-such-package-axon"}, nil)
	if err == nil || !strings.Contains(err.Error(), "apt-cache policy no-such-package-axon") {
		t.Errorf("unknown package: %v, want an error naming apt-cache policy", err)
	}
}

func TestKey(t *testing.T) {
	a := []Package{{"curl", "1", "amd64"}, {"libc6", "2", "amd64"}}
	b := []Package{{"curl", "1", "amd64"}, {"libc6", "3", "amd64"}}
	links := map[string]string{"/bin/nc": "nc.openbsd"}
	if Key(a, links) != Key(slices.Clone(a), map[string]string{"/bin/nc": "nc.openbsd"}) {
		t.Error("the same packages and links gave two keys")
	}
	if Key(a, links) == Key(b, links) || Key(a, links) == Key(a, nil) {
		t.Error("another version or no links gave the same key")
	}
}
