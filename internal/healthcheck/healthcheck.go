// Package healthcheck serves the per-Service health checks of Services with
// externalTrafficPolicy: Local, compatible with kube-proxy's
// (k8s.io/kubernetes/pkg/proxy/healthcheck): on each Service's
// spec.healthCheckNodePort, any path answers
//
//	200 {"service":{"namespace":"ns","name":"web"},"localEndpoints":2,"serviceProxyHealthy":true}
//
// when the node has local ready endpoints of the Service and the datapath
// is healthy, 503 with the same body otherwise, and the header
// X-Load-Balancing-Endpoint-Weight carries the count. Cloud load balancers
// probe it to skip nodes that would drop the traffic.
package healthcheck

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/axonhq/axon/internal/lb"
)

// ServiceName is a Service's namespace and name.
type ServiceName struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

func (n ServiceName) String() string { return n.Namespace + "/" + n.Name }

// Service is one health check to serve.
type Service struct {
	Port           uint16 // spec.healthCheckNodePort
	LocalEndpoints int    // ready endpoints of the Service on this node
}

// Reply is the JSON body, field for field as kube-proxy writes it.
type Reply struct {
	Service             ServiceName `json:"service"`
	LocalEndpoints      int         `json:"localEndpoints"`
	ServiceProxyHealthy bool        `json:"serviceProxyHealthy"`
}

// Server opens one listener per Service port and node address. It is safe
// for concurrent use.
type Server struct {
	log   *slog.Logger
	addrs []netip.Addr // where to listen; empty = every address (0.0.0.0 and ::)

	mu       sync.Mutex
	svcs     map[ServiceName]*instance
	healthy  bool
	failures map[ServiceName]string // why a Service's port could not be opened
}

type instance struct {
	port      uint16
	endpoints int
	servers   []*http.Server
}

// New returns a server listening on addrs (the node's addresses; none = all
// addresses). It serves nothing until Sync.
func New(addrs []netip.Addr, log *slog.Logger) *Server {
	if log == nil {
		log = slog.Default()
	}
	return &Server{log: log, addrs: slices.Clone(addrs), svcs: map[ServiceName]*instance{}, healthy: true, failures: map[ServiceName]string{}}
}

// SetHealthy sets serviceProxyHealthy: when false every check answers 503
// (the node's datapath cannot deliver, whatever the endpoints).
func (s *Server) SetHealthy(ok bool) {
	s.mu.Lock()
	s.healthy = ok
	s.mu.Unlock()
}

// Sync makes the served set equal to want: opens listeners for new Services
// (or changed ports), closes those of Services gone, and updates endpoint
// counts in place. A port that cannot be opened is reported in the returned
// error and in Failures, and retried on the next Sync; the others are served.
func (s *Server) Sync(want map[ServiceName]Service) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, inst := range s.svcs {
		if w, ok := want[name]; !ok || w.Port != inst.port {
			inst.close()
			delete(s.svcs, name)
			s.log.Info("health check closed", "service", name.String(), "port", inst.port)
		}
	}
	for name := range s.failures {
		if _, ok := want[name]; !ok {
			delete(s.failures, name)
		}
	}
	var errs []error
	names := make([]ServiceName, 0, len(want))
	for n := range want {
		names = append(names, n)
	}
	slices.SortFunc(names, func(a, b ServiceName) int { return cmp.Compare(a.String(), b.String()) })
	for _, name := range names {
		w := want[name]
		if inst, ok := s.svcs[name]; ok {
			inst.endpoints = w.LocalEndpoints
			continue
		}
		if w.Port == 0 {
			errs = append(errs, fmt.Errorf("health check for %s: port 0", name))
			continue
		}
		inst := &instance{port: w.Port, endpoints: w.LocalEndpoints}
		if err := s.listen(name, inst); err != nil {
			msg := fmt.Sprintf("listen on health check node port %d: %v", w.Port, err)
			if s.failures[name] != msg {
				s.log.Warn("health check not served; retrying on the next sync", "service", name.String(), "port", w.Port, "error", err)
			}
			s.failures[name] = msg
			errs = append(errs, fmt.Errorf("health check for %s: %s", name, msg))
			continue
		}
		delete(s.failures, name)
		s.svcs[name] = inst
		s.log.Info("health check serving", "service", name.String(), "port", w.Port, "localEndpoints", w.LocalEndpoints)
	}
	return errors.Join(errs...)
}

// listen opens every address of inst; all or nothing. Called with mu held.
func (s *Server) listen(name ServiceName, inst *instance) error {
	addrs := s.addrs
	network := map[bool]string{false: "tcp4", true: "tcp6"}
	if len(addrs) == 0 {
		addrs = []netip.Addr{netip.IPv4Unspecified(), netip.IPv6Unspecified()}
	}
	for _, a := range addrs {
		ln, err := (&net.ListenConfig{}).Listen(context.Background(), network[a.Is6() && !a.Is4In6()], netip.AddrPortFrom(a, inst.port).String())
		if err != nil {
			if a.IsUnspecified() && a.Is6() && len(inst.servers) > 0 {
				continue // no IPv6 in this netns: IPv4 is enough
			}
			inst.close()
			return err
		}
		srv := &http.Server{Handler: s.handler(name), ReadHeaderTimeout: 5 * time.Second}
		inst.servers = append(inst.servers, srv)
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.log.Warn("health check server stopped", "service", name.String(), "address", ln.Addr().String(), "error", err)
			}
		}()
	}
	return nil
}

func (inst *instance) close() {
	for _, srv := range inst.servers {
		_ = srv.Close()
	}
	inst.servers = nil
}

func (s *Server) handler(name ServiceName) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		s.mu.Lock()
		inst, ok := s.svcs[name]
		var count int
		if ok {
			count = inst.endpoints
		}
		healthy := s.healthy
		s.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("X-Load-Balancing-Endpoint-Weight", strconv.Itoa(count))
		if count > 0 && healthy {
			w.WriteHeader(http.StatusOK)
		} else {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(Reply{Service: name, LocalEndpoints: count, ServiceProxyHealthy: healthy})
	})
}

// Status is one served (or failed) health check, for `axon status`.
type Status struct {
	Service        ServiceName `json:"service"`
	Port           uint16      `json:"port"`
	LocalEndpoints int         `json:"localEndpoints"`
	Error          string      `json:"error,omitempty"`
}

// Statuses lists the health checks, sorted by Service.
func (s *Server) Statuses() []Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Status, 0, len(s.svcs)+len(s.failures))
	for n, inst := range s.svcs {
		out = append(out, Status{Service: n, Port: inst.port, LocalEndpoints: inst.endpoints})
	}
	for n, msg := range s.failures {
		out = append(out, Status{Service: n, Error: msg})
	}
	slices.SortFunc(out, func(a, b Status) int { return cmp.Compare(a.Service.String(), b.Service.String()) })
	return out
}

// Close stops every listener.
func (s *Server) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, inst := range s.svcs {
		inst.close()
		delete(s.svcs, name)
	}
}

// FromFrontends derives the health checks to serve from the node's
// programmed frontends: every Service with a healthCheckNodePort, with its
// local active endpoints counted across its frontends (lb.LocalEndpoints).
func FromFrontends(fs []lb.Frontend, node string) map[ServiceName]Service {
	bySvc := map[string][]lb.Frontend{}
	port := map[string]uint16{}
	for _, f := range fs {
		if f.HealthCheckNodePort == 0 {
			continue
		}
		bySvc[f.Service] = append(bySvc[f.Service], f)
		port[f.Service] = f.HealthCheckNodePort
	}
	out := make(map[ServiceName]Service, len(bySvc))
	for svc, list := range bySvc {
		ns, name, _ := strings.Cut(svc, "/")
		out[ServiceName{Namespace: ns, Name: name}] = Service{Port: port[svc], LocalEndpoints: lb.LocalEndpoints(list, node)}
	}
	return out
}
