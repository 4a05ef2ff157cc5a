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
	"runtime"
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
	// Slots is how many VMs RunVMs runs at once with parallel, and so how many VMs share
	// one kernel's packages (default runtime.NumCPU(): single-threaded TCG keeps one VM
	// on one host core).
	Slots int

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
		bins = append(bins, TestBinary{Package: f[0], Dir: f[1], Name: name, Binary: filepath.Join(dir, "bin", name), MustRun: r.MustRun})
	}
	for _, x := range r.Extra {
		b, err := r.extraBinary(ctx, dir, x)
		if err != nil {
			return nil, err
		}
		bins = append(bins, b)
	}
	if len(bins) == 0 && !r.Lab && !r.TwoVM {
		return nil, fmt.Errorf("no package with tests in %s", strings.Join(r.Packages, " "))
	}
	// One go command per binary, as many at once as the host has cores: compiling and
	// linking one test binary keeps about one core busy (the link most of its time), and
	// the go build cache is safe to share between them.
	jobs := make([]func() error, 0, len(bins)+1)
	for _, b := range bins {
		jobs = append(jobs, func() error {
			start := time.Now()
			cmd := exec.CommandContext(ctx, r.goTool(), "test", "-c", "-o", b.Binary, b.Package)
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
			if out, err := cmd.CombinedOutput(); err != nil {
				return fmt.Errorf("go test -c %s: %w\n%s", b.Package, err, out)
			}
			if b.RunRegex != "" {
				r.Log.Info("built test binary", "package", b.Package, "run", b.RunRegex, "kernels", strings.Join(b.Kernels, ","), "took", time.Since(start).Round(time.Millisecond))
			} else {
				r.Log.Info("built test binary", "package", b.Package, "took", time.Since(start).Round(time.Millisecond))
			}
			return nil
		})
	}
	if r.Lab || r.TwoVM {
		jobs = append(jobs, func() error {
			start := time.Now()
			// import paths, not ./dirs: the runner also runs from a package dir (TestKernelMatrix)
			pkgs := []string{modulePath + "/cmd/axon", modulePath + "/cmd/axon-agent", modulePath + "/cmd/axon-cni"}
			if r.TwoVM {
				pkgs = append(pkgs, modulePath+"/hack/vm/twonode")
			}
			cmd := exec.CommandContext(ctx, r.goTool(), append([]string{"build", "-trimpath", "-o", filepath.Join(dir, "bin") + "/"}, pkgs...)...)
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
			if out, err := cmd.CombinedOutput(); err != nil {
				return fmt.Errorf("go build ./cmd/... for the lab subset: %w\n%s", err, out)
			}
			r.Log.Info("built axon binaries for the lab subsets", "packages", strings.Join(pkgs, " "), "took", time.Since(start).Round(time.Millisecond))
			return nil
		})
	}
	start := time.Now()
	if err := runLimited(jobs, runtime.NumCPU()); err != nil {
		return nil, err
	}
	r.labBins = r.Lab
	r.twoVMBins = r.TwoVM
	r.Log.Info("built the binaries for the VMs", "binaries", len(jobs), "at once", min(len(jobs), runtime.NumCPU()), "took", time.Since(start).Round(time.Millisecond))
	return bins, nil
}

// extraBinary is the test binary of an ExtraRun (built with the others by Build), named
// <pkg>-only.test so the package may also be in Packages.
func (r *Runner) extraBinary(ctx context.Context, dir string, x ExtraRun) (TestBinary, error) {
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
	return TestBinary{Package: f[0], Dir: f[1], Name: name, Binary: filepath.Join(dir, "bin", name),
		RunRegex: x.RunRegex, Kernels: x.Kernels, MustRun: x.MustRun}, nil
}

// runLimited runs jobs, at most n at once, and returns the first error (the other jobs
// still finish: each is a go command that ends on its own).
func runLimited(jobs []func() error, n int) error {
	sem := make(chan struct{}, max(n, 1))
	errs := make([]error, len(jobs))
	var wg sync.WaitGroup
	for i, job := range jobs {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			errs[i] = job()
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
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
	s.WriteString("mkdir -p /run/axon-vm/out/results /run/axon-vm/out/claim\nrc=0\n")
	// The kernel's VMs share this script and its run dir: each job goes to the VM whose
	// mkdir of its claim dir succeeds first (atomic on the host through 9p), and the jobs
	// are listed the most expensive first, so the VMs end close together.
	if r.labBins {
		s.WriteString("if mkdir /run/axon-vm/out/claim/lab 2>/dev/null; then\n")
		s.WriteString(r.labSubsetScript()) // labdevice.go
		s.WriteString("fi\n")
	}
	for _, b := range costliestFirst(bins) {
		base := "/run/axon-vm/out/" + strings.TrimSuffix(b.Name, ".test")
		args := []string{shellQuote("/run/axon-vm/bin/" + b.Name)}
		for _, a := range r.testArgs(b) {
			args = append(args, shellQuote(a))
		}
		fmt.Fprintf(&s, "if mkdir %s 2>/dev/null; then\n", shellQuote("/run/axon-vm/out/claim/"+b.Name))
		fmt.Fprintf(&s, "echo 'AXON-VM-PKG %s'\n", b.Package)
		fmt.Fprintf(&s, "cd %s || exit 120\n", shellQuote(b.Dir))
		s.WriteString("t0=$(date +%s%N)\n")
		fmt.Fprintf(&s, "{ %s 2>&1; echo $? >%s.rc; } | tee %s.txt\n", strings.Join(args, " "), base, base)
		fmt.Fprintf(&s, "echo $(( ($(date +%%s%%N) - t0) / 1000000 )) >%s.ms\n", base)
		fmt.Fprintf(&s, "[ \"$(cat %s.rc)\" = 0 ] || rc=1\n", base)
		s.WriteString("fi\n")
	}
	s.WriteString("exit $rc\n")
	return s.String()
}

// costliestFirst orders bins by vmCost, the most expensive first (stable otherwise).
func costliestFirst(bins []TestBinary) []TestBinary {
	out := slices.Clone(bins)
	slices.SortStableFunc(out, func(a, b TestBinary) int { return cmp.Compare(vmCost(b.Package), vmCost(a.Package)) })
	return out
}

// vmCost is the wall time in seconds a package's tests took in the 6.12 VM of CI's
// TestKernelMatrix (TCG, 2026-11-27), 10 for a package not listed. Only the order of the
// VMs' queue uses it: the long packages go first so no VM starts one near the end.
func vmCost(pkg string) int {
	switch strings.TrimPrefix(pkg, modulePath+"/") {
	case "internal/datapath/nodeport":
		return 161
	case "internal/datapath/sockmap":
		return 158
	case "internal/datapath/podpath":
		return 95
	case "internal/datapath/vmbypass":
		return 89
	case "internal/datapath/fuzz":
		return 30
	case "internal/cni":
		return 23
	case "internal/datapath/socklb":
		return 13
	case "internal/verifier":
		return 11
	case "internal/datapath":
		return 10
	case "internal/vmtest/virtionet":
		return 5
	case "internal/datapath/bandwidth", "internal/datapath/drops":
		return 2
	}
	return 10
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
	kv := r.prepareKernel(ctx, spec, bins, 1)
	if kv.kernel != nil {
		r.runShard(ctx, kv, 0, r.Console)
	}
	r.finishKernel(ctx, kv)
	r.twoVMAfter(ctx, kv)
	return kv.KernelRun
}

// RunVMs runs the binaries on every kernel of specs, as RunVM does. With parallel, up to
// Slots VMs run at once (default: one per host core; single-threaded TCG keeps each VM on
// one core) and each kernel gets that many VMs, which take its packages from one queue
// (RunScript), the most expensive first: the kernels run one after the other, each on
// every core, and its VMs end within about one short package of each other. The two-VM
// subsets (two VMs each) follow once two slots are free. Without parallel, one VM per
// kernel, one kernel after the other, each followed by its two-VM subset.
func (r *Runner) RunVMs(ctx context.Context, specs []KernelSpec, bins []TestBinary, parallel bool) []KernelRun {
	kvs := make([]*kernelVM, len(specs))
	if !parallel {
		for i, spec := range specs {
			kvs[i] = r.prepareKernel(ctx, spec, bins, 1)
			if kvs[i].kernel != nil {
				r.runShard(ctx, kvs[i], 0, r.Console)
			}
			r.finishKernel(ctx, kvs[i])
			r.twoVMAfter(ctx, kvs[i])
		}
	} else {
		slots := cmp.Or(r.Slots, runtime.NumCPU())
		for i, spec := range specs {
			kvs[i] = r.prepareKernel(ctx, spec, bins, slots)
		}
		// The dispatcher starts the VMs in order, each once a slot is free.
		sem := make(chan struct{}, slots)
		var wg sync.WaitGroup
		for _, kv := range kvs {
			for shard := range kv.shards {
				sem <- struct{}{}
				if ctx.Err() != nil {
					<-sem
					break
				}
				var console io.Writer // live consoles, one prefix per VM
				if r.Console != nil {
					console = prefixWriter{prefix: "[" + kv.shardName(shard) + "] ", w: r.Console}
				}
				wg.Go(func() {
					defer func() { <-sem }()
					r.runShard(ctx, kv, shard, console)
				})
			}
		}
		wg.Wait()
		for _, kv := range kvs {
			r.finishKernel(ctx, kv)
		}
		for _, kv := range kvs { // every slot is free again: a two-VM subset's two VMs have a core each
			r.twoVMAfter(ctx, kv)
		}
	}
	runs := make([]KernelRun, len(kvs))
	for i := range kvs {
		runs[i] = kvs[i].KernelRun
	}
	return runs
}

// kernelVM is one kernel's run: its VMs (shards) running the test binaries, and what
// its two-VM subset reuses.
type kernelVM struct {
	KernelRun
	spec   KernelSpec
	kernel *Kernel // nil when the run failed before booting
	initrd string
	dir    string // the kernel's run dir (kernelDir)
	bins   []TestBinary
	vm     VM // what the shards share; each gets its own script, NIC ports and console
	shards []shardRun

	mu           sync.Mutex
	running      int
	stopPressure func() []float64
	pressure     []float64
}

// shardRun is one VM of a kernel.
type shardRun struct {
	res        VMResult
	err        error
	start, end time.Time
}

// shardScript is the run script of a kernel's VM number i: run.sh, run-1.sh, ... (the
// same content; init.sh writes each VM's exit code to a file named after its script).
func shardScript(i int) string {
	if i == 0 {
		return "run.sh"
	}
	return fmt.Sprintf("run-%d.sh", i)
}

// shardName names a kernel's VM in logs: the kernel, with #i when it has several VMs.
func (kv *kernelVM) shardName(i int) string {
	if len(kv.shards) < 2 {
		return kv.spec.Name
	}
	return fmt.Sprintf("%s#%d", kv.spec.Name, i)
}

// twoVMAfter runs the two-VM subset on kv's kernel when the runner has it and the kernel
// is one of TwoVMKernels, and adds its result to kv.
func (r *Runner) twoVMAfter(ctx context.Context, kv *kernelVM) {
	if !r.twoVMBins || kv.kernel == nil || ctx.Err() != nil ||
		(len(r.TwoVMKernels) > 0 && !slices.Contains(r.TwoVMKernels, kv.spec.Name)) {
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

// prepareKernel fetches the kernel and prepares its run dir for vms VMs (at most one per
// binary): run scripts, initramfs, the VM settings they share.
func (r *Runner) prepareKernel(ctx context.Context, spec KernelSpec, bins []TestBinary, vms int) *kernelVM {
	bins = forKernel(bins, spec.Name)
	kv := &kernelVM{spec: spec, bins: bins}
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
	jobs := len(bins)
	if r.labBins {
		jobs++
	}
	vms = max(1, min(vms, jobs))
	script := r.RunScript(bins)
	for i := range vms {
		if err := os.WriteFile(filepath.Join(dir, shardScript(i)), []byte(script), 0o755); err != nil {
			kr.Err = err
			return kv
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, "out", "claim"), 0o755); err != nil {
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
	r.Log.Info("kernel ready", "kernel", spec.Name, "release", k.Release, "accel", kr.Accel, "VMs", vms,
		"modules", len(info.Loaded), "missing optional", strings.Join(info.Missing, ","), "initramfs KiB", info.Size>>10)

	// Each VM may be the one that takes every package (the other died or started late).
	timeout := 30 * time.Minute
	if r.TestTimeout > 0 {
		timeout = time.Duration(len(bins))*r.TestTimeout + 2*time.Minute
	}
	kv.vm = VM{Kernel: k, Initramfs: initrd, RunDir: dir, Timeout: timeout, Boot: r.Boot, ICount: r.ICount,
		MultiThreadTCG: r.MultiThreadTCG}
	kv.shards = make([]shardRun, vms)
	kv.kernel, kv.initrd, kv.dir = k, initrd, dir
	return kv
}

// runShard boots VM number i of kv's kernel and waits for it, with the live console (if
// any) to console. The kernel's VMs mirror the host's CPU pressure into its run dir while
// any of them runs.
func (r *Runner) runShard(ctx context.Context, kv *kernelVM, i int, console io.Writer) {
	sh := &kv.shards[i]
	sh.start = time.Now()
	defer func() { sh.end = time.Now() }()
	vm := kv.vm
	vm.Script, vm.Console = shardScript(i), console
	if r.NICs {
		var err error
		if vm.NICPorts, err = FreeUDPPorts(); err != nil {
			sh.err = err
			return
		}
	}
	kv.mu.Lock()
	if kv.running == 0 {
		kv.stopPressure = mirrorHostPressure(ctx, kv.dir, time.Second) // the guest reads the host's CPU pressure
	}
	kv.running++
	kv.mu.Unlock()
	r.Log.Info("booting VM", "vm", kv.shardName(i), "release", kv.Release, "accel", kv.Accel)
	sh.res, sh.err = vm.Run(ctx)
	kv.mu.Lock()
	if kv.running--; kv.running == 0 {
		kv.pressure = append(kv.pressure, kv.stopPressure()...)
	}
	kv.mu.Unlock()
	if sh.res.BootRetries > 0 {
		r.Log.Warn("guest kernel crashed before init and was booted again (its console log has both boots)",
			"vm", kv.shardName(i), "retries", sh.res.BootRetries)
	}
	r.Log.Info("VM done", "vm", kv.shardName(i), "took", sh.res.Total.Round(time.Millisecond))
}

// finishKernel collects what kv's VMs left in its run dir: every binary's test output,
// the reports, the lab subset, the consoles (one console.log, the VMs one after the other).
func (r *Runner) finishKernel(ctx context.Context, kv *kernelVM) {
	kr := &kv.KernelRun
	if kv.kernel == nil {
		return
	}
	if len(kv.pressure) > 0 {
		r.Log.Info("host CPU pressure during the VM run", "kernel", kv.spec.Name, "some_avg10", summarizePressure(kv.pressure))
	}
	var first, last time.Time
	var consoles strings.Builder
	var runErrs []error
	for i, sh := range kv.shards {
		if sh.start.IsZero() {
			runErrs = append(runErrs, fmt.Errorf("%s never started", kv.shardName(i)))
			continue
		}
		if first.IsZero() || sh.start.Before(first) {
			first = sh.start
		}
		if sh.end.After(last) {
			last = sh.end
		}
		if i == 0 {
			kr.Boot, kr.Shell = sh.res.BootTime, sh.res.ShellTime
		}
		if len(kv.shards) > 1 {
			fmt.Fprintf(&consoles, "=== AXON-VM console of %s ===\n", kv.shardName(i))
		}
		consoles.WriteString(sh.res.Console)
		if sh.err != nil {
			runErrs = append(runErrs, fmt.Errorf("%s: %w\n--- console (last 60 lines, full log in %s) ---\n%s", kv.shardName(i), sh.err,
				filepath.Join(r.OutDir, kv.spec.Name, "console.log"), tail(sh.res.Console, 60)))
		}
	}
	kr.Total, kr.Console = last.Sub(first), consoles.String()
	if err := os.MkdirAll(filepath.Join(r.OutDir, kv.spec.Name), 0o755); err == nil {
		_ = os.WriteFile(filepath.Join(r.OutDir, kv.spec.Name, "console.log"), []byte(kr.Console), 0o644)
	}
	for _, b := range kv.bins {
		base := filepath.Join(kv.dir, "out", strings.TrimSuffix(b.Name, ".test"))
		raw, err := os.ReadFile(base + ".txt")
		if err != nil {
			continue // never started: the run errors say why
		}
		code := -1
		if rc, err := os.ReadFile(base + ".rc"); err == nil {
			if n, err := strconv.Atoi(strings.TrimSpace(string(rc))); err == nil {
				code = n
			}
		}
		pr, err := r.collect(ctx, kv.spec.Name, b, raw, code)
		if err != nil {
			kr.Err = err
			return
		}
		checkMustRun(&pr, b, kv.spec.Name)
		if ms, err := os.ReadFile(base + ".ms"); err == nil {
			if n, err := strconv.Atoi(strings.TrimSpace(string(ms))); err == nil {
				pr.Elapsed = time.Duration(n) * time.Millisecond
			}
		}
		kr.Packages = append(kr.Packages, pr)
	}
	copyDir(filepath.Join(kv.dir, "out", "results"), filepath.Join(r.OutDir, kv.spec.Name))
	if r.labBins {
		if pr, err := r.collectLab(ctx, kv.spec.Name, kv.dir); err == nil {
			kr.Packages = append(kr.Packages, pr)
		} else if len(runErrs) == 0 {
			kr.Err = err
		}
	}
	if len(runErrs) > 0 {
		kr.Err = errors.Join(runErrs...)
	}
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
