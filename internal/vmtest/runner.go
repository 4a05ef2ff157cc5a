package vmtest

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// modulePath is axon's Go module.
const modulePath = "github.com/axonhq/axon"

// HostKernel is the matrix name of the machine's own kernel.
const HostKernel = "host"

// TestBinary is a compiled test binary of one package.
type TestBinary struct {
	Package string // import path
	Dir     string // package source dir (the binary runs there, as under go test)
	Binary  string // host path of the binary
	Name    string // file name inside the run dir
	// Set for a Runner.Extra run: its -test.run, the kernels it runs on
	// (empty: all) and the tests that must pass there.
	RunRegex string
	Kernels  []string
	MustRun  []string
}

// ExtraRun is a package whose tests run only on some kernels, with their
// own -test.run, and whose named tests must have run there: passed, not
// skipped (a skip fails the kernel's column, with the skip's reason). The
// matrix uses it for internal/cni's netkit tests in the 6.12 VM, the only
// matrix kernel with netkit, where a skip would otherwise read as a pass.
type ExtraRun struct {
	Package  string   // one package (import path or ./dir)
	RunRegex string   // -test.run in that package
	Kernels  []string // kernel names (HostKernel, KernelSpec.Name) it runs on
	MustRun  []string // top-level tests that must pass on those kernels
}

// Runner builds test binaries once and runs them on the host and in VMs.
type Runner struct {
	Go          string   // go tool, default "go"
	Packages    []string // go package patterns, e.g. ./internal/datapath
	RunRegex    string   // -test.run
	TestTimeout time.Duration
	CacheRoot   string
	OutDir      string // per-kernel outputs and console logs land here
	Boot        BootMode
	Modules     []string
	Refresh     bool
	Console     io.Writer // live serial console, optional
	Log         *slog.Logger
	// Lab adds the single-node lab subset in VMs (axon lab up --nodes 1, check, down) as
	// the pseudo tests LabUp, LabCheck, LabDown. It needs the cached control plane
	// (make deps). The host column never runs it: the host's lab is `make test`'s.
	Lab bool
	// NICs gives each VM two virtio-net NICs wired back to back (see VM.NICPorts); run.sh
	// exports their MACs as AXON_VM_NIC_MACS so tests can find and use them.
	NICs bool
	// TwoVM adds the two-VM subset per VM kernel: two VMs, one axon node each (agent, CNI,
	// one pod; the first VM also runs etcd + kube-apiserver), joined by a virtio-net link,
	// with cross-node pod-to-pod probes (hack/vm/twonode), reported as the package "twovm".
	// It needs the cached control plane (make deps).
	TwoVM bool
	// TwoVMKernels limits the two-VM subset to these kernels (empty: every VM kernel).
	TwoVMKernels []string
	// Env is exported in the guest's run.sh (KEY=VALUE; hack/vm -env): knobs for tests
	// such as the datapath benchmark.
	Env []string
	// LabDevice is the lab subset's `axon lab up --device` (default auto: netkit pods
	// where the kernel has netkit, veth elsewhere).
	LabDevice string
	// LabNodes is the lab subset's `axon lab up --nodes` (default 1; 2 adds cross-node
	// pod-to-pod over the lab's wire to the check).
	LabNodes int
	// ICount boots the VMs with instruction counting (VM.ICount): durations measured in
	// the guest count guest instructions. run.sh exports AXON_VM_ICOUNT=1.
	ICount bool
	// MultiThreadTCG boots the VMs with one host thread per vCPU (VM.MultiThreadTCG).
	MultiThreadTCG bool
	// Extra are packages run only on some kernels (ExtraRun).
	Extra []ExtraRun
	// MustRun names top-level tests of Packages that must pass on every
	// kernel, not skip (hack/vm -must-run; meant for one package).
	MustRun []string

	labBins   bool
	twoVMBins bool

	runDir string
}

func (r *Runner) goTool() string {
	if r.Go != "" {
		return r.Go
	}
	return "go"
}

// Build compiles the packages' test binaries (CGO_ENABLED=0, static) into a fresh run dir.
// Call Close to remove it.
func (r *Runner) Build(ctx context.Context) ([]TestBinary, error) {
	dir, err := os.MkdirTemp("", "axt-vm-run-")
	if err != nil {
		return nil, err
	}
	r.runDir = dir
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		return nil, err
	}
	list := exec.CommandContext(ctx, r.goTool(), append([]string{"list", "-f", "{{.ImportPath}}\t{{.Dir}}\t{{len .TestGoFiles}}"}, r.Packages...)...)
	var stderr bytes.Buffer
	list.Stderr = &stderr
	out, err := list.Output()
	if err != nil {
		return nil, fmt.Errorf("go list %s: %w: %s", strings.Join(r.Packages, " "), err, stderr.String())
	}
	var bins []TestBinary
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, "\t")
		if len(f) != 3 || f[2] == "0" {
			continue
		}
		name := strings.ReplaceAll(strings.TrimPrefix(f[0], modulePath+"/"), "/", "_") + ".test"
		b := TestBinary{Package: f[0], Dir: f[1], Name: name, Binary: filepath.Join(dir, "bin", name), MustRun: r.MustRun}
		start := time.Now()
		cmd := exec.CommandContext(ctx, r.goTool(), "test", "-c", "-o", b.Binary, b.Package)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("go test -c %s: %w\n%s", b.Package, err, out)
		}
		r.Log.Info("built test binary", "package", b.Package, "took", time.Since(start).Round(time.Millisecond))
		bins = append(bins, b)
	}
	for _, x := range r.Extra {
		b, err := r.buildExtra(ctx, dir, x)
		if err != nil {
			return nil, err
		}
		bins = append(bins, b)
	}
	if len(bins) == 0 && !r.Lab && !r.TwoVM {
		return nil, fmt.Errorf("no package with tests in %s", strings.Join(r.Packages, " "))
	}
	if r.Lab || r.TwoVM {
		start := time.Now()
		// import paths, not ./dirs: the runner also runs from a package dir (TestKernelMatrix)
		pkgs := []string{modulePath + "/cmd/axon", modulePath + "/cmd/axon-agent", modulePath + "/cmd/axon-cni"}
		if r.TwoVM {
			pkgs = append(pkgs, modulePath+"/hack/vm/twonode")
		}
		cmd := exec.CommandContext(ctx, r.goTool(), append([]string{"build", "-trimpath", "-o", filepath.Join(dir, "bin") + "/"}, pkgs...)...)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("go build ./cmd/... for the lab subset: %w\n%s", err, out)
		}
		r.labBins = r.Lab
		r.twoVMBins = r.TwoVM
		r.Log.Info("built axon binaries for the lab subsets", "packages", strings.Join(pkgs, " "), "took", time.Since(start).Round(time.Millisecond))
	}
	return bins, nil
}

// buildExtra builds the test binary of an ExtraRun as <pkg>-only.test (a
// name of its own, so the package may also be in Packages).
func (r *Runner) buildExtra(ctx context.Context, dir string, x ExtraRun) (TestBinary, error) {
	if len(x.Kernels) == 0 {
		return TestBinary{}, fmt.Errorf("extra run of %s: no kernels given", x.Package)
	}
	var stderr bytes.Buffer
	list := exec.CommandContext(ctx, r.goTool(), "list", "-f", "{{.ImportPath}}\t{{.Dir}}", x.Package)
	list.Stderr = &stderr
	out, err := list.Output()
	f := strings.Split(strings.TrimSpace(string(out)), "\t")
	if err != nil || len(f) != 2 {
		return TestBinary{}, fmt.Errorf("go list %s: %v: %s", x.Package, err, stderr.String())
	}
	name := strings.ReplaceAll(strings.TrimPrefix(f[0], modulePath+"/"), "/", "_") + "-only.test"
	b := TestBinary{Package: f[0], Dir: f[1], Name: name, Binary: filepath.Join(dir, "bin", name),
		RunRegex: x.RunRegex, Kernels: x.Kernels, MustRun: x.MustRun}
	start := time.Now()
	cmd := exec.CommandContext(ctx, r.goTool(), "test", "-c", "-o", b.Binary, b.Package)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return TestBinary{}, fmt.Errorf("go test -c %s: %w\n%s", b.Package, err, out)
	}
	r.Log.Info("built test binary", "package", b.Package, "run", x.RunRegex, "kernels", strings.Join(x.Kernels, ","), "took", time.Since(start).Round(time.Millisecond))
	return b, nil
}

// forKernel is bins without the extra runs meant for other kernels.
func forKernel(bins []TestBinary, kernel string) []TestBinary {
	var out []TestBinary
	for _, b := range bins {
		if len(b.Kernels) == 0 || slices.Contains(b.Kernels, kernel) {
			out = append(out, b)
		}
	}
	return out
}

// checkMustRun fails pr where a test b.MustRun names did not pass: skipped
// (with its reason) or absent.
func checkMustRun(pr *PackageResult, b TestBinary, kernel string) {
	for _, name := range b.MustRun {
		why := "it did not run (no such test, or -test.run " + b.RunRegex + " excludes it)"
		for _, tr := range pr.Tests {
			if tr.Name != name {
				continue
			}
			switch tr.Outcome {
			case Pass:
				why = ""
			case Skip:
				why = "it was skipped: " + tr.Reason
			default:
				why = "" // its own failure is already counted
			}
		}
		if why != "" {
			pr.Tests = append(pr.Tests, TestResult{Name: name + "/must-run", Outcome: Fail,
				Reason: fmt.Sprintf("%s must run on %s, but %s", name, kernel, why)})
		}
	}
}

// Close removes the run dir.
func (r *Runner) Close() error {
	if r.runDir == "" {
		return nil
	}
	return os.RemoveAll(r.runDir)
}

func (r *Runner) testArgs(b TestBinary) []string {
	args := []string{"-test.v=test2json", "-test.count=1"}
	if r.TestTimeout > 0 {
		args = append(args, "-test.timeout="+r.TestTimeout.String())
	}
	if re := cmp.Or(b.RunRegex, r.RunRegex); re != "" {
		args = append(args, "-test.run="+re)
	}
	return args
}

// RunHost runs the binaries on this machine, each in its package dir.
func (r *Runner) RunHost(ctx context.Context, bins []TestBinary) KernelRun {
	kr := KernelRun{Kernel: HostKernel, Accel: "-", Release: hostRelease()}
	start := time.Now()
	for _, b := range forKernel(bins, HostKernel) {
		cmd := exec.CommandContext(ctx, b.Binary, r.testArgs(b)...)
		cmd.Dir = b.Dir
		if abs, err := filepath.Abs(filepath.Join(r.OutDir, HostKernel)); err == nil && os.MkdirAll(abs, 0o755) == nil {
			cmd.Env = append(os.Environ(), "AXON_RESULTS="+abs)
		}
		if len(r.Env) > 0 { // hack/vm -env
			if cmd.Env == nil {
				cmd.Env = os.Environ()
			}
			cmd.Env = append(cmd.Env, r.Env...)
		}
		t0 := time.Now()
		raw, err := cmd.CombinedOutput()
		took := time.Since(t0)
		code := 0
		if err != nil {
			code = -1
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			}
		}
		pr, err := r.collect(ctx, HostKernel, b, raw, code)
		if err != nil {
			kr.Err = err
			break
		}
		checkMustRun(&pr, b, HostKernel)
		pr.Elapsed = took
		kr.Packages = append(kr.Packages, pr)
	}
	kr.Total = time.Since(start)
	return kr
}

// collect saves the raw output and parses it.
func (r *Runner) collect(ctx context.Context, kernel string, b TestBinary, raw []byte, code int) (PackageResult, error) {
	dir := filepath.Join(r.OutDir, kernel)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return PackageResult{}, err
	}
	js, err := Test2JSON(ctx, r.goTool(), b.Package, raw)
	if err != nil {
		return PackageResult{}, err
	}
	_ = os.WriteFile(filepath.Join(dir, strings.TrimSuffix(b.Name, ".test")+".json"), js, 0o644)
	return ParseTestJSON(b.Package, bytes.NewReader(js), code)
}

func hostRelease() string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(b))
}

// shellQuote quotes s for /bin/sh.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// RunScript is the guest's run.sh: each binary in its package dir (visible read-only
// through the host root share), output to /run/axon-vm/out and the console.
func (r *Runner) RunScript(bins []TestBinary) string {
	var s strings.Builder
	s.WriteString("#!/bin/sh\n# generated by internal/vmtest: runs inside the VM, chrooted into the host's root\n")
	s.WriteString("export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin TMPDIR=/run/tmp HOME=/root\n")
	if r.CacheRoot != "" {
		fmt.Fprintf(&s, "export AXON_CACHE=%s\n", shellQuote(r.CacheRoot))
	}
	if r.NICs {
		s.WriteString("export AXON_VM_NIC_MACS=52:54:00:a0:00:01,52:54:00:a0:00:02\n")
	}
	// Tests may stretch their deadlines by AXON_TEST_SLOWDOWN (CPU work under TCG is 3-12x
	// slower than on the host, more when the host is busy); AXON_VM says they run in a VM.
	fmt.Fprintf(&s, "export AXON_VM=1 AXON_TEST_SLOWDOWN=%d\n", Slowdown(HardwareKVM()))
	if r.ICount && !HardwareKVM() {
		s.WriteString("export AXON_VM_ICOUNT=1\n") // the guest's clock counts instructions (VM.ICount)
	}
	// Reports tests write (the verifier's verifier-<kernel>.{md,json}) come back through the share.
	s.WriteString("export AXON_RESULTS=/run/axon-vm/out/results\n")
	for _, kv := range r.Env { // hack/vm -env
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			fmt.Fprintf(&s, "export %s=%s\n", k, shellQuote(v))
		}
	}
	s.WriteString("mkdir -p /run/axon-vm/out/results\nrc=0\n")
	for _, b := range bins {
		base := "/run/axon-vm/out/" + strings.TrimSuffix(b.Name, ".test")
		args := []string{shellQuote("/run/axon-vm/bin/" + b.Name)}
		for _, a := range r.testArgs(b) {
			args = append(args, shellQuote(a))
		}
		fmt.Fprintf(&s, "echo 'AXON-VM-PKG %s'\n", b.Package)
		fmt.Fprintf(&s, "cd %s || exit 120\n", shellQuote(b.Dir))
		s.WriteString("t0=$(date +%s%N)\n")
		fmt.Fprintf(&s, "{ %s 2>&1; echo $? >%s.rc; } | tee %s.txt\n", strings.Join(args, " "), base, base)
		fmt.Fprintf(&s, "echo $(( ($(date +%%s%%N) - t0) / 1000000 )) >%s.ms\n", base)
		fmt.Fprintf(&s, "[ \"$(cat %s.rc)\" = 0 ] || rc=1\n", base)
	}
	if r.labBins {
		s.WriteString(r.labSubsetScript()) // labdevice.go
	}
	s.WriteString("exit $rc\n")
	return s.String()
}

// labScript runs the single-node lab subset as pseudo tests in `go test -v` format, so the
// same parser reads it. Each step's log is indented under its result line.
const labScript = `echo 'AXON-VM-PKG lab'
labstep() {
	name=$1; shift
	echo "=== RUN   $name"
	t0=$(date +%s)
	if "$@" >/run/axon-vm/out/$name.log 2>&1; then r=PASS; else r=FAIL; labrc=1; fi
	tail -n 40 /run/axon-vm/out/$name.log | sed 's/^/    /'
	echo "--- $r: $name ($(( $(date +%s) - t0 )).00s)"
	[ $r = PASS ]
}
labrc=0
` + labDeviceFunc + `{
	if labstep LabUp /run/axon-vm/bin/axon lab up --nodes @NODES@ --pods-per-node 2 --device @DEVICE@ --bin-dir /run/axon-vm/bin --ready-timeout 6m; then
		labstep LabStatus /run/axon-vm/bin/axon lab status
		labstep LabDevice labdevice @DEVICE@ @NODES@
		labstep LabCheck /run/axon-vm/bin/axon lab check --timeout 10s
	fi
	labstep LabDown /run/axon-vm/bin/axon lab down
	# go test's closing line: test2json reports the last test only once it sees it.
	if [ $labrc = 0 ]; then echo PASS; else echo FAIL; fi
	echo "rc=$labrc" >/run/axon-vm/out/lab.rc.tmp
} | tee /run/axon-vm/out/lab.txt
[ "$(cat /run/axon-vm/out/lab.rc.tmp)" = rc=0 ] && echo 0 >/run/axon-vm/out/lab.rc || { echo 1 >/run/axon-vm/out/lab.rc; rc=1; }
`

// RunVM fetches the kernel, builds the initramfs and runs the binaries in a VM, then the
// two-VM subset on that kernel when it is asked for.
func (r *Runner) RunVM(ctx context.Context, spec KernelSpec, bins []TestBinary) KernelRun {
	kv := r.runVM(ctx, spec, bins, r.Console, nil)
	r.twoVMAfter(ctx, &kv)
	return kv.KernelRun
}

// RunVMs runs the binaries on every kernel of specs, as RunVM does. With parallel, the
// kernels' VMs run at the same time, each in its own run dir (single-threaded TCG keeps
// each VM on one host core: on a 2-core host two kernels take the time of the slower one,
// not the sum), and a kernel's two-VM subset (two VMs) starts as soon as any kernel's
// single VM has finished and its own kernel is booted: a core freed by the shorter kernel
// runs the subset beside the longer kernel's VM instead of idling until it is done.
func (r *Runner) RunVMs(ctx context.Context, specs []KernelSpec, bins []TestBinary, parallel bool) []KernelRun {
	kvs := make([]kernelVM, len(specs))
	if !parallel {
		for i, spec := range specs {
			kvs[i] = r.runVM(ctx, spec, bins, r.Console, nil)
			r.twoVMAfter(ctx, &kvs[i])
		}
	} else {
		// booted[i] is closed when kernel i's single VM boots (boots[i] then holds its
		// kernel, initramfs and run dir, and later its two-VM subset's result) or its run
		// ends without a boot
		booted := make([]chan struct{}, len(specs))
		boots := make([]kernelVM, len(specs))
		oneDone := make(chan struct{})
		var doneOnce sync.Once
		var wg sync.WaitGroup
		for i, spec := range specs {
			booted[i] = make(chan struct{})
			var bootOnce sync.Once
			var console io.Writer // live consoles, one prefix per kernel
			if r.Console != nil {
				console = prefixWriter{prefix: "[" + spec.Name + "] ", w: r.Console}
			}
			wg.Go(func() {
				kvs[i] = r.runVM(ctx, spec, bins, console, func(k *Kernel, initrd, dir string) {
					boots[i] = kernelVM{spec: spec, kernel: k, initrd: initrd, dir: dir}
					bootOnce.Do(func() { close(booted[i]) })
				})
				bootOnce.Do(func() { close(booted[i]) })
				doneOnce.Do(func() { close(oneDone) })
			})
			if !r.wantsTwoVM(spec) {
				continue
			}
			wg.Go(func() {
				<-booted[i]
				select {
				case <-oneDone:
				case <-ctx.Done():
					return
				}
				r.twoVMAfter(ctx, &boots[i])
			})
		}
		wg.Wait()
		for i := range kvs { // the two-VM subsets' results (nothing where none ran)
			kvs[i].Total += boots[i].Total
			kvs[i].Packages = append(kvs[i].Packages, boots[i].Packages...)
			kvs[i].Err = errors.Join(kvs[i].Err, boots[i].Err)
		}
	}
	runs := make([]KernelRun, len(kvs))
	for i := range kvs {
		runs[i] = kvs[i].KernelRun
	}
	return runs
}

// kernelVM is one kernel's single-VM run and what its two-VM subset reuses.
type kernelVM struct {
	KernelRun
	spec   KernelSpec
	kernel *Kernel // nil when the run failed before booting
	initrd string
	dir    string // the kernel's run dir (kernelDir)
}

// wantsTwoVM says whether the two-VM subset runs on spec's kernel: the runner has its
// binaries and the kernel is one of TwoVMKernels (all when empty).
func (r *Runner) wantsTwoVM(spec KernelSpec) bool {
	return r.twoVMBins && (len(r.TwoVMKernels) == 0 || slices.Contains(r.TwoVMKernels, spec.Name))
}

// twoVMAfter runs the two-VM subset on kv's kernel when wantsTwoVM, and adds its result
// to kv.
func (r *Runner) twoVMAfter(ctx context.Context, kv *kernelVM) {
	if !r.wantsTwoVM(kv.spec) || kv.kernel == nil || ctx.Err() != nil {
		return
	}
	pr, err := r.runTwoVM(ctx, kv.spec, kv.kernel, kv.initrd, kv.dir)
	kv.Total += pr.Elapsed
	if len(pr.Tests) > 0 || err == nil {
		kv.Packages = append(kv.Packages, pr)
	}
	if err != nil {
		kv.Err = errors.Join(kv.Err, err)
	}
}

// kernelDir makes a fresh run dir for the VMs of one kernel (the guest's /run/axon-vm:
// run.sh, out/, the initramfs) with hard links to the test and axon binaries Build put in
// the shared bin/, so VMs of different kernels can run at once without sharing a file.
func (r *Runner) kernelDir(name string) (string, error) {
	dir := filepath.Join(r.runDir, "vm-"+name)
	if err := os.RemoveAll(dir); err != nil {
		return "", fmt.Errorf("clear the run dir of %s: %w", name, err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		return "", fmt.Errorf("run dir of %s: %w", name, err)
	}
	ents, err := os.ReadDir(filepath.Join(r.runDir, "bin"))
	if err != nil {
		return "", fmt.Errorf("run dir of %s: %w", name, err)
	}
	for _, e := range ents {
		src, dst := filepath.Join(r.runDir, "bin", e.Name()), filepath.Join(dir, "bin", e.Name())
		if err := os.Link(src, dst); err != nil {
			if err := copyFile(src, dst); err != nil {
				return "", fmt.Errorf("run dir of %s: %w", name, err)
			}
		}
	}
	return dir, nil
}

// copyFile copies src to dst as an executable (kernelDir, where a hard link fails).
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// runVM is RunVM without the two-VM subset, with the live console (if any) to console;
// onBoot (if not nil) is called with the kernel, initramfs and run dir as the VM boots.
func (r *Runner) runVM(ctx context.Context, spec KernelSpec, bins []TestBinary, console io.Writer,
	onBoot func(k *Kernel, initrd, dir string)) kernelVM {
	bins = forKernel(bins, spec.Name)
	kv := kernelVM{spec: spec}
	kr := &kv.KernelRun
	*kr = KernelRun{Kernel: spec.Name, Accel: VM{ICount: r.ICount, MultiThreadTCG: r.MultiThreadTCG}.AccelName("tcg")}
	if HardwareKVM() {
		kr.Accel = "kvm"
	}
	f := &Fetcher{CacheRoot: r.CacheRoot, Refresh: r.Refresh, Log: r.Log}
	_, cacheErr := f.Cached(spec)
	kr.Cached = cacheErr == nil && !r.Refresh
	start := time.Now()
	k, err := f.Fetch(ctx, spec)
	kr.Fetch = time.Since(start)
	if err != nil {
		kr.Err = fmt.Errorf("fetch %s: %w", spec.Name, err)
		return kv
	}
	kr.Release = k.Release

	dir, err := r.kernelDir(spec.Name)
	if err != nil {
		kr.Err = err
		return kv
	}
	keep := filepath.Join(dir, "keep-host-tmp")
	for _, b := range bins {
		if strings.HasPrefix(b.Dir, "/tmp/") {
			if err := os.WriteFile(keep, nil, 0o644); err != nil {
				kr.Err = err
				return kv
			}
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "run.sh"), []byte(r.RunScript(bins)), 0o755); err != nil {
		kr.Err = err
		return kv
	}
	modules := r.Modules
	if len(modules) == 0 {
		modules = DefaultModules()
	}
	initrd := filepath.Join(dir, "initramfs.cpio.gz")
	info, err := Initramfs{Kernel: k, Modules: modules}.Build(ctx, initrd)
	if err != nil {
		kr.Err = err
		return kv
	}
	r.Log.Info("booting VM", "kernel", spec.Name, "release", k.Release, "accel", kr.Accel,
		"modules", len(info.Loaded), "missing optional", strings.Join(info.Missing, ","), "initramfs KiB", info.Size>>10)

	timeout := 30 * time.Minute
	if r.TestTimeout > 0 {
		timeout = time.Duration(len(bins))*r.TestTimeout + 2*time.Minute
	}
	vm := VM{Kernel: k, Initramfs: initrd, RunDir: dir, Timeout: timeout, Boot: r.Boot, Console: console, ICount: r.ICount,
		MultiThreadTCG: r.MultiThreadTCG}
	if r.NICs {
		if vm.NICPorts, err = FreeUDPPorts(); err != nil {
			kr.Err = err
			return kv
		}
	}
	stopPressure := mirrorHostPressure(ctx, dir, time.Second) // the guest reads the host's CPU pressure
	if onBoot != nil {
		onBoot(k, initrd, dir)
	}
	res, runErr := vm.Run(ctx)
	r.Log.Info("host CPU pressure during the VM run", "kernel", spec.Name, "some_avg10", summarizePressure(stopPressure()))
	kr.Boot, kr.Shell, kr.Total, kr.Console = res.BootTime, res.ShellTime, res.Total, res.Console
	if res.BootRetries > 0 {
		r.Log.Warn("guest kernel crashed before init and was booted again (console.log has both boots)",
			"kernel", spec.Name, "retries", res.BootRetries)
	}
	if err := os.MkdirAll(filepath.Join(r.OutDir, spec.Name), 0o755); err == nil {
		_ = os.WriteFile(filepath.Join(r.OutDir, spec.Name, "console.log"), []byte(res.Console), 0o644)
	}
	for _, b := range bins {
		base := filepath.Join(dir, "out", strings.TrimSuffix(b.Name, ".test"))
		raw, err := os.ReadFile(base + ".txt")
		if err != nil {
			continue // never started: runErr says why
		}
		code := -1
		if rc, err := os.ReadFile(base + ".rc"); err == nil {
			if n, err := strconv.Atoi(strings.TrimSpace(string(rc))); err == nil {
				code = n
			}
		}
		pr, err := r.collect(ctx, spec.Name, b, raw, code)
		if err != nil {
			kr.Err = err
			return kv
		}
		checkMustRun(&pr, b, spec.Name)
		if ms, err := os.ReadFile(base + ".ms"); err == nil {
			if n, err := strconv.Atoi(strings.TrimSpace(string(ms))); err == nil {
				pr.Elapsed = time.Duration(n) * time.Millisecond
			}
		}
		kr.Packages = append(kr.Packages, pr)
	}
	copyDir(filepath.Join(dir, "out", "results"), filepath.Join(r.OutDir, spec.Name))
	if r.labBins {
		if pr, err := r.collectLab(ctx, spec.Name, dir); err == nil {
			kr.Packages = append(kr.Packages, pr)
		} else if runErr == nil {
			kr.Err = err
		}
	}
	if runErr != nil {
		kr.Err = fmt.Errorf("%w\n--- console (last 60 lines, full log in %s) ---\n%s", runErr,
			filepath.Join(r.OutDir, spec.Name, "console.log"), tail(res.Console, 60))
	}
	kv.kernel, kv.initrd, kv.dir = k, initrd, dir
	return kv
}

// collectLab parses the lab subset's output of a VM run.
func (r *Runner) collectLab(ctx context.Context, kernel, dir string) (PackageResult, error) {
	base := filepath.Join(dir, "out", "lab")
	raw, err := os.ReadFile(base + ".txt")
	if err != nil {
		return PackageResult{}, fmt.Errorf("lab subset left no output: %w", err)
	}
	code := -1
	if rc, err := os.ReadFile(base + ".rc"); err == nil {
		code, _ = strconv.Atoi(strings.TrimSpace(string(rc)))
	}
	pr, err := r.collect(ctx, kernel, TestBinary{Package: "lab", Name: "lab.test"}, raw, code)
	pr.Elapsed = 0
	for _, t := range pr.Tests {
		pr.Elapsed += t.Elapsed
	}
	return pr, err
}

// copyDir copies the regular files of src (if any) into dst; best effort (reports only).
func copyDir(src, dst string) {
	ents, err := os.ReadDir(src)
	if err != nil {
		return
	}
	_ = os.MkdirAll(dst, 0o755)
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		if b, err := os.ReadFile(filepath.Join(src, e.Name())); err == nil {
			_ = os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644)
		}
	}
}
