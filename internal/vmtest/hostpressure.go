package vmtest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/axonhq/axon/internal/stats"
)

// HostPressureFile is the name, in the run dir (the guest's /run/axon-vm), of
// the mirror of the host's /proc/pressure/cpu that the runner refreshes once
// a second while a VM runs: benchmarks in the guest record the host's CPU
// pressure from it (the guest's own /proc/pressure says nothing about the
// other work competing for the host's cores).
const HostPressureFile = "host-pressure"

// hostPressure mirrors /proc/pressure/cpu into dir/HostPressureFile every
// interval until ctx ends, and keeps the "some avg10" samples.
type hostPressure struct {
	samples []float64
	done    chan struct{}
}

// mirrorHostPressure starts the mirror; stop ends it and returns the samples.
func mirrorHostPressure(ctx context.Context, dir string, interval time.Duration) (stop func() []float64) {
	ctx, cancel := context.WithCancel(ctx)
	hp := &hostPressure{done: make(chan struct{})}
	go func() {
		defer close(hp.done)
		dst := filepath.Join(dir, HostPressureFile)
		for {
			if b, err := os.ReadFile("/proc/pressure/cpu"); err == nil {
				tmp := dst + ".tmp"
				if os.WriteFile(tmp, b, 0o644) == nil {
					_ = os.Rename(tmp, dst)
				}
				if v, ok := parseAvg10(string(b)); ok {
					hp.samples = append(hp.samples, v)
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(interval):
			}
		}
	}()
	return func() []float64 {
		cancel()
		<-hp.done
		return hp.samples
	}
}

// parseAvg10 returns avg10 of the "some" line of /proc/pressure/cpu.
func parseAvg10(s string) (float64, bool) {
	for _, line := range strings.Split(s, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "some" {
			continue
		}
		if v, ok := strings.CutPrefix(f[1], "avg10="); ok {
			x, err := strconv.ParseFloat(v, 64)
			return x, err == nil
		}
	}
	return 0, false
}

// summarizePressure renders samples as "median M % (min–max A–B %, N samples)".
func summarizePressure(v []float64) string {
	if len(v) == 0 {
		return "not available"
	}
	return fmt.Sprintf("median %.1f %% (min–max %.1f–%.1f %%, %d samples)", stats.Median(v), slices.Min(v), slices.Max(v), len(v))
}
