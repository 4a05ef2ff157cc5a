package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// ErrUnreachable is wrapped by every client error caused by failing to reach
// the agent (socket missing, connection refused, timeout while dialing).
var ErrUnreachable = errors.New("axon-agent not reachable")

// RemoteError is an error reply of the agent: its HTTP status and message.
type RemoteError struct {
	Code    int
	Message string
}

func (e *RemoteError) Error() string {
	return fmt.Sprintf("axon-agent: %s (HTTP %d)", e.Message, e.Code)
}

// IsStatus reports whether err is a RemoteError with the given HTTP status.
func IsStatus(err error, code int) bool {
	var re *RemoteError
	return errors.As(err, &re) && re.Code == code
}

// Client talks to the agent over its unix socket. It is safe for concurrent use.
type Client struct {
	socket string
	http   *http.Client
}

// NewClient returns a client for the agent listening on socketPath.
func NewClient(socketPath string) *Client {
	d := &net.Dialer{Timeout: 5 * time.Second}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return d.DialContext(ctx, "unix", socketPath)
		},
		MaxIdleConns:    2,
		IdleConnTimeout: 30 * time.Second,
	}
	return &Client{socket: socketPath, http: &http.Client{Transport: tr, Timeout: 60 * time.Second}}
}

// Socket returns the socket path the client dials.
func (c *Client) Socket() string { return c.socket }

// Healthy returns nil when GET /healthz answers 200, else the agent's reason.
func (c *Client) Healthy(ctx context.Context) error {
	resp, err := c.roundTrip(ctx, http.MethodGet, "/healthz", nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode == http.StatusOK {
		return nil
	}
	msg := strings.TrimSpace(string(body))
	if msg == "" {
		msg = http.StatusText(resp.StatusCode)
	}
	return &RemoteError{Code: resp.StatusCode, Message: "not ready: " + msg}
}

// Status returns GET /v1/status.
func (c *Client) Status(ctx context.Context) (Status, error) {
	var st Status
	err := c.do(ctx, http.MethodGet, "/v1/status", nil, &st)
	return st, err
}

// Endpoints returns GET /v1/endpoints.
func (c *Client) Endpoints(ctx context.Context) ([]Endpoint, error) {
	var eps []Endpoint
	err := c.do(ctx, http.MethodGet, "/v1/endpoints", nil, &eps)
	return eps, err
}

// Allocate asks the agent's IPAM for addresses (idempotent per containerID/ifName).
func (c *Client) Allocate(ctx context.Context, r AllocateRequest) (AllocateResponse, error) {
	var resp AllocateResponse
	err := c.do(ctx, http.MethodPost, "/v1/ipam/allocate", r, &resp)
	return resp, err
}

// Release frees an allocation (idempotent).
func (c *Client) Release(ctx context.Context, r ReleaseRequest) error {
	return c.do(ctx, http.MethodPost, "/v1/ipam/release", r, nil)
}

// PutEndpoint registers or updates an endpoint.
func (c *Client) PutEndpoint(ctx context.Context, ep Endpoint) error {
	return c.do(ctx, http.MethodPut, "/v1/endpoints", ep, nil)
}

// DeleteEndpoint removes an endpoint and releases its addresses (idempotent).
func (c *Client) DeleteEndpoint(ctx context.Context, a Attachment) error {
	q := url.Values{"containerID": {a.ContainerID}, "ifname": {a.IfName}}
	return c.do(ctx, http.MethodDelete, "/v1/endpoints?"+q.Encode(), nil, nil)
}

// GC removes every attachment not listed in r.Valid.
func (c *Client) GC(ctx context.Context, r GCRequest) (GCResponse, error) {
	var resp GCResponse
	err := c.do(ctx, http.MethodPost, "/v1/gc", r, &resp)
	return resp, err
}

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("encode %s %s request: %w", method, path, err)
		}
		body = bytes.NewReader(b)
	}
	resp, err := c.roundTrip(ctx, method, path, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("read reply of %s %s from axon-agent at %s: %w", method, path, c.socket, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		var e Error
		if json.Unmarshal(data, &e) != nil || e.Message == "" {
			e.Message = strings.TrimSpace(string(data))
			if e.Message == "" {
				e.Message = http.StatusText(resp.StatusCode)
			}
		}
		return &RemoteError{Code: resp.StatusCode, Message: e.Message}
	}
	if out == nil || resp.StatusCode == http.StatusNoContent {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("decode reply of %s %s from axon-agent at %s: %w", method, path, c.socket, err)
	}
	return nil
}

func (c *Client) roundTrip(ctx context.Context, method, path string, body io.Reader) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, "http://axon-agent"+path, body)
	if err != nil {
		return nil, fmt.Errorf("build %s %s request: %w", method, path, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" {
			return nil, fmt.Errorf("%w at %s: is the agent running? (%v)", ErrUnreachable, c.socket, op.Err)
		}
		return nil, fmt.Errorf("%s %s to axon-agent at %s: %w", method, path, c.socket, err)
	}
	return resp, nil
}
