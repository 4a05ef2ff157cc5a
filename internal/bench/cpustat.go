package bench

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// cpuTimes is one "cpu" or "cpuN" line of /proc/stat, in USER_HZ ticks
// (clkTck per second).
type cpuTimes struct {
	User, Nice, System, Idle, IOWait, IRQ, SoftIRQ, Steal uint64
}

// Busy is the time the CPU ran code: user (guest time is part of it),
// system, irq and softirq. Idle, iowait and steal (time the hypervisor ran
// someone else) are not.
func (c cpuTimes) Busy() uint64 { return c.User + c.Nice + c.System + c.IRQ + c.SoftIRQ }

// parseCPUTimes returns the line of /proc/stat named name ("cpu" for the
// sum of all CPUs, "cpu3" for one).
func parseCPUTimes(stat, name string) (cpuTimes, error) {
	for _, line := range strings.Split(stat, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != name {
			continue
		}
		if len(f) < 9 {
			return cpuTimes{}, fmt.Errorf("/proc/stat line %q: %d fields, want at least 9", name, len(f))
		}
		var v [8]uint64
		for i := range v {
			n, err := strconv.ParseUint(f[i+1], 10, 64)
			if err != nil {
				return cpuTimes{}, fmt.Errorf("/proc/stat line %q field %d: %w", name, i+1, err)
			}
			v[i] = n
		}
		return cpuTimes{User: v[0], Nice: v[1], System: v[2], Idle: v[3], IOWait: v[4], IRQ: v[5], SoftIRQ: v[6], Steal: v[7]}, nil
	}
	return cpuTimes{}, fmt.Errorf("/proc/stat has no line %q", name)
}

// cpuBusyTicks sums the busy ticks of the given CPUs (all CPUs when cpus is
// empty) from the /proc/stat text.
func cpuBusyTicks(stat string, cpus []int) (uint64, error) {
	if len(cpus) == 0 {
		c, err := parseCPUTimes(stat, "cpu")
		return c.Busy(), err
	}
	var sum uint64
	for _, n := range cpus {
		c, err := parseCPUTimes(stat, "cpu"+strconv.Itoa(n))
		if err != nil {
			return 0, err
		}
		sum += c.Busy()
	}
	return sum, nil
}

// readCPUBusy reads /proc/stat and returns the busy ticks of cpus (all CPUs
// when empty).
func readCPUBusy(cpus []int) (uint64, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, fmt.Errorf("read CPU times: %w", err)
	}
	return cpuBusyTicks(string(b), cpus)
}
