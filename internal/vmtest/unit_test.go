package vmtest

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseDepends(t *testing.T) {
	cases := []struct {
		desc, in, want, wantErr string
	}{
		{desc: "trixie", in: "linux-image-amd64\n  Depends: linux-image-6.12.117+deb13-amd64\n", want: "linux-image-6.12.117+deb13-amd64"},
		{desc: "bookworm with extra lines", in: "linux-image-amd64\n  Depends: linux-image-6.1.0-56-amd64\n  Recommends: foo\n", want: "linux-image-6.1.0-56-amd64"},
		{desc: "no kernel", in: "linux-image-amd64\n  Depends: something-else\n", wantErr: "no linux-image-*"},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			got, err := parseDepends([]byte(c.in))
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err = %v, want %q", err, c.wantErr)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("got %q, %v; want %q", got, err, c.want)
			}
		})
	}
	if v := fieldValue([]byte("Package: x\nVersion: 6.12.117-1\nArchitecture: amd64\n"), "Version"); v != "6.12.117-1" {
		t.Errorf("fieldValue Version = %q", v)
	}
}

func TestLookupKernel(t *testing.T) {
	if s, err := LookupKernel("debian-6.1"); err != nil || s.Suite != "bookworm" {
		t.Errorf("debian-6.1 → %+v, %v", s, err)
	}
	if _, err := LookupKernel("debian-5.10"); err == nil || !strings.Contains(err.Error(), "debian-6.12") {
		t.Errorf("unknown kernel error should list the known ones, got %v", err)
	}
}

const sampleDep = `kernel/fs/9p/9p.ko.xz: kernel/net/9p/9pnet.ko.xz kernel/fs/netfs/netfs.ko.xz
kernel/net/9p/9pnet.ko.xz:
kernel/fs/netfs/netfs.ko.xz:
kernel/net/9p/9pnet_virtio.ko.xz: kernel/net/9p/9pnet.ko.xz
kernel/drivers/net/virtio_net.ko.xz: kernel/drivers/net/net_failover.ko.xz kernel/net/core/failover.ko.xz
kernel/drivers/net/net_failover.ko.xz: kernel/net/core/failover.ko.xz
kernel/net/core/failover.ko.xz:
kernel/net/sched/sch_fq.ko.xz:
`

func TestResolveModules(t *testing.T) {
	idx, err := parseModuleIndex([]byte(sampleDep), []byte("kernel/drivers/net/netkit.ko\nkernel/drivers/virtio/virtio_pci.ko\n"))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		desc        string
		wanted      []string
		order, miss []string
		wantErr     string
	}{
		{desc: "deps first", wanted: []string{"9p"}, order: []string{"9pnet", "netfs", "9p"}},
		{desc: "shared deps once", wanted: []string{"9p", "9pnet_virtio"}, order: []string{"9pnet", "netfs", "9p", "9pnet_virtio"}},
		{desc: "nested deps", wanted: []string{"virtio_net"}, order: []string{"failover", "net_failover", "virtio_net"}},
		{desc: "builtin skipped", wanted: []string{"netkit", "virtio_pci?", "sch_fq"}, order: []string{"sch_fq"}},
		{desc: "dash equals underscore", wanted: []string{"sch-fq"}, order: []string{"sch_fq"}},
		{desc: "optional missing", wanted: []string{"br_netfilter?", "sch_fq"}, order: []string{"sch_fq"}, miss: []string{"br_netfilter"}},
		{desc: "required missing", wanted: []string{"ip_vs"}, wantErr: "neither a module nor built in"},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			order, miss, err := idx.Resolve(c.wanted)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err = %v, want %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(order, c.order) || !reflect.DeepEqual(miss, c.miss) {
				t.Fatalf("order %v missing %v; want %v %v", order, miss, c.order, c.miss)
			}
		})
	}
	if p, ok := idx.Path("9pnet_virtio"); !ok || p != "kernel/net/9p/9pnet_virtio.ko.xz" {
		t.Errorf("Path(9pnet_virtio) = %q, %v", p, ok)
	}
}

// TestCPIOReadableByCpio checks the archive with GNU cpio, the reference reader.
func TestCPIOReadableByCpio(t *testing.T) {
	if _, err := exec.LookPath("cpio"); err != nil {
		t.Skip("cpio not installed (hack/install-packages.sh vm)")
	}
	var buf bytes.Buffer
	w := NewCPIOWriter(&buf)
	w.Dir("bin", 0o755)
	w.File("bin/hello", 0o755, []byte("#!/bin/sh\necho hi\n"))
	w.Symlink("bin/sh", "busybox")
	w.File("odd-size", 0o644, []byte("abcde"))
	w.CharDev("console", 0o600, 5, 1)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if buf.Len()%4 != 0 {
		t.Errorf("archive length %d not 4-aligned", buf.Len())
	}
	cmd := exec.Command("cpio", "-itv", "--quiet")
	cmd.Stdin = &buf
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("cpio -itv: %v\n%s", err, out)
	}
	for _, want := range []string{"bin\n", "bin/hello\n", "bin/sh -> busybox", "odd-size\n", "console\n"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("cpio listing lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(string(out), "crw-------") || !strings.Contains(string(out), "-rwxr-xr-x") {
		t.Errorf("modes wrong:\n%s", out)
	}
}

// fakeBzImage builds a minimal image with the setup header fields Payload reads.
func fakeBzImage(t *testing.T, payload []byte) []byte {
	t.Helper()
	const setupSects = 3
	img := make([]byte, (setupSects+1)*512)
	img[offSetupSects] = setupSects
	copy(img[offHeaderMagic:], "HdrS")
	binary.LittleEndian.PutUint16(img[offVersion:], 0x20f)
	binary.LittleEndian.PutUint32(img[offPayloadOffset:], 16)
	binary.LittleEndian.PutUint32(img[offPayloadLength:], uint32(len(payload)))
	img = append(img, make([]byte, 16)...) // decompressor stub stand-in
	img = append(img, payload...)
	return append(img, make([]byte, 64)...)
}

func TestExtractVmlinux(t *testing.T) {
	elf := append([]byte{0x7f, 'E', 'L', 'F'}, bytes.Repeat([]byte("kernel"), 1000)...)
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(elf)
	zw.Close()
	sized := func(b []byte) []byte { // the kernel build's _with_size suffix
		return binary.LittleEndian.AppendUint32(append([]byte(nil), b...), uint32(len(elf)))
	}
	compress := func(tool string, args ...string) []byte {
		if _, err := exec.LookPath(tool); err != nil {
			return nil
		}
		cmd := exec.Command(tool, args...)
		cmd.Stdin = bytes.NewReader(elf)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%s: %v", tool, err)
		}
		return out
	}
	cases := []struct {
		desc    string
		payload []byte
		wantErr string
	}{
		{desc: "gzip", payload: gz.Bytes()},
		{desc: "xz", payload: sized(compress("xz", "-c", "--check=crc32"))},
		{desc: "zstd", payload: sized(compress("zstd", "-c", "-q"))},
		{desc: "uncompressed", payload: elf},
		{desc: "unknown compression", payload: []byte("LZ4?garbage"), wantErr: "unknown payload compression"},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			if len(c.payload) <= 4 && c.wantErr == "" {
				t.Skipf("%s tool not installed", c.desc)
			}
			got, err := ExtractVmlinux(context.Background(), fakeBzImage(t, c.payload))
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err = %v, want %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, elf) {
				t.Fatalf("extracted %d bytes, want the %d-byte ELF", len(got), len(elf))
			}
		})
	}
	if _, _, err := Payload([]byte("MZ not a kernel")); err == nil {
		t.Error("Payload accepted a non-bzImage")
	}
}

func TestHasKVMModule(t *testing.T) {
	cases := []struct {
		in   string
		want bool
	}{
		{"kvm_intel 409600 0 - Live 0x0\nkvm 1146880 1 kvm_intel, Live 0x0\n", true},
		{"kvm_amd 200000 0 - Live 0x0\n", true},
		{"kvm 1146880 0 - Live 0x0\nveth 40960 0 - Live 0x0\n", false},
		{"", false},
	}
	for _, c := range cases {
		if got := hasKVMModule([]byte(c.in)); got != c.want {
			t.Errorf("hasKVMModule(%q) = %v", c.in, got)
		}
	}
}

// rawOutput is what a test binary prints with -test.v=test2json (markers are ^V).
const rawOutput = "\x16=== RUN   TestA\n\x16--- PASS: TestA (0.01s)\n" +
	"\x16=== RUN   TestB\n    b_test.go:12: netkit: creating a netkit device failed: operation not supported\n\x16--- SKIP: TestB (0.00s)\n" +
	"\x16=== RUN   TestC\n\x16=== RUN   TestC/sub\n    c_test.go:40: want 1, got 2\n        stdout:\n        more detail\n\x16--- FAIL: TestC/sub (0.20s)\n\x16--- FAIL: TestC (0.20s)\n" +
	"\x16=== RUN   TestD\npanic: boom\n"

func TestParseTestOutput(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("go tool not in PATH")
	}
	js, err := Test2JSON(context.Background(), "go", "example.com/p", []byte(rawOutput))
	if err != nil {
		t.Fatal(err)
	}
	res, err := ParseTestJSON("example.com/p", bytes.NewReader(js), 2)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]TestResult{}
	for _, tr := range res.Tests {
		got[tr.Name] = tr
	}
	cases := []struct {
		name   string
		out    Outcome
		reason string
	}{
		{"TestA", Pass, ""},
		{"TestB", Skip, "netkit: creating a netkit device failed: operation not supported"},
		{"TestC/sub", Fail, "want 1, got 2"},
		{"TestC", Fail, ""},
		{"TestD", Fail, "did not finish (panic, timeout or crash)"},
	}
	for _, c := range cases {
		tr, ok := got[c.name]
		if !ok {
			t.Errorf("%s missing from %v", c.name, res.Tests)
			continue
		}
		if tr.Outcome != c.out || (c.reason != "" && tr.Reason != c.reason) {
			t.Errorf("%s = %s %q, want %s %q", c.name, tr.Outcome, tr.Reason, c.out, c.reason)
		}
	}
	if p, f, s := res.Counts(); p != 1 || f != 3 || s != 1 || !res.Failed() {
		t.Errorf("counts %d/%d/%d failed=%v", p, f, s, res.Failed())
	}
}

func TestWriteMatrix(t *testing.T) {
	runs := []KernelRun{
		{Kernel: "host", Release: "6.18", Accel: "-", Total: time.Second, Packages: []PackageResult{{Package: "x/datapath", Tests: []TestResult{
			{Name: "TestTCX", Outcome: Pass}, {Name: "TestNetkit", Outcome: Skip, Reason: "netkit: operation not supported"}}}}},
		{Kernel: "debian-6.1", Release: "6.1.0", Accel: "tcg", Shell: 4 * time.Second, Packages: []PackageResult{{Package: "x/datapath", Tests: []TestResult{
			{Name: "TestTCX", Outcome: Skip, Reason: "tcx not supported (requires >= v6.6)"}, {Name: "TestNetkit", Outcome: Skip, Reason: "netkit: operation not supported"}}}}},
	}
	var b bytes.Buffer
	WriteMatrix(&b, runs)
	out := b.String()
	for _, want := range []string{
		"datapath.TestTCX", "debian-6.1   SKIP datapath.TestTCX: tcx not supported (requires >= v6.6)",
		"\n1 passed, 0 failed, 3 skipped\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("matrix lacks %q:\n%s", want, out)
		}
	}
	if runs[0].Failed() || runs[1].Failed() {
		t.Error("runs without failures reported as failed")
	}
	var md bytes.Buffer
	WriteMarkdown(&md, runs)
	if !strings.Contains(md.String(), "| datapath.TestTCX | pass | skip: tcx not supported (requires >= v6.6) |") {
		t.Errorf("markdown grid wrong:\n%s", md.String())
	}
}

// TestWriteMatrixFailureOutput: a failed test's reason is one line, its
// message may be another (a later t.Log): the matrix prints the tail of
// what each failed test printed, for a bounded number of them.
func TestWriteMatrixFailureOutput(t *testing.T) {
	var tests []TestResult
	for i := range maxFailOutputs + 2 {
		out := fmt.Sprintf("=== RUN   TestF%d\n    x_test.go:10: the bypass differs from the stack:\n        bypass: %d bytes\n    x_test.go:12: proxied: 1048576 bytes\n--- FAIL: TestF%d\n", i, i, i)
		tests = append(tests, TestResult{Name: fmt.Sprintf("TestF%d", i), Outcome: Fail, Output: out, Reason: reasonOf(out)})
	}
	var b bytes.Buffer
	WriteMatrix(&b, []KernelRun{{Kernel: "debian-6.1", Release: "6.1", Accel: "tcg", Packages: []PackageResult{{Package: "x/sockmap", Tests: tests}}}})
	out := b.String()
	for _, want := range []string{
		"debian-6.1   FAIL sockmap.TestF0: proxied: 1048576 bytes\n",
		"debian-6.1 FAIL sockmap.TestF0, its output (last 30 lines):\n",
		"x_test.go:10: the bypass differs from the stack:\n        bypass: 0 bytes\n",
		"debian-6.1: the output of further failed tests is in debian-6.1's outputs\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("matrix lacks %q:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "its output (last"); n != maxFailOutputs {
		t.Errorf("%d failed tests' outputs printed, want %d:\n%s", n, maxFailOutputs, out)
	}
}

// TestWriteMatrixQuietFailure: a kernel that failed with no failed test says why.
func TestWriteMatrixQuietFailure(t *testing.T) {
	pass := []TestResult{{Name: "lab.LabUp", Outcome: Pass}}
	for _, tc := range []struct {
		pkgs []PackageResult
		want string
	}{
		{nil, "FAIL: no test package ran"},
		{[]PackageResult{{Package: "x/internal/vmtest/virtionet"}, {Package: "lab", Tests: pass}},
			"FAIL: no test ran in virtionet (does -run match a test there?)"},
		{[]PackageResult{{Package: "x/datapath", Tests: pass, ExitCode: 2}}, "FAIL: a test binary exited non-zero"},
	} {
		var b bytes.Buffer
		WriteMatrix(&b, []KernelRun{{Kernel: "debian-6.12", Release: "6.12", Accel: "tcg", Packages: tc.pkgs}})
		if !strings.Contains(b.String(), tc.want) {
			t.Errorf("matrix lacks %q:\n%s", tc.want, b.String())
		}
	}
}

func TestRunScriptIsValidShell(t *testing.T) {
	r := &Runner{RunRegex: "TestA|Test'B", TestTimeout: time.Minute}
	s := r.RunScript([]TestBinary{{Package: "github.com/axonhq/axon/internal/datapath", Dir: "/work/it's here", Name: "internal_datapath.test"}})
	path := filepath.Join(t.TempDir(), "run.sh")
	if err := os.WriteFile(path, []byte(s), 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("sh", "-n", path).CombinedOutput(); err != nil {
		t.Fatalf("sh -n: %v\n%s\n%s", err, out, s)
	}
	for _, want := range []string{`'-test.run=TestA|Test'\''B'`, `cd '/work/it'\''s here'`, "'-test.v=test2json'"} {
		if !strings.Contains(s, want) {
			t.Errorf("run.sh lacks %s:\n%s", want, s)
		}
	}
}

// TestICountArgs: TCG is single-threaded unless MultiThreadTCG asks otherwise;
// instruction counting runs single-threaded TCG with a fixed shift and no sleeping
// whatever MultiThreadTCG says; KVM ignores both; run.sh tells the guest.
func TestICountArgs(t *testing.T) {
	k := &Kernel{Vmlinux: "/k/vmlinux"}
	for _, c := range []struct {
		vm        VM
		accel     string
		want, not []string
		name      string
	}{
		{VM{Kernel: k, ICount: true}, "tcg", []string{"-accel tcg,thread=single", "-icount shift=0,sleep=off"}, []string{"thread=multi"}, "tcg-icount"},
		{VM{Kernel: k}, "tcg", []string{"-accel tcg,thread=single"}, []string{"-icount", "thread=multi"}, "tcg"},
		{VM{Kernel: k, MultiThreadTCG: true}, "tcg", []string{"-accel tcg,thread=multi"}, []string{"-icount", "thread=single"}, "tcg-mt"},
		{VM{Kernel: k, MultiThreadTCG: true, ICount: true}, "tcg", []string{"-accel tcg,thread=single", "-icount"}, []string{"thread=multi"}, "tcg-icount"},
		{VM{Kernel: k, MultiThreadTCG: true}, "kvm", []string{"-accel kvm"}, []string{"tcg"}, "kvm"},
		{VM{Kernel: k, ICount: true}, "kvm", []string{"-accel kvm"}, []string{"-icount", "tcg"}, "kvm"},
	} {
		args := strings.Join(c.vm.Args(c.accel), " ")
		for _, w := range c.want {
			if !strings.Contains(args, w) {
				t.Errorf("ICount=%v %s: args lack %q: %s", c.vm.ICount, c.accel, w, args)
			}
		}
		for _, w := range c.not {
			if strings.Contains(args, w) {
				t.Errorf("ICount=%v %s: args contain %q: %s", c.vm.ICount, c.accel, w, args)
			}
		}
		if got := c.vm.AccelName(c.accel); got != c.name {
			t.Errorf("AccelName(%s) with ICount=%v = %q, want %q", c.accel, c.vm.ICount, got, c.name)
		}
	}
	if HardwareKVM() {
		return // run.sh exports nothing under KVM
	}
	for _, on := range []bool{false, true} {
		s := (&Runner{ICount: on}).RunScript(nil)
		if got := strings.Contains(s, "export AXON_VM_ICOUNT=1"); got != on {
			t.Errorf("Runner{ICount: %v}: run.sh exports AXON_VM_ICOUNT: %v", on, got)
		}
	}
}

// TestTwoVMWiring: the two ends of a VM-to-VM link send to each other's port, each VM runs
// its own script and records its exit code in its own file.
func TestTwoVMWiring(t *testing.T) {
	a, b, err := WirePair()
	if err != nil {
		t.Fatal(err)
	}
	if a.LocalPort != b.RemotePort || b.LocalPort != a.RemotePort || a.LocalPort == b.LocalPort || a.MAC == b.MAC {
		t.Fatalf("ends do not mirror each other: %+v %+v", a, b)
	}
	k := &Kernel{Vmlinux: "/k/vmlinux"}
	cases := []struct {
		desc     string
		vm       VM
		want     []string
		notWant  []string
		exitFile string
	}{
		{"single VM, back-to-back NICs", VM{Kernel: k, NICPorts: [2]int{1001, 1002}},
			[]string{"axon.script=run.sh", "udp=127.0.0.1:1002,localaddr=127.0.0.1:1001", "mac=52:54:00:a0:00:02"}, []string{"id=w0"}, "exit-code"},
		{"two-VM end a", VM{Kernel: k, Wire: a, Script: "run-twovm-a.sh", NICPorts: [2]int{1001, 1002}},
			[]string{"axon.script=run-twovm-a.sh", fmt.Sprintf("udp=127.0.0.1:%d,localaddr=127.0.0.1:%d", a.RemotePort, a.LocalPort), "mac=" + a.MAC},
			[]string{"mac=52:54:00:a0:00:01"}, "exit-code.run-twovm-a.sh"},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			args := strings.Join(c.vm.Args("tcg"), " ")
			for _, w := range c.want {
				if !strings.Contains(args, w) {
					t.Errorf("args lack %q: %s", w, args)
				}
			}
			for _, w := range c.notWant {
				if strings.Contains(args, w) {
					t.Errorf("args contain %q: %s", w, args)
				}
			}
			if got := ExitCodeFile(c.vm.Script); got != c.exitFile {
				t.Errorf("ExitCodeFile(%q) = %q, want %q", c.vm.Script, got, c.exitFile)
			}
		})
	}
	r := &Runner{CacheRoot: "/root/.cache/axon"}
	s := r.twoVMScript("a", a)
	path := filepath.Join(t.TempDir(), "run-twovm-a.sh")
	if err := os.WriteFile(path, []byte(s), 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("sh", "-n", path).CombinedOutput(); err != nil {
		t.Fatalf("sh -n: %v\n%s\n%s", err, out, s)
	}
	for _, want := range []string{"-role a", "-mac " + a.MAC, "/run/axon-vm/out/twovm-a.rc", "AXON_CACHE='/root/.cache/axon'"} {
		if !strings.Contains(s, want) {
			t.Errorf("two-VM script lacks %q:\n%s", want, s)
		}
	}
	if Slowdown(true) != 1 || Slowdown(false) < 5 {
		t.Errorf("Slowdown(kvm)=%d, Slowdown(tcg)=%d", Slowdown(true), Slowdown(false))
	}
}

// TestExtraRunsAndMustRun: an extra run reaches only its kernels, with its
// own -test.run, and a must-run test that skipped or never ran fails the
// package with the reason, while one that passed or failed on its own adds
// nothing.
func TestExtraRunsAndMustRun(t *testing.T) {
	r := &Runner{RunRegex: "TestAll"}
	main := TestBinary{Package: "x/datapath", Name: "datapath.test"}
	extra := TestBinary{Package: "x/cni", Name: "cni-only.test", RunRegex: "^TestNetkit", Kernels: []string{"debian-6.12"},
		MustRun: []string{"TestNetkitA", "TestNetkitB", "TestNetkitC", "TestNetkitD"}}
	bins := []TestBinary{main, extra}
	for _, tc := range []struct {
		kernel string
		want   []string
	}{{"debian-6.12", []string{"datapath.test", "cni-only.test"}}, {"debian-6.1", []string{"datapath.test"}}, {HostKernel, []string{"datapath.test"}}} {
		var got []string
		for _, b := range forKernel(bins, tc.kernel) {
			got = append(got, b.Name)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("forKernel(%s) = %v, want %v", tc.kernel, got, tc.want)
		}
	}
	if a := r.testArgs(extra); !slices.Contains(a, "-test.run=^TestNetkit") {
		t.Errorf("extra run's args %v lack its own -test.run", a)
	}
	if a := r.testArgs(main); !slices.Contains(a, "-test.run=TestAll") {
		t.Errorf("main package's args %v lack the runner's -test.run", a)
	}
	pr := PackageResult{Package: "x/cni", Tests: []TestResult{
		{Name: "TestNetkitA", Outcome: Pass},
		{Name: "TestNetkitB", Outcome: Skip, Reason: "netkit_test.go:40: netkit not supported"},
		{Name: "TestNetkitD", Outcome: Fail},
	}}
	checkMustRun(&pr, extra, "debian-6.12")
	var added []string
	for _, tr := range pr.Tests[3:] {
		added = append(added, tr.Name+": "+tr.Reason)
	}
	want := []string{
		"TestNetkitB/must-run: TestNetkitB must run on debian-6.12, but it was skipped: netkit_test.go:40: netkit not supported",
		"TestNetkitC/must-run: TestNetkitC must run on debian-6.12, but it did not run (no such test, or -test.run ^TestNetkit excludes it)",
	}
	if !slices.Equal(added, want) {
		t.Errorf("checkMustRun added\n%s\nwant\n%s", strings.Join(added, "\n"), strings.Join(want, "\n"))
	}
	if _, fail, _ := pr.Counts(); fail != 3 || !pr.Failed() {
		t.Errorf("counts: %d failures (want the test's own and two must-runs), Failed %v", fail, pr.Failed())
	}
}

// TestKernelDirsShareNoFile checks what lets two kernels' VMs run at once:
// each gets its own run dir holding every built binary (hard links to the
// shared bin/), and making a kernel's dir again clears its earlier outputs
// without touching the other kernel's.
func TestKernelDirsShareNoFile(t *testing.T) {
	r := &Runner{runDir: t.TempDir()}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(r.runDir, "bin"), 0o755))
	for _, b := range []string{"internal_datapath.test", "axon-agent"} {
		must(os.WriteFile(filepath.Join(r.runDir, "bin", b), []byte("#!/bin/sh\necho "+b+"\n"), 0o755))
	}
	a, err := r.kernelDir("debian-6.12")
	must(err)
	b, err := r.kernelDir("debian-6.1")
	must(err)
	if a == b || filepath.Dir(a) != r.runDir || filepath.Dir(b) != r.runDir {
		t.Fatalf("kernel dirs %q and %q: want two different dirs in %s", a, b, r.runDir)
	}
	for _, dir := range []string{a, b} {
		for _, name := range []string{"internal_datapath.test", "axon-agent"} {
			fi, err := os.Stat(filepath.Join(dir, "bin", name))
			if err != nil {
				t.Fatalf("%s: %v", dir, err)
			}
			if fi.Mode().Perm()&0o100 == 0 {
				t.Errorf("%s/bin/%s is not executable: %v", dir, name, fi.Mode())
			}
		}
	}
	must(os.MkdirAll(filepath.Join(a, "out"), 0o755))
	must(os.WriteFile(filepath.Join(a, "out", "old.txt"), nil, 0o644))
	must(os.MkdirAll(filepath.Join(b, "out"), 0o755))
	must(os.WriteFile(filepath.Join(b, "out", "other.txt"), nil, 0o644))
	if _, err := r.kernelDir("debian-6.12"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(a, "out", "old.txt")); !os.IsNotExist(err) {
		t.Errorf("an earlier run's output survived a fresh kernel dir: %v", err)
	}
	if _, err := os.Stat(filepath.Join(b, "out", "other.txt")); err != nil {
		t.Errorf("making 6.12's dir again touched 6.1's: %v", err)
	}
}
