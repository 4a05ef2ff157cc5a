package vmguest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/axonhq/axon/internal/vmtest"
)

// Guest is one QEMU guest whose only NIC is a virtio-net device on a tap device the
// caller opened (OpenTap), in whatever netns the tap lives: QEMU itself runs in the
// caller's netns and only holds the tap's fd, as KubeVirt's virt-launcher does.
type Guest struct {
	Kernel    *vmtest.Kernel
	Initramfs string   // Initramfs.Build's output
	Tap       *os.File // the tap's fd (IFF_TAP|IFF_NO_PI|IFF_VNET_HDR); QEMU gets a copy
	MAC       string   // the guest NIC's MAC (KubeVirt gives the guest the pod's MAC)
	CPUs      int      // default 1
	MemoryMiB int      // default 256
	Console   io.Writer
}

// Running is a started guest.
type Running struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	start   time.Time
	accel   string
	mu      sync.Mutex
	console strings.Builder
	lines   chan string // console lines not yet consumed by WaitFor or Run
	done    chan struct{}
	runMu   sync.Mutex
	seq     int
}

// Accel is the accelerator a guest gets here: kvm with hardware KVM, else tcg.
func Accel() string {
	if vmtest.HardwareKVM() {
		return "kvm"
	}
	return "tcg"
}

// QEMUArgv is the guest's whole QEMU command line for a process the caller starts
// itself (detached, e.g. the lab's VM pods): the tap must be the child's fd 3 (its
// first extra file) and the serial console goes to the file consoleLog, where
// nobody types (the boot markers are in the file). commandSock, when not empty, is a
// unix socket where QEMU serves the guest's second serial port (ttyS1), on which
// init runs every line it reads as a shell command: Dial it for a Session.
func (g Guest) QEMUArgv(consoleLog, commandSock string) ([]string, error) {
	if g.Kernel == nil || g.Initramfs == "" || g.MAC == "" || consoleLog == "" {
		return nil, errors.New("vmguest: Kernel, Initramfs, MAC and a console log are required")
	}
	if _, err := exec.LookPath(vmtest.QEMUPath); err != nil {
		return nil, fmt.Errorf("%s not found: install the VM packages with `hack/install-packages.sh vm`: %w", vmtest.QEMUPath, err)
	}
	if _, err := os.Stat(vmtest.QbootPath); err != nil {
		return nil, fmt.Errorf("qboot firmware missing (package qemu-system-data): %w", err)
	}
	argv := append([]string{vmtest.QEMUPath}, g.args(Accel(), "file:"+consoleLog)...)
	if commandSock != "" {
		if strings.ContainsAny(commandSock, ",") {
			return nil, fmt.Errorf("vmguest: command socket %q: QEMU's option syntax cannot hold a comma", commandSock)
		}
		argv = append(argv, "-serial", "unix:"+commandSock+",server=on,wait=off")
	}
	return argv, nil
}

func (g Guest) args(accel, serial string) []string {
	cpus, mem := g.CPUs, g.MemoryMiB
	if cpus <= 0 {
		cpus = 1
	}
	if mem <= 0 {
		mem = 256
	}
	args := []string{"-nodefaults", "-no-user-config", "-display", "none", "-serial", serial,
		"-no-reboot", "-smp", strconv.Itoa(cpus), "-m", strconv.Itoa(mem)}
	if accel == "kvm" {
		args = append(args, "-accel", "kvm", "-cpu", "host")
	} else {
		args = append(args, "-accel", "tcg,thread=single", "-cpu", "max,-la57")
	}
	return append(args,
		"-bios", vmtest.QbootPath,
		"-kernel", g.Kernel.Vmlinux,
		"-initrd", g.Initramfs,
		// no_timer_check: under TCG on a loaded host the kernel's check that the 8254 timer
		// reaches the IO-APIC fails now and then ("IO-APIC + timer doesn't work!", a panic at
		// 0.05 s). Not tsc=reliable: with it the guest's clock ran ~40x fast until it locked up.
		"-append", "console=ttyS0 panic=-1 oops=panic loglevel=4 rdinit=/init quiet mitigations=off no_timer_check",
		// fd 3 is the tap (ExtraFiles[0]); vhost needs /dev/vhost-net, which is optional.
		"-netdev", "tap,id=n0,fd=3,vhost=off",
		"-device", "virtio-net-pci,netdev=n0,mac="+g.MAC,
	)
}

// Start boots the guest and returns at once; WaitReady waits for its network.
func (g Guest) Start(ctx context.Context) (*Running, error) {
	if g.Kernel == nil || g.Initramfs == "" || g.Tap == nil || g.MAC == "" {
		return nil, errors.New("vmguest: Kernel, Initramfs, Tap and MAC are required")
	}
	if _, err := exec.LookPath(vmtest.QEMUPath); err != nil {
		return nil, fmt.Errorf("%s not found: install the VM packages with `hack/install-packages.sh vm`: %w", vmtest.QEMUPath, err)
	}
	if _, err := os.Stat(vmtest.QbootPath); err != nil {
		return nil, fmt.Errorf("qboot firmware missing (package qemu-system-data): %w", err)
	}
	accel := Accel()
	cmd := exec.CommandContext(ctx, vmtest.QEMUPath, g.args(accel, "stdio")...)
	cmd.ExtraFiles = []*os.File{g.Tap}
	cmd.WaitDelay = 5 * time.Second
	// The guest dies with its caller (a test killed by its timeout leaves no QEMU behind).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = cmd.Stdout // QEMU's own complaints land in the console log too
	r := &Running{cmd: cmd, stdin: stdin, accel: accel, lines: make(chan string, 4096), done: make(chan struct{})}
	r.start = time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start qemu: %w", err)
	}
	go func() {
		defer close(r.done)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := strings.TrimRight(sc.Text(), "\r")
			r.mu.Lock()
			r.console.WriteString(line + "\n")
			r.mu.Unlock()
			if g.Console != nil {
				fmt.Fprintln(g.Console, line)
			}
			select {
			case r.lines <- line:
			default: // nobody is reading: the console log keeps it
			}
		}
		_ = cmd.Wait()
	}()
	return r, nil
}

// PID is QEMU's process id.
func (r *Running) PID() int { return r.cmd.Process.Pid }

// Accel is kvm or tcg.
func (r *Running) Accel() string { return r.accel }

// Console returns the whole serial console so far.
func (r *Running) Console() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.console.String()
}

// ErrGuestGone means QEMU exited.
var ErrGuestGone = errors.New("the guest's QEMU exited")

// WaitFor consumes console lines until one starts with prefix and returns it.
func (r *Running) WaitFor(prefix string, timeout time.Duration) (string, error) {
	deadline := time.After(timeout)
	for {
		select {
		case line := <-r.lines:
			if strings.HasPrefix(line, "AXON-GUEST-ERROR") {
				return line, fmt.Errorf("guest: %s", line)
			}
			if strings.HasPrefix(line, prefix) {
				return line, nil
			}
		case <-r.done:
			return "", fmt.Errorf("waiting for %q: %w", prefix, ErrGuestGone)
		case <-deadline:
			return "", fmt.Errorf("no %q on the guest's console within %s", prefix, timeout)
		}
	}
}

// Ready waits for the guest's DHCP lease and its qperf server, and returns the leased
// address (e.g. 10.244.1.5/24) and how long the boot took from QEMU's start.
func (r *Running) Ready(timeout time.Duration) (addr string, boot time.Duration, err error) {
	line, err := r.WaitFor("AXON-GUEST-NET ", timeout)
	if err != nil {
		return "", 0, err
	}
	addr = strings.TrimSpace(strings.TrimPrefix(line, "AXON-GUEST-NET "))
	if _, err := r.WaitFor("AXON-GUEST-READY", timeout); err != nil {
		return addr, 0, err
	}
	return addr, time.Since(r.start), nil
}

// Run runs a shell command in the guest (on its serial console) and returns its output
// and exit code. Kernel messages printed meanwhile end up in the output.
func (r *Running) Run(command string, timeout time.Duration) (string, int, error) {
	r.runMu.Lock()
	defer r.runMu.Unlock()
	r.seq++
	return runCommand(r.stdin, r.lines, r.done, fmt.Sprintf("AXON-GUEST-RC-%d", r.seq), command, timeout)
}

// Stop kills QEMU by its PID and waits for it.
func (r *Running) Stop() {
	if r.cmd.Process != nil {
		_ = r.cmd.Process.Kill()
	}
	select {
	case <-r.done:
	case <-time.After(10 * time.Second):
	}
}

// EchoPort is the guest's TCP echo (busybox nc in init.sh, one cat per connection): the
// port of the lab's echo probes (probe.EchoPort), so a guest answers them like a pod.
const EchoPort = 5657

// WaitReadyFile waits for the boot markers in a console log file (a guest started with
// QEMUArgv) and returns the leased address (e.g. 10.244.1.5/32). alive says whether QEMU
// still runs; a guest that exits, reports AXON-GUEST-ERROR or is not ready by ctx's end is
// an error with the console's last lines.
func WaitReadyFile(ctx context.Context, consoleLog string, alive func() bool) (string, error) {
	for {
		b, _ := os.ReadFile(consoleLog)
		addr, ready, bad := scanMarkers(string(b))
		switch {
		case bad != "":
			return "", fmt.Errorf("guest: %s; console %s:\n%s", bad, consoleLog, lastLines(string(b), 15))
		case ready && addr != "":
			return addr, nil
		case !alive():
			return "", fmt.Errorf("waiting for the guest's lease: %w; console %s:\n%s", ErrGuestGone, consoleLog, lastLines(string(b), 15))
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("no DHCP lease and AXON-GUEST-READY on the guest's console (%s): %w; its last lines:\n%s", consoleLog, ctx.Err(), lastLines(string(b), 15))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// scanMarkers reads a console: the leased address (AXON-GUEST-NET), whether
// AXON-GUEST-READY came, and the first AXON-GUEST-ERROR line.
func scanMarkers(console string) (addr string, ready bool, bad string) {
	for _, line := range strings.Split(console, "\n") {
		line = strings.TrimRight(line, "\r")
		switch {
		case strings.HasPrefix(line, "AXON-GUEST-ERROR"):
			if bad == "" {
				bad = line
			}
		case strings.HasPrefix(line, "AXON-GUEST-NET "):
			addr = strings.TrimSpace(strings.TrimPrefix(line, "AXON-GUEST-NET "))
		case strings.HasPrefix(line, "AXON-GUEST-READY"):
			ready = true
		}
	}
	return addr, ready, bad
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
