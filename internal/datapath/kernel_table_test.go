package datapath

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/axonhq/axon/internal/testutil"
)

// TestKernelSupportTable checks the README's kernel support table against
// the probes: the column whose header starts with the running kernel's
// major.minor must say "yes" exactly where Probe() finds the feature.
func TestKernelSupportTable(t *testing.T) {
	testutil.RequireRoot(t, "the probes create devices and load programs")
	readme := filepath.Join("..", "..", "README.md")
	f, err := os.Open(readme)
	if err != nil {
		t.Skipf("README.md not next to the source (%v): the table is checked from the source tree only", err)
	}
	defer f.Close()

	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	release := unix.ByteSliceToString(u.Release[:])
	parts := strings.SplitN(release, ".", 3)
	family := parts[0] + "." + parts[1]

	col := -1
	rows := map[string]string{} // probe name → cell for this kernel
	inTable := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "| probe |") {
			inTable = true
			for i, h := range splitRow(line) {
				if strings.HasPrefix(h, family+" ") {
					col = i
				}
			}
			continue
		}
		if !inTable {
			continue
		}
		if !strings.HasPrefix(line, "|") {
			break
		}
		cells := splitRow(line)
		if strings.HasPrefix(cells[0], "---") || col < 0 || col >= len(cells) {
			continue
		}
		rows[strings.Trim(cells[0], "`")] = cells[col]
	}
	if !inTable {
		t.Fatal("README.md has no kernel support table (a row starting with '| probe |')")
	}
	if col < 0 {
		t.Skipf("README's kernel table has no column for kernel %s (%s): add one from `axon status`", family, release)
	}
	if len(rows) == 0 {
		t.Fatal("README kernel table has no rows")
	}
	probed := map[string]bool{}
	for _, ft := range Probe().List() {
		probed[ft.Name] = ft.Available
	}
	for name, cell := range rows {
		avail, ok := probed[name]
		if !ok {
			t.Errorf("README kernel table row %q is not a probe (known: %v)", name, probed)
			continue
		}
		if want := map[bool]string{true: "yes", false: "no"}[avail]; cell != want {
			t.Errorf("README says %s=%q on %s, the probe says %q", name, cell, family, want)
		}
	}
}

func splitRow(line string) []string {
	cells := strings.Split(strings.Trim(line, "|"), "|")
	for i := range cells {
		cells[i] = strings.TrimSpace(cells[i])
	}
	return cells
}
