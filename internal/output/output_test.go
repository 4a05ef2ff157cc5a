package output

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
)

type sample struct {
	Node     string         `json:"node"`
	Ready    bool           `json:"ready"`
	PodCIDRs []netip.Prefix `json:"podCIDRs"`
	Counters []counter      `json:"counters,omitempty"`
	Big      uint64         `json:"big"`
}

type counter struct {
	Name  string `json:"name"`
	Value uint64 `json:"value"`
}

var value = sample{
	Node: "node1", Ready: true,
	PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:10:244:1::/64")},
	Counters: []counter{{"redirect_peer_local", 7}, {"pass_malformed", 0}},
	Big:      1<<63 + 1,
}

func TestWrite(t *testing.T) {
	cases := []struct {
		format string
		want   string
	}{
		{"yaml", "big: 9223372036854775809\ncounters:\n- name: redirect_peer_local\n  value: 7\n- name: pass_malformed\n  value: 0\nnode: node1\npodCIDRs:\n- 10.244.1.0/24\n- fd00:10:244:1::/64\nready: true\n"},
		{"jsonpath={.node}", "node1"},
		{"jsonpath={.ready}", "true"},
		{"jsonpath={.podCIDRs[1]}", "fd00:10:244:1::/64"},
		{"jsonpath={.counters[?(@.name==\"redirect_peer_local\")].value}", "7"},
		{"jsonpath={range .counters[*]}{.name}={.value}{\"\\n\"}{end}", "redirect_peer_local=7\npass_malformed=0\n"},
		// uint64 above 2^53 survives (decoded as json.Number, not float64).
		{"jsonpath={.big}", "9223372036854775809"},
	}
	for _, tc := range cases {
		t.Run(tc.format, func(t *testing.T) {
			f, err := Parse(tc.format)
			if err != nil {
				t.Fatal(err)
			}
			if !f.Structured() {
				t.Fatalf("%s: not structured", tc.format)
			}
			var b bytes.Buffer
			if err := f.Write(&b, value); err != nil {
				t.Fatal(err)
			}
			if b.String() != tc.want {
				t.Errorf("got\n%q\nwant\n%q", b.String(), tc.want)
			}
		})
	}
}

// TestJSONUnchanged: -o json is byte for byte what the CLI printed before
// (encoding/json, two-space indent, trailing newline).
func TestJSONUnchanged(t *testing.T) {
	for _, v := range []any{value, []counter{}, map[string]int{"b": 1, "a": 2}, nil} {
		var before bytes.Buffer
		enc := json.NewEncoder(&before)
		enc.SetIndent("", "  ")
		if err := enc.Encode(v); err != nil {
			t.Fatal(err)
		}
		f, _ := Parse("json")
		var after bytes.Buffer
		if err := f.Write(&after, v); err != nil {
			t.Fatal(err)
		}
		if before.String() != after.String() {
			t.Errorf("%T: -o json changed:\nbefore %q\nafter  %q", v, before.String(), after.String())
		}
	}
}

func TestParseErrors(t *testing.T) {
	cases := []struct{ format, want string }{
		{"xml", `unknown output format "xml": use -o text, json, yaml or jsonpath='{...}'`},
		{"jsonpath", "needs a template"},
		{"jsonpath=", "needs a template"},
		{"jsonpath={.node", "unclosed action"},
		{"wide", "unknown output format"},
	}
	for _, tc := range cases {
		t.Run(tc.format, func(t *testing.T) {
			_, err := Parse(tc.format)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Parse(%q) = %v, want an error containing %q", tc.format, err, tc.want)
			}
		})
	}
	for _, s := range []string{"", "text"} {
		if f, err := Parse(s); err != nil || f.Structured() {
			t.Errorf("Parse(%q) = %v, %v: want text", s, f, err)
		}
	}
}

// TestJSONPathMissingKey: a misspelt field is an error, not empty output
// that a script would take for an empty value.
func TestJSONPathMissingKey(t *testing.T) {
	f, err := Parse("jsonpath={.nodes}")
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	err = f.Write(&b, value)
	if err == nil || !strings.Contains(err.Error(), "nodes is not found") {
		t.Fatalf("err %v, output %q: want 'nodes is not found'", err, b.String())
	}
}
