package kubenode

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/axonhq/axon/internal/netnsutil"
	"github.com/axonhq/axon/internal/proc"
)

// poll calls check every 100ms until it succeeds, the timeout passes or p exits.
func poll(ctx context.Context, timeout time.Duration, p proc.Named, check func() error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		err := check()
		if err == nil {
			return nil
		}
		if !p.Alive() {
			return fmt.Errorf("%s (pid %d) exited: %w", p.Name, p.PID, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s after %v: %w", ctx.Err(), timeout, err)
		case <-t.C:
		}
	}
}

// waitOwnMountNS waits until the holder has unshared its mount namespace and exec'd sleep
// (unshare sets the propagation after unshare(2), before exec).
func waitOwnMountNS(ctx context.Context, holder proc.Named, timeout time.Duration) error {
	self, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return fmt.Errorf("own mount namespace: %w", err)
	}
	return poll(ctx, timeout, holder, func() error {
		comm, err := os.ReadFile("/proc/" + strconv.Itoa(holder.PID) + "/comm")
		if err != nil {
			return err
		}
		mnt, err := os.Readlink("/proc/" + strconv.Itoa(holder.PID) + "/ns/mnt")
		if err != nil {
			return err
		}
		if strings.TrimSpace(string(comm)) != "sleep" || mnt == self {
			return fmt.Errorf("mount namespace holder not ready (comm %q, %s)", strings.TrimSpace(string(comm)), mnt)
		}
		return nil
	})
}

// waitUnixSocket waits until something accepts on the unix socket path.
func waitUnixSocket(ctx context.Context, path string, timeout time.Duration, p proc.Named) error {
	return poll(ctx, timeout, p, func() error {
		c, err := net.DialTimeout("unix", path, time.Second)
		if err != nil {
			return err
		}
		return c.Close()
	})
}

// waitHealthz waits for kubelet's /healthz on 127.0.0.1 of the node netns.
func waitHealthz(ctx context.Context, netnsPath string, timeout time.Duration, p proc.Named) error {
	return poll(ctx, timeout, p, func() error { return healthz(netnsPath) })
}

// healthz asks kubelet's healthz endpoint once. The socket is created inside the netns (a
// socket stays in the namespace it was created in); the HTTP exchange runs outside it.
func healthz(netnsPath string) error {
	var c net.Conn
	err := netnsutil.DoAt(netnsPath, func() error {
		var err error
		c, err = net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(kubeletHealthzPort)), time.Second)
		return err
	})
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"); err != nil {
		return err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return errors.New("kubelet /healthz: " + resp.Status)
	}
	return nil
}
