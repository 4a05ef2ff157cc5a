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
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/axonhq/axon/internal/atomicfile"
	"github.com/axonhq/axon/internal/proc"
)

const pidsFile = "pids.json"

// procRecord identifies one detached process in pids.json. StartTime (see proc.Record) guards
// against signalling an unrelated process that reused the PID.
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
	return atomicfile.Write(filepath.Join(dir, pidsFile), append(b, '\n'), 0o644)
}

// record is the process identity the proc package signals and inspects.
func (r procRecord) record() *proc.Record {
	return &proc.Record{PID: r.PID, StartTime: r.StartTime, Log: r.Log}
}

// alive reports whether the recorded process still runs (same PID and start time, not a zombie).
func (r procRecord) alive() bool { return r.record().Alive() }

// spawn starts a detached process (own session, stdin /dev/null, stdout+stderr appended to
// logPath after a start marker). The returned channel is closed when the process exits while
// this process is still its parent (it also reaps it, so a stopped child never lingers as a
// zombie).
func spawn(name, bin string, args []string, logPath string) (procRecord, <-chan struct{}, error) {
	argv := append([]string{bin}, args...)
	banner := fmt.Sprintf("\n=== %s start %s: %s %s\n", time.Now().UTC().Format(time.RFC3339), name, bin, strings.Join(args, " "))
	p, exited, err := proc.Start(proc.Spec{Argv: argv, Log: logPath, Banner: banner})
	if err != nil {
		return procRecord{}, nil, fmt.Errorf("%s: %w", name, err)
	}
	return procRecord{Name: name, PID: p.PID, StartTime: p.StartTime, Args: argv, Log: logPath}, exited, nil
}

// logTail returns the last n lines of a log file, for error messages.
func logTail(path string, n int) string {
	t, err := proc.LogTail(path, n)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	return t
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
