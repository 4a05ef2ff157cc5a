package cni

import (
	"encoding/json"
	"fmt"

	"github.com/containernetworking/cni/pkg/types"
)

// ConfListFile is the name of axon's CNI configuration in the runtime's
// configuration directory (/etc/cni/net.d): "05-" sorts it before the
// usual defaults, so the runtime picks axon.
const ConfListFile = "05-axon.conflist"

// NetworkName is the network name in axon's configuration list.
const NetworkName = "axon"

// confList is the configuration list file format (CNI spec 1.1 §1) with
// axon-cni as its one plugin.
type confList struct {
	CNIVersion string       `json:"cniVersion"`
	Name       string       `json:"name"`
	Plugins    []pluginConf `json:"plugins"`
}

type pluginConf struct {
	Type   string `json:"type"`
	Socket string `json:"socket"`
	MTU    int    `json:"mtu"`
}

// ConfList is the content of axon's configuration list naming the agent's
// socket and the pod MTU; it is what axon-agent --cni-conf-dir writes and
// what ParseConfList accepts. The one source of this file's content.
func ConfList(socket string, mtu int) ([]byte, error) {
	raw, err := json.MarshalIndent(confList{
		CNIVersion: SupportedVersions[len(SupportedVersions)-1],
		Name:       NetworkName,
		Plugins:    []pluginConf{{Type: "axon-cni", Socket: socket, MTU: mtu}},
	}, "", "  ")
	if err != nil {
		return nil, err
	}
	raw = append(raw, '\n')
	if _, err := ParseConfList(raw); err != nil {
		return nil, fmt.Errorf("CNI configuration for socket %q, mtu %d: %w", socket, mtu, err)
	}
	return raw, nil
}

// ParseConfList parses a configuration list whose one plugin is axon-cni
// and returns that plugin's configuration as axon-cni sees it (the runtime
// injects the list's cniVersion and name into each plugin's config).
func ParseConfList(raw []byte) (*NetConf, error) {
	var list struct {
		CNIVersion string            `json:"cniVersion"`
		Name       string            `json:"name"`
		Plugins    []json.RawMessage `json:"plugins"`
	}
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, fmt.Sprintf("configuration list is not valid JSON: %v", err), "")
	}
	if len(list.Plugins) != 1 {
		return nil, invalidConf(fmt.Sprintf("configuration list has %d plugins, want 1 (axon-cni)", len(list.Plugins)))
	}
	var plugin map[string]any
	if err := json.Unmarshal(list.Plugins[0], &plugin); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, fmt.Sprintf("plugin config is not a JSON object: %v", err), "")
	}
	if plugin["type"] != "axon-cni" {
		return nil, invalidConf(fmt.Sprintf("plugin type %v, want axon-cni", plugin["type"]))
	}
	plugin["cniVersion"], plugin["name"] = list.CNIVersion, list.Name
	conf, err := json.Marshal(plugin)
	if err != nil {
		return nil, err
	}
	return ParseConfig(conf)
}
