package controlplane

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const pidsFile = "pids.json"

// procRecord identifies one detached process. StartTime (field 22 of /proc/<pid>/stat, in
// clock ticks since boot) guards against signalling an unrelated process that reused the PID.
type procRecord struct {
	Name      string   `json:"name"`
	PID       int      `json:"pid"`
	StartTime uint64   `json:"startTime"`
	Args      []string `json:"args"`
	Log       string   `json:"log"`
}

type pidState struct {
	// Processes in start order (etcd, then kube-apiserver); stopped in reverse.
	Processes []procRecord `json:"processes"`
}

func readPIDs(dir string) (pidState, error) {
	var st pidState
	b, err := os.ReadFile(filepath.Join(dir, pidsFile))
	if errors.Is(err, fs.ErrNotExist) {
		return st, nil
	}
	if err != nil {
		return st, fmt.Errorf("read %s: %w", pidsFile, err)
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("parse %s: %w (stop stray processes by hand, then delete it)", filepath.Join(dir, pidsFile), err)
	}
	return st, nil
}

func writePIDs(dir string, st pidState) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return fmt.Errorf("encode pids: %w", err)
	}
	return writeFileAtomic(filepath.Join(dir, pidsFile), append(b, '\n'), 0o644)
}

// procStartTime returns field 22 (starttime) of /proc/<pid>/stat and whether the process is a
// zombie. The comm field may contain spaces and parentheses, so parse after the last ')'.
func procStartTime(pid int) (start uint64, zombie bool, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false, err
	}
	return parseStat(b)
}

func parseStat(b []byte) (start uint64, zombie bool, err error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false, errors.New("malformed /proc/pid/stat")
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); starttime is field 22 → f[19].
	if len(f) < 20 {
		return 0, false, errors.New("short /proc/pid/stat")
	}
	start, err = strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("parse starttime: %w", err)
	}
	return start, f[0] == "Z" || f[0] == "X", nil
}

// alive reports whether the recorded process still runs (same PID and start time, not a zombie).
func (r procRecord) alive() bool {
	if r.PID <= 0 {
		return false
	}
	start, zombie, err := procStartTime(r.PID)
	return err == nil && !zombie && start == r.StartTime
}

// spawn starts a detached process (own session, stdin /dev/null, stdout+stderr appended to
// logPath). The returned channel is closed when the process exits while this process is still
// its parent (it also reaps it, so a stopped child never lingers as a zombie).
func spawn(name, bin string, args []string, logPath string) (procRecord, <-chan struct{}, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return procRecord{}, nil, fmt.Errorf("open log for %s: %w", name, err)
	}
	defer logf.Close()
	fmt.Fprintf(logf, "\n=== %s start %s: %s %s\n", time.Now().UTC().Format(time.RFC3339), name, bin, strings.Join(args, " "))
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return procRecord{}, nil, fmt.Errorf("start %s (%s): %w", name, bin, err)
	}
	rec := procRecord{Name: name, PID: cmd.Process.Pid, Args: append([]string{bin}, args...), Log: logPath}
	start, _, err := procStartTime(rec.PID)
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return procRecord{}, nil, fmt.Errorf("read start time of %s pid %d: %w", name, rec.PID, err)
	}
	rec.StartTime = start
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	return rec, exited, nil
}

// stopProc sends SIGTERM, waits up to grace, then SIGKILL and waits again. A process that is
// already gone (or whose PID now belongs to another process) is left alone.
func stopProc(r procRecord, grace time.Duration) error {
	if !r.alive() {
		return nil
	}
	if err := syscall.Kill(r.PID, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("SIGTERM %s pid %d: %w", r.Name, r.PID, err)
	}
	if waitGone(r, grace) {
		return nil
	}
	if err := syscall.Kill(r.PID, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("SIGKILL %s pid %d: %w", r.Name, r.PID, err)
	}
	if !waitGone(r, 5*time.Second) {
		return fmt.Errorf("%s pid %d still running after SIGKILL", r.Name, r.PID)
	}
	return nil
}

func waitGone(r procRecord, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		if !r.alive() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// logTail returns the last n lines of a log file, for error messages.
func logTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// portOwner describes who listens on 127.0.0.1:port (or the wildcard address) in this network
// namespace, e.g. "pid 1234 (etcd)", or "" when the port is free or the owner is unknown.
func portOwner(port int) string {
	inodes := map[string]bool{}
	// thread-self: /proc/net follows the main thread's netns, which need not be ours.
	for _, f := range []string{"/proc/thread-self/net/tcp", "/proc/thread-self/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, ino := range listenInodes(b, port) {
			inodes[ino] = true
		}
	}
	if len(inodes) == 0 {
		return ""
	}
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		fds, _ := os.ReadDir(filepath.Join("/proc", p.Name(), "fd"))
		for _, fd := range fds {
			l, err := os.Readlink(filepath.Join("/proc", p.Name(), "fd", fd.Name()))
			if err != nil || !strings.HasPrefix(l, "socket:[") {
				continue
			}
			if inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] {
				comm, _ := os.ReadFile(filepath.Join("/proc", p.Name(), "comm"))
				return fmt.Sprintf("pid %d (%s)", pid, strings.TrimSpace(string(comm)))
			}
		}
	}
	return "an unknown process"
}

// listenInodes parses /proc/net/tcp{,6} content and returns the socket inodes in LISTEN state
// on the given port, bound to loopback or the wildcard address.
func listenInodes(table []byte, port int) []string {
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(table))
	sc.Scan() // header
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 10 || f[3] != "0A" { // 0A = TCP_LISTEN
			continue
		}
		addr, portHex, ok := strings.Cut(f[1], ":")
		if !ok {
			continue
		}
		p, err := strconv.ParseUint(portHex, 16, 16)
		if err != nil || int(p) != port {
			continue
		}
		if !loopbackOrAny(addr) {
			continue
		}
		out = append(out, f[9])
	}
	return out
}

func loopbackOrAny(hexAddr string) bool {
	b, err := hex.DecodeString(hexAddr)
	if err != nil {
		return false
	}
	switch len(b) {
	case 4: // little-endian IPv4: 0100007F = 127.0.0.1
		return b[3] == 127 || (b[0]|b[1]|b[2]|b[3]) == 0
	case 16:
		allZero := true
		for _, x := range b {
			allZero = allZero && x == 0
		}
		// ::1 is stored as 00000000 00000000 00000000 01000000 (per-word little endian).
		loop6 := bytes.Equal(b, []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0})
		// ::ffff:127.x.x.x
		mapped := bytes.Equal(b[:12], []byte{0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0}) && b[15] == 127
		return allZero || loop6 || mapped
	}
	return false
}
