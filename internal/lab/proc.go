package lab

import (
	"syscall"
	"time"

	"github.com/axonhq/axon/internal/proc"
)

// killPIDs SIGKILLs the given PIDs (processes found inside lab namespaces or
// cgroups) and waits briefly for them to go away.
func killPIDs(pids []int) {
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	for _, pid := range pids {
		for range 100 {
			if proc.Exited(pid) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}
