// Package api defines the agent's local API: the JSON types exchanged over the
// agent's unix socket by axon-cni and the axon CLI, a client and a server mux.
// See docs/architecture.md ("Agent local API") for the routes.
package api

import (
	"net"
	"net/netip"
	"time"
)

// DefaultSocket is where a production agent listens.
const DefaultSocket = "/var/run/axon/axon.sock"

// Error is the body of every non-2xx reply.
type Error struct {
	Message string `json:"message"`
}

// AllocateRequest asks the agent's IPAM for addresses for one pod interface.
// Allocation is idempotent per (ContainerID, IfName).
type AllocateRequest struct {
	ContainerID  string `json:"containerID"`
	IfName       string `json:"ifName"`
	PodName      string `json:"podName,omitempty"`
	PodNamespace string `json:"podNamespace,omitempty"`
}

// Address is one allocated pod address with the pool prefix it came from.
type Address struct {
	IP     netip.Addr   `json:"ip"`
	Prefix netip.Prefix `json:"prefix"` // the node podCIDR the IP belongs to
}

// AllocateResponse carries one address per configured family (v4 first).
type AllocateResponse struct {
	Addresses []Address `json:"addresses"`
	// Device is how the CNI plugin must build the pod device;
	// nil (an agent that does not say) means a veth with kernel defaults.
	Device *DeviceConfig `json:"device,omitempty"`
}

// Pod device types (Endpoint.DeviceType, DeviceConfig.Type).
const (
	DeviceVeth   = "veth"
	DeviceNetkit = "netkit"
)

// DeviceConfig is the pod device the agent's operational mode asks for, with
// the BIG TCP sizes for both ends (0 = leave the kernel default).
type DeviceConfig struct {
	Type       string `json:"type"`                 // DeviceVeth | DeviceNetkit
	NetkitMode string `json:"netkitMode,omitempty"` // "l3" (default) | "l2", netkit only
	// BIG TCP (IFLA_GSO_MAX_SIZE, IFLA_GRO_MAX_SIZE, IFLA_GSO_IPV4_MAX_SIZE,
	// IFLA_GRO_IPV4_MAX_SIZE) for the pod device and its host-side end.
	GSOMaxSize     uint32 `json:"gsoMaxSize,omitempty"`
	GROMaxSize     uint32 `json:"groMaxSize,omitempty"`
	GSOIPv4MaxSize uint32 `json:"gsoIPv4MaxSize,omitempty"`
	GROIPv4MaxSize uint32 `json:"groIPv4MaxSize,omitempty"`
}

// ReleaseRequest frees what AllocateRequest took. Idempotent.
type ReleaseRequest struct {
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
}

// Endpoint is a pod interface wired by axon-cni and programmed by the agent.
type Endpoint struct {
	ContainerID  string           `json:"containerID"`
	IfName       string           `json:"ifName"`
	Netns        string           `json:"netns"`
	PodName      string           `json:"podName,omitempty"`
	PodNamespace string           `json:"podNamespace,omitempty"`
	IPs          []netip.Addr     `json:"ips"`
	HostIfName   string           `json:"hostIfName"`
	HostIfIndex  int              `json:"hostIfIndex"`
	HostMAC      net.HardwareAddr `json:"hostMAC"`
	PodMAC       net.HardwareAddr `json:"podMAC"`
	// DeviceType is the pod device axon-cni created (DeviceVeth when empty,
	// for endpoints registered by an agent older than netkit support); NetkitMode "l3"|"l2" for netkit.
	DeviceType string `json:"deviceType,omitempty"`
	NetkitMode string `json:"netkitMode,omitempty"`
	// Filled in by the agent in replies:
	State   string    `json:"state,omitempty"` // "ready", "pending", "orphan" (no Pod object)
	Created time.Time `json:"created,omitempty"`
	// VMBypass, for a pod annotated axon.io/vm-bypass: enabled: "bypassed",
	// or "not bypassed: <reason>" (docs/vm-bypass.md); empty otherwise.
	VMBypass string `json:"vmBypass,omitempty"`
	// PodLB, for a pod whose sockets the socket LB skips (opt-out,
	// hostns-only, a VM guest): "attached", "attached, replies at <tap>", or
	// "not attached: <why>" (docs/services.md); empty otherwise.
	PodLB string `json:"podLB,omitempty"`
}

// Attachment names one (ContainerID, IfName) pair, as in CNI GC's cni.dev/valid-attachments.
type Attachment struct {
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
}

// GCRequest lists the attachments that are still valid; everything else is
// removed. An empty Valid list is refused unless All says that removing every
// endpoint is meant (a CNI GC whose runtime passed an empty
// cni.dev/valid-attachments: no attachment is valid); All with a non-empty
// Valid list is refused too.
type GCRequest struct {
	Valid []Attachment `json:"valid"`
	All   bool         `json:"all,omitempty"`
}

// GCResponse reports what GC removed.
type GCResponse struct {
	Removed []Attachment `json:"removed"`
}

// Decision is one datapath choice shown by `axon status`, e.g.
// {Name: "attach", Value: "tcx", Reason: "kernel supports tcx links"}.
type Decision struct {
	Name   string `json:"name"`
	Value  string `json:"value"`
	Reason string `json:"reason,omitempty"`
}

// Feature is one kernel capability probe result.
type Feature struct {
	Name      string `json:"name"`
	Available bool   `json:"available"`
	Reason    string `json:"reason,omitempty"` // why not, or how it was found
}

// APIServerStatus is the agent's view of its kube-apiserver connection.
type APIServerStatus struct {
	Connected bool   `json:"connected"`
	Synced    bool   `json:"synced"`
	Message   string `json:"message,omitempty"`
}

// Status is the reply of GET /v1/status.
type Status struct {
	Node      string          `json:"node"`
	Ready     bool            `json:"ready"`
	Message   string          `json:"message,omitempty"` // why not ready
	Version   string          `json:"version"`
	APIServer APIServerStatus `json:"apiServer"`
	PodCIDRs  []netip.Prefix  `json:"podCIDRs"`
	Uplink    string          `json:"uplink"`
	Datapath  []Decision      `json:"datapath"`
	Features  []Feature       `json:"features"`
	Endpoints int             `json:"endpoints"`
	Routes    int             `json:"routes"` // podCIDR routes to other nodes

	// Bandwidth Manager (nil when the agent predates it)
	Bandwidth *BandwidthStatus `json:"bandwidth,omitempty"`
	// same-node TCP bypass (nil when the agent predates it)
	Sockmap *SockmapStatus `json:"sockmap,omitempty"`
}
