package controlplane

import (
	"bufio"
	"bytes"
	"encoding/hex"
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

type pidState struct {
	// Processes in start order (etcd, then kube-apiserver); stopped in reverse.
	Processes []proc.Named `json:"processes"`
}

// readPIDs reads pids.json; none is an empty state.
func readPIDs(dir string) (pidState, error) {
	var st pidState
	err := atomicfile.ReadJSON(filepath.Join(dir, pidsFile), &st)
	if errors.Is(err, fs.ErrNotExist) {
		return st, nil
	}
	if err != nil {
		return st, fmt.Errorf("%w (stop stray processes by hand, then delete it)", err)
	}
	return st, nil
}

func writePIDs(dir string, st pidState) error {
	return atomicfile.WriteJSON(filepath.Join(dir, pidsFile), st, 0o644)
}

// spawn starts a detached process (own session, stdin /dev/null, stdout+stderr appended to
// logPath after a start marker). The returned channel is closed when the process exits while
// this process is still its parent (it also reaps it, so a stopped child never lingers as a
// zombie).
func spawn(name, bin string, args []string, logPath string) (proc.Named, <-chan struct{}, error) {
	argv := append([]string{bin}, args...)
	banner := fmt.Sprintf("\n=== %s start %s: %s %s\n", time.Now().UTC().Format(time.RFC3339), name, bin, strings.Join(args, " "))
	p, exited, err := proc.Start(proc.Spec{Argv: argv, Log: logPath, Banner: banner})
	if err != nil {
		return proc.Named{}, nil, fmt.Errorf("%s: %w", name, err)
	}
	return proc.Named{Name: name, Record: p, Args: argv}, exited, nil
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
