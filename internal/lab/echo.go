package lab

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

// The connectivity check's tiny echo protocol. `axon lab _echo serve` runs
// in a destination namespace (a TCP and a UDP echo on one port, both
// families); `axon lab _echo probe` runs in a source pod (namespace and
// cgroup) and probes a list of destinations, printing one JSON line each.

// EchoPort is the TCP and UDP port of the check's echo servers.
const EchoPort = 5657

// Probe is one check of one protocol to one address.
type Probe struct {
	Proto string     `json:"proto"` // tcp, udp, icmp
	Addr  netip.Addr `json:"addr"`
}

func (p Probe) String() string { return p.Proto + "/" + p.Addr.String() }

// ParseProbe parses "tcp/10.244.1.2" (the probe command's arguments).
func ParseProbe(s string) (Probe, error) {
	proto, addr, ok := strings.Cut(s, "/")
	if !ok {
		return Probe{}, fmt.Errorf("probe %q: want proto/address such as tcp/10.244.1.2", s)
	}
	switch proto {
	case "tcp", "udp", "icmp":
	default:
		return Probe{}, fmt.Errorf("probe %q: protocol must be tcp, udp or icmp", s)
	}
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return Probe{}, fmt.Errorf("probe %q: %w", s, err)
	}
	return Probe{Proto: proto, Addr: a}, nil
}

// ProbeResult is printed by the probe command, one JSON object per line.
type ProbeResult struct {
	Probe
	OK  bool          `json:"ok"`
	RTT time.Duration `json:"rtt"`
	Err string        `json:"err,omitempty"`
}

// ServeEcho listens on [::]:port for TCP and UDP (IPv4 and IPv6), writes
// "ready" to ready and serves until ctx ends or stop is closed/readable.
func ServeEcho(ctx context.Context, port int, ready io.Writer, stop io.Reader) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	addr := ":" + strconv.Itoa(port)
	tl, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("echo: listen tcp %s: %w", addr, err)
	}
	defer tl.Close()
	ul, err := net.ListenPacket("udp", addr)
	if err != nil {
		return fmt.Errorf("echo: listen udp %s: %w", addr, err)
	}
	defer ul.Close()
	go func() {
		<-ctx.Done()
		tl.Close()
		ul.Close()
	}()
	if stop != nil {
		go func() { _, _ = io.Copy(io.Discard, stop); cancel() }()
	}
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := ul.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = ul.WriteTo(buf[:n], from)
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
			return fmt.Errorf("echo: accept: %w", err)
		}
		go func() {
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			_, _ = io.Copy(c, c)
		}()
	}
}

// RunProbes runs the probes concurrently (at most 16 at a time) and writes
// one ProbeResult JSON line per probe to out.
func RunProbes(ctx context.Context, probes []Probe, timeout time.Duration, out io.Writer) error {
	var mu sync.Mutex
	enc := json.NewEncoder(out)
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	var werr error
	for _, p := range probes {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			start := time.Now()
			err := runProbe(ctx, p, timeout)
			r := ProbeResult{Probe: p, OK: err == nil, RTT: time.Since(start)}
			if err != nil {
				r.Err = err.Error()
			}
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

func runProbe(ctx context.Context, p Probe, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	switch p.Proto {
	case "tcp":
		return probeTCP(ctx, p.Addr)
	case "udp":
		return probeUDP(ctx, p.Addr)
	case "icmp":
		return probeICMP(ctx, p.Addr, timeout)
	}
	return fmt.Errorf("unknown protocol %q", p.Proto)
}

func token() []byte {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return []byte("axon-lab-" + hex.EncodeToString(b))
}

func probeTCP(ctx context.Context, a netip.Addr) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", netip.AddrPortFrom(a, EchoPort).String())
	if err != nil {
		return err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	tok := token()
	if _, err := c.Write(tok); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	buf := make([]byte, len(tok))
	if _, err := io.ReadFull(c, buf); err != nil {
		return fmt.Errorf("read echo: %w", err)
	}
	if !bytes.Equal(buf, tok) {
		return errors.New("echo mismatch")
	}
	return nil
}

// probeUDP sends a token up to 5 times and waits for it to come back.
func probeUDP(ctx context.Context, a netip.Addr) error {
	network := "udp4"
	if a.Is6() {
		network = "udp6"
	}
	c, err := net.ListenPacket(network, ":0")
	if err != nil {
		return err
	}
	defer c.Close()
	dst := net.UDPAddrFromAddrPort(netip.AddrPortFrom(a, EchoPort))
	tok := token()
	buf := make([]byte, 256)
	for attempt := 0; ctx.Err() == nil; attempt++ {
		if _, err := c.WriteTo(tok, dst); err != nil {
			return fmt.Errorf("send: %w", err)
		}
		wait := time.Now().Add(300 * time.Millisecond)
		if dl, ok := ctx.Deadline(); ok && dl.Before(wait) {
			wait = dl
		}
		_ = c.SetReadDeadline(wait)
		for {
			n, _, err := c.ReadFrom(buf)
			if err != nil {
				break // timeout: send again
			}
			if bytes.Equal(buf[:n], tok) {
				return nil
			}
		}
	}
	return errors.New("no UDP echo before the deadline")
}

func probeICMP(ctx context.Context, a netip.Addr, timeout time.Duration) error {
	// Up to 3 echo requests, 300 ms apart: the first may wait for ARP/ND.
	sent, recv, err := Ping(ctx, a, 3, 300*time.Millisecond, timeout, true)
	if err != nil {
		return err
	}
	if recv == 0 {
		return fmt.Errorf("no ICMP echo reply (%d sent)", sent)
	}
	return nil
}

// Ping sends count ICMP echo requests to a, one per interval, and counts the
// replies that arrive before the last request's wait expires. With
// untilFirst it stops at the first reply. It uses a raw ICMP socket (root),
// so the lab needs no ping binary; concurrent pingers filter by ID.
func Ping(ctx context.Context, a netip.Addr, count int, interval, wait time.Duration, untilFirst bool) (sent, recv int, err error) {
	network, laddr := "ip4:icmp", "0.0.0.0"
	var reqType, replyType icmp.Type = ipv4.ICMPTypeEcho, ipv4.ICMPTypeEchoReply
	proto := 1
	if a.Is6() {
		network, laddr = "ip6:ipv6-icmp", "::"
		reqType, replyType = ipv6.ICMPTypeEchoRequest, ipv6.ICMPTypeEchoReply
		proto = 58
	}
	c, err := icmp.ListenPacket(network, laddr)
	if err != nil {
		return 0, 0, fmt.Errorf("icmp socket: %w", err)
	}
	defer c.Close()
	var idb [2]byte
	_, _ = rand.Read(idb[:])
	id := int(idb[0])<<8 | int(idb[1])
	payload := token()
	dst := &net.IPAddr{IP: net.IP(a.AsSlice())}

	got := make(map[int]bool)
	replies := make(chan int, count)
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		buf := make([]byte, 1500)
		for {
			n, _, err := c.ReadFrom(buf)
			if err != nil {
				return
			}
			m, err := icmp.ParseMessage(proto, buf[:n])
			if err != nil || m.Type != replyType {
				continue
			}
			if e, ok := m.Body.(*icmp.Echo); ok && e.ID == id && bytes.Equal(e.Data, payload) {
				replies <- e.Seq
			}
		}
	}()
	deadline := time.Now().Add(time.Duration(count-1)*interval + wait)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	_ = c.SetReadDeadline(deadline)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for seq := 0; ; {
		if seq < count {
			msg := icmp.Message{Type: reqType, Body: &icmp.Echo{ID: id, Seq: seq, Data: payload}}
			b, err := msg.Marshal(nil) // the kernel computes the ICMPv6 checksum
			if err != nil {
				return sent, len(got), err
			}
			if _, err := c.WriteTo(b, dst); err != nil {
				return sent, len(got), fmt.Errorf("send echo request: %w", err)
			}
			sent++
			seq++
		}
		select {
		case s := <-replies:
			got[s] = true
			if untilFirst || len(got) == count {
				return sent, len(got), nil
			}
		case <-tick.C:
			continue
		case <-readerDone:
			return sent, len(got), nil // read deadline reached
		case <-ctx.Done():
			return sent, len(got), nil
		}
		// A reply arrived: wait for the next tick before sending again.
		if seq < count {
			select {
			case <-tick.C:
			case <-ctx.Done():
				return sent, len(got), nil
			}
		}
	}
}

// readReady waits for the "ready" line of a server's stdout.
func readReady(r io.Reader) error {
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil {
		return fmt.Errorf("echo server did not start: %w", err)
	}
	if strings.TrimSpace(line) != "ready" {
		return fmt.Errorf("echo server: unexpected output %q", line)
	}
	return nil
}
