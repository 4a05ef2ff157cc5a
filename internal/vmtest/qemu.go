package vmtest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// QEMUPath is the emulator binary (Debian package qemu-system-x86).
const QEMUPath = "qemu-system-x86_64"

// QbootPath is the minimal firmware that boots an uncompressed vmlinux via PVH.
const QbootPath = "/usr/share/qemu/qboot.rom"

// BootMode selects how QEMU loads the kernel.
type BootMode string

const (
	// BootPVH boots the uncompressed vmlinux through its PVH entry with qboot (fastest).
	BootPVH BootMode = "pvh"
	// BootBzImage boots vmlinuz with QEMU's default SeaBIOS.
	BootBzImage BootMode = "bzimage"
)

// HardwareKVM reports whether kvm_intel or kvm_amd is loaded per /proc/modules. A bare
// /dev/kvm is not enough: on this machine it is a paravirtual nesting module.
func HardwareKVM() bool {
	b, err := os.ReadFile("/proc/modules")
	if err != nil {
		return false
	}
	return hasKVMModule(b)
}

func hasKVMModule(procModules []byte) bool {
	for _, line := range strings.Split(string(procModules), "\n") {
		name, _, _ := strings.Cut(line, " ")
		if name == "kvm_intel" || name == "kvm_amd" {
			return true
		}
	}
	return false
}

// VM is one QEMU run.
type VM struct {
	Kernel    *Kernel
	Initramfs string
	RunDir    string // host dir shared writable as /run/axon-vm; must contain run.sh
	CPUs      int
	MemoryMiB int
	Timeout   time.Duration
	Boot      BootMode
	Console   io.Writer // optional live copy of the serial console
	// NICPorts, when set, gives the guest two virtio-net NICs (MACs 52:54:00:a0:00:01 and :02)
	// wired back to back through QEMU's UDP socket netdev on these two host loopback ports:
	// native virtio_net for cross-"node" traffic and XDP without touching the host network.
	NICPorts [2]int
	// Wire, when set, gives the guest one virtio-net NIC joined to another VM's Wire NIC
	// (the two-VM subset): each side sends to the other's port. NICPorts is then ignored.
	Wire *WireNIC
	// Script is the file in RunDir that init runs (default "run.sh"); two VMs sharing one
	// RunDir run different scripts. Its exit code lands in ExitCodeFile(Script).
	Script string
	// ICount runs TCG with instruction counting (-icount shift=0,sleep=off): the vCPUs
	// take turns on one host thread, the guest's clock advances 1 ns per instruction any
	// of them executes and jumps over idle time, so a duration measured inside the guest
	// counts the guest's work in it, whatever the host's speed or load. Ignored under KVM.
	ICount bool
	// MultiThreadTCG gives each vCPU its own host thread (-accel tcg,thread=multi) instead
	// of the default single-threaded TCG, where the vCPUs take turns on one host thread.
	// Only for throughput experiments that need two vCPUs really running at once: under
	// multi-threaded TCG (QEMU 7.2) the guest kernel now and then dies with "Oops: int3"
	// when it patches a static key (text_poke_bp) while another vCPU runs that code, which
	// our tests do whenever they attach or detach a program. Single-threaded TCG cannot
	// interleave a vCPU's stale code with another's patching, and runs the kernel matrix
	// in the same wall time on a 2-core host (3m57s vs 4m03s, 20 % less host CPU).
	// Ignored with ICount (always single-threaded) and under KVM.
	MultiThreadTCG bool
}

// AccelName is how a run under accel is reported: kvm, tcg (single-threaded),
// tcg-mt (MultiThreadTCG) or tcg-icount.
func (vm VM) AccelName(accel string) string {
	switch {
	case accel == "tcg" && vm.ICount:
		return "tcg-icount"
	case accel == "tcg" && vm.MultiThreadTCG:
		return "tcg-mt"
	}
	return accel
}

// WireNIC is one end of a point-to-point virtio-net link between two VMs over QEMU's UDP
// socket netdev on host loopback ports: nothing on the host network, no tap, no bridge.
type WireNIC struct {
	LocalPort, RemotePort int
	MAC                   string
}

// WirePair returns the two ends of a fresh VM-to-VM link with MACs 52:54:00:a0:01:01 and :02.
func WirePair() (a, b *WireNIC, err error) {
	p, err := FreeUDPPorts()
	if err != nil {
		return nil, nil, err
	}
	return &WireNIC{LocalPort: p[0], RemotePort: p[1], MAC: "52:54:00:a0:01:01"},
		&WireNIC{LocalPort: p[1], RemotePort: p[0], MAC: "52:54:00:a0:01:02"}, nil
}

// ExitCodeFile is where init records the exit code of script in the run dir.
func ExitCodeFile(script string) string {
	if script == "" || script == "run.sh" {
		return "exit-code"
	}
	return "exit-code." + script
}

func (vm VM) script() string {
	if vm.Script == "" {
		return "run.sh"
	}
	return vm.Script
}

// FreeUDPPorts returns two currently unused UDP ports on 127.0.0.1 for VM.NICPorts.
func FreeUDPPorts() ([2]int, error) {
	var ports [2]int
	var conns []net.PacketConn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := range ports {
		c, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			return ports, fmt.Errorf("pick a loopback UDP port for the VM NICs: %w", err)
		}
		conns = append(conns, c)
		ports[i] = c.LocalAddr().(*net.UDPAddr).Port
	}
	return ports, nil
}

// VMResult is what a run produced.
type VMResult struct {
	Console   string        // whole serial console log
	ExitCode  int           // run.sh's exit code (-1 if it never finished)
	BootTime  time.Duration // QEMU start → init's AXON-VM-BOOTED marker
	ShellTime time.Duration // QEMU start → AXON-VM-BEGIN (shares mounted, command starting)
	Total     time.Duration
	Accel     string
	// BootRetries counts boots repeated because the guest kernel crashed
	// before init started (see Run).
	BootRetries int
}

// Args returns the QEMU command line.
func (vm VM) Args(accel string) []string {
	cpus, mem := vm.CPUs, vm.MemoryMiB
	if cpus <= 0 {
		cpus = 2
	}
	if mem <= 0 {
		mem = 2048
	}
	args := []string{"-nodefaults", "-no-user-config", "-display", "none", "-serial", "stdio",
		"-no-reboot", "-smp", strconv.Itoa(cpus), "-m", strconv.Itoa(mem)}
	if accel == "kvm" {
		args = append(args, "-accel", "kvm", "-cpu", "host")
	} else if vm.ICount {
		args = append(args, "-accel", "tcg,thread=single", "-cpu", "max,-la57", "-icount", "shift=0,sleep=off")
	} else if vm.MultiThreadTCG {
		args = append(args, "-accel", "tcg,thread=multi", "-cpu", "max,-la57")
	} else {
		args = append(args, "-accel", "tcg,thread=single", "-cpu", "max,-la57")
	}
	kernel := vm.Kernel.Vmlinux
	if vm.Boot == BootBzImage {
		kernel = vm.Kernel.Vmlinuz
	} else {
		args = append(args, "-bios", QbootPath)
	}
	args = append(args,
		"-kernel", kernel,
		"-initrd", vm.Initramfs,
		"-append", "console=ttyS0 panic=-1 oops=panic loglevel=4 rdinit=/init axon.script="+vm.script(),
		"-virtfs", "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
		"-virtfs", "local,path="+vm.RunDir+",mount_tag=axonrun,security_model=none,multidevs=remap",
	)
	if w := vm.Wire; w != nil {
		args = append(args,
			"-netdev", fmt.Sprintf("socket,id=w0,udp=127.0.0.1:%d,localaddr=127.0.0.1:%d", w.RemotePort, w.LocalPort),
			"-device", "virtio-net-pci,netdev=w0,mac="+w.MAC)
	} else if p := vm.NICPorts; p[0] != 0 && p[1] != 0 {
		for i := range 2 {
			args = append(args,
				"-netdev", fmt.Sprintf("socket,id=n%d,udp=127.0.0.1:%d,localaddr=127.0.0.1:%d", i, p[1-i], p[i]),
				"-device", fmt.Sprintf("virtio-net-pci,netdev=n%d,mac=52:54:00:a0:00:%02x", i, i+1))
		}
	}
	return args
}

var endRe = regexp.MustCompile(`AXON-VM-END rc=(\d+)`)

// panicMarkers in the console mean the guest kernel died.
var panicMarkers = []string{"Kernel panic", "BUG: kernel NULL pointer", "Oops:"}

// Run boots the VM and waits for it to power off, the timeout, or ctx. An error means
// the run itself failed (panic, hang, no result); the console log is in the result.
//
// A guest kernel that crashes before init printed AXON-VM-BOOTED is booted once
// more (within the same timeout): nothing of ours has run by then, and under
// multi-threaded TCG (MultiThreadTCG) the stock Debian kernels occasionally die in
// early boot (an int3 left by text patching, hit on another vCPU). The first
// attempt's console stays at the top of the result's console log and BootRetries
// says it happened. A crash after init started is never retried.
func (vm VM) Run(ctx context.Context) (VMResult, error) {
	timeout := vm.Timeout
	if timeout <= 0 {
		timeout = 30 * time.Minute
	}
	deadline := time.Now().Add(timeout)
	var earlier string
	for attempt := 0; ; attempt++ {
		res, err := vm.runOnce(ctx, time.Until(deadline))
		res.BootRetries = attempt
		res.Console = earlier + res.Console
		var crash *earlyCrashError
		if attempt > 0 || !errors.As(err, &crash) || time.Until(deadline) < time.Minute {
			return res, err
		}
		note := fmt.Sprintf("AXON-VM: %v before init started; booting again\n", err)
		if vm.Console != nil {
			fmt.Fprint(vm.Console, note)
		}
		earlier = res.Console + note
	}
}

// earlyCrashError is a guest kernel crash before init's AXON-VM-BOOTED marker.
type earlyCrashError struct{ err error }

func (e *earlyCrashError) Error() string { return e.err.Error() }
func (e *earlyCrashError) Unwrap() error { return e.err }

func (vm VM) runOnce(ctx context.Context, timeout time.Duration) (VMResult, error) {
	res := VMResult{ExitCode: -1, Accel: vm.AccelName("tcg")}
	if HardwareKVM() {
		res.Accel = "kvm"
	}
	if _, err := exec.LookPath(QEMUPath); err != nil {
		return res, fmt.Errorf("%s not found: install the VM packages with `hack/install-packages.sh vm`: %w", QEMUPath, err)
	}
	if vm.Boot != BootBzImage {
		if _, err := os.Stat(QbootPath); err != nil {
			return res, fmt.Errorf("qboot firmware missing (package qemu-system-data): %w", err)
		}
	}
	if _, err := os.Stat(filepath.Join(vm.RunDir, vm.script())); err != nil {
		return res, fmt.Errorf("run dir %s has no %s: %w", vm.RunDir, vm.script(), err)
	}
	_ = os.Remove(filepath.Join(vm.RunDir, ExitCodeFile(vm.Script)))
	runCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	cmd := exec.CommandContext(runCtx, QEMUPath, vm.Args(res.Accel)...)
	cmd.WaitDelay = 5 * time.Second
	cmd.Stdin = nil
	// The VM dies with the runner (a test binary killed by go test's -timeout leaves no QEMU behind).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return res, err
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return res, fmt.Errorf("start qemu: %w", err)
	}

	var (
		mu      sync.Mutex
		console bytes.Buffer
		ended   = make(chan struct{})
	)
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		endSeen := false
		for sc.Scan() {
			line := strings.TrimRight(sc.Text(), "\r")
			now := time.Since(start)
			mu.Lock()
			console.WriteString(line + "\n")
			switch {
			case strings.HasPrefix(line, "AXON-VM-BOOTED") && res.BootTime == 0:
				res.BootTime = now
			case strings.HasPrefix(line, "AXON-VM-BEGIN") && res.ShellTime == 0:
				res.ShellTime = now
			}
			mu.Unlock()
			if vm.Console != nil {
				fmt.Fprintln(vm.Console, line)
			}
			if !endSeen && endRe.MatchString(line) {
				endSeen = true
				close(ended)
			}
		}
	}()
	// Once the guest printed its end marker, give it a moment to power off, then stop it.
	go func() {
		select {
		case <-ended:
			select {
			case <-time.After(15 * time.Second):
				cancel()
			case <-runCtx.Done():
			}
		case <-runCtx.Done():
		}
	}()
	<-readDone
	waitErr := cmd.Wait()
	res.Total = time.Since(start)
	mu.Lock()
	res.Console = console.String()
	mu.Unlock()
	if s := strings.TrimSpace(stderr.String()); s != "" {
		res.Console += "[qemu stderr] " + s + "\n"
	}

	for _, m := range panicMarkers {
		if strings.Contains(res.Console, m) {
			err := fmt.Errorf("guest kernel %s crashed (%q in the console)", vm.Kernel.Release, m)
			if res.BootTime == 0 {
				return res, &earlyCrashError{err}
			}
			return res, err
		}
	}
	if b, err := os.ReadFile(filepath.Join(vm.RunDir, ExitCodeFile(vm.Script))); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			res.ExitCode = n
		}
	}
	if res.ExitCode < 0 {
		if m := endRe.FindStringSubmatch(res.Console); m != nil {
			res.ExitCode, _ = strconv.Atoi(m[1])
		}
	}
	if res.ExitCode < 0 {
		switch {
		case errors.Is(runCtx.Err(), context.DeadlineExceeded):
			return res, fmt.Errorf("VM on %s timed out after %s without finishing", vm.Kernel.Release, timeout)
		case ctx.Err() != nil:
			return res, ctx.Err()
		default:
			return res, fmt.Errorf("VM on %s stopped without a result (qemu: %v)", vm.Kernel.Release, waitErr)
		}
	}
	if m := regexp.MustCompile(`AXON-VM-ERROR (.*)`).FindStringSubmatch(res.Console); m != nil {
		return res, fmt.Errorf("VM setup on %s failed: %s", vm.Kernel.Release, m[1])
	}
	return res, nil
}
