// Command vm runs axon's test binaries on a matrix of kernels: the host's own and Debian
// kernels booted in QEMU (see internal/vmtest and hack/vm/README.md).
//
//	go run ./hack/vm -kernels host,debian-6.12,debian-6.1 -pkgs ./internal/datapath
//
// It exits 1 when any test fails, a test binary exits non-zero, or a VM panics or hangs.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/axonhq/axon/internal/vmtest"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "vm:", err)
		os.Exit(1)
	}
}

func defaultCache() string {
	if c := os.Getenv("AXON_CACHE"); c != "" {
		return c
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "/var/cache/axon"
	}
	return filepath.Join(home, ".cache", "axon")
}

func run() error {
	var (
		kernels  = flag.String("kernels", "host,debian-6.12,debian-6.1", "comma-separated: host and/or "+knownNames())
		pkgs     = flag.String("pkgs", "./internal/datapath/...,./internal/verifier,./internal/vmtest/virtionet", "comma-separated go packages whose tests run on every kernel")
		runRe    = flag.String("run", "", "only tests matching this regexp (-test.run)")
		mustRun  = flag.String("must-run", "", "comma-separated top-level tests that must pass on every kernel, not skip (a skip fails the kernel, with its reason); meant for one package in -pkgs")
		timeout  = flag.Duration("timeout", 20*time.Minute, "per test binary (-test.timeout); the VM gets this plus 2m per binary")
		cache    = flag.String("cache", defaultCache(), "cache root; kernels go under <cache>/kernels")
		out      = flag.String("out", "results/kernels", "where outputs, console logs and matrix.md go")
		boot     = flag.String("boot", "pvh", "pvh (vmlinux + qboot, fastest) or bzimage (vmlinuz + SeaBIOS)")
		modules  = flag.String("modules", "", "comma-separated modules to load at boot (default: vmtest.DefaultModules)")
		refresh  = flag.Bool("refresh", false, "ask apt for a newer kernel even when a recent resolution is cached")
		verbose  = flag.Bool("v", false, "stream the VM serial console")
		withLab  = flag.Bool("lab", false, "also run the single-node lab subset in each VM (needs `make deps build`)")
		nics     = flag.Bool("nics", true, "give each VM two back-to-back virtio-net NICs (MACs in $AXON_VM_NIC_MACS)")
		twoVM    = flag.Bool("twovm", false, "also run the two-VM subset per VM kernel: one axon node per VM over a virtio-net link, cross-node pod-to-pod probes (needs `make deps`)")
		fetchOne = flag.Bool("fetch-only", false, "only fetch and unpack the kernels, then print their paths")
		labNodes = flag.Int("lab-nodes", 1, "nodes of the lab subset (axon lab up --nodes): 2 adds cross-node pod-to-pod to its check")
		icount   = flag.Bool("icount", false, "TCG with instruction counting (one host thread, guest clock = 1 ns per guest instruction, idle time skipped): timings in the guest count work, not host speed")
		mttcg    = flag.Bool("mttcg", false, "multi-threaded TCG (one host thread per vCPU) instead of single-threaded: only for throughput experiments that need both vCPUs running at once; the guest kernel can die with \"Oops: int3\" when it patches code another vCPU runs")
		parallel = flag.Bool("parallel", false, "boot the VM kernels at the same time (one host core each under single-threaded TCG), then their two-VM subsets one after the other; the host column runs first")
		labDev   = flag.String("lab-device", "auto", "pod device of the lab subset (axon lab up --device): auto (netkit where the kernel has it), veth or netkit")
		env      envFlag
	)
	flag.Var(&env, "env", "KEY=VALUE exported to the tests in the VMs and on the host (repeatable), e.g. -env AXON_NK_BENCH_REPS=30")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	if os.Geteuid() != 0 {
		return fmt.Errorf("needs root (the tests load BPF programs and create namespaces): run it as root")
	}
	var targets []string
	var specs []vmtest.KernelSpec
	for _, name := range strings.Split(*kernels, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		if name == vmtest.HostKernel {
			targets = append(targets, name)
			specs = append(specs, vmtest.KernelSpec{})
			continue
		}
		spec, err := vmtest.LookupKernel(name)
		if err != nil {
			return err
		}
		targets = append(targets, name)
		specs = append(specs, spec)
	}
	if len(targets) == 0 {
		return fmt.Errorf("no kernels given: -kernels host,%s", knownNames())
	}
	bootMode := vmtest.BootMode(*boot)
	if bootMode != vmtest.BootPVH && bootMode != vmtest.BootBzImage {
		return fmt.Errorf("-boot %q: use pvh or bzimage", *boot)
	}

	if *fetchOne {
		f := &vmtest.Fetcher{CacheRoot: *cache, Refresh: *refresh, Log: log}
		for _, s := range specs {
			if s.Name == "" {
				continue
			}
			start := time.Now()
			k, err := f.Fetch(ctx, s)
			if err != nil {
				return err
			}
			fmt.Printf("%s\t%s\t%s\t%s\t%s\n", s.Name, k.Release, k.PkgVersion, k.Dir, time.Since(start).Round(time.Millisecond))
		}
		return nil
	}

	if err := os.MkdirAll(*out, 0o755); err != nil {
		return fmt.Errorf("results dir: %w", err)
	}
	r := &vmtest.Runner{
		Packages: split(*pkgs), RunRegex: *runRe, TestTimeout: *timeout, CacheRoot: *cache,
		OutDir: *out, Boot: bootMode, Modules: split(*modules), Refresh: *refresh, Log: log,
		Lab: *withLab, NICs: *nics, TwoVM: *twoVM,
		Env: env, LabDevice: *labDev, LabNodes: *labNodes, ICount: *icount, MultiThreadTCG: *mttcg,
		MustRun: split(*mustRun),
	}
	if *verbose {
		r.Console = os.Stderr
	}
	defer r.Close()
	bins, err := r.Build(ctx)
	if err != nil {
		return err
	}
	var runs []vmtest.KernelRun
	done := func(kr vmtest.KernelRun) {
		p, f, s := kr.Counts()
		log.Info("kernel done", "kernel", kr.Kernel, "release", kr.Release, "pass", p, "fail", f, "skip", s, "took", kr.Total.Round(time.Millisecond), "err", errLine(kr.Err))
		runs = append(runs, kr)
	}
	var vmSpecs []vmtest.KernelSpec // -parallel: the VM kernels, run together after the host
	for i, name := range targets {
		if *parallel && name != vmtest.HostKernel {
			vmSpecs = append(vmSpecs, specs[i])
			continue
		}
		log.Info("running tests", "kernel", name)
		if name == vmtest.HostKernel {
			done(r.RunHost(ctx, bins))
		} else {
			done(r.RunVM(ctx, specs[i], bins))
		}
		if ctx.Err() != nil {
			break
		}
	}
	if len(vmSpecs) > 0 && ctx.Err() == nil {
		log.Info("running tests", "kernels", len(vmSpecs), "parallel", true)
		for _, kr := range r.RunVMs(ctx, vmSpecs, bins, true) {
			done(kr)
		}
	}
	vmtest.WriteMatrix(os.Stdout, runs)
	if err := writeMarkdown(filepath.Join(*out, "matrix.md"), runs); err != nil {
		return err
	}
	for _, k := range runs {
		if k.Failed() {
			return fmt.Errorf("kernel matrix failed (outputs in %s)", *out)
		}
	}
	return nil
}

func writeMarkdown(path string, runs []vmtest.KernelRun) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	vmtest.WriteMarkdown(f, runs)
	return f.Close()
}

func split(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func knownNames() string {
	var n []string
	for _, k := range vmtest.KnownKernels() {
		n = append(n, k.Name)
	}
	return strings.Join(n, ",")
}

func errLine(err error) string {
	if err == nil {
		return ""
	}
	line, _, _ := strings.Cut(err.Error(), "\n")
	return line
}

// envFlag collects -env KEY=VALUE flags (benchmark knobs for the guest).
type envFlag []string

func (e *envFlag) String() string { return strings.Join(*e, " ") }

func (e *envFlag) Set(v string) error {
	k, _, ok := strings.Cut(v, "=")
	if !ok || k == "" || strings.IndexFunc(k, func(c rune) bool {
		return !(c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9')
	}) >= 0 || k[0] >= '0' && k[0] <= '9' {
		return fmt.Errorf("%q: want KEY=VALUE with KEY a shell variable name, e.g. AXON_NK_BENCH_REPS=30", v)
	}
	*e = append(*e, v)
	return nil
}
