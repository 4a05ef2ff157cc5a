// Package lab runs a whole multi-node cluster on one machine: nodes are
// network namespaces joined by a bridge namespace (the "wire"), pods are
// namespaces wired by axon-cni (or the reference ptp plugin), a real
// kube-apiserver runs on loopback and one axon-agent runs per node.
//
// Everything the lab creates is recorded in <stateDir>/lab.json so that
// `axon lab down` (and a later `up` after a crash) can remove it by name and
// by PID. See docs/lab.md "Lab topology".
package lab

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/axonhq/axon/internal/atomicfile"
	"github.com/axonhq/axon/internal/proc"
)

// DefaultStateDir is where `axon lab` keeps lab.json, logs and per-node state.
const DefaultStateDir = "/run/axon-lab"

// Names and addresses of the lab topology (docs/lab.md).
const (
	NetnsPrefix   = "axonlab-"
	WireNetns     = NetnsPrefix + "wire"
	ExternalName  = "external"
	WireBridge    = "wire0"
	PinRoot       = "/sys/fs/bpf/axon-lab"
	cgroupSubtree = "axon-lab"
	stateFile     = "lab.json"
	lockFile      = "lab.lock"
	stateVersion  = 1
	// Uplink is every node's (and the external namespace's) device on the wire.
	Uplink = "eth0"
)

// WirePort is the wire bridge's port (in WireNetns) whose peer is the uplink
// of the node or namespace called name.
func WirePort(name string) string { return "w-" + name }

// Datapaths a pod can be wired with.
const (
	DatapathAxon     = "axon"
	DatapathBaseline = "baseline"
)

// Proc identifies a process started by the lab. Its StartTime guards against
// PID reuse: the lab never signals a PID whose start time differs.
type Proc = proc.Record

// Node is one lab node (a network namespace with uplink eth0 on the wire).
type Node struct {
	Name          string         `json:"name"`
	Index         int            `json:"index"`
	Netns         string         `json:"netns"` // netns name, /run/netns/<Netns>
	IP            netip.Addr     `json:"ip"`
	IPs           []netip.Addr   `json:"ips"`
	PodCIDRs      []netip.Prefix `json:"podCIDRs"`
	BaselineCIDRs []netip.Prefix `json:"baselineCIDRs"`
	StateDir      string         `json:"stateDir"` // agent state (IPAM, endpoints)
	Socket        string         `json:"socket"`
	PinDir        string         `json:"pinDir"`
	Cgroup        string         `json:"cgroup"` // absolute cgroup2 dir
	Kubeconfig    string         `json:"kubeconfig,omitempty"`
	Agent         *Proc          `json:"agent,omitempty"`
	KubeProxy     *Proc          `json:"kubeProxy,omitempty"`   // --kube-proxy iptables|nftables
	KubeNodeDir   string         `json:"kubeNodeDir,omitempty"` // --kubelet: kubenode's state dir (kubelet.go)
}

// Pod is one lab pod (a network namespace wired into its node).
type Pod struct {
	Name        string       `json:"name"`
	Namespace   string       `json:"namespace"`
	Node        string       `json:"node"`
	Netns       string       `json:"netns"`
	Datapath    string       `json:"datapath"`
	ContainerID string       `json:"containerID"`
	IfName      string       `json:"ifName"`
	IP          netip.Addr   `json:"ip"`
	IPs         []netip.Addr `json:"ips"`
	Cgroup      string       `json:"cgroup"`
}

// External is the namespace on the wire that plays a client outside the cluster.
type External struct {
	Name  string       `json:"name"`
	Netns string       `json:"netns"`
	IP    netip.Addr   `json:"ip"`
	IPs   []netip.Addr `json:"ips"`
}

// ControlPlaneState records where the control plane lives.
type ControlPlaneState struct {
	Dir        string `json:"dir"`
	Kubeconfig string `json:"kubeconfig"` // admin
	APIPort    int    `json:"apiPort"`
	EtcdPort   int    `json:"etcdPort"`
	PIDs       []int  `json:"pids,omitempty"`
}

// State is the content of lab.json.
type State struct {
	Version      int               `json:"version"`
	Created      time.Time         `json:"created"`
	StateDir     string            `json:"stateDir"`
	BinDir       string            `json:"binDir"`
	Datapath     string            `json:"datapath"`               // datapath of `up`
	KubeProxy    string            `json:"kubeProxy,omitempty"`    // none|iptables|nftables ("" = none)
	DemoServices bool              `json:"demoServices,omitempty"` // `up` created the demo Services
	Device       string            `json:"device,omitempty"`       // agents' --device-mode (auto|veth|netkit; "" = veth)
	BigTCP       bool              `json:"bigTCP,omitempty"`       // BIG TCP on wire, uplinks and pod devices
	NoFibCache   bool              `json:"noFibCache,omitempty"`   // agents' --fib-cache=false
	NoSockmap    bool              `json:"noSockmap,omitempty"`    // agents' --sockmap=disabled (sockmap.go)
	PodsPerNode  int               `json:"podsPerNode"`
	Kubelet      bool              `json:"kubelet,omitempty"` // real kubelet nodes, axon from its chart (kubelet.go)
	Ready        bool              `json:"ready"`             // up finished
	ControlPlane ControlPlaneState `json:"controlPlane"`
	Forwarder    *Proc             `json:"forwarder,omitempty"`
	Cgroup       string            `json:"cgroup"` // <cgroup2>/axon-lab
	Nodes        []Node            `json:"nodes"`
	Pods         []Pod             `json:"pods"`
	// --vm-pods: VM pods per node and the VM pods, apart from Pods (vmpods.go)
	VMPodsPerNode int      `json:"vmPodsPerNode,omitempty"`
	VMPods        []VMPod  `json:"vmPods,omitempty"`
	External      External `json:"external"`

	// agents' --bandwidth-manager (on|off; "" = off)
	BandwidthManager string `json:"bandwidthManager,omitempty"`

	// north-south LB: agents' --lb-acceleration and --nodeport-mode ("" = agent default; check_external.go)
	LBAcceleration string `json:"lbAcceleration,omitempty"`
	NodePortMode   string `json:"nodePortMode,omitempty"`
}

func statePath(dir string) string { return filepath.Join(dir, stateFile) }

// readState reads lab.json; an error wrapping os.ErrNotExist when there is no lab.
func readState(dir string) (*State, error) {
	var s State
	if err := atomicfile.ReadJSON(statePath(dir), &s); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("read lab state: %w", err)
		}
		return nil, fmt.Errorf("%w (remove it with `axon lab down`)", err)
	}
	if s.Version != stateVersion {
		return nil, fmt.Errorf("%s has version %d, this axon understands %d: run `axon lab down` with the axon that created it", statePath(dir), s.Version, stateVersion)
	}
	return &s, nil
}

// writeState writes lab.json atomically (atomicfile), so a crash never
// leaves a half-written state behind.
func writeState(dir string, s *State) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create state dir: %w", err)
	}
	return atomicfile.WriteJSON(statePath(dir), s, 0o600)
}

// lockState takes an exclusive flock on <dir>/lab.lock so that concurrent
// `axon lab` invocations (and library users) never interleave mutations.
func lockState(dir string) (unlock func(), err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create state dir: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open lab lock: %w", err)
	}
	deadline := time.Now().Add(5 * time.Minute)
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) || time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("lock %s (another `axon lab` is running?): %w", f.Name(), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return func() { f.Close() }, nil
}

// Node is the lab node named name.
func (s *State) Node(name string) (*Node, bool) {
	for i := range s.Nodes {
		if s.Nodes[i].Name == name {
			return &s.Nodes[i], true
		}
	}
	return nil, false
}

func (s *State) pod(name string) (*Pod, bool) {
	for i := range s.Pods {
		if s.Pods[i].Name == name {
			return &s.Pods[i], true
		}
	}
	return nil, false
}
