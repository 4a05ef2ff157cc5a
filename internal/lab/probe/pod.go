package probe

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
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

// Pod is one check of one protocol to one address.
type Pod struct {
	Proto string     `json:"proto"` // tcp, udp, icmp
	Addr  netip.Addr `json:"addr"`
}

func (p Pod) String() string { return p.Proto + "/" + p.Addr.String() }

// ParsePod parses "tcp/10.244.1.2" (the probe command's arguments).
func ParsePod(s string) (Pod, error) {
	proto, addr, ok := strings.Cut(s, "/")
	if !ok {
		return Pod{}, fmt.Errorf("probe %q: want proto/address such as tcp/10.244.1.2", s)
	}
	switch proto {
	case "tcp", "udp", "icmp":
	default:
		return Pod{}, fmt.Errorf("probe %q: protocol must be tcp, udp or icmp", s)
	}
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return Pod{}, fmt.Errorf("probe %q: %w", s, err)
	}
	return Pod{Proto: proto, Addr: a}, nil
}

// PodResult is printed by the probe command, one JSON object per line.
type PodResult struct {
	Pod
	OK  bool          `json:"ok"`
	RTT time.Duration `json:"rtt"`
	Err string        `json:"err,omitempty"`
}

// ServeEcho listens on [::]:port for TCP and UDP (IPv4 and IPv6), writes
// "ready" to ready and serves until ctx ends or stop is closed/readable.
func ServeEcho(ctx context.Context, port int, ready io.Writer, stop io.Reader) error {
	return serve(ctx, "echo", port, ready, stop, 2048,
		func(req []byte, _ net.Addr) []byte { return req },
		func(c net.Conn) { _, _ = io.Copy(c, c) })
}

// RunPods runs the probes concurrently (at most 16 at a time) and writes
// one PodResult JSON line per probe to out.
func RunPods(ctx context.Context, probes []Pod, timeout time.Duration, out io.Writer) error {
	return runAll(ctx, probes, timeout, out, func(ctx context.Context, p Pod) PodResult {
		start := time.Now()
		err := p.Run(ctx, timeout)
		r := PodResult{Pod: p, OK: err == nil, RTT: time.Since(start)}
		if err != nil {
			r.Err = err.Error()
		}
		return r
	})
}

// Run probes p once, within timeout.
func (p Pod) Run(ctx context.Context, timeout time.Duration) error {
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

func probeTCP(ctx context.Context, a netip.Addr) error {
	_, err := EchoTCP(ctx, netip.AddrPortFrom(a, EchoPort))
	return err
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
