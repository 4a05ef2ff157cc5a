package vmguest

// The guest's command port: QEMU serves the guest's second serial port (ttyS1)
// on a unix socket (QEMUArgv's commandSock), and the guest's init runs every
// line it reads there as a shell command, its output and a marker with the
// exit code written back (init.sh). The lab's VM pods use it to probe from
// inside their guests (internal/lab's CheckVMPods); nothing else listens on
// the guest's side.

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Session is a connection to a guest's command port. One command runs at a
// time; Close ends the connection (the guest's shell stays for the next).
type Session struct {
	conn  net.Conn
	lines chan string
	done  chan struct{}
	mu    sync.Mutex
	nonce string // in every marker: output of another session's command cannot match
	seq   int
}

// Dial connects to the command port at sock.
func Dial(ctx context.Context, sock string) (*Session, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return nil, fmt.Errorf("the guest's command port %s: %w", sock, err)
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	s := &Session{conn: c, lines: make(chan string, 1024), done: make(chan struct{}), nonce: hex.EncodeToString(b)}
	go func() {
		defer close(s.done)
		sc := bufio.NewScanner(c)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			select {
			case s.lines <- strings.TrimRight(sc.Text(), "\r"):
			default: // nobody reads: a Run only waits for its own marker
			}
		}
	}()
	return s, nil
}

// Run runs command in the guest and returns its output (stdout and stderr)
// and exit code. Its standard input is /dev/null.
func (s *Session) Run(command string, timeout time.Duration) (string, int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	return runCommand(s.conn, s.lines, s.done, fmt.Sprintf("AXON-GUEST-RC-%s-%d", s.nonce, s.seq), command, timeout)
}

// Close closes the connection.
func (s *Session) Close() error { return s.conn.Close() }

// runCommand writes command to a guest shell reading lines on w, in a
// subshell with stdin /dev/null (an exit or exec ends that subshell, not the
// guest's shell, and gives its code), followed by a printf of tag and the
// exit code, and reads output lines until tag's line. The marker is printed
// by printf so that an echo of the command line cannot match it; anything
// before it on its line (output without a newline, a prompt) is output.
func runCommand(w io.Writer, lines <-chan string, done <-chan struct{}, tag, command string, timeout time.Duration) (string, int, error) {
	if strings.ContainsAny(command, "\n\r") {
		return "", -1, fmt.Errorf("guest command %q: one line only", command)
	}
	if _, err := fmt.Fprintf(w, "( %s ) </dev/null; printf '\\n%%s %%d\\n' %s $?\n", command, tag); err != nil {
		return "", -1, fmt.Errorf("write to the guest: %w", err)
	}
	var out strings.Builder
	deadline := time.After(timeout)
	for {
		select {
		case line := <-lines:
			if i := strings.Index(line, tag+" "); i >= 0 {
				out.WriteString(line[:i])
				rest := line[i+len(tag)+1:]
				rc, err := strconv.Atoi(strings.TrimSpace(rest))
				if err != nil {
					return out.String(), -1, fmt.Errorf("guest exit code %q: %w", rest, err)
				}
				// the marker's own leading newline
				return strings.TrimSuffix(out.String(), "\n"), rc, nil
			}
			out.WriteString(line + "\n")
		case <-done:
			return out.String(), -1, fmt.Errorf("%q: %w", command, ErrGuestGone)
		case <-deadline:
			return out.String(), -1, fmt.Errorf("%q did not finish in the guest within %s", command, timeout)
		}
	}
}
