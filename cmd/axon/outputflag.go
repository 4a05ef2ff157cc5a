package main

import (
	"github.com/spf13/cobra"

	"github.com/axonhq/axon/internal/output"
)

// outputFlag is the -o flag of every command with structured output: text
// (the command's own table), json, yaml or jsonpath='{...}' (internal/output).
type outputFlag struct {
	raw    string
	format output.Format
}

func (o *outputFlag) register(cmd *cobra.Command) {
	cmd.Flags().StringVarP(&o.raw, "output", "o", "text", "output format: "+output.Formats)
}

// parse validates -o; call it before doing the command's work.
func (o *outputFlag) parse() error {
	f, err := output.Parse(o.raw)
	if err != nil {
		return err
	}
	o.format = f
	return nil
}

// structured is true when the command prints its value with write instead
// of its text form.
func (o *outputFlag) structured() bool { return o.format.Structured() }

func (o *outputFlag) write(cmd *cobra.Command, v any) error {
	return o.format.Write(cmd.OutOrStdout(), v)
}
