package lab

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// startDetached starts argv as a daemon in its own session with stdout and
// stderr appended to logPath. The process outlives the caller; a goroutine
// reaps it if it exits while the caller is still running (long-lived library
// users such as tests would otherwise collect zombies).
func startDetached(argv []string, env []string, logPath string) (*Proc, error) {
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		return nil, fmt.Errorf("create log dir: %w", err)
	}
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open log %s: %w", logPath, err)
	}
	defer logf.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = env
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", strings.Join(argv, " "), err)
	}
	go cmd.Wait() //nolint:errcheck // reaper only
	st, err := procStartTime(cmd.Process.Pid)
	if err != nil {
		return nil, fmt.Errorf("start %s: process exited at once (see %s): %w", argv[0], logPath, err)
	}
	return &Proc{PID: cmd.Process.Pid, StartTime: st, Log: logPath}, nil
}

// procStat returns the state letter and start time of pid.
func procStat(pid int) (state byte, start uint64, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	// comm may contain spaces and parentheses: fields start after the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return 0, 0, fmt.Errorf("parse /proc/%d/stat: %d fields", pid, len(f))
	}
	// f[0] is field 3 (state); field 22 (starttime) is f[19].
	start, err = strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("parse /proc/%d/stat starttime: %w", pid, err)
	}
	return f[0][0], start, nil
}

func procStartTime(pid int) (uint64, error) {
	_, st, err := procStat(pid)
	return st, err
}

// Alive reports whether p is still the process the lab started and is not a zombie.
func (p *Proc) Alive() bool {
	if p == nil || p.PID <= 0 {
		return false
	}
	state, st, err := procStat(p.PID)
	if err != nil || st != p.StartTime {
		return false
	}
	return state != 'Z' && state != 'X'
}

// stop sends SIGTERM, waits up to grace, then SIGKILL. Stopping a process
// that is already gone (or whose PID was reused) is a no-op.
func (p *Proc) stop(grace time.Duration) error {
	if !p.Alive() {
		return nil
	}
	if err := syscall.Kill(p.PID, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("signal pid %d: %w", p.PID, err)
	}
	deadline := time.Now().Add(grace)
	for time.Now().Before(deadline) {
		if !p.Alive() {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := syscall.Kill(p.PID, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("kill pid %d: %w", p.PID, err)
	}
	for range 100 {
		if !p.Alive() {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("pid %d did not exit after SIGKILL", p.PID)
}

// killPIDs SIGKILLs the given PIDs (processes found inside lab namespaces or
// cgroups) and waits briefly for them to go away.
func killPIDs(pids []int) {
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	for _, pid := range pids {
		for range 100 {
			state, _, err := procStat(pid)
			if err != nil || state == 'Z' || state == 'X' {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}
