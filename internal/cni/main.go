package cni

import (
	"bytes"
	"io"
	"log/slog"
	"os"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
)

// About is printed when the binary is run without CNI_COMMAND.
const About = "axon-cni: CNI plugin of the axon eBPF datapath (talks to axon-agent over its unix socket)"

// Main runs the plugin the way a container runtime invokes it (env + stdin)
// and returns the process exit code. Logs go to stderr; set AXON_CNI_LOG=info
// (or debug) for more than warnings.
func Main() int {
	level := slog.LevelWarn
	switch os.Getenv("AXON_CNI_LOG") {
	case "info":
		level = slog.LevelInfo
	case "debug":
		level = slog.LevelDebug
	}
	p := &Plugin{Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))}

	cmd := os.Getenv("CNI_COMMAND")
	if cmd != "" && cmd != "VERSION" {
		// Read the config once to give clear cniVersion errors before skel
		// does its own (terser) check, then hand it on.
		data, err := io.ReadAll(os.Stdin)
		if err != nil {
			return printErr(types.NewError(types.ErrIOFailure, "read network config from stdin: "+err.Error(), ""))
		}
		if e := CheckVersion(data); e != nil {
			return printErr(e)
		}
		r, w, err := os.Pipe()
		if err != nil {
			return printErr(types.NewError(types.ErrIOFailure, "pipe: "+err.Error(), ""))
		}
		go func() {
			_, _ = io.Copy(w, bytes.NewReader(data))
			w.Close()
		}()
		old := os.Stdin
		os.Stdin = r
		defer func() { os.Stdin = old; r.Close() }()
	}
	e := skel.PluginMainFuncsWithError(skel.CNIFuncs{
		Add:    p.Add,
		Del:    p.Del,
		Check:  p.Check,
		Status: p.Status,
		GC:     p.GC,
	}, version.PluginSupports(SupportedVersions...), About)
	if e != nil {
		return printErr(e)
	}
	return 0
}

func printErr(e *types.Error) int {
	_ = e.Print() // JSON error on stdout, as the spec asks
	return 1
}
