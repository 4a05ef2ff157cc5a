package controlplane

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/axonhq/axon/internal/netnsutil"
)

// The apiserver's cluster egress (kubectl exec/logs/port-forward to kubelets, the apiserver's
// proxy to pods) in a real-kubelet lab: kubelets listen on their node IP inside their node
// netns, which the root-netns apiserver cannot route to. The apiserver's egress selector
// (Config.EgressProxySocket) sends those connections as HTTP CONNECT requests over a unix
// socket to a ConnectProxy, which dials the target from inside a lab namespace that reaches
// every node and pod (`axon lab _forward --connect-socket`, next to the node forwarders).

// egressSelectorFile is the apiserver's EgressSelectorConfiguration in Config.Dir.
const egressSelectorFile = "egress-selector.yaml"

// egressSelectorConfig routes the "cluster" egress (kubelets, pods, services) through the
// HTTP CONNECT proxy on socket; "controlplane" and "etcd" stay direct.
func egressSelectorConfig(socket string) string {
	return fmt.Sprintf(`# written by axon's lab control plane: cluster egress through the lab's CONNECT proxy
apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
- name: cluster
  connection:
    proxyProtocol: HTTPConnect
    transport:
      uds:
        udsName: %s
`, jsonQuote(socket))
}

// ConnectProxy serves HTTP CONNECT on a unix socket and dials each target from inside one
// network namespace. Only IP:port targets inside Allow are dialed (the lab's wire and pod
// ranges): anything else is refused with 403.
type ConnectProxy struct {
	l     net.Listener
	netns string
	allow []netip.Prefix
	log   *slog.Logger
}

// ListenConnectProxy listens on the unix socket path (mode 0600, a stale socket file is
// replaced) for CONNECT requests whose targets it dials inside the netns at dialNetns.
func ListenConnectProxy(socket, dialNetns string, allow []netip.Prefix, log *slog.Logger) (*ConnectProxy, error) {
	if log == nil {
		log = slog.Default()
	}
	if len(allow) == 0 {
		return nil, errors.New("connect proxy: no allowed target prefixes (give the lab's wire and pod ranges)")
	}
	if st, err := os.Stat(dialNetns); err != nil || st.IsDir() {
		return nil, fmt.Errorf("connect proxy netns %q: not a network namespace file (%v)", dialNetns, err)
	}
	if err := os.MkdirAll(filepath.Dir(socket), 0o700); err != nil {
		return nil, fmt.Errorf("connect proxy socket dir: %w", err)
	}
	if err := os.Remove(socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove stale connect proxy socket: %w", err)
	}
	l, err := net.Listen("unix", socket)
	if err != nil {
		return nil, fmt.Errorf("connect proxy listen on %s: %w", socket, err)
	}
	if err := os.Chmod(socket, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("connect proxy socket mode: %w", err)
	}
	return &ConnectProxy{l: l, netns: dialNetns, allow: allow, log: log.With("component", "egress-connect-proxy")}, nil
}

// Serve accepts CONNECT requests until ctx is cancelled, then closes the listener and every
// open tunnel. It returns nil after a cancel.
func (p *ConnectProxy) Serve(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	conns := &connSet{m: map[net.Conn]struct{}{}}
	var wg sync.WaitGroup
	errc := make(chan error, 1)
	go func() {
		for {
			c, err := p.l.Accept()
			if err != nil {
				if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
					errc <- nil
				} else {
					errc <- fmt.Errorf("connect proxy accept: %w", err)
				}
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				p.handle(ctx, c, conns)
			}()
		}
	}()
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	p.l.Close()
	conns.closeAll()
	wg.Wait()
	return err
}

// Close closes the listener (Serve closes it itself when it returns).
func (p *ConnectProxy) Close() { p.l.Close() }

// target validates a CONNECT authority: an IP:port inside the allowed prefixes.
func (p *ConnectProxy) target(authority string) (netip.AddrPort, error) {
	ap, err := netip.ParseAddrPort(authority)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("target %q is not IP:port: %w", authority, err)
	}
	a := ap.Addr().Unmap()
	for _, pr := range p.allow {
		if pr.Contains(a) {
			return netip.AddrPortFrom(a, ap.Port()), nil
		}
	}
	return netip.AddrPort{}, fmt.Errorf("target %s is outside the lab's ranges %v", ap, p.allow)
}

func (p *ConnectProxy) handle(ctx context.Context, in net.Conn, conns *connSet) {
	if !conns.add(in) {
		in.Close()
		return
	}
	defer conns.remove(in)
	_ = in.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(in)
	req, err := http.ReadRequest(br)
	if err != nil {
		p.log.Warn("read CONNECT request", "err", err)
		return
	}
	_ = in.SetReadDeadline(time.Time{})
	reply := func(code int, msg string) {
		fmt.Fprintf(in, "HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n%s\n", code, http.StatusText(code), msg)
	}
	if req.Method != http.MethodConnect {
		reply(http.StatusMethodNotAllowed, "only CONNECT is served here")
		return
	}
	dst, err := p.target(req.Host)
	if err != nil {
		p.log.Warn("refused CONNECT", "err", err)
		reply(http.StatusForbidden, err.Error())
		return
	}
	var out net.Conn
	err = netnsutil.DoAt(p.netns, func() (err error) {
		d := net.Dialer{Timeout: 5 * time.Second}
		out, err = d.DialContext(ctx, "tcp", dst.String())
		return err
	})
	if err != nil {
		p.log.Warn("dial CONNECT target", "target", dst, "netns", p.netns, "err", err)
		reply(http.StatusBadGateway, fmt.Sprintf("dial %s in %s: %v", dst, p.netns, err))
		return
	}
	if !conns.add(out) {
		out.Close()
		return
	}
	defer conns.remove(out)
	if _, err := fmt.Fprint(in, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	p.log.Debug("tunnel", "target", dst)
	splice(in, br, out) // br may hold bytes the client sent right after its request
}

// jsonQuote quotes s as a JSON string, which is a YAML double-quoted scalar.
func jsonQuote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
