// Package cpustat reads CPU time from /proc/stat: how much of the machine's
// CPUs a measurement used, for benchmarks that report work per byte or per
// packet next to throughput.
package cpustat

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// TicksPerSecond is USER_HZ, the unit of /proc/stat (100 on Linux).
const TicksPerSecond = 100

// Times is one "cpu" or "cpuN" line of /proc/stat, in USER_HZ ticks.
type Times struct {
	User, Nice, System, Idle, IOWait, IRQ, SoftIRQ, Steal uint64
}

// Busy is the time the CPU ran code: user (guest time is part of it),
// system, irq and softirq. Idle, iowait and steal (time the hypervisor ran
// someone else) are not.
func (c Times) Busy() uint64 { return c.User + c.Nice + c.System + c.IRQ + c.SoftIRQ }

// Parse returns the line of /proc/stat text stat named name ("cpu" for the
// sum of all CPUs, "cpu3" for one).
func Parse(stat, name string) (Times, error) {
	for _, line := range strings.Split(stat, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != name {
			continue
		}
		if len(f) < 9 {
			return Times{}, fmt.Errorf("/proc/stat line %q: %d fields, want at least 9", name, len(f))
		}
		var v [8]uint64
		for i := range v {
			n, err := strconv.ParseUint(f[i+1], 10, 64)
			if err != nil {
				return Times{}, fmt.Errorf("/proc/stat line %q field %d: %w", name, i+1, err)
			}
			v[i] = n
		}
		return Times{User: v[0], Nice: v[1], System: v[2], Idle: v[3], IOWait: v[4], IRQ: v[5], SoftIRQ: v[6], Steal: v[7]}, nil
	}
	return Times{}, fmt.Errorf("/proc/stat has no line %q", name)
}

// BusyTicks sums the busy ticks of the given CPUs (all CPUs when cpus is
// empty) from /proc/stat text.
func BusyTicks(stat string, cpus []int) (uint64, error) {
	if len(cpus) == 0 {
		c, err := Parse(stat, "cpu")
		return c.Busy(), err
	}
	var sum uint64
	for _, n := range cpus {
		c, err := Parse(stat, "cpu"+strconv.Itoa(n))
		if err != nil {
			return 0, err
		}
		sum += c.Busy()
	}
	return sum, nil
}

// Read returns the current /proc/stat text.
func Read() (string, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return "", fmt.Errorf("read CPU times: %w", err)
	}
	return string(b), nil
}

// ReadBusy reads /proc/stat and returns the busy ticks of cpus (all CPUs
// when empty).
func ReadBusy(cpus []int) (uint64, error) {
	stat, err := Read()
	if err != nil {
		return 0, err
	}
	return BusyTicks(stat, cpus)
}

// ProcessSeconds is a process's user + system CPU time in seconds
// (/proc/<pid>/stat), e.g. a QEMU guest's whole cost.
func ProcessSeconds(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("CPU time of pid %d: %w", pid, err)
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 > len(s) {
		return 0, fmt.Errorf("CPU time of pid %d: malformed stat %q", pid, s)
	}
	f := strings.Fields(s[i+2:]) // from field 3, state
	if len(f) < 13 {
		return 0, fmt.Errorf("CPU time of pid %d: %d fields after the name", pid, len(f))
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("CPU time of pid %d: utime %q, stime %q", pid, f[11], f[12])
	}
	return float64(ut+st) / TicksPerSecond, nil
}
