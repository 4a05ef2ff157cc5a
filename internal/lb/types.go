// Package lb is the load-balancing model shared by the agent (which builds it
// from Services and EndpointSlices) and the datapath (which writes it into BPF
// maps): frontends (a service address + port + protocol + scope) and the
// backends they translate to.
package lb

import (
	"errors"
	"net/netip"
	"time"
)

// Proto is an L4 protocol number as in the IP header.
type Proto uint8

const (
	TCP  Proto = 6
	UDP  Proto = 17
	SCTP Proto = 132
)

// Scope says who may use a frontend.
type Scope uint8

const (
	// ScopeCluster: a ClusterIP, externalIP or LoadBalancer ingress IP, used by everyone in-cluster.
	ScopeCluster Scope = iota
	// ScopeNodePort: matches any local address of the node and loopback, on the node port.
	ScopeNodePort
	// ScopeHostPort: a pod hostPort on this node's addresses.
	ScopeHostPort
)

// Kind records which Service field produced the frontend (for display).
type Kind string

const (
	KindClusterIP    Kind = "ClusterIP"
	KindNodePort     Kind = "NodePort"
	KindExternalIP   Kind = "ExternalIP"
	KindLoadBalancer Kind = "LoadBalancer"
	KindHostPort     Kind = "HostPort"
)

// FrontendKey identifies a frontend. For ScopeNodePort, Addr is the zero
// Addr of the family (any local address).
type FrontendKey struct {
	Addr  netip.Addr
	Port  uint16
	Proto Proto
	Scope Scope
}

// BackendState follows EndpointSlice conditions.
type BackendState uint8

const (
	// Active: ready (and serving): chosen for new connections.
	Active BackendState = iota
	// Terminating: serving but terminating: keeps existing connections, chosen
	// for new ones only when no Active backend exists.
	Terminating
	// Quarantined: not serving: never chosen.
	Quarantined
)

// Backend is one endpoint address + target port.
type Backend struct {
	Addr     netip.Addr
	Port     uint16
	State    BackendState
	NodeName string // for internalTrafficPolicy=Local and display
	Zone     string // topology hints
}

// Frontend is one translated service address with its backends, in a stable
// order (sorted by Addr, Port).
type Frontend struct {
	Key       FrontendKey
	Kind      Kind
	Service   string // namespace/name
	PortName  string
	Backends  []Backend
	Affinity  time.Duration // sessionAffinity ClientIP timeout; 0 = none
	LocalOnly bool          // internalTrafficPolicy/externalTrafficPolicy Local already applied to Backends

	// North-south load balancing (see northsouth.go):
	Algorithm           Algorithm      // backend selection; "" = node default
	SourceRanges        []netip.Prefix // loadBalancerSourceRanges (LoadBalancer frontends); empty = any client
	HealthCheckNodePort uint16         // healthCheckNodePort of an externalTrafficPolicy=Local Service; 0 = none
}

// Writer is what the datapath implements to program frontends. Upserts of a
// frontend replace its whole backend set atomically from the datapath's
// point of view (no partial service is ever visible).
type Writer interface {
	UpsertFrontend(f Frontend) error
	DeleteFrontend(k FrontendKey) error
	Frontends() ([]Frontend, error) // as read back from the maps
}

// BatchWriter is implemented by Writers that can program many frontends
// at once more cheaply than one by one (the full sync). errs is nil when all
// succeeded, else errs[i] is the outcome of fs[i].
type BatchWriter interface {
	UpsertFrontends(fs []Frontend) (errs []error)
}

// ErrFull is wrapped by errors of a Writer whose maps cannot take a write.
var ErrFull = errors.New("load-balancer maps full")

// CapacityChecker is implemented by Writers with bounded maps. Fits says,
// without writing anything, whether all frontends of one Service fit now;
// the agent writes a Service only when they do, so a Service is either
// programmed whole or not at all.
type CapacityChecker interface {
	Fits(fs []Frontend) error
}
