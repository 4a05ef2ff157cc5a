package dptest

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
)

// EnumCase is one C enum of bpf/ and what Go keeps of it: a table of
// names in enum order (names) or constants by member name (values).
type EnumCase struct {
	Enum   string            // the C enum
	Prefix string            // dropped from a member's name, which is then lower-cased, to give its Go name
	Max    string            // the member that counts the others (not a name), "" if none
	Names  []string          // the Go table of names, index = value
	Values map[string]uint64 // Go constants by C member name: every member must be there
}

// CheckEnums checks the Go tables and constants that mirror C enums of bpf/
// (metric and verdict names, directions, hooks, flag bits, LB scopes and
// states) against the enums in the BTF of the compiled objects, so that
// neither side can change alone: same members in the same order, same
// values, same count. The enums are in BTF through the AXON_BTF_ANCHOR
// globals (bpf/lib/common.h). Every object holding an enum is checked; each
// enum must be in at least one. objects maps an object's name to its
// bpf2go loader.
func CheckEnums(t *testing.T, objects map[string]func() (*ebpf.CollectionSpec, error), cases []EnumCase) {
	t.Helper()
	specs := map[string]*btf.Spec{}
	for name, load := range objects {
		spec, err := load()
		if err != nil {
			t.Fatalf("load %s: %v", name, err)
		}
		specs[name] = spec.Types
	}
	for _, c := range cases {
		t.Run(c.Enum, func(t *testing.T) {
			found := 0
			for obj, types := range specs {
				var e *btf.Enum
				err := types.TypeByName(c.Enum, &e)
				if errors.Is(err, btf.ErrNotFound) {
					continue
				}
				if err != nil {
					t.Fatalf("%s: %v", obj, err)
				}
				found++
				for _, msg := range c.check(e) {
					t.Errorf("%s: enum %s: %s", obj, c.Enum, msg)
				}
			}
			if found == 0 {
				t.Fatalf("enum %s is in no object's BTF (an AXON_BTF_ANCHOR lost?)", c.Enum)
			}
		})
	}
}

// check compares e with the Go side of c; it returns the disagreements.
func (c EnumCase) check(e *btf.Enum) []string {
	var msgs []string
	var members []btf.EnumValue
	count := uint64(0)
	hasMax := false
	for _, v := range e.Values {
		if c.Max != "" && v.Name == c.Max {
			count, hasMax = v.Value, true
			continue
		}
		members = append(members, v)
	}
	if c.Max != "" && !hasMax {
		msgs = append(msgs, "no member "+c.Max)
	}
	if c.Names != nil {
		var want []string
		for i, v := range members {
			if v.Value != uint64(i) {
				msgs = append(msgs, v.Name+" is not the next value: the Go table is indexed by value")
			}
			want = append(want, strings.ToLower(strings.TrimPrefix(v.Name, c.Prefix)))
		}
		if hasMax && count != uint64(len(members)) {
			msgs = append(msgs, c.Max+" does not count the members")
		}
		if !slices.Equal(c.Names, want) {
			msgs = append(msgs, "Go names "+strings.Join(c.Names, ",")+"; C has "+strings.Join(want, ","))
		}
	}
	if c.Values != nil {
		seen := map[string]bool{}
		for _, v := range members {
			seen[v.Name] = true
			got, ok := c.Values[v.Name]
			switch {
			case !ok:
				msgs = append(msgs, v.Name+" has no Go counterpart")
			case got != v.Value:
				msgs = append(msgs, v.Name+": C and Go values differ")
			}
		}
		for name := range c.Values {
			if !seen[name] {
				msgs = append(msgs, "Go has "+name+", C does not")
			}
		}
	}
	return msgs
}
