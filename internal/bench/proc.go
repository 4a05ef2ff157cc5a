package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Wrap returns the argv that runs argv pinned to cpu inside the network
// namespace netns: `nsenter --net=<netns> taskset -c <cpu> argv...`. nsenter and
// taskset both exec, so the PID of the started process is the PID of the tool.
// An empty netns runs in the caller's namespace; cpu < 0 skips taskset.
func (t ToolPaths) Wrap(netns string, cpu int, argv ...string) []string {
	var out []string
	if netns != "" {
		out = append(out, t.Nsenter, "--net="+netns)
	}
	if cpu >= 0 {
		out = append(out, t.Taskset, "-c", strconv.Itoa(cpu))
	}
	return append(out, argv...)
}

// Command builds an exec.Cmd for argv placed in cgroupDir (a cgroup v2
// directory, optional). The returned cleanup closes the cgroup fd; call it
// after Start.
func Command(ctx context.Context, cgroupDir string, argv []string) (*exec.Cmd, func(), error) {
	if len(argv) == 0 {
		return nil, nil, errors.New("empty command")
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 3 * time.Second
	cleanup := func() {}
	// No Pdeathsig: it fires when the starting OS thread exits, which Go may do
	// at any time. Servers are stopped by PID instead.
	attr := &syscall.SysProcAttr{}
	if cgroupDir != "" {
		f, err := os.Open(cgroupDir)
		if err != nil {
			return nil, nil, fmt.Errorf("open cgroup %s (it must be an existing cgroup v2 directory): %w", cgroupDir, err)
		}
		attr.UseCgroupFD = true
		attr.CgroupFD = int(f.Fd())
		cleanup = func() { f.Close() }
	}
	cmd.SysProcAttr = attr
	return cmd, cleanup, nil
}

// Server is one long-lived or one-shot server process, stopped by PID.
type Server struct {
	cmd  *exec.Cmd
	argv []string
	out  *bytes.Buffer
	done chan struct{}
	err  error // set when done is closed
}

// StartServer starts argv in cgroupDir and waits until it listens on ip:port
// (seen in /proc/<pid>/net/tcp{,6}, which show the process's own netns).
func StartServer(ctx context.Context, cgroupDir string, argv []string, ip netip.Addr, port int, timeout time.Duration) (*Server, error) {
	// The server must outlive nothing but the run: ctx cancel stops it too.
	cmd, cleanup, err := Command(ctx, cgroupDir, argv)
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	cmd.Stdout = &limitedWriter{w: &out, n: 64 << 10}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		cleanup()
		return nil, fmt.Errorf("start %s: %w", strings.Join(argv, " "), err)
	}
	cleanup()
	s := &Server{cmd: cmd, argv: argv, out: &out, done: make(chan struct{})}
	go func() { s.err = cmd.Wait(); close(s.done) }()

	deadline := time.Now().Add(timeout)
	for {
		select {
		case <-s.done:
			return nil, fmt.Errorf("server %s exited before listening on %s: %v: %s",
				strings.Join(argv, " "), netip.AddrPortFrom(ip, uint16(port)), s.err, strings.TrimSpace(out.String()))
		default:
		}
		ok, err := pidListens(cmd.Process.Pid, ip, port)
		if err == nil && ok {
			return s, nil
		}
		if time.Now().After(deadline) {
			s.Stop()
			return nil, fmt.Errorf("server %s did not listen on %s within %s (is the address configured in that namespace?): %s",
				strings.Join(argv, " "), netip.AddrPortFrom(ip, uint16(port)), timeout, strings.TrimSpace(out.String()))
		}
		select {
		case <-ctx.Done():
			s.Stop()
			return nil, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// PID returns the server's PID.
func (s *Server) PID() int { return s.cmd.Process.Pid }

// Exited reports whether the server process has ended.
func (s *Server) Exited() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// Wait waits up to d for the server to exit by itself (iperf3 -1).
func (s *Server) Wait(d time.Duration) bool {
	select {
	case <-s.done:
		return true
	case <-time.After(d):
		return false
	}
}

// Stop sends SIGTERM to the server's PID, then SIGKILL after 2 s. Safe to call twice.
func (s *Server) Stop() {
	select {
	case <-s.done:
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	if s.Wait(2 * time.Second) {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.done
}

// RunClient runs argv to completion (bounded by timeout) and returns its stdout
// and stderr.
func RunClient(ctx context.Context, cgroupDir string, argv []string, timeout time.Duration) (stdout, stderr []byte, err error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd, cleanup, err := Command(ctx, cgroupDir, argv)
	if err != nil {
		return nil, nil, err
	}
	var o, e bytes.Buffer
	cmd.Stdout = &limitedWriter{w: &o, n: 16 << 20}
	cmd.Stderr = &limitedWriter{w: &e, n: 64 << 10}
	if err := cmd.Start(); err != nil {
		cleanup()
		return nil, nil, fmt.Errorf("start %s: %w", strings.Join(argv, " "), err)
	}
	cleanup()
	err = cmd.Wait()
	if ctx.Err() == context.DeadlineExceeded {
		err = fmt.Errorf("timed out after %s: %w", timeout, ctx.Err())
	}
	return o.Bytes(), e.Bytes(), err
}

// limitedWriter keeps at most n bytes and drops the rest.
type limitedWriter struct {
	w io.Writer
	n int
}

func (l *limitedWriter) Write(p []byte) (int, error) {
	if l.n <= 0 {
		return len(p), nil
	}
	q := p
	if len(q) > l.n {
		q = q[:l.n]
	}
	n, err := l.w.Write(q)
	l.n -= n
	if err != nil {
		return n, err
	}
	return len(p), nil
}

// pidListens reports whether the network namespace of pid has a TCP socket in
// LISTEN state on ip:port.
func pidListens(pid int, ip netip.Addr, port int) (bool, error) {
	for _, f := range []string{"tcp", "tcp6"} {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, f))
		if err != nil {
			if errors.Is(err, os.ErrNotExist) && f == "tcp6" {
				continue // IPv6 disabled
			}
			return false, err
		}
		ls, err := parseProcNetTCP(data)
		if err != nil {
			return false, fmt.Errorf("parse /proc/%d/net/%s: %w", pid, f, err)
		}
		for _, l := range ls {
			if l.Port() == uint16(port) && l.Addr().Unmap() == ip.Unmap() {
				return true, nil
			}
		}
	}
	return false, nil
}

// parseProcNetTCP returns the local addresses of the LISTEN sockets in the
// text of /proc/net/tcp or /proc/net/tcp6. Addresses there are printed as
// 32-bit words in host (little-endian on the machines we support) byte order.
func parseProcNetTCP(data []byte) ([]netip.AddrPort, error) {
	var out []netip.AddrPort
	sc := bufio.NewScanner(bytes.NewReader(data))
	first := true
	for sc.Scan() {
		if first {
			first = false
			continue // header
		}
		f := strings.Fields(sc.Text())
		if len(f) < 4 {
			continue
		}
		if f[3] != "0A" { // TCP_LISTEN
			continue
		}
		hexAddr, hexPort, ok := strings.Cut(f[1], ":")
		if !ok {
			return nil, fmt.Errorf("bad local address %q", f[1])
		}
		raw, err := hex.DecodeString(hexAddr)
		if err != nil || (len(raw) != 4 && len(raw) != 16) {
			return nil, fmt.Errorf("bad local address %q", f[1])
		}
		for i := 0; i < len(raw); i += 4 {
			w := binary.BigEndian.Uint32(raw[i:])
			binary.LittleEndian.PutUint32(raw[i:], w)
		}
		addr, _ := netip.AddrFromSlice(raw)
		port, err := strconv.ParseUint(hexPort, 16, 16)
		if err != nil {
			return nil, fmt.Errorf("bad local port %q", f[1])
		}
		out = append(out, netip.AddrPortFrom(addr, uint16(port)))
	}
	return out, sc.Err()
}
