// Package proc starts detached processes and later finds, stops and inspects
// them again by PID, guarded against PID reuse by the start time the kernel
// records for each process (/proc/<pid>/stat field 22).
package proc

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

	"golang.org/x/sys/unix"
)

// Record identifies a detached process. StartTime (clock ticks since boot,
// /proc/<pid>/stat field 22) guards against PID reuse: a Record never signals
// a PID whose start time differs.
type Record struct {
	PID       int    `json:"pid"`
	StartTime uint64 `json:"startTime"`
	Log       string `json:"log,omitempty"`
}

// Named is a detached process as a state file keeps it (JSON): its Record,
// the name it was started under, and its command line and environment, so
// that a later run can tell whether the running one is still the one it
// wants.
type Named struct {
	Name string `json:"name"`
	Record
	Args []string `json:"args"`
	Env  []string `json:"env,omitempty"`
}

// Spec describes a process to start detached.
type Spec struct {
	Argv []string // program and arguments
	Env  []string // environment; nil inherits this process's
	// Log receives stdout and stderr (appended; its directory is created).
	Log string
	// Banner, when not empty, is appended to Log before the process starts.
	Banner string
	// ExtraFiles are the child's fds 3, 4, ... (e.g. a VM guest's tap for QEMU).
	ExtraFiles []*os.File
}

// Start starts s.Argv in its own session with stdin /dev/null and stdout and
// stderr appended to s.Log. The process outlives the caller. The returned
// channel is closed when the process exits while the caller is still its
// parent: a goroutine reaps it, so a stopped child never lingers as a zombie
// (long-lived callers such as tests would otherwise collect them).
func Start(s Spec) (Record, <-chan struct{}, error) {
	if len(s.Argv) == 0 {
		return Record{}, nil, errors.New("start: empty command")
	}
	if err := os.MkdirAll(filepath.Dir(s.Log), 0o755); err != nil {
		return Record{}, nil, fmt.Errorf("create log dir: %w", err)
	}
	logf, err := os.OpenFile(s.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return Record{}, nil, fmt.Errorf("open log %s: %w", s.Log, err)
	}
	defer logf.Close()
	if s.Banner != "" {
		if _, err := logf.WriteString(s.Banner); err != nil {
			return Record{}, nil, fmt.Errorf("write log %s: %w", s.Log, err)
		}
	}
	cmd := exec.Command(s.Argv[0], s.Argv[1:]...)
	cmd.Env = s.Env
	cmd.ExtraFiles = s.ExtraFiles
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return Record{}, nil, fmt.Errorf("start %s: %w", strings.Join(s.Argv, " "), err)
	}
	r := Record{PID: cmd.Process.Pid, Log: s.Log}
	// Read the start time before anything reaps the child: until then even a
	// process that exited at once is still a zombie with a readable stat.
	_, r.StartTime, err = Stat(r.PID)
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return Record{}, nil, fmt.Errorf("start %s: read start time of pid %d (see %s): %w", s.Argv[0], r.PID, s.Log, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	return r, exited, nil
}

// Stat returns the state letter (field 3) and the start time (field 22) of
// /proc/<pid>/stat. A missing process yields the os.ReadFile error.
func Stat(pid int) (state byte, start uint64, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	state, start, err = parseStat(b)
	if err != nil {
		return 0, 0, fmt.Errorf("parse /proc/%d/stat: %w", pid, err)
	}
	return state, start, nil
}

func parseStat(b []byte) (state byte, start uint64, err error) {
	// comm may contain spaces and parentheses: fields start after the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, errors.New("no ')' after comm")
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); field 22 (starttime) is f[19].
	if len(f) < 20 {
		return 0, 0, fmt.Errorf("%d fields after comm, want at least 20", len(f))
	}
	start, err = strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("starttime: %w", err)
	}
	return f[0][0], start, nil
}

// exited reports whether a process in this state has finished (zombie or dead).
func exited(state byte) bool { return state == 'Z' || state == 'X' }

// Exited reports whether pid is gone, a zombie or dead. Unlike Alive it does
// not compare start times: it is for PIDs found a moment ago.
func Exited(pid int) bool {
	state, _, err := Stat(pid)
	return err != nil || exited(state)
}

// Alive reports whether r is still the process it records (same PID and start
// time) and has not exited. A nil Record is not alive.
func (r *Record) Alive() bool {
	if r == nil || r.PID <= 0 {
		return false
	}
	state, start, err := Stat(r.PID)
	return err == nil && start == r.StartTime && !exited(state)
}

// Stop sends SIGTERM, waits up to grace, then sends SIGKILL and waits again.
// Stopping a nil Record, a process that is already gone, or a PID that now
// belongs to another process (different start time) is a no-op.
func (r *Record) Stop(grace time.Duration) error {
	if !r.Alive() {
		return nil
	}
	if err := syscall.Kill(r.PID, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("SIGTERM pid %d: %w", r.PID, err)
	}
	if r.waitGone(grace) {
		return nil
	}
	if err := syscall.Kill(r.PID, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("SIGKILL pid %d: %w", r.PID, err)
	}
	if !r.waitGone(5 * time.Second) {
		return fmt.Errorf("pid %d still running after SIGKILL", r.PID)
	}
	return nil
}

// waitGone polls until r is no longer alive or d has passed.
func (r *Record) waitGone(d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		if !r.Alive() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// LogTail returns the last n lines of the file at path (without the final
// newline), for error messages.
func LogTail(path string, n int) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n"), nil
}

// StartTime is when pid started (/proc/<pid>/stat field 22: clock ticks of
// CLOCK_BOOTTIME at start, Linux ≥ 5.5), at the kernel's 10 ms resolution.
// It is the process's age on CLOCK_BOOTTIME subtracted from now, not
// /proc/stat's btime (whole seconds: up to a second off).
func StartTime(pid int) (time.Time, error) {
	_, ticks, err := Stat(pid)
	if err != nil {
		return time.Time{}, err
	}
	var ts unix.Timespec
	now := time.Now()
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return time.Time{}, fmt.Errorf("read CLOCK_BOOTTIME: %w", err)
	}
	age := time.Duration(ts.Nano()) - time.Duration(ticks)*10*time.Millisecond // USER_HZ is 100 on Linux
	return now.Add(-age), nil
}
