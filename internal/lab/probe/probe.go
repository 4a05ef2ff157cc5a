// Package probe holds the small programs `axon lab` runs inside the lab's
// namespaces for its checks: echo servers (`_echo serve`, `_peerecho`) and
// probers that print one JSON line per probe: pod-to-pod TCP/UDP/ICMP
// (`_echo probe`, Pod), Service addresses (`_probe`, Service) and the
// external client's north-south exchanges (`_xprobe`, External).
package probe

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"
)

// runAll runs one for every probe, at most 16 at a time, each under its own
// timeout, and writes each result as one JSON line to out.
func runAll[P, R any](ctx context.Context, probes []P, timeout time.Duration, out io.Writer, one func(context.Context, P) R) error {
	var mu sync.Mutex
	enc := json.NewEncoder(out)
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	var werr error
	for _, p := range probes {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			pctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			r := one(pctx, p)
			mu.Lock()
			if err := enc.Encode(r); err != nil && werr == nil {
				werr = err
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	return werr
}

// serve listens on [::]:port for TCP and UDP (IPv4 and IPv6), answers every
// datagram with udp's reply (nil: none) and hands every TCP connection, with
// a 10 s deadline, to tcp. It writes "ready" to ready and serves until ctx
// ends or stop reaches EOF. name prefixes its errors.
func serve(ctx context.Context, name string, port int, ready io.Writer, stop io.Reader, udpBuf int,
	udp func(req []byte, from net.Addr) []byte, tcp func(net.Conn)) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	addr := ":" + strconv.Itoa(port)
	tl, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("%s: listen tcp %s: %w", name, addr, err)
	}
	defer tl.Close()
	ul, err := net.ListenPacket("udp", addr)
	if err != nil {
		return fmt.Errorf("%s: listen udp %s: %w", name, addr, err)
	}
	defer ul.Close()
	context.AfterFunc(ctx, func() { tl.Close(); ul.Close() })
	if stop != nil {
		go func() { _, _ = io.Copy(io.Discard, stop); cancel() }()
	}
	go func() {
		buf := make([]byte, udpBuf)
		for {
			n, from, err := ul.ReadFrom(buf)
			if err != nil {
				return
			}
			if b := udp(buf[:n], from); b != nil {
				_, _ = ul.WriteTo(b, from)
			}
		}
	}()
	if _, err := fmt.Fprintln(ready, "ready"); err != nil {
		return err
	}
	for {
		c, err := tl.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("%s: accept: %w", name, err)
		}
		go func() {
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			tcp(c)
		}()
	}
}

// token is a random payload that only this probe's echo can carry back.
func token() []byte {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return []byte("axon-lab-" + hex.EncodeToString(b))
}

// ReadReady waits for the "ready" line that ServeEcho and ServePeerEcho
// write once they listen (a server's stdout).
func ReadReady(r io.Reader) error {
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil {
		return fmt.Errorf("echo server did not start: %w", err)
	}
	if strings.TrimSpace(line) != "ready" {
		return fmt.Errorf("echo server: unexpected output %q", line)
	}
	return nil
}
