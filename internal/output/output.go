// Package output prints the axon CLI's structured output the way kubectl
// does: -o json (indented, as before), -o yaml, and -o jsonpath='{...}' with
// client-go's JSONPath. YAML and JSONPath see the JSON form of a value (its
// json tags), so the three agree on names.
package output

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"k8s.io/client-go/util/jsonpath"
	"sigs.k8s.io/yaml"
)

// Formats lists the -o values, for flag help and errors.
const Formats = "text, json, yaml or jsonpath='{...}'"

// Format is a parsed -o value.
type Format struct {
	kind string // text, json, yaml, jsonpath
	jp   *jsonpath.JSONPath
}

// Parse reads an -o value: text, json, yaml, jsonpath=TEMPLATE.
func Parse(s string) (Format, error) {
	switch s {
	case "", "text":
		return Format{kind: "text"}, nil
	case "json", "yaml":
		return Format{kind: s}, nil
	}
	if tmpl, ok := strings.CutPrefix(s, "jsonpath="); ok {
		if tmpl == "" {
			return Format{}, fmt.Errorf("-o jsonpath= needs a template, e.g. -o jsonpath='{.ready}'")
		}
		jp := jsonpath.New("output").AllowMissingKeys(false)
		if err := jp.Parse(tmpl); err != nil {
			return Format{}, fmt.Errorf("-o jsonpath template %q: %w", tmpl, err)
		}
		return Format{kind: "jsonpath", jp: jp}, nil
	}
	if s == "jsonpath" {
		return Format{}, fmt.Errorf("-o jsonpath needs a template: -o jsonpath='{.field}'")
	}
	return Format{}, fmt.Errorf("unknown output format %q: use -o %s", s, Formats)
}

// Structured is true for every format but text: the command then prints v
// with Write instead of its table.
func (f Format) Structured() bool { return f.kind != "text" && f.kind != "" }

// Write prints v in the format. JSON is encoding/json's indented form with
// a trailing newline.
func (f Format) Write(w io.Writer, v any) error {
	switch f.kind {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	case "yaml":
		b, err := yaml.Marshal(v)
		if err != nil {
			return fmt.Errorf("yaml output: %w", err)
		}
		_, err = w.Write(b)
		return err
	case "jsonpath":
		// Through JSON so that the template uses the JSON field names.
		raw, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("jsonpath output: %w", err)
		}
		var data any
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		if err := dec.Decode(&data); err != nil {
			return fmt.Errorf("jsonpath output: %w", err)
		}
		var buf bytes.Buffer
		if err := f.jp.Execute(&buf, data); err != nil {
			return fmt.Errorf("-o jsonpath: %w (-o json shows the field names)", err)
		}
		_, err = w.Write(buf.Bytes())
		return err
	}
	return fmt.Errorf("output format %q prints no structure", f.kind)
}
