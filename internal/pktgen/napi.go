package pktgen

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// ThreadedNAPI moves the NAPI instances of dev, in the named network
// namespace, from softirq context into kernel threads of their own
// (/sys/class/net/<dev>/threaded = 1, Linux ≥ 5.12) and returns those
// threads' PIDs. A thread's CPU time (CPUTime) is then exactly what the
// device's receive processing cost, wherever it is pinned (Pin).
//
// dev must already have NAPI: a veth has it with an XDP program attached
// or GRO on. sysfs shows the devices of the namespace it was mounted in, so
// the write goes through `ip netns exec`, which mounts a private one.
func ThreadedNAPI(nsName, dev string) ([]int, error) {
	before, err := napiThreads("")
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("ip", "netns", "exec", nsName, "tee", filepath.Join("/sys/class/net", dev, "threaded"))
	cmd.Stdin = strings.NewReader("1\n")
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = nil, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("pktgen: threaded NAPI on %s in %s (needs Linux ≥ 5.12 and NAPI on the device: an XDP program or GRO on a veth): %v: %s",
			dev, nsName, err, strings.TrimSpace(stderr.String()))
	}
	after, err := napiThreads(dev)
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, pid := range after {
		if !slices.Contains(before, pid) {
			pids = append(pids, pid)
		}
	}
	if len(pids) == 0 {
		return nil, fmt.Errorf("pktgen: no new NAPI thread for %s in %s (was it threaded already?)", dev, nsName)
	}
	return pids, nil
}

// napiThreads lists the PIDs of NAPI kernel threads ("napi/<dev>-<id>",
// truncated to the kernel's 15-character comm) of dev, or of every device
// when dev is empty.
func napiThreads(dev string) ([]int, error) {
	prefix := "napi/"
	if dev != "" {
		prefix += dev + "-"
	}
	if len(prefix) > 15 {
		prefix = prefix[:15]
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("pktgen: list /proc: %w", err)
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, err := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		if err == nil && strings.HasPrefix(strings.TrimSpace(string(comm)), prefix) {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// CPUTime is the CPU time a process (a kernel thread is one) has run so far,
// to the nanosecond: its process CPU clock (clock_getcpuclockid(3)).
func CPUTime(pid int) (time.Duration, error) {
	var ts unix.Timespec
	clock := int32(^uint32(pid)<<3 | 2) // MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)
	if err := unix.ClockGettime(clock, &ts); err != nil {
		return 0, fmt.Errorf("pktgen: CPU time of PID %d: %w", pid, err)
	}
	return time.Duration(ts.Nano()), nil
}

// Pin restricts a thread to one CPU.
func Pin(pid, cpu int) error {
	var set unix.CPUSet
	set.Set(cpu)
	if err := unix.SchedSetaffinity(pid, &set); err != nil {
		return fmt.Errorf("pktgen: pin PID %d to CPU %d: %w", pid, cpu, err)
	}
	return nil
}

// SetFIFO gives a thread the real-time class SCHED_FIFO at priority prio
// (1–99), so that it runs as soon as it has work; prio 0 puts it back to
// SCHED_NORMAL.
func SetFIFO(pid, prio int) error {
	attr := unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_FIFO, Priority: uint32(prio)}
	if prio == 0 {
		attr.Policy = unix.SCHED_NORMAL
	}
	if err := unix.SchedSetAttr(pid, &attr, 0); err != nil {
		return fmt.Errorf("pktgen: scheduling class of PID %d (FIFO %d): %w", pid, prio, err)
	}
	return nil
}
