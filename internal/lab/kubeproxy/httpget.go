package kubeproxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/axonhq/axon/internal/netnsutil"
)

// HTTPGet does a plain HTTP/1.0 GET of addr+path with a socket
// created inside the netns at nsPath (sockets keep the netns they were made
// in), within timeout or ctx's deadline if sooner. status is the status line
// without the protocol ("200 OK"); the body is read up to 16 MiB. The lab and
// the Service benchmark read kube-proxy's /healthz and /metrics with it.
func HTTPGet(ctx context.Context, nsPath, addr, path string, timeout time.Duration) (body []byte, status string, err error) {
	var c net.Conn
	if err := netnsutil.DoAt(nsPath, func() (err error) {
		d := net.Dialer{Timeout: 2 * time.Second}
		c, err = d.DialContext(ctx, "tcp", addr)
		return err
	}); err != nil {
		if ctx.Err() != nil {
			return nil, "", ctx.Err()
		}
		return nil, "", err
	}
	defer c.Close()
	dl := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(dl) {
		dl = d
	}
	_ = c.SetDeadline(dl)
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n", path, addr); err != nil {
		return nil, "", err
	}
	br := bufio.NewReader(c)
	status, err = br.ReadString('\n')
	if err != nil {
		return nil, "", fmt.Errorf("read %s%s: %w", addr, path, err)
	}
	status = strings.TrimSpace(status)
	if _, code, ok := strings.Cut(status, " "); ok { // "HTTP/1.0 200 OK" → "200 OK"
		status = code
	}
	for { // headers
		line, err := br.ReadString('\n')
		if err != nil {
			return nil, status, err
		}
		if strings.TrimSpace(line) == "" {
			break
		}
	}
	body, _ = io.ReadAll(io.LimitReader(br, 16<<20)) // /metrics is a few hundred KiB
	return body, status, nil
}

// HTTPGetOK is HTTPGet within 5 s at most that takes any status but 200 as
// an error: the body of a successful GET (the benchmarks read kube-proxy's
// and the axon agent's /metrics with it).
func HTTPGetOK(ctx context.Context, nsPath, addr, path string) ([]byte, error) {
	body, status, err := HTTPGet(ctx, nsPath, addr, path, 5*time.Second)
	if err != nil {
		return nil, err
	}
	if !strings.HasPrefix(status+" ", "200 ") {
		return nil, fmt.Errorf("GET %s%s: %s", addr, path, status)
	}
	return body, nil
}
