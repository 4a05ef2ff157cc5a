package agent

// The two pods of the same-node TCP bypass test, as one helper process in
// the test's cgroup (sock_ops sees only sockets made by processes under the
// cgroup it is attached to; the test process itself stays out of it). The
// process listens with an echo server in the server pod's netns and one on
// loopback in the client pod's netns (a sidecar) and, on commands read from
// stdin, dials from the client pod's netns and checks echoed bytes end to
// end.

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/testutil"
)

// sockmapPeersEnv carries the JSON peersConfig of the helper process.
const sockmapPeersEnv = "AXON_AGENT_TEST_SOCKMAP_PEERS"

type peersConfig struct {
	ServerNetns string `json:"serverNetns"` // netns path of the server pod
	Listen      string `json:"listen"`      // ip:port in it
	ClientNetns string `json:"clientNetns"` // netns path of the client pod
	Loopback    string `json:"loopback"`    // loopback ip:port in the client pod's netns
}

// TestSockmapPeersHelper is the helper process (testutil.HelperCommand).
// Commands (one per line), answers:
//
//	dial pod|loop  → "conn <id> <local> <remote>" (to the server pod, or to loopback)
//	echo <id> <n>  → "ok <id> <n>" once n random bytes came back intact
//
// Any failure answers "fail <reason>". It ends when stdin closes.
func TestSockmapPeersHelper(t *testing.T) {
	var cfg peersConfig
	testutil.HelperStart(t, sockmapPeersEnv, "the helper process of TestSockmapAgainstKernelAndAPIServer", &cfg)
	for _, l := range [][2]string{{cfg.ServerNetns, cfg.Listen}, {cfg.ClientNetns, cfg.Loopback}} {
		var ln net.Listener
		if err := netnsutil.DoAt(l[0], func() (err error) {
			ln, err = net.Listen("tcp", l[1])
			return err
		}); err != nil {
			fmt.Println("fail listen:", err)
			return
		}
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go echo(c)
			}
		}()
	}
	fmt.Println("ready")
	var conns []net.Conn
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 2 && f[0] == "dial" && (f[1] == "pod" || f[1] == "loop"):
			to := cfg.Listen
			if f[1] == "loop" {
				to = cfg.Loopback
			}
			var c net.Conn
			err := netnsutil.DoAt(cfg.ClientNetns, func() (err error) {
				c, err = net.DialTimeout("tcp", to, 5*time.Second)
				return err
			})
			if err != nil {
				fmt.Println("fail dial:", err)
				continue
			}
			conns = append(conns, c)
			fmt.Println("conn", len(conns)-1, c.LocalAddr(), c.RemoteAddr())
		case len(f) == 3 && f[0] == "echo":
			id, _ := strconv.Atoi(f[1])
			n, _ := strconv.Atoi(f[2])
			if id < 0 || id >= len(conns) || n <= 0 {
				fmt.Println("fail bad echo command:", sc.Text())
				continue
			}
			if err := echoCheck(conns[id], n); err != nil {
				fmt.Printf("fail echo %d: %v\n", id, err)
				continue
			}
			fmt.Println("ok", id, n)
		default:
			fmt.Println("fail unknown command:", sc.Text())
		}
	}
}

// echo writes back what it reads. A plain read/write loop, not io.Copy:
// io.Copy between two TCP sockets splices, a different kernel path than
// the one applications mostly use and the one this test checks.
func echo(c net.Conn) {
	defer c.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			if _, werr := c.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// echoChunk is what echoCheck writes at a time: each chunk is echoed before
// the next is written, so the bytes queued for a reader stay far below its
// receive buffer (with more the bypass's back-pressure rule moves the
// writer to the stack, which is not what these checks are about).
const echoChunk = 16 << 10

// echoCheck sends n pseudo-random bytes on c, echoChunk at a time, and
// compares each chunk's echo.
func echoCheck(c net.Conn, n int) error {
	want := make([]byte, n)
	var seed [32]byte
	binary.NativeEndian.PutUint64(seed[:], uint64(time.Now().UnixNano()))
	r := rand.NewChaCha8(seed)
	_, _ = r.Read(want)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	defer c.SetDeadline(time.Time{})
	got := make([]byte, echoChunk)
	for off := 0; off < n; off += echoChunk {
		chunk := want[off:min(off+echoChunk, n)]
		if _, err := c.Write(chunk); err != nil {
			return fmt.Errorf("write at byte %d: %w", off, err)
		}
		if _, err := io.ReadFull(c, got[:len(chunk)]); err != nil {
			return fmt.Errorf("read the echo at byte %d: %w", off, err)
		}
		if !bytes.Equal(got[:len(chunk)], chunk) {
			i := 0
			for got[i] == chunk[i] {
				i++
			}
			return fmt.Errorf("echoed bytes differ from byte %d of %d", off+i, n)
		}
	}
	return nil
}

// peers is the running helper process.
type peers struct {
	t   *testing.T
	in  io.WriteCloser
	out *bufio.Scanner
}

// startPeers starts the helper in the cgroup whose directory fd is
// cgroupFD; it is stopped at cleanup.
func startPeers(t *testing.T, cfg peersConfig, cgroupFD int) *peers {
	t.Helper()
	raw, _ := json.Marshal(cfg)
	cmd := testutil.HelperCommand(t.Context(), "TestSockmapPeersHelper", sockmapPeersEnv, raw, cgroupFD)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	must(t, err)
	out, err := cmd.StdoutPipe()
	must(t, err)
	if err := cmd.Start(); err != nil {
		t.Fatalf("start the peers helper: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		in.Close()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	p := &peers{t: t, in: in, out: bufio.NewScanner(out)}
	if got := p.read(); got != "ready" {
		t.Fatalf("peers helper: %s", got)
	}
	return p
}

func (p *peers) read() string {
	p.t.Helper()
	line := make(chan string, 1)
	go func() {
		if p.out.Scan() {
			line <- p.out.Text()
		} else {
			line <- fmt.Sprintf("fail helper output ended: %v", p.out.Err())
		}
	}()
	select {
	case l := <-line:
		return l
	case <-time.After(30 * time.Second):
		p.t.Fatal("peers helper: no answer within 30s")
		return ""
	}
}

// do sends one command and returns the answer; a "fail" answer fails the test.
func (p *peers) do(cmd string) []string {
	p.t.Helper()
	if _, err := fmt.Fprintln(p.in, cmd); err != nil {
		p.t.Fatalf("peers helper: %s: %v", cmd, err)
	}
	ans := p.read()
	if strings.HasPrefix(ans, "fail") {
		p.t.Fatalf("peers helper: %s: %s", cmd, ans)
	}
	return strings.Fields(ans)
}

// dial opens a connection from the client pod to the server pod (to =
// "pod") or to its own loopback (to = "loop"); it returns its id and both
// ends.
func (p *peers) dial(to string) (id int, local, remote string) {
	p.t.Helper()
	f := p.do("dial " + to)
	if len(f) != 4 || f[0] != "conn" {
		p.t.Fatalf("peers helper: dial answered %q", f)
	}
	id, _ = strconv.Atoi(f[1])
	return id, f[2], f[3]
}

// echo sends n bytes on connection id and checks the echo.
func (p *peers) echo(id, n int) {
	p.t.Helper()
	p.do(fmt.Sprintf("echo %d %d", id, n))
}
