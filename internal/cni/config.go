// Package cni is the axon-cni plugin (CNI spec 1.1: ADD, DEL, CHECK, STATUS,
// GC). It wires a pod with a veth pair, gets addresses from the node's
// axon-agent and registers the endpoint with it. See docs/architecture.md.
package cni

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/axonhq/axon/internal/api"
)

// SupportedVersions are the CNI spec versions axon-cni speaks.
var SupportedVersions = []string{"0.4.0", "1.0.0", "1.1.0"}

const (
	DefaultMTU = 1500
	// MinMTU is IPv6's minimum link MTU: pods are dual stack.
	MinMTU = 1280
	MaxMTU = 65535
)

// NetConf is axon-cni's network configuration (stdin), e.g.
//
//	{"cniVersion":"1.1.0","name":"axon","type":"axon-cni","socket":"/run/axon/axon.sock","mtu":1500,"deviceMode":"netkit"}
type NetConf struct {
	types.PluginConf
	// Socket is the agent's API socket (default api.DefaultSocket).
	Socket string `json:"socket,omitempty"`
	// MTU of both veth ends (default 1500).
	MTU int `json:"mtu,omitempty"`
	// DeviceMode overrides the pod device the agent asks for: "veth",
	// "netkit" (L3), "netkit-l2" or "auto" (netkit where the kernel has it).
	// Empty (the default) follows the agent's --device-mode.
	DeviceMode string `json:"deviceMode,omitempty"`
}

// CheckVersion reports a missing or unsupported cniVersion as a CNI error with
// code 1, and malformed JSON with code 6. It is cheap and runs before anything else.
func CheckVersion(stdin []byte) *types.Error {
	var v struct {
		CNIVersion *string `json:"cniVersion"`
	}
	if err := json.Unmarshal(stdin, &v); err != nil {
		return types.NewError(types.ErrDecodingFailure, fmt.Sprintf("network config is not valid JSON: %v", err), "")
	}
	if v.CNIVersion == nil || *v.CNIVersion == "" {
		return types.NewError(types.ErrIncompatibleCNIVersion,
			fmt.Sprintf(`network config has no "cniVersion": set it to one of %s`, strings.Join(SupportedVersions, ", ")), "")
	}
	if !slices.Contains(SupportedVersions, *v.CNIVersion) {
		return types.NewError(types.ErrIncompatibleCNIVersion,
			fmt.Sprintf(`cniVersion %q is not supported by axon-cni: use one of %s`, *v.CNIVersion, strings.Join(SupportedVersions, ", ")), "")
	}
	return nil
}

// ParseConfig decodes and validates the network configuration, filling
// defaults. Errors are *types.Error with the spec's codes.
func ParseConfig(stdin []byte) (*NetConf, error) {
	if e := CheckVersion(stdin); e != nil {
		return nil, e
	}
	conf := &NetConf{}
	if err := json.Unmarshal(stdin, conf); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, fmt.Sprintf("decode network config: %v", err), "")
	}
	if conf.Name == "" {
		return nil, invalidConf(`"name" is missing: set the network name, e.g. "axon"`)
	}
	if conf.MTU == 0 {
		conf.MTU = DefaultMTU
	}
	if conf.MTU < MinMTU || conf.MTU > MaxMTU {
		return nil, invalidConf(fmt.Sprintf(`"mtu" %d is out of range: set it between %d and %d (or omit it for %d)`, conf.MTU, MinMTU, MaxMTU, DefaultMTU))
	}
	if conf.DeviceMode != "" && !slices.Contains(DeviceModes, conf.DeviceMode) {
		return nil, invalidConf(fmt.Sprintf(`"deviceMode" %q is unknown: use one of %s, or omit it to follow axon-agent's --device-mode`, conf.DeviceMode, strings.Join(DeviceModes, ", ")))
	}
	if conf.Socket == "" {
		conf.Socket = api.DefaultSocket
	}
	if !filepath.IsAbs(conf.Socket) {
		return nil, invalidConf(fmt.Sprintf(`"socket" %q must be an absolute path to the axon-agent socket, e.g. %q`, conf.Socket, api.DefaultSocket))
	}
	if conf.RawPrevResult != nil {
		if err := version.ParsePrevResult(&conf.PluginConf); err != nil {
			return nil, types.NewError(types.ErrDecodingFailure, fmt.Sprintf("decode prevResult: %v", err), "")
		}
	}
	for i, a := range conf.ValidAttachments {
		if a.ContainerID == "" || a.IfName == "" {
			return nil, invalidConf(fmt.Sprintf(`"cni.dev/valid-attachments"[%d] needs both "containerID" and "ifname"`, i))
		}
	}
	return conf, nil
}

func invalidConf(msg string) *types.Error {
	return types.NewError(types.ErrInvalidNetworkConfig, "invalid network config: "+msg, "")
}

// K8sArgs are the CNI_ARGS kubelet passes.
type K8sArgs struct {
	types.CommonArgs
	K8S_POD_NAME               types.UnmarshallableString //nolint:revive // CNI_ARGS key
	K8S_POD_NAMESPACE          types.UnmarshallableString //nolint:revive
	K8S_POD_INFRA_CONTAINER_ID types.UnmarshallableString //nolint:revive
	K8S_POD_UID                types.UnmarshallableString //nolint:revive
}

// ParseArgs parses CNI_ARGS ("K=V;K=V"), ignoring keys it does not know.
func ParseArgs(s string) (K8sArgs, error) {
	var a K8sArgs
	a.IgnoreUnknown = true
	if err := types.LoadArgs(s, &a); err != nil {
		return a, types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("parse CNI_ARGS %q: %v", s, err), "")
	}
	return a, nil
}
